"""Shard markers in migrations: what the database records of each shard column.

A marker is a CHECK constraint whose name records a client-side shard column's spec
(:mod:`sharded_orm.schema.markers` says why and makes the tables' own). Here: the marker a
model's shard column should have, its clause as migration text, and the one found among a
table's reflected CHECK constraints, so autogenerate can tell a changed spec from an
unchanged one by reading INFORMATION_SCHEMA.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sharded_orm.errors import ShardConfigError
from sharded_orm.schema.columns import ShardColumn
from sharded_orm.schema.markers import marker_name, marker_prefix, spec_digest

__all__ = ["Marker", "find_marker", "marker_clause", "marker_for", "spec_digest"]


@dataclass(frozen=True)
class Marker:
    """A shard marker as found in (or meant for) the database."""

    name: str
    table: str
    column: str
    count: int
    digest: str


def marker_for(sc: ShardColumn) -> Marker:
    """The marker a shard column declared in the models should have."""
    table = sc.column.table.name
    name = marker_name(table, sc)
    return Marker(name, table, sc.name, sc.count, name.rsplit("_", 1)[1])


def marker_clause(column: str, count: int, quote: str = '"') -> str:
    """The CHECK text of a shard marker; the column name is pasted into it, so it is checked."""
    if not isinstance(column, str) or quote in column or not column.isprintable():
        raise ShardConfigError(
            f"shard column name {column!r} cannot be written into a CHECK constraint: "
            f"it holds {quote} or a control character. Rename the column."
        )
    q = f"{quote}{column}{quote}"
    return f"{q} >= 0 AND {q} < {count}"


def find_marker(table: str, column: str, constraint_names: list[str]) -> Marker | None:
    """The marker of ``table.column`` among reflected CHECK constraint names."""
    pattern = re.compile(re.escape(marker_prefix(table, column)) + r"(\d+)_([0-9a-f]{8})$")
    for name in constraint_names:
        m = pattern.match(name)
        if m:
            return Marker(name, table, column, int(m.group(1)), m.group(2))
    return None
