"""Timestamps as shard sources: an aware datetime is hashed as its UTC instant, and
what the database stores of it depends on the database.

Spanner stores the instant. SQLite's ``DATETIME`` stores the wall time and drops the
offset, and reads the value back naive. So while the write layer fills a statement's rows
for SQLite (:data:`OFFSETS_DROPPED`), an offset other than UTC is refused, naming
``UTCDateTime`` (which stores every instant as UTC itself), unless the shard column says
naive values mean UTC (``naive_datetimes="utc"``: the value is then stored as its UTC
instant, which reads back as that). A naive value read back from the database is refused
as a stored value (:func:`read_back_error`): the fix is the column's type.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from sqlalchemy import types as sqltypes

from sharded_orm.errors import ShardValueError
from sharded_orm.hashing import show
from sharded_orm.schema.naive import OPT_IN
from sharded_orm.schema.source_errors import describe, none_error, type_error, value_error
from sharded_orm.schema.types import UTCDateTime

Coercer = Callable[[Any], Any]

_UTC = _dt.timezone.utc
_ZERO = _dt.timedelta(0)

#: True while the write layer fills the rows of a statement bound for a database that
#: stores a timestamp's wall time and drops its offset (SQLite's ``DATETIME``; see
#: :func:`drops_offsets`): a source with an offset other than UTC is refused there, as
#: the row would store another instant than the one hashed. Set per statement by the
#: write layer; unset (False) for lookups and on Spanner, which stores the instant.
OFFSETS_DROPPED: ContextVar[bool] = ContextVar("sharded_orm_offsets_dropped", default=False)


def drops_offsets(dialect: Any) -> bool:
    """Whether ``dialect``'s ``DateTime`` stores the wall time and drops the offset."""
    return getattr(dialect, "name", None) == "sqlite"


def keeps_instant(type_: Any) -> bool:
    """Whether a UTCDateTime in the column's type stores every instant as UTC itself."""
    seen = 0
    while isinstance(type_, sqltypes.TypeDecorator) and seen < 8:
        if isinstance(type_, UTCDateTime):
            return True
        type_ = type_.impl_instance
        seen += 1
    return False


def _declared_aware(column: Any) -> bool:
    """A plain ``DateTime(timezone=True)`` (not a UTCDateTime, which reads back aware)."""
    type_ = getattr(column, "type", None)
    t, seen = type_, 0
    while isinstance(t, sqltypes.TypeDecorator) and seen < 8:
        t, seen = t.impl_instance, seen + 1
    return bool(getattr(t, "timezone", False)) and not keeps_instant(type_)


def datetime_coercer(column: Any, naive_utc: Callable[[], bool] | None = None) -> Coercer:
    """Aware datetimes as their UTC instant; a naive one as given where ``naive_utc()``
    says so (the app's opt-in, :mod:`sharded_orm.schema.naive`: the hash takes it as UTC),
    else refused. While :data:`OFFSETS_DROPPED` (a write to SQLite), an offset other than
    UTC is refused unless a UTCDateTime stores the value as UTC itself or naive values
    mean UTC (the value is then sent as its UTC instant, which reads back as that)."""
    instant_kept = keeps_instant(getattr(column, "type", None))
    aware_column = _declared_aware(column)

    def coerce(v: Any) -> Any:
        if v.__class__ is _dt.datetime and v.tzinfo is _UTC:
            return v
        if v is None:
            raise none_error(column)
        if not isinstance(v, _dt.datetime):
            raise type_error(
                column,
                v,
                "a timestamp column's source must be a timezone-aware datetime "
                "(dates and ISO strings are refused: their stored instant depends on the driver)",
            )
        offset = v.utcoffset()
        if offset is None:
            if naive_utc is not None and v.tzinfo is None and naive_utc():
                return v
            hint = (
                "; if it was read back from the database, the database keeps no offset "
                "(SQLite reads a DateTime(timezone=True) back naive): declare the column "
                "sharded_orm.UTCDateTime, which reads back aware"
                if aware_column
                else ""
            )
            raise value_error(
                column,
                v,
                "a naive datetime is no instant; attach a timezone, "
                f"e.g. datetime.now(timezone.utc){hint}; or, {OPT_IN}",
            )
        if v.tzinfo is _UTC:
            return v
        if (
            offset != _ZERO
            and not instant_kept
            and OFFSETS_DROPPED.get()
            and not (naive_utc is not None and naive_utc())  # stored as UTC, read as UTC
        ):
            raise value_error(
                column,
                v,
                f"its offset is {offset} and this database (SQLite) stores a DateTime's wall "
                "time without its offset, so the row would hold another instant than the "
                "one hashed (and read it back naive). Declare the column "
                "sharded_orm.UTCDateTime, which stores every instant as UTC, or pass the "
                "value in UTC: value.astimezone(timezone.utc)",
            )
        try:
            return v.astimezone(_UTC)
        except OverflowError:
            raise value_error(column, v, "its UTC instant is out of range (years 1-9999)") from None

    return coerce


def read_back_error(column: Any, value: Any) -> ShardValueError:
    """The refusal of a source value read back from the database that cannot be hashed:
    a naive datetime there is what the database stored (SQLite keeps no offset), so the
    fix is the column's type, not the caller's value."""
    if isinstance(value, _dt.datetime) and value.utcoffset() is None:
        return ShardValueError(
            f"cannot hash {show(value)}, the value of shard source {describe(column)} "
            f"({column.type!r}) read back from the database: the database keeps no offset "
            "(SQLite's DATETIME) and returns a naive datetime, which is no instant. Declare "
            "the column sharded_orm.UTCDateTime (it stores UTC and reads back aware); or, "
            f"{OPT_IN}"
        )
    return ShardValueError(
        f"cannot hash {show(value)}, the value of shard source {describe(column)} "
        f"({column.type!r}) read back from the database: the stored value is no value the "
        "column's type takes; fix the stored rows (or the column's type)"
    )
