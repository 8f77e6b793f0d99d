"""The shard hash: one canonical text per value, one function from texts to a shard.

The same shard must come out of this module, out of a generated column on
Spanner, and out of a Go or Java service reading ``docs/hashing.md``. So the
encoding is defined on *text*, every rule has a GoogleSQL twin (see
``sharded_orm.spanner.expressions``), and nothing here depends on Python's
``hash()`` or on the host.

Canonical string of the sources ``v1, ..., vk``::

    <byte length of t1 in UTF-8> ":" t1 ... <byte length of tk> ":" tk

where ``ti`` is the canonical text of ``vi``. The length prefix makes the join
unambiguous: ``("ab", "c")`` is ``2:ab1:c`` and ``("a", "bc")`` is ``1:a2:bc``.
"""

from __future__ import annotations

import base64
import datetime as _dt
import uuid
import zlib
from collections.abc import Callable, Sequence
from decimal import Context, Decimal
from typing import Any, Final

from sharded_orm.errors import ShardConfigError, ShardTypeError, ShardValueError

CRC32: Final = "crc32"
FARM_FINGERPRINT: Final = "farm_fingerprint"
#: For adopting rows sharded by hand as the seed article does,
#: ``zlib.crc32(company_id + timestamp.isoformat()) % N`` with ``datetime.utcnow()``: the
#: sources' plain texts joined with no separator (see :func:`concat_text`).
CRC32_CONCAT: Final = "crc32_concat"
ALGORITHMS: Final = (CRC32, FARM_FINGERPRINT, CRC32_CONCAT)

#: Largest shard count accepted: keeps ``BETWEEN 0 AND N-1`` fan-outs sane and
#: every shard id far inside INT64.
MAX_SHARD_COUNT: Final = 1 << 16

_UTC = _dt.timezone.utc
_datetime_isoformat = _dt.datetime.isoformat
_date_isoformat = _dt.date.isoformat


def _text_str(value: str) -> str:
    return value


def _text_str_subclass(value: str) -> str:
    return str.__str__(value)  # a (str, Enum) member hashes as its value, as stored


def _text_bool(value: bool) -> str:
    return "true" if value else "false"


#: The range of Spanner's INT64, the one integer type a column holds.
INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1


