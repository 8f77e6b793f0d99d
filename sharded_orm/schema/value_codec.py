"""The one value codec of the library's cursors and resume positions.

Every key value the library hands back or keeps to go on later goes through here: the
sort values inside ``page()``'s cursors (:mod:`sharded_orm.read.cursors`, which seals
them), the key a ``copy_table(cursor_table=...)`` saves after each batch
(:mod:`sharded_orm.load.copy`), and the ``resume_position`` copies and backfills
report. One value is a small JSON list, ``[tag, text]`` (a timestamp adds its
nanoseconds and, when they matter, details), exact and type-preserving for every
type a Spanner key holds and the other column types a page sorts on:

======================================  ===  ==========================================
value                                   tag  kept as
======================================  ===  ==========================================
None                                    n    null
Enum member (str / int Enums too)       e    its name (read back through ``enum_name``)
bool (BOOL)                             b    true / false
int (INT64)                             i    decimal text (no float rounding in JSON)
float (FLOAT64)                         f    ``repr``: NaN, inf, -inf and -0.0 included
str (STRING; a UUID kept as STRING(36)) s    the text
datetime (TIMESTAMP)                    t    ISO text, nanoseconds, and ``{"ns": 1}``
                                             for Spanner's DatetimeWithNanoseconds,
                                             ``"z"`` the ZoneInfo key, ``"f"`` the fold
date (DATE)                             d    ISO text
time                                    h    ISO text (its offset included), ``"f"``
timedelta                               r    [days, seconds, microseconds]
Decimal (NUMERIC)                       m    ``str``: exponent, sign of zero, NaN kept
uuid.UUID                               u    canonical text
bytes (BYTES; a UUID kept as BYTES)     y    base64
======================================  ===  ==========================================

A tz-aware datetime comes back at the same instant with the same offset; its tzinfo is
the same ZoneInfo (by key) or ``datetime.timezone`` of that offset for any other tzinfo.
An Enum comes back as its name (``enum_name(name)``, a ``str`` by default): the column,
not the cursor, knows the class, and a stored cursor never names a class to import.

The tags are those page cursors have always carried, so cursors issued before this
module decode unchanged. A saved key (:func:`dumps_key`) is ``{"codec": 1, "key":
[values]}``; :func:`loads_key` also reads the list copy cursors were saved as before
(``[["v", 1], ["ts", "<iso>"], ["b", "<base64>"]]``).
"""

from __future__ import annotations

import base64
import datetime as dt
import enum
import json
import uuid
import zoneinfo
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from sharded_orm.errors import ShardingError, ShardTypeError

__all__ = [
    "VERSION",
    "ValueCodecError",
    "decode_value",
    "dumps_key",
    "encode_value",
    "loads_key",
]

#: the version a saved key carries (``{"codec": VERSION, "key": [...]}``)
VERSION = 1

_TYPES = (
    "None, bool, int, float, Decimal, str, bytes, date, datetime, time, timedelta, "
    "uuid.UUID or an Enum member"
)


class ValueCodecError(ShardingError, ValueError):
    """Text that is not a value or key this codec wrote (edited, truncated, or from an
    unknown version)."""


def encode_value(v: Any) -> list[Any]:
    """``v`` as a JSON-ready ``[tag, ...]`` list; ShardTypeError for a type no key or
    cursor holds."""
    if v is None:
        return ["n", None]
    if isinstance(v, enum.Enum):  # before bool/int/str: IntEnum, StrEnum members
        return ["e", v.name]
    if isinstance(v, bool):
        return ["b", v]
    if isinstance(v, int):
        return ["i", str(v)]
    if isinstance(v, float):
        return ["f", repr(v)]
    if isinstance(v, str):
        return ["s", str(v)]
    if isinstance(v, dt.datetime):
        return _encode_timestamp(v)
    if isinstance(v, dt.date):
        return ["d", v.isoformat()]
    if isinstance(v, dt.time):
        return ["h", v.isoformat(), {"f": 1}] if v.fold else ["h", v.isoformat()]
    if isinstance(v, dt.timedelta):
        return ["r", [v.days, v.seconds, v.microseconds]]
    if isinstance(v, Decimal):
        return ["m", str(v)]
    if isinstance(v, uuid.UUID):
        return ["u", str(v)]
    if isinstance(v, bytes):
        return ["y", base64.b64encode(v).decode()]
    raise ShardTypeError(
        f"cannot encode a {type(v).__name__} into a cursor or resume position: "
        f"it holds {_TYPES}. Give the column one of those Python types (a TypeDecorator "
        "whose process_result_value returns one)"
    )


def _encode_timestamp(v: dt.datetime) -> list[Any]:
    nanosecond = getattr(v, "nanosecond", None)  # Spanner's DatetimeWithNanoseconds
    nanos = v.microsecond * 1000 if nanosecond is None else int(nanosecond)
    item: list[Any] = ["t", v.isoformat(), nanos]
    details: dict[str, Any] = {}
    if nanosecond is not None:
        details["ns"] = 1
    if isinstance(v.tzinfo, zoneinfo.ZoneInfo) and v.tzinfo.key:
        details["z"] = v.tzinfo.key
    if v.fold:
        details["f"] = 1
    if details:
        item.append(details)
    return item


def _text(raw: Any) -> str:
    if not isinstance(raw, str):
        raise TypeError(raw)
    return raw


