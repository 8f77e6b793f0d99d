"""A deadline for the DB-API commit a migration makes before a schema change.

google-cloud-spanner's DB-API ``Connection.commit()`` takes no timeout: its Commit RPC
waits up to the client's default hour on a silent server, and on ABORTED it replays the
transaction and commits again, without end while another writer keeps aborting it. It
offers no hook to bound either, so the commit runs in a daemon thread and the migration
waits for it at most ``seconds``: past that it fails with what is known and how to go on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sharded_orm.spanner.commits import finished_within

from .errors import MigrationError

#: ``alembic.config.Config.attributes`` key: the seconds a migration's commit before a
#: schema change may take (default ``DEFAULT_COMMIT_TIMEOUT``).
COMMIT_TIMEOUT_ATTRIBUTE = "sharded_orm.commit_timeout"
DEFAULT_COMMIT_TIMEOUT = 120.0


def commit_timeout(attributes: dict[str, Any]) -> float:
    value = attributes.get(COMMIT_TIMEOUT_ATTRIBUTE, DEFAULT_COMMIT_TIMEOUT)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
        raise MigrationError(
            f"config.attributes[{COMMIT_TIMEOUT_ATTRIBUTE!r}] must be a positive number of "
            f"seconds, got {value!r}"
        )
    return float(value)


def commit_within(commit: Callable[[], None], seconds: float) -> None:
    """``commit()``, or :class:`MigrationError` if it has not returned within ``seconds``
    (its outcome then unknown: the thread is left to the client's own timeout)."""
    if not finished_within(commit, seconds):
        raise MigrationError(
            f"The commit of this migration's statements before its next schema change did "
            f"not finish within {seconds:g} s (the server is silent, or another writer keeps "
            "aborting the transaction); whether it was applied is unknown, and the schema "
            "change was not sent. Check the database is reachable, then run `alembic "
            "upgrade` again: the revision is not recorded, so it runs again (a backfill "
            "resumes where it stopped). config.attributes"
            f"[{COMMIT_TIMEOUT_ATTRIBUTE!r}] sets this limit."
        )
