"""Split keys as Spanner's split statistics print them, decoded with the models' metadata.

Format (Spanner, "Split statistics", *Split start and split limit keys*): ``<begin>`` and
``<end>`` bound the database's key space; any other key is ``Name(part, part, ...)``
where ``Name`` is a table or an index (``schema.Name`` in a named schema) and the parts
are its key in order. A key may be
truncated (``Users()`` precedes every ``Users`` row; ``Threads(10)`` every thread of user
10). An interleaved child is named by itself with its full key (``Messages(3,"a",1)``).
The documentation shows INT64 parts bare and STRING parts in double quotes; it shows no
other type, so other parts are accepted quoted or bare (``2024-01-01T00:00:00Z``).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Column, Index, MetaData, Table
from sqlalchemy import types as sqltypes

from sharded_orm.errors import ShardValueError
from sharded_orm.ids.mixins import bit_reverse
from sharded_orm.schema.coerce import base_type
from sharded_orm.schema.columns import is_shard_column
from sharded_orm.schema.keys import is_descending
from sharded_orm.tools.lint import index_parts
from sharded_orm.tools.simulate import guess_role

BEGIN, END = "<begin>", "<end>"
#: a key space's name: ``Table``, or ``schema.Table`` for a table of a named schema
_NAME = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_$]*(?:\.[A-Za-z_][A-Za-z0-9_$]*)?)\s*\(")
_BARE = re.compile(r"\s*([^,()\"\s][^,()\"]*?)\s*(?=[,)])")
_STRING = re.compile(r'\s*(b?)("(?:[^"\\]|\\.)*")\s*')


@dataclass(frozen=True)
class RawKey:
    """A parsed split key: the key space's name and the printed parts, not yet typed."""

    name: str  # a table or index name, or "<begin>" / "<end>"
    parts: tuple[Any, ...] = ()  # str for quoted parts, else the bare text

    @property
    def boundary(self) -> bool:
        return self.name in (BEGIN, END)


def parse_key(text: str) -> RawKey:
    """``Users(7,"abc")`` -> RawKey("Users", (Bare("7"), "abc")); raise on malformed text."""
    if not isinstance(text, str):
        raise ShardValueError(f"a split key is a string, got {text!r}")
    stripped = text.strip()
    if stripped in (BEGIN, END):
        return RawKey(stripped)
    m = _NAME.match(stripped)
    if not m:
        raise ShardValueError(
            f"malformed split key {text!r}: expected <begin>, <end> or Name(part, ...)"
        )
    pos = m.end()
    parts: list[Any] = []
    if stripped[pos:].lstrip().startswith(")"):
        pos = stripped.index(")", pos) + 1
    else:
        while True:
            sm = _STRING.match(stripped, pos)
            if sm:
                try:
                    value: Any = json.loads(sm.group(2))
                except ValueError:
                    raise ShardValueError(
                        f"malformed split key {text!r}: bad string at {pos}"
                    ) from None
                parts.append(value.encode("latin-1") if sm.group(1) else value)
                pos = sm.end()
            else:
                bm = _BARE.match(stripped, pos)
                if not bm:
                    raise ShardValueError(
                        f"malformed split key {text!r}: expected a value at position {pos}"
                    )
                parts.append(Bare(bm.group(1)))
                pos = bm.end()
            if pos < len(stripped) and stripped[pos] == ",":
                pos += 1
                continue
            if pos < len(stripped) and stripped[pos] == ")":
                pos += 1
                break
            raise ShardValueError(
                f"malformed split key {text!r}: expected ',' or ')' at position {pos}"
            )
    if stripped[pos:].strip():
        raise ShardValueError(f"malformed split key {text!r}: text after the key")
    return RawKey(m.group(1), tuple(parts))


@dataclass(frozen=True)
class Bare:
    """A key part printed without quotes (a number, a timestamp...)."""

    text: str


@dataclass(frozen=True)
class KeyPart:
    """One decoded key part and what it is to the library."""

    column: str
    value: Any
    #: shard, tenant, time, counter, bit_reversed, uuid4, uuid7, uuid1, ulid, time_prefix,
    #: user, random, constant (a UUID, ULID or time-led text: from the value itself)
    role: str
    descending: bool = False
    #: for a bit-reversed INT64: the sequence number it came from
    sequence: int | None = None


@dataclass(frozen=True)
class Key:
    """A split key decoded: which table or index, and its key parts."""

    text: str
    name: str
    kind: str  # "table", "index", "boundary" or "unknown"
    table: str | None = None
    parts: tuple[KeyPart, ...] = ()
    full_length: int = 0
    interleaved_in: str | None = None

    def part(self, role: str) -> KeyPart | None:
        return next((p for p in self.parts if p.role == role), None)


