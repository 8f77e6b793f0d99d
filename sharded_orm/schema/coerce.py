"""The value a column stores: what a shard source is hashed as.

A shard must equal the hash of the *stored* sources, and the database stores what
the column's type and the driver make of a value, not the Python object given:
``1`` into a Boolean is stored ``true``, an upper-case string into a ``Uuid`` is stored
lower-case, a ``(str, Enum)`` member into a String is stored as its value. So every
source is passed through :func:`stored_value` before hashing, on writes and on point
lookups alike. A pair whose stored form is lossy or ambiguous (``True`` into an Integer,
a datetime into a Date, a Decimal finer than the column's scale, a float, a naive
datetime for a timestamp) is refused with a :class:`ShardTypeError` or
:class:`ShardValueError` instead of being guessed. The rules are listed in
``docs/hashing.md``.

:func:`coercer_for` builds the per-column function once (at shard-column resolution),
with a fast path for the common exact types, so the hot path pays one type check.
"""

from __future__ import annotations

import datetime as _dt
import enum
import uuid
from collections.abc import Callable
from decimal import Context, Decimal, InvalidOperation
from typing import Any

from sqlalchemy import types as sqltypes
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.sql.schema import Column

from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.hashing import INT64_MAX, INT64_MIN
from sharded_orm.memo import Memo
from sharded_orm.schema.source_errors import describe as _describe
from sharded_orm.schema.source_errors import none_error as _none
from sharded_orm.schema.source_errors import type_error as _type_error
from sharded_orm.schema.source_errors import value_error as _value_error
from sharded_orm.schema.timestamps import datetime_coercer as _datetime_coercer
from sharded_orm.schema.types import UTCDateTime

Coercer = Callable[[Any], Any]

_UTC = _dt.timezone.utc
#: Collations that compare byte for byte; any other one may equate distinct strings.
_EXACT_COLLATIONS = frozenset({"binary", "c", "posix", "ucs_basic", "unicode:cs", "und:cs"})


# --------------------------------------------------------------------------- per type


def _int_coercer(column: Any) -> Coercer:
    def slow(v: Any) -> Any:
        if v is None:
            raise _none(column)
        if isinstance(v, bool):
            raise _type_error(
                column, v, "a bool in an integer column is ambiguous; pass 0 or 1 explicitly"
            )
        if not isinstance(v, int):
            raise _type_error(column, v, "an integer column's source must be an int")
        v = int.__index__(v)  # an IntEnum member or int subclass: the plain int stored
        if not INT64_MIN <= v <= INT64_MAX:
            raise _value_error(column, v, "out of the INT64 range a Spanner column holds")
        return v

    def coerce(v: Any) -> Any:
        if v.__class__ is int and INT64_MIN <= v <= INT64_MAX:
            return v
        return slow(v)

    return coerce


def _bool_coercer(column: Any) -> Coercer:
    def coerce(v: Any) -> Any:
        if v.__class__ is bool:
            return v
        if v is None:
            raise _none(column)
        if isinstance(v, int) and v in (0, 1):
            return bool(v)  # stored as false/true and read back as a bool
        raise _type_error(column, v, "a Boolean column's source must be a bool (or 0 / 1)")

    return coerce


def _str_coercer(column: Any) -> Coercer:
    def coerce(v: Any) -> Any:
        if v.__class__ is str:
            return v
        if v is None:
            raise _none(column)
        if isinstance(v, str):
            return str.__str__(v)  # a (str, Enum) member or str subclass: its text is stored
        raise _type_error(column, v, "a string column's source must be a str")

    return coerce


def _enum_coercer(column: Any) -> Coercer:
    type_: sqltypes.Enum = base_type(column.type)
    names = set(type_.enums)  # the strings the database stores
    # member -> stored string, as the type's own bind processing maps it
    lookup = {k: v for k, v in getattr(type_, "_valid_lookup", {}).items() if v is not None}

    def coerce(v: Any) -> Any:
        if v is None:
            raise _none(column)
        if isinstance(v, enum.Enum):
            if v in lookup:
                return lookup[v]
        elif isinstance(v, str) and str.__str__(v) in names:
            return str.__str__(v)
        raise _value_error(column, v, f"not one of the Enum's values {sorted(names)}")

    return coerce


def _uuid_coercer(column: Any) -> Coercer:
    as_uuid = bool(getattr(base_type(column.type), "as_uuid", True))

    def coerce(v: Any) -> Any:
        if v is None:
            raise _none(column)
        if isinstance(v, uuid.UUID):
            u = v
        elif isinstance(v, str):
            try:
                u = uuid.UUID(v)
            except ValueError:
                raise _value_error(column, v, "not a UUID") from None
        else:
            raise _type_error(column, v, "a Uuid column's source must be a UUID or its text")
        if as_uuid:
            return u
        text = str(u)  # lower-case with dashes: what the column reads back
        return v if v.__class__ is str and v == text else text

    return coerce


