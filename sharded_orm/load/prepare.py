"""Bulk loading, step 1: each row prepared and checked.

Pure functions (no I/O): every row is filled (defaults, ids, shard columns as the ORM
would), checked (types, lengths, INT64 range) and converted for the wire before anything
is written, so a bad row stops the load with its position and nothing written. Sorting
by key, duplicate keys, ranges and batches: :mod:`sharded_orm.load.staging`.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import types as sqltypes

from sharded_orm.errors import ShardConfigError, ShardingError
from sharded_orm.hashing import INT64_MAX, INT64_MIN
from sharded_orm.limits import value_bytes
from sharded_orm.schema.columns import (
    ATTR_COLUMNS_KEY,
    ShardComputed,
    attr_column,
    is_shard_column,
    shard_columns,
)
from sharded_orm.write.sql import MISSING, evaluate_default


class BulkValidationError(ShardingError, ValueError):
    """A row that cannot be loaded; ``position`` is its index in the input."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"row {position}: {message}")
        self.position = position


_PYTHON_TYPES: list[tuple[type[sqltypes.TypeEngine[Any]], tuple[type, ...]]] = [
    (sqltypes.Boolean, (bool,)),
    (sqltypes.Integer, (int,)),
    (sqltypes.Float, (float, int, Decimal)),
    (sqltypes.Numeric, (Decimal, int)),
    (sqltypes.DateTime, (dt.datetime,)),
    (sqltypes.Date, (dt.date,)),
    (sqltypes.Enum, (str, enum.Enum)),
    (sqltypes.String, (str,)),
    (sqltypes._Binary, (bytes,)),
    (sqltypes.Uuid, (uuid.UUID, str)),
]


def expected_types(col: sa.Column[Any]) -> tuple[type, ...] | None:
    t = col.type
    if isinstance(t, sqltypes.TypeDecorator):
        t = t.impl_instance
    for sa_type, py in _PYTHON_TYPES:
        if isinstance(t, sa_type):
            return py
    return None


def max_length(col: sa.Column[Any]) -> int | None:
    """The most characters (or bytes) ``col`` holds, or None for no limit."""
    t = col.type.impl_instance if isinstance(col.type, sqltypes.TypeDecorator) else col.type
    length = getattr(t, "length", None)
    return length if isinstance(length, int) else None


def check_value(
    col: sa.Column[Any], want: tuple[type, ...] | None, v: Any, length: int | None = MISSING
) -> str | None:
    """Why ``v`` cannot go into ``col``, or None. ``length`` is ``max_length(col)``, which
    a caller checking many rows computes once (looked up here when not given)."""
    if want is not None and (not isinstance(v, want) or (bool not in want and isinstance(v, bool))):
        return (
            f"column {col.key!r} takes {'/'.join(t.__name__ for t in want)}, "
            f"got {type(v).__name__} {v!r}"
        )
    if isinstance(v, int) and not isinstance(v, bool) and not INT64_MIN <= v <= INT64_MAX:
        return f"column {col.key!r}: {v} does not fit in an INT64 (-2**63 .. 2**63 - 1)"
    if isinstance(v, dt.datetime) and v.tzinfo is None:
        return f"column {col.key!r}: naive datetime {v!r}; give it a timezone (UTC)"
    if length is MISSING:
        length = max_length(col)
    if isinstance(v, (str, bytes)) and length is not None and len(v) > length:
        return f"column {col.key!r} holds at most {length} characters, got {len(v)}"
    if isinstance(v, str) and not v.isascii():
        try:
            v.encode()
        except UnicodeEncodeError as exc:
            return (
                f"column {col.key!r}: {v[exc.start]!r} at index {exc.start} is a lone "
                "surrogate, which has no UTF-8 form (Spanner stores UTF-8 text); decode "
                "the input properly or drop that character"
            )
    return None


@dataclass
class Prepared:
    columns: list[str]
    rows: list[tuple[Any, ...]]  # in input order, as they will be sent
    keys: list[tuple[Any, ...]]  # primary-key values as stored (for the range order)
    sizes: list[int]