class Catalog:
    """The models' tables and indexes by the names Spanner gives them."""

    def __init__(
        self, metadata: MetaData, attributes: dict[tuple[str, str], str] | None = None
    ) -> None:
        #: (table, column) -> ORM attribute name, where the models are mapped classes
        self.attributes = dict(attributes or {})
        self.tables: dict[str, Table] = {}
        self.indexes: dict[str, Index] = {}
        for t in metadata.tables.values():
            # Spanner names a named schema's tables and indexes ``schema.Name``; a bare
            # name is the default schema's, never another schema's table of that name
            prefix = f"{t.schema}." if t.schema else ""
            self.tables[prefix + t.name] = t
            for ix in t.indexes:
                if ix.name:
                    self.indexes[prefix + str(ix.name)] = ix

    def columns_of(self, name: str) -> tuple[str, list[tuple[Column[Any], bool]], Table] | None:
        """(kind, key columns in order with their DESC flag, table) of a key space."""
        if name in self.tables:
            t = self.tables[name]
            return "table", [(c, is_descending(c)) for c in t.primary_key.columns], t
        if name in self.indexes:
            ix = self.indexes[name]
            table = ix.table
            assert isinstance(table, Table)
            parts = index_parts(ix)
            seen = {c for c, _ in parts}
            # an index's key ends with the table's key (Spanner indexes carry it)
            rest = [(c, is_descending(c)) for c in table.primary_key.columns if c not in seen]
            return "index", parts + rest, table
        return None

    def decode(self, text: str) -> Key:
        raw = parse_key(text)
        if raw.boundary:
            return Key(text, raw.name, "boundary")
        found = self.columns_of(raw.name)
        if found is None:
            return Key(
                text,
                raw.name,
                "unknown",
                parts=tuple(KeyPart("?", p, "unknown") for p in raw.parts),
            )
        kind, cols, table = found
        if len(raw.parts) > len(cols):
            raise ShardValueError(
                f"malformed split key {text!r}: {raw.name} has {len(cols)} key parts in the "
                f"models, the key has {len(raw.parts)}"
            )
        parts = tuple(
            _decode_part(text, col, desc, value)
            for (col, desc), value in zip(cols, raw.parts, strict=False)
        )
        opts: Any = table.dialect_options.get("spanner", {})
        return Key(
            text,
            raw.name,
            kind,
            table.name,
            parts,
            len(cols),
            interleaved_in=opts.get("interleave_in") or None,
        )


def role_of(col: Column[Any]) -> str:
    """The part a column plays in a key: a shard column, else the simulator's guess."""
    return "shard" if is_shard_column(col) else guess_role(col)


_FRACTION = re.compile(r"(\.\d{6})\d+")


def parse_timestamp(text: str) -> dt.datetime:
    """An RFC 3339 timestamp (Spanner prints up to nanoseconds; Python keeps microseconds)."""
    v = dt.datetime.fromisoformat(_FRACTION.sub(r"\1", text.strip()).replace("Z", "+00:00"))
    return v if v.tzinfo else v.replace(tzinfo=dt.timezone.utc)


def _decode_part(text: str, col: Column[Any], desc: bool, value: Any) -> KeyPart:
    t = base_type(col.type)
    raw = value.text if isinstance(value, Bare) else value
    role = role_of(col)
    if isinstance(value, Bare) and raw.upper() == "NULL":
        return KeyPart(col.name, None, role, desc)
    sequence = None
    try:
        if isinstance(t, sqltypes.Integer):
            v: Any = int(raw)
            if role == "bit_reversed" and 0 <= v < 2**63:
                sequence = bit_reverse(v)
        elif isinstance(t, sqltypes.DateTime):
            v = parse_timestamp(str(raw))
        elif isinstance(t, sqltypes.Date):
            v = dt.date.fromisoformat(str(raw))
        elif isinstance(t, (sqltypes.Float, sqltypes.Numeric)):
            v = float(raw)
        elif isinstance(t, sqltypes.Boolean):
            if str(raw).lower() not in ("true", "false"):
                raise ValueError(raw)
            v = str(raw).lower() == "true"
        elif isinstance(t, sqltypes.Uuid):
            v = uuid.UUID(str(raw))
        else:
            v = raw if isinstance(raw, (str, bytes)) else str(raw)
    except (TypeError, ValueError):
        raise ShardValueError(
            f"malformed split key {text!r}: {raw!r} is not a {type(t).__name__} value for "
            f"column {col.name}"
        ) from None
    if role in VALUE_ROLES:
        seen = value_role(v)
        if seen is not None and (role != "user" or seen in TIME_ORDERED):
            role = seen
    return KeyPart(col.name, v, role, desc, sequence)


