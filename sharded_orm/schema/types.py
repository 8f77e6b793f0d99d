"""Column types that keep shard sources hashable after a round trip."""

from __future__ import annotations

import datetime as _dt
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.types import DateTime, TypeDecorator

from sharded_orm.errors import ShardTypeError, ShardValueError

_UTC = _dt.timezone.utc


class UTCDateTime(TypeDecorator[_dt.datetime]):
    """A timezone-aware UTC timestamp on every backend.

    SQLite stores no offset and hands back naive datetimes, which cannot be hashed
    (a naive datetime is no instant). This type refuses naive values on the way in,
    stores UTC, and returns aware UTC datetimes on the way out, so a row read back
    from SQLite hashes to the same shard it was written with. On Spanner it is a
    plain ``TIMESTAMP``.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        if not isinstance(value, _dt.datetime):
            # SQLite's driver would store a str or an int as is, and hand it back as one
            raise ShardTypeError(
                f"a UTCDateTime column takes a timezone-aware datetime, got {value!r} "
                f"({type(value).__name__})"
            )
        if value.utcoffset() is None:
            raise ShardValueError(
                f"naive datetime {value!r} given to a UTCDateTime column: "
                "attach a timezone, e.g. datetime.now(timezone.utc)"
            )
        try:
            utc = value.astimezone(_UTC)
        except OverflowError:
            raise ShardValueError(
                f"{value!r} is out of range: in UTC it falls outside 0001-01-01 .. 9999-12-31"
            ) from None
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if isinstance(value, _dt.datetime) and value.tzinfo is None:
            return value.replace(tzinfo=_UTC)
        return value