def written_columns(table: sa.Table, on_spanner: bool) -> list[sa.Column[Any]]:
    """Columns the load sends: not the server's generated ones, except our server-side
    shards off Spanner, which the client fills there."""
    server_made = {sc.key for sc in shard_columns(table) if sc.server_side and on_spanner}
    return [
        c
        for c in table.columns
        if c.key not in server_made
        and (c.computed is None or (not on_spanner and isinstance(c.computed, ShardComputed)))
    ]


class RowProblem(ShardingError, ValueError):
    """Why one row cannot be written; the caller says which row (``bulk_load`` by its
    position, a pipeline in its dead letter)."""


def _same(a: Any, b: Any) -> bool:
    """Two values given for one column are one value (a NaN given twice included)."""
    if a is b:
        return True
    try:
        return bool(type(a) is type(b) and a == b)
    except Exception:  # a value whose == does not give a bool: not provably the same
        return False


class RowChecker:
    """One row filled as the ORM would fill it (Python defaults, library ids, every shard
    computed and a given one checked), each value checked against its column, then
    converted by ``processors`` when given. Shared by ``bulk_load`` and the Beam transforms,
    so a row one of them accepts the other accepts too."""

    def __init__(
        self, table: sa.Table, cols: list[sa.Column[Any]], processors: list[Any] | None = None
    ) -> None:
        self.table = table
        self.cols = cols
        self.attr_map: Mapping[str, Any] = {
            attr: col
            for attr in (table.__dict__.get("info") or {}).get(ATTR_COLUMNS_KEY, ())
            if (col := attr_column(table, attr)) is not None
        }
        written = {c.key for c in cols}
        self.shards = [sc for sc in shard_columns(table) if sc.key in written]
        self.expected = [expected_types(c) for c in cols]
        self.lengths = [max_length(c) for c in cols]
        # columns a missing value is filled for, and whether only the database can fill it
        self.defaulted = [
            (c, _database_fills(c))
            for c in cols
            if c.default is not None and not is_shard_column(c)
        ]
        self.processors = processors

    def keyed(self, items: Iterable[tuple[str, Any]]) -> dict[str, Any]:
        """The row by column key (ORM attribute names are accepted too)."""
        row: dict[str, Any] = {}
        named: dict[str, str] = {}  # column key -> the name the row gave it by
        for k, v in items:
            col = self.attr_map.get(k)
            key = col.key if col is not None else k
            if key not in self.table.c:
                raise RowProblem(f"{k!r} is not a column of {self.table.name!r}")
            if key in row and not _same(row[key], v):
                raise RowProblem(
                    f"{named[key]!r} and {k!r} both name column {key!r}, with different "
                    f"values ({row[key]!r:.60} and {v!r:.60}); give each column once"
                )
            row[key] = v
            named.setdefault(key, k)
        return row

    def values(self, row: dict[str, Any]) -> list[Any]:
        """The row's values in ``cols`` order, filled, checked and converted."""
        for c, database_fills in self.defaulted:
            if c.key not in row:
                if database_fills:
                    raise RowProblem(
                        f"column {c.key!r} has no value and its default is SQL or a sequence, "
                        "which only the database evaluates and a load cannot ask it for; give "
                        "the value in every row"
                    )
                try:
                    v = evaluate_default(c, row)
                except ShardingError as exc:
                    raise RowProblem(f"column {c.key!r}: {exc}") from None
                if v is not MISSING:
                    row[c.key] = v
        for sc in self.shards:
            try:
                shard = sc.compute([row.get(k) for k in sc.source_keys])
            except ShardingError as exc:
                raise RowProblem(f"shard column {sc.name!r}: {exc}") from None
            given = row.get(sc.key)
            if given is not None and given != shard:
                raise RowProblem(
                    f"{sc.name}={given!r} disagrees with its sources, which hash to {shard}"
                )
            row[sc.key] = shard
        values = []
        for i, (c, want, length) in enumerate(
            zip(self.cols, self.expected, self.lengths, strict=True)
        ):
            v = row.get(c.key)
            if v is None:
                if c.primary_key:
                    raise RowProblem(f"key column {c.key!r} is missing")
                if not c.nullable:
                    raise RowProblem(f"column {c.key!r} is NOT NULL but has no value")
            else:
                problem = check_value(c, want, v, length)
                if problem:
                    raise RowProblem(problem)
                proc = self.processors[i] if self.processors is not None else None
                if proc is not None:
                    try:
                        v = proc(v)
                    except Exception as exc:
                        raise RowProblem(f"column {c.key!r}: cannot convert {v!r}: {exc}") from None
            values.append(v)
        return values