def _numeric_coercer(column: Any) -> Coercer:
    scale = getattr(base_type(column.type), "scale", None)

    def coerce(v: Any) -> Any:
        if v is None:
            raise _none(column)
        if isinstance(v, (bool, float)):
            raise _type_error(column, v, "pass a Decimal (floats and bools are inexact)")
        if isinstance(v, int):
            v = Decimal(int.__index__(v))
        if not isinstance(v, Decimal):
            raise _type_error(column, v, "a Numeric column's source must be a Decimal")
        if not v.is_finite():
            raise _value_error(column, v, "NUMERIC holds no NaN or infinity")
        if scale is not None and v.as_tuple().exponent < -scale:
            # finer than the scale, unless only by trailing zeros; quantized in a context
            # wide enough for every digit (the default 28 digits would overflow a
            # NUMERIC(38, 9) value such as 10**19)
            wide = Context(prec=len(v.as_tuple().digits) + scale + 2)
            try:
                exact = v == v.quantize(Decimal(1).scaleb(-scale), context=wide)
            except InvalidOperation:
                exact = False
            if not exact:
                raise _value_error(
                    column,
                    v,
                    f"it has more decimal places than the column's scale ({scale}), so the "
                    "database would round it; round it yourself first",
                )
        return v

    return coerce


def _date_coercer(column: Any) -> Coercer:
    def coerce(v: Any) -> Any:
        if v.__class__ is _dt.date:
            return v
        if v is None:
            raise _none(column)
        if isinstance(v, _dt.datetime):
            raise _type_error(column, v, "a Date column drops the time; pass value.date()")
        if isinstance(v, _dt.date):
            return _dt.date(v.year, v.month, v.day)
        raise _type_error(column, v, "a Date column's source must be a date")

    return coerce


def _bytes_coercer(column: Any) -> Coercer:
    def coerce(v: Any) -> Any:
        if v.__class__ is bytes:
            return v
        if v is None:
            raise _none(column)
        if isinstance(v, (bytes, bytearray, memoryview)):
            return bytes(v)
        raise _type_error(column, v, "a binary column's source must be bytes")

    return coerce


def _refused_type(column: Any) -> ShardConfigError:
    return ShardConfigError(
        f"column {_describe(column)} of type {column.type!r} cannot be a shard source: its "
        "stored values are inexact or have no canonical text. Sources may be String, Integer, "
        "Boolean, Numeric (Decimal), Date, UTCDateTime/DateTime, LargeBinary, Uuid or Enum."
    )


#: The dialect a TypeDecorator's ``process_bind_param`` is asked about when its conversion
#: is hashed: the shard is computed once per row, before any connection is known, so a
#: decorator whose conversion depends on the dialect cannot be a source (see hashing.md).
_HASH_DIALECT = DefaultDialect()


def _overrides(type_: Any, method: str, *bases: type) -> bool:
    own = getattr(type(type_), method, None)
    return all(own is not getattr(b, method, None) for b in bases)


def _bind_steps(column: Any) -> list[Callable[[Any], Any]]:
    """The Python conversions the column's TypeDecorators apply to a value before the
    driver sees it, outermost first; raises ShardConfigError for a decorator whose stored
    value the client cannot know (SQL-side ``bind_expression``, ``Interval``,
    ``PickleType``)."""
    steps: list[Callable[[Any], Any]] = []
    type_ = column.type
    seen = 0
    while isinstance(type_, sqltypes.TypeDecorator) and seen < 8:
        if isinstance(type_, (sqltypes.Interval, sqltypes.PickleType)):
            raise _refused_type(column)
        if _overrides(type_, "bind_expression", sqltypes.TypeDecorator, sqltypes.TypeEngine):
            raise ShardConfigError(
                f"column {_describe(column)} of type {column.type!r} cannot be a shard source: "
                "its bind_expression() converts the value in SQL, so the client cannot hash "
                "what is stored. Convert in process_bind_param() instead."
            )
        if isinstance(type_, UTCDateTime) and not _overrides(
            type_, "process_bind_param", UTCDateTime
        ):
            pass  # keeps the instant: the DateTime rule hashes it, on the inline fast path
        elif _overrides(type_, "process_bind_param", sqltypes.TypeDecorator):
            steps.append(_bound(type_))
        type_ = type_.impl_instance
        seen += 1
    return steps


def _bound(type_: Any) -> Callable[[Any], Any]:
    convert = type_.process_bind_param

    def step(v: Any) -> Any:
        return convert(v, _HASH_DIALECT)

    return step


def converts_on_bind(column: Any) -> bool:
    """Whether a TypeDecorator of the column changes a value in Python before it is stored
    (so the given value is sent and the converted one hashed)."""
    return bool(_bind_steps(column)) if hasattr(column, "type") else False


def base_type(type_: Any) -> Any:
    """The type whose storage rule applies: a TypeDecorator's impl, a variant's base."""
    seen = 0
    while isinstance(type_, sqltypes.TypeDecorator) and seen < 8:
        type_ = type_.impl_instance
        seen += 1
    return type_


