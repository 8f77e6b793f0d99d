"""Exceptions raised by sharded-orm.

Every error the library raises on bad input is a :class:`ShardingError`, so
callers can catch one base class; the subclasses say which kind of mistake it
was. Where users would expect a standard exception (``TypeError`` for a wrong
type, ``ValueError`` for a bad value) the subclass also derives from it.
"""

from __future__ import annotations


class ShardingError(Exception):
    """Base class of every error raised by sharded-orm."""


class ShardConfigError(ShardingError, ValueError):
    """A shard column, index or key strategy was declared wrongly."""


class ShardValueError(ShardingError, ValueError):
    """A value cannot be hashed to a shard (None, naive datetime, NaN...)."""


class ShardTypeError(ShardingError, TypeError):
    """A value's type has no canonical encoding, or an argument has the wrong type."""


class ShardMismatchError(ShardingError, ValueError):
    """A shard value given by the caller disagrees with its sources.

    Such a row would be invisible to every sharded query, so it is never written.
    """


class ShardReadError(ShardingError, RuntimeError):
    """A read across shards could not give a consistent answer (the rows kept changing
    between its statements)."""


class UnsupportedOnDialectError(ShardingError, NotImplementedError):
    """A construct cannot be honoured on the dialect in use."""


class SuccessorWriteError(ShardingError, RuntimeError):
    """A write to a table with a successor (a key reshard under way) ran, but could not be
    mirrored into the successor: its transaction must roll back (COMMIT is refused)."""


class ShardingWarning(UserWarning):
    """Something sharded-orm cannot check, such as raw SQL writing a sharded table."""