def server_filled_keys(table: sa.Table) -> list[str]:
    """Key columns only the database can fill (IDENTITY, sequences, SQL defaults): a load
    through mutations cannot ask it for them."""
    return [c.key for c in table.primary_key.columns if _database_fills(c)]


def _database_fills(c: sa.Column[Any]) -> bool:
    return (
        c.identity is not None
        or c.server_default is not None
        or isinstance(c.default, sa.Sequence)
        or (c.default is not None and getattr(c.default, "is_clause_element", False))
    )


class RowPreparer:
    """One input row at a time: filled, checked and converted (``RowChecker``), with its
    primary-key values as stored (the order ranges are cut in) and its size in a commit.

    ``processors`` are the columns' bind processors (on Spanner: the mutation API runs
    none of SQLAlchemy's) and ``key_order`` maps a bound key value to its stored order;
    None elsewhere, where Core converts.
    """

    def __init__(
        self,
        table: sa.Table,
        cols: list[sa.Column[Any]],
        processors: list[Any] | None,
        key_order: Any,
    ) -> None:
        server_keys = server_filled_keys(table)
        if server_keys:
            raise ShardConfigError(
                f"bulk_load needs every key value up front, but {table.name}.{server_keys[0]} "
                "is filled by the server; give the rows their ids (e.g. from a SpannerSequence "
                "pool)"
            )
        self.table = table
        self.checker = RowChecker(table, cols, processors)
        self.names = [c.key for c in cols]
        self.pk_index = [self.names.index(c.key) for c in table.primary_key.columns]
        self.key_order = key_order

    def filled(self, raw: object, pos: int) -> dict[str, Any]:
        """The row by column key (defaults, ids and shards not filled yet)."""
        if not isinstance(raw, Mapping):
            raise BulkValidationError(f"rows are mappings of column to value, got {raw!r}", pos)
        try:
            return self.checker.keyed(raw.items())
        except RowProblem as exc:
            raise BulkValidationError(str(exc), pos) from None

    def prepare(
        self, filled: dict[str, Any], pos: int
    ) -> tuple[tuple[Any, ...], tuple[Any, ...], int]:
        """(values as sent, key as stored, bytes in a commit) of a row from ``filled``
        (which is completed in place: defaults, ids, shards)."""
        try:
            values = self.checker.values(filled)
        except RowProblem as exc:
            raise BulkValidationError(str(exc), pos) from None
        order = self.key_order
        key = tuple(order(values[i]) if order else values[i] for i in self.pk_index)
        return tuple(values), key, sum(value_bytes(v) for v in values)


def duplicate_key_error(key: tuple[Any, ...], pos: int, first: int) -> BulkValidationError:
    return BulkValidationError(
        f"its primary key {key!r} is also the key of row {first}; one load writes each key "
        "once (drop or merge the duplicates)",
        pos,
    )


def prepare_rows(
    table: sa.Table,
    rows: Iterable[Mapping[str, Any]],
    cols: list[sa.Column[Any]],
    processors: list[Any] | None,
    key_order: Any,
) -> Prepared:
    """Every row prepared and checked, in memory (for a few rows: ``bulk_load`` streams
    them through :mod:`sharded_orm.load.staging` instead)."""
    preparer = RowPreparer(table, cols, processors, key_order)
    out, keys, sizes = [], [], []
    seen: dict[tuple[Any, ...], int] = {}
    for pos, raw in enumerate(rows):
        values, key, size = preparer.prepare(preparer.filled(raw, pos), pos)
        first = seen.setdefault(key, pos)
        if first != pos:
            raise duplicate_key_error(key, pos, first)
        out.append(values)
        keys.append(key)
        sizes.append(size)
    return Prepared(preparer.names, out, keys, sizes)