def show(value: object) -> str:
    """``repr(value)`` for an error message, bounded: an int too long to print (Python
    refuses more than 4,300 digits) or any very long text is described, not printed."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > 256:
            return f"an int of about {int(value.bit_length() * 0.30103) + 1:,} digits"
        return int.__repr__(value)
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails is still named
        return f"a {type(value).__name__}"
    return text if len(text) <= 200 else f"{text[:120]}... ({len(text):,} characters)"


def _int64(value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise ShardValueError(
            f"cannot hash {show(value)}: it is out of the INT64 range a Spanner column holds"
        )
    return value


def _text_int(value: int) -> str:
    return str(_int64(value))


def _text_int_subclass(value: int) -> str:
    return int.__repr__(_int64(int.__index__(value)))  # an (int, Enum) member: its number


def _text_bytes(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _text_uuid(value: uuid.UUID) -> str:
    return str(value)


#: Longest fixed-notation text of a Decimal hashed (digits on both sides of the point):
#: far beyond any database's NUMERIC, short of a text that would take memory and time.
MAX_DECIMAL_DIGITS: Final = 4300


def _text_decimal(value: Decimal) -> str:
    if not value.is_finite():
        raise ShardValueError(
            f"cannot hash the non-finite Decimal {show(value)}: Spanner NUMERIC has none"
        )
    if value.is_zero():
        return "0"
    digits, exponent = len(value.as_tuple().digits), int(value.as_tuple().exponent)
    if max(digits + exponent, -exponent, digits) > MAX_DECIMAL_DIGITS:
        raise ShardValueError(
            f"cannot hash the Decimal {show(value)}: written out it has more than "
            f"{MAX_DECIMAL_DIGITS:,} digits, far beyond any NUMERIC column"
        )
    # Fixed notation, no exponent, no trailing zeros: what CAST(NUMERIC AS STRING) prints.
    # normalize() in a context holding every digit: the default 28 digits would round a
    # NUMERIC(38, 9) value
    wide = Context(prec=max(len(value.as_tuple().digits), 1))
    return format(value.normalize(wide), "f")


def _text_date(value: _dt.date) -> str:
    return _date_isoformat(value)


_TIMESTAMP_TEXT = "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ"
# Zero-padded field texts: an f-string of table lookups builds a timestamp's text in half
# the time ``%02d`` conversions take, and this runs once per row on every insert.
TWO_DIGITS: Final = tuple(f"{i:02d}" for i in range(100))
THREE_DIGITS: Final = tuple(f"{i:03d}" for i in range(1000))


def _offset(value: _dt.datetime) -> _dt.timedelta | None:
    """``value.utcoffset()``; a tzinfo that gives no valid offset is a ShardValueError."""
    try:
        return value.utcoffset()
    except (ValueError, TypeError, OverflowError) as exc:
        raise ShardValueError(
            f"cannot hash {show(value)}: its tzinfo gives no valid UTC offset ({exc})"
        ) from None


def _as_utc(value: _dt.datetime) -> _dt.datetime:
    """The UTC instant of an aware datetime; out of years 1-9999 is a ShardValueError."""
    try:
        return value.astimezone(_UTC)
    except (OverflowError, ValueError):
        raise ShardValueError(
            f"cannot hash {show(value)}: its UTC instant is out of range (years 1-9999)"
        ) from None


def _text_datetime(value: _dt.datetime) -> str:
    if value.tzinfo is not _UTC:
        offset = _offset(value)
        if offset is None:
            raise ShardValueError(
                f"cannot hash the naive datetime {value!r}: a shard needs an absolute instant. "
                "Give it a timezone (e.g. datetime.now(timezone.utc)), or declare the column "
                "as sharded_orm.UTCDateTime so values read back from SQLite are aware too."
            )
        if offset:
            value = _as_utc(value)
    # DatetimeWithNanoseconds keeps nanoseconds aside and its microsecond field is already
    # truncated, exactly like %E6S on the server. (The hot paths build the same text from
    # lookup tables: ``piece_function`` and ``sharded_orm.write.fastpath``.)
    return _TIMESTAMP_TEXT % (
        value.year,
        value.month,
        value.day,
        value.hour,
        value.minute,
        value.second,
        value.microsecond,
    )


_ENCODERS: dict[type, Callable[[Any], str]] = {
    str: _text_str,
    bool: _text_bool,
    int: _text_int,
    bytes: _text_bytes,
    uuid.UUID: _text_uuid,
    Decimal: _text_decimal,
    _dt.date: _text_date,
    _dt.datetime: _text_datetime,
}

# Checked in this order for subclasses (bool before int, datetime before date).
_BASES: tuple[tuple[type, Callable[[Any], str]], ...] = (
    (bool, _text_bool),
    (str, _text_str_subclass),
    (int, _text_int_subclass),
    (bytes, _text_bytes),
    (bytearray, lambda v: _text_bytes(bytes(v))),
    (memoryview, lambda v: _text_bytes(bytes(v))),
    (uuid.UUID, _text_uuid),
    (Decimal, _text_decimal),
    (_dt.datetime, _text_datetime),
    (_dt.date, _text_date),
)


def _encoder_for(tp: type) -> Callable[[Any], str]:
    if tp is type(None):
        raise ShardValueError(
            "cannot hash None: every shard source must have a value (make the column NOT NULL)"
        )
    for base, enc in _BASES:
        if issubclass(tp, base):
            _ENCODERS[tp] = enc  # remember the subclass (e.g. DatetimeWithNanoseconds)
            return enc
    raise ShardTypeError(
        f"cannot hash a value of type {tp.__name__}: shard sources must be str, bytes, int, "
        "bool, uuid.UUID, Decimal, date or timezone-aware datetime "
        "(floats are refused: equal-looking floats can hash differently)"
    )


def canonical_text(value: object) -> str:
    """The canonical text of one source value (see ``docs/hashing.md``)."""
    enc = _ENCODERS.get(type(value))
    if enc is None:
        enc = _encoder_for(type(value))
    return enc(value)


def _noutf8(text: str) -> ShardValueError:
    return ShardValueError(
        f"cannot hash {show(text)}: it holds a lone surrogate, which has no UTF-8 form "
        "(no database column stores it)"
    )


def utf8_len(text: str) -> int:
    """The UTF-8 byte length of ``text``; a lone surrogate is a ShardValueError."""
    try:
        return len(text.encode())
    except UnicodeEncodeError:
        raise _noutf8(text) from None


def utf8(text: str) -> bytes:
    """``text`` in UTF-8; a lone surrogate is a ShardValueError."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise _noutf8(text) from None