def coercer_for(column: Column[Any], naive_utc: Callable[[], bool] | None = None) -> Coercer:
    """The stored-value function of one column, built once; raises ShardConfigError for a
    column type that cannot be a source (Float, JSON, ARRAY...). ``naive_utc``: asked when
    a naive datetime comes; if it says so, that is stored as given (the caller hashes it
    as UTC), else refused.

    A TypeDecorator's own Python conversion (``process_bind_param``) is applied first, as
    the column does before storing: a ``LowerCase`` string hashes its lower-cased text."""
    steps = _bind_steps(column)
    base = _base_coercer(column, naive_utc)
    if not steps:
        return base
    # A decorator that stores timestamps as naive UTC (SQLAlchemy's documented TZDateTime)
    # hands the column a naive datetime: that wall time is what is stored (and what
    # Spanner's client stores as UTC), so it is hashed as that UTC instant.
    naive_is_utc = isinstance(base_type(column.type), sqltypes.DateTime)

    def decorated(v: Any) -> Any:
        if v is None:
            raise _none(column)
        for step in steps:
            v = step(v)
        if naive_is_utc and isinstance(v, _dt.datetime) and v.tzinfo is None:
            v = v.replace(tzinfo=_UTC)
        return base(v)

    return decorated


def _base_coercer(column: Column[Any], naive_utc: Callable[[], bool] | None = None) -> Coercer:
    type_ = base_type(column.type)
    if isinstance(type_, sqltypes.Float) or (
        isinstance(type_, sqltypes.Numeric) and not type_.asdecimal
    ):
        raise _refused_type(column)
    if isinstance(type_, sqltypes.Enum):
        return _enum_coercer(column)
    if isinstance(type_, sqltypes.Boolean):
        return _bool_coercer(column)
    if isinstance(type_, sqltypes.Integer):
        return _int_coercer(column)
    if isinstance(type_, sqltypes.Numeric):
        return _numeric_coercer(column)
    if isinstance(type_, sqltypes.Uuid):
        return _uuid_coercer(column)
    if isinstance(type_, sqltypes.String):
        return _str_coercer(column)
    if isinstance(type_, sqltypes.DateTime):
        return _datetime_coercer(column, naive_utc)
    if isinstance(type_, sqltypes.Date):
        return _date_coercer(column)
    if isinstance(type_, sqltypes._Binary):
        return _bytes_coercer(column)
    if isinstance(type_, sqltypes.NullType):
        return _untyped  # sa.column('x') with no type: hashed as given
    raise _refused_type(column)


def sends_stored_form(column: Column[Any]) -> bool:
    """Whether the column's stored form is also the Python value to send and keep on the
    object. Not for an Enum: its stored form is the database string, while the column
    takes and reads back the member. Not for a Uuid either: the database compares the text
    the caller's own queries bind (case kept), so the row must hold the caller's text for
    their plain ``u == value`` to find it; the hash uses the canonical form, which the
    server-side expression also rebuilds from any case and dashes."""
    if converts_on_bind(column):
        return False  # sent as given: the decorator converts it on the way in
    t = base_type(column.type)
    if isinstance(t, sqltypes.Uuid):
        return bool(t.as_uuid)  # a UUID object carries no case; a string keeps the caller's
    return not isinstance(t, sqltypes.Enum)


def _untyped(v: Any) -> Any:
    return v


#: id(column) -> (the column, its type, its coercer): holding the column keeps its id its
#: own while the entry lives; the type is compared to notice a column whose type was replaced
_coercers: Memo[int, tuple[Column[Any], Any, Coercer]] = Memo("schema.coerce", 4096)


def stored_value(column: Column[Any], value: Any) -> Any:
    """``value`` as ``column`` stores and reads it back, in the form the hash uses.

    Raises ShardTypeError / ShardValueError when the stored form would be lossy or
    ambiguous, ShardConfigError when the column's type cannot be a source at all.
    """
    hit = _coercers.get(id(column))
    if hit is None or hit[0] is not column or hit[1] is not column.type:
        try:
            fn = coercer_for(column)
        except ShardConfigError as exc:
            raise ShardTypeError(str(exc)) from None
        _coercers.put(id(column), (column, column.type, fn))
    else:
        fn = hit[2]
    return fn(value)


def has_case_insensitive_collation(column: Any) -> bool:
    """True when the column's collation may treat distinct strings as equal.

    Only byte-wise collations (none, BINARY, C, POSIX) are trusted: under any other the
    database's ``=`` matches values that hash differently, so a lookup cannot prune and
    an UPDATE cannot take the value from its WHERE clause.
    """
    collation = getattr(base_type(getattr(column, "type", None)), "collation", None)
    if not collation:
        return False
    return str(collation).strip('"').lower() not in _EXACT_COLLATIONS
