"""Shard markers: the table records how each shard column is computed.

A client-side shard column is a plain INT64: nothing in the database says it holds
``crc32(CompanyId, Timestamp) mod 8``. Its *marker* is a CHECK constraint that does::

    CONSTRAINT ck_LogEntries_EntryShardId_shard8_1f2e3d4c
        CHECK (`EntryShardId` >= 0 AND `EntryShardId` < 8)

The clause keeps values in range (as CockroachDB's hash-sharded indexes do); the name
carries the count and a digest of (algorithm, count, source column names), so a changed
spec is told from an unchanged one by reading INFORMATION_SCHEMA (``alembic_ext``).

A sharded table declares its markers itself (:class:`ShardMarker`, added once its shard
columns resolve), so ``create_all`` creates them with the table, as a migration does: a
schema made either way is the same schema, and autogenerate over it finds nothing. A
server-side shard column has none (its generated expression is its record).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import CheckConstraint, Table, and_, literal

if TYPE_CHECKING:
    from sharded_orm.schema.columns import ShardColumn

#: Spanner's limit on a constraint name
MAX_NAME = 128


def spec_digest(algorithm: str, count: int, sources: tuple[str, ...]) -> str:
    """Eight hex digits of (algorithm, count, source column names)."""
    text = f"{algorithm}|{count}|{','.join(sources)}"
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def marker_prefix(table: str, column: str) -> str:
    """The part of a marker's name before its count and digest."""
    prefix = f"ck_{table}_{column}_shard"
    if len(prefix) + 20 > MAX_NAME:  # keep within Spanner's 128 characters
        prefix = "ck_" + hashlib.sha1(f"{table}.{column}".encode()).hexdigest()[:16] + "_shard"
    return prefix


def marker_name(table: str, sc: ShardColumn) -> str:
    """The marker name of shard column ``sc`` of table ``table``."""
    digest = spec_digest(sc.algorithm, sc.count, tuple(c.name for c in sc.sources))
    return f"{marker_prefix(table, sc.name)}{sc.count}_{digest}"


class ShardMarker(CheckConstraint):
    """A shard column's marker in its table (see the module docstring); a copy of its
    table (``Table.to_metadata``) gets a copy on its own column."""

    def __init__(self, name: str, column: Any, count: int) -> None:
        clause = and_(column >= literal(0), column < literal(count))
        super().__init__(clause, name=name, _autoattach=False)
        self.shard_column_name = str(column.name)
        self.count = count

    def _copy(self, **kw: Any) -> ShardMarker:
        target = kw.get("target_table")
        column = None
        if isinstance(target, Table):
            column = next((c for c in target.c if c.name == self.shard_column_name), None)
        if column is None:  # no table to put it on: a copy of the same clause
            return ShardMarker(str(self.name), self._clause_column(), self.count)
        return ShardMarker(str(self.name), column, self.count)

    def _clause_column(self) -> Any:
        return next(iter(self.columns))


def add_markers(table: Table, cols: Iterable[ShardColumn]) -> None:
    """Give ``table`` the marker of each client-side shard column of ``cols`` (a marker
    made from an earlier resolution of that column, now different, is replaced)."""
    have = {c.shard_column_name: c for c in table.constraints if isinstance(c, ShardMarker)}
    for sc in cols:
        if sc.server_side:
            continue
        name = marker_name(table.name, sc)
        old = have.get(sc.name)
        if old is not None and old.name == name:
            continue
        if old is not None:
            table.constraints.discard(old)
        table.append_constraint(ShardMarker(name, sc.column, sc.count))