def canonical_string(values: Sequence[object]) -> str:
    """The length-prefixed join of the canonical texts of ``values``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise ShardTypeError(
            f"canonical_string takes a sequence (list or tuple) of source values, got "
            f"{type(values).__name__}; write canonical_string([value])"
        )
    out = ""
    get = _ENCODERS.get
    for value in values:
        enc = get(type(value))
        if enc is None:
            enc = _encoder_for(type(value))
        text = enc(value)
        # len(str) counts code points; the prefix counts UTF-8 bytes.
        out += f"{len(text) if text.isascii() else utf8_len(text)}:{text}"
    return out


def _crc32(data: str) -> int:
    return zlib.crc32(data.encode("utf-8"))


def _farm_fingerprint(data: str) -> int:
    import farmhash  # from the ``cityhash`` distribution; C extension, imported on first use

    fp: int = farmhash.Fingerprint64(data)
    return fp - (1 << 64) if fp >= (1 << 63) else fp  # as Spanner's signed INT64


_HASHES: dict[str, Callable[[str], int]] = {CRC32: _crc32, FARM_FINGERPRINT: _farm_fingerprint}


def concat_text(value: object) -> str:
    """One source's text in the ``crc32_concat`` form: a ``str`` as it is, an ``int`` in
    decimal, a ``date`` as ``isoformat()``, a timezone-aware ``datetime`` as the
    ``isoformat()`` of its UTC instant without offset (what ``datetime.utcnow()
    .isoformat()`` printed when the row was written: no fraction when the microseconds
    are 0; nanoseconds dropped)."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(_int64(int.__index__(value)))
    if isinstance(value, _dt.datetime):
        if _offset(value) is None:
            raise ShardValueError(
                f"cannot hash naive datetime {show(value)}: attach a timezone, e.g. timezone.utc"
            )
        utc = _as_utc(value)
        return _datetime_isoformat(
            _dt.datetime(
                utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second, utc.microsecond
            )
        )
    if isinstance(value, _dt.date):
        return _date_isoformat(value)
    raise ShardTypeError(
        f"the crc32_concat form takes str, int, date or aware datetime sources, got "
        f"{show(value)} ({type(value).__name__})"
    )


def _crc32_concat(values: Sequence[object], count: int) -> int:
    return zlib.crc32(utf8("".join([concat_text(v) for v in values]))) % count


def hash_string(data: str, algorithm: str = CRC32) -> int:
    """The raw hash of a canonical string: unsigned CRC-32, or signed FARM_FINGERPRINT."""
    try:
        fn = _HASHES[algorithm]
    except (KeyError, TypeError):
        raise ShardConfigError(
            f"unknown shard algorithm {algorithm!r}: use one of {', '.join(ALGORITHMS)}"
        ) from None
    return fn(data)


def validate_count(count: object) -> int:
    """Return ``count`` if it is a usable shard count, else raise ``ShardConfigError``."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise ShardConfigError(
            f"shard count must be an int between 1 and {MAX_SHARD_COUNT}, got {count!r} "
            f"({type(count).__name__})"
        )
    if not 1 <= count <= MAX_SHARD_COUNT:
        raise ShardConfigError(f"shard count must be between 1 and {MAX_SHARD_COUNT}, got {count}")
    return count


def validate_algorithm(algorithm: object) -> str:
    if algorithm not in ALGORITHMS:
        raise ShardConfigError(
            f"unknown shard algorithm {algorithm!r}: use one of {', '.join(ALGORITHMS)}"
        )
    return str(algorithm)


def _as_sources(values: object) -> Sequence[object]:
    if isinstance(values, (list, tuple)):
        if not values:
            raise ShardValueError("compute_shard got no source values: a shard needs at least one")
        return values
    return (values,)


def compute_shard(values: object, count: int, algorithm: str = CRC32) -> int:
    """The shard in ``[0, count)`` for one source value or a sequence of them.

    ``crc32`` is zlib's CRC-32 of the UTF-8 canonical string; ``farm_fingerprint``
    is Spanner's ``FARM_FINGERPRINT`` of it. Both are reduced with a modulo that
    never goes negative (Spanner's ``MOD`` keeps the dividend's sign; Python's does not).

    A list or tuple is taken as several sources in order; any other value is one source.
    """
    validate_count(count)
    if validate_algorithm(algorithm) == CRC32_CONCAT:
        return _crc32_concat(_as_sources(values), count)
    return hash_string(canonical_string(_as_sources(values)), algorithm) % count


def shard_function(count: int, algorithm: str = CRC32) -> Callable[[Sequence[object]], int]:
    """A validated, pre-bound ``compute_shard`` for the hot path (one call per row)."""
    validate_count(count)
    if validate_algorithm(algorithm) == CRC32_CONCAT:
        return lambda values: _crc32_concat(values, count)
    if algorithm == CRC32:
        crc32 = zlib.crc32

        def shard(values: Sequence[object]) -> int:
            return crc32(canonical_string(values).encode()) % count

        return shard
    fn = _HASHES[algorithm]

    def shard_fp(values: Sequence[object]) -> int:
        return fn(canonical_string(values)) % count

    return shard_fp


def hash_function(algorithm: str) -> Callable[[str], int]:
    """The raw hash of ``crc32`` or ``farm_fingerprint`` (see :func:`hash_string`)."""
    if algorithm == CRC32:
        return _crc32
    return _HASHES[validate_algorithm(algorithm)]