#: the roles a column's declaration guesses that the values it holds may correct (a UUID or
#: string key filled by an application helper whose name says nothing)
VALUE_ROLES = ("uuid1", "uuid4", "uuid7", "user", "random")
#: roles of values that grow with time (each names how doctor saw it)
TIME_ORDERED = ("uuid7", "ulid", "time_prefix")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ULID = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}", re.IGNORECASE)
_DATE_PREFIX = re.compile(
    r"(\d{4})-?(\d{2})-?(\d{2})(?:[T _-]?(\d{2}):?(\d{2})(?::?(\d{2}))?)?(?![0-9])"
)
_EPOCH_PREFIX = re.compile(r"(\d{10}|\d{13}|\d{16}|\d{19})(?![0-9])")
#: the years a time-ordered id may encode (a random value rarely decodes into them)
_YEARS = (2000, 2100)


def _plausible(seconds: float) -> bool:
    low = dt.datetime(_YEARS[0], 1, 1, tzinfo=dt.timezone.utc).timestamp()
    high = dt.datetime(_YEARS[1], 1, 1, tzinfo=dt.timezone.utc).timestamp()
    return low <= seconds < high


#: minutes a version-1 UUID's leading field (``time_low``: the low 32 bits of its count of
#: 100-ns ticks) takes to wrap: 2**32 ticks
UUID1_WRAP_MINUTES = 2**32 * 100e-9 / 60
#: what a key led by version-1 UUIDs does with its inserts (said by doctor and advise)
UUID1_KEYS = (
    "a version-1 UUID's text starts with time_low, the low 32 bits of its 100-ns clock, "
    f"which wraps about every {UUID1_WRAP_MINUTES:.2f} minutes: the rows written together "
    "land together, at a point that walks across the key space and wraps, so the hotspot "
    "moves rather than sitting at the end"
)


def _uuid_role(u: uuid.UUID) -> str | None:
    if u.variant != uuid.RFC_4122:
        return None
    if u.version in (6, 7):
        return "uuid7"  # time-ordered: v7's Unix ms, v6's 60-bit clock, most significant first
    if u.version == 1:
        return "uuid1"  # the clock's low 32 bits first: a moving point, not a growing end
    return "uuid4" if u.version == 4 else None


def value_role(value: Any) -> str | None:
    """What a key part's value shows by its shape, or None: ``uuid7`` (a UUID whose version
    nibble is 6 or 7: time-ordered, its clock's high bits first), ``uuid1`` (version 1: its
    clock's low 32 bits first, so its inserts sweep the key space and wrap, see
    ``UUID1_KEYS``: neither growing nor spread), ``uuid4`` (version 4: random), ``ulid`` (26
    Crockford base-32 characters led by a 48-bit millisecond time in 2000-2100),
    ``time_prefix`` (text led by a date, a date-time or Unix seconds, ms, us or ns in
    2000-2100). A value decides nothing alone: doctor takes a column's role from most of
    the values the hot splits show."""
    if isinstance(value, uuid.UUID):
        return _uuid_role(value)
    if isinstance(value, bytes):
        return _uuid_role(uuid.UUID(bytes=value)) if len(value) == 16 else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    if len(text) in (32, 36, 38, 45):  # hex, dashed, {braced}, urn:uuid:
        try:
            return _uuid_role(uuid.UUID(text))
        except ValueError:
            pass
    if len(text) == 26 and _ULID.fullmatch(text):
        ms = 0
        for ch in text[:10].upper():
            ms = ms * 32 + _CROCKFORD.index(ch)
        if _plausible(ms / 1000):
            return "ulid"
    m = _DATE_PREFIX.match(text)
    if m:
        y, mo, d, hh, mm, ss = (int(g) if g else 0 for g in m.groups())
        try:
            when = dt.datetime(y, mo, d, hh, mm, ss, tzinfo=dt.timezone.utc)
        except ValueError:
            when = None
        if when is not None and _plausible(when.timestamp()):
            return "time_prefix"
    m = _EPOCH_PREFIX.match(text)
    if m:
        digits = m.group(1)
        if _plausible(int(digits) / 10 ** (len(digits) - 10)):
            return "time_prefix"
    return None
