"""The error a refused migration step raises."""

from __future__ import annotations

from alembic.util import CommandError

from sharded_orm.errors import ShardConfigError


class MigrationError(ShardConfigError, CommandError):
    """A migration or autogenerate step refused, with what to do instead.

    A :class:`~alembic.util.CommandError`, so Alembic's CLI prints it as one ``FAILED:``
    line rather than a traceback; a :class:`~sharded_orm.ShardConfigError` for callers
    that catch the library's errors.
    """