def _decode_timestamp(raw: Any, nanos: Any, details: Any) -> dt.datetime:
    value = dt.datetime.fromisoformat(_text(raw))
    if isinstance(nanos, bool) or not isinstance(nanos, int) or not 0 <= nanos < 10**9:
        raise ValueError(nanos)
    if nanos // 1000 != value.microsecond:
        raise ValueError(nanos)
    if not isinstance(details, dict) or not set(details) <= {"ns", "z", "f"}:
        raise TypeError(details)
    zone = details.get("z")
    if zone is not None:
        if value.tzinfo is None:
            raise ValueError(details)
        value = value.astimezone(zoneinfo.ZoneInfo(_text(zone)))
    if details.get("f"):
        value = value.replace(fold=1)
    if nanos % 1000 or details.get("ns"):
        from google.api_core.datetime_helpers import DatetimeWithNanoseconds

        out: dt.datetime = DatetimeWithNanoseconds(  # type: ignore[no-untyped-call]
            value.year, value.month, value.day, value.hour, value.minute, value.second,
            nanosecond=nanos, tzinfo=value.tzinfo, fold=value.fold,
        )  # fmt: skip
        return out
    return value


def _decode_bool(raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise TypeError(raw)
    return raw


def _decode_interval(raw: Any) -> dt.timedelta:
    if not isinstance(raw, list) or len(raw) != 3 or not all(type(x) is int for x in raw):
        raise TypeError(raw)
    days, seconds, micros = raw
    return dt.timedelta(days=days, seconds=seconds, microseconds=micros)


def _decode_int(raw: Any) -> int:
    text = _text(raw)
    if text.strip() != text or "_" in text:  # str(int) writes neither
        raise ValueError(text)
    return int(text)


def _decode_none(raw: Any) -> None:
    if raw is not None:
        raise TypeError(raw)


_DECODERS: dict[str, Callable[[Any], Any]] = {
    "n": _decode_none,
    "b": _decode_bool,
    "i": _decode_int,
    "f": lambda r: float(_text(r)),
    "s": _text,
    "d": lambda r: dt.date.fromisoformat(_text(r)),
    "h": lambda r: dt.time.fromisoformat(_text(r)),
    "r": _decode_interval,
    "m": lambda r: Decimal(_text(r)),
    "u": lambda r: uuid.UUID(_text(r)),
    "y": lambda r: base64.b64decode(_text(r), validate=True),
}


def decode_value(item: Any, *, enum_name: Callable[[str], Any] = str) -> Any:
    """The value ``encode_value`` made ``item`` of (an Enum member's name given to
    ``enum_name``); ValueCodecError when ``item`` is not one it makes."""
    try:
        if not isinstance(item, list) or not 2 <= len(item) <= 4:
            raise TypeError(item)
        tag, raw = item[0], item[1]
        if tag == "t" and len(item) >= 3:
            return _decode_timestamp(raw, item[2], item[3] if len(item) == 4 else {})
        if tag == "h" and len(item) == 3 and item[2] == {"f": 1}:
            return dt.time.fromisoformat(_text(raw)).replace(fold=1)
        if len(item) != 2 or not isinstance(tag, str):
            raise TypeError(item)
        if tag == "e":
            return enum_name(_text(raw))
        return _DECODERS[tag](raw)
    except (ValueError, TypeError, KeyError, ArithmeticError, zoneinfo.ZoneInfoNotFoundError):
        raise ValueCodecError(f"not a value the cursor codec wrote: {item!r:.200}") from None


def dumps_key(values: Sequence[Any]) -> str:
    """A key (its values in order) as JSON text, to save and read back with
    :func:`loads_key`."""
    body = {"codec": VERSION, "key": [encode_value(v) for v in values]}
    return json.dumps(body, separators=(",", ":"), allow_nan=False)


def loads_key(text: str, *, enum_name: Callable[[str], Any] = str) -> list[Any]:
    """The key :func:`dumps_key` saved as ``text`` (or a copy cursor of the format
    before it); ValueCodecError when ``text`` is neither."""
    try:
        data = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        raise ValueCodecError(f"not a key the cursor codec wrote: {text!r:.200}") from None
    if isinstance(data, list):
        return _legacy_copy_key(data, text)
    if not isinstance(data, dict) or not isinstance(data.get("key"), list):
        raise ValueCodecError(f"not a key the cursor codec wrote: {text!r:.200}")
    if data.get("codec") != VERSION:
        raise ValueCodecError(
            f"this key was saved by codec version {data.get('codec')!r}; this sharded-orm "
            f"reads version {VERSION}. Upgrade sharded-orm, or delete the saved cursor to "
            "start the walk over (a copy is idempotent)"
        )
    return [decode_value(item, enum_name=enum_name) for item in data["key"]]


def _legacy_copy_key(data: list[Any], text: str) -> list[Any]:
    """A copy cursor as ``load.copy`` saved it before this codec: ``["ts", iso]``,
    ``["b", base64]`` or ``["v", a JSON scalar]`` per key part."""
    out: list[Any] = []
    try:
        for kind, v in data:
            if kind == "ts":
                out.append(dt.datetime.fromisoformat(_text(v)))
            elif kind == "b":
                out.append(base64.b64decode(_text(v), validate=True))
            elif kind == "v" and (v is None or isinstance(v, (bool, int, float, str))):
                out.append(v)
            else:
                raise TypeError(kind)
    except (ValueError, TypeError):
        raise ValueCodecError(f"not a key the cursor codec wrote: {text!r:.200}") from None
    return out
