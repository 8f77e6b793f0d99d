"""The shard function's hot path: one source's piece of the canonical string, inline.

``piece_function`` builds, once per source column, ``value -> canonical piece`` with the
common exact types (a plain ``str``, an ``int``, a datetime in ``timezone.utc``) encoded
inline, because it runs once per source per row on every insert; every other value takes
the general encoding of ``sharded_orm.hashing``, which defines the result.
"""

from __future__ import annotations

import datetime as _dt
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Final

from sharded_orm.hashing import (
    CRC32,
    CRC32_CONCAT,
    INT64_MAX,
    INT64_MIN,
    THREE_DIGITS,
    TWO_DIGITS,
    canonical_text,
    hash_function,
    utf8,
    utf8_len,
    validate_algorithm,
    validate_count,
)

_UTC = _dt.timezone.utc

#: Fast paths of :func:`piece_function`, by the Python type a column stores.
PIECE_STR: Final = "str"
PIECE_INT: Final = "int"
PIECE_UTC_DATETIME: Final = "utc_datetime"


def canonical_piece(value: object) -> str:
    """``<UTF-8 byte length>:<canonical text>`` of one value: one source's part of the string."""
    text = canonical_text(value)
    return f"{len(text) if text.isascii() else utf8_len(text)}:{text}"


def piece_function(kind: str | None, coerce: Callable[[Any], Any]) -> Callable[[Any], str]:
    """``value -> canonical_piece(coerce(value))``, with the common exact types (``kind``:
    a plain ``str``, an ``int``, a datetime in ``timezone.utc``) encoded inline, because this
    runs once per source per row on every insert."""

    def slow(v: Any) -> str:
        return canonical_piece(coerce(v))

    if kind == PIECE_STR:

        def piece_str(v: Any) -> str:
            if v.__class__ is str:
                return f"{len(v) if v.isascii() else utf8_len(v)}:{v}"
            return slow(v)

        return piece_str
    if kind == PIECE_INT:
        lo, hi = INT64_MIN, INT64_MAX

        def piece_int(v: Any) -> str:
            if v.__class__ is int and lo <= v <= hi:
                t = str(v)
                return f"{len(t)}:{t}"
            return slow(v)

        return piece_int
    if kind == PIECE_UTC_DATETIME:
        dt_class = _dt.datetime

        d2, d3 = TWO_DIGITS, THREE_DIGITS

        def piece_dt(v: Any) -> str:
            if v.__class__ is dt_class and v.tzinfo is _UTC and v.year >= 1000:
                us = v.microsecond
                return (
                    f"27:{v.year}-{d2[v.month]}-{d2[v.day]}T{d2[v.hour]}:{d2[v.minute]}"
                    f":{d2[v.second]}.{d3[us // 1000]}{d3[us % 1000]}Z"
                )
            return slow(v)

        return piece_dt
    return slow


def shard_function_of_pieces(
    pieces: Sequence[Callable[[Any], str]], count: int, algorithm: str = CRC32
) -> Callable[[Sequence[object]], int]:
    """A shard function over source values, each turned into its piece by ``pieces[i]``
    (for ``crc32_concat``: its :func:`concat_text`)."""
    validate_count(count)
    algorithm = validate_algorithm(algorithm)
    if algorithm == CRC32_CONCAT:

        def concat(values: Sequence[object]) -> int:
            text = "".join([p(v) for p, v in zip(pieces, values, strict=True)])
            return zlib.crc32(utf8(text)) % count

        return concat
    if algorithm == CRC32:
        crc32 = zlib.crc32
        if len(pieces) == 1:
            (p0,) = pieces

            def one(values: Sequence[object]) -> int:
                return crc32(p0(values[0]).encode()) % count

            return one
        if len(pieces) == 2:
            p0, p1 = pieces

            def two(values: Sequence[object]) -> int:
                return crc32((p0(values[0]) + p1(values[1])).encode()) % count

            return two

        def many(values: Sequence[object]) -> int:
            return (
                crc32("".join([p(v) for p, v in zip(pieces, values, strict=True)]).encode()) % count
            )

        return many
    fn = hash_function(algorithm)

    def fp(values: Sequence[object]) -> int:
        return fn("".join([p(v) for p, v in zip(pieces, values, strict=True)])) % count

    return fp
