"""Shard markers: the database remembers how each shard column was computed.

A client-side shard column is a plain INT64 in the database: nothing there says it holds
``crc32(CompanyId, Timestamp) mod 8``. Change ``count=8`` to ``count=16`` in the model and
a schema diff sees nothing, while every query now looks in the wrong shards. So each shard
column gets a CHECK constraint that records its spec::

    CONSTRAINT ck_LogEntries_EntryShardId_shard8_1f2e3d4c
        CHECK (`EntryShardId` >= 0 AND `EntryShardId` < 8)

The clause keeps values in range (as CockroachDB's hash-sharded indexes do), and the
name carries the count and a digest of (algorithm, count, sources), so autogenerate
can tell a changed spec from an unchanged one by reading INFORMATION_SCHEMA.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from sharded_orm.errors import ShardConfigError
from sharded_orm.schema.columns import ShardColumn

MAX_NAME = 128


@dataclass(frozen=True)
class Marker:
    """A shard marker as found in (or meant for) the database."""

    name: str
    table: str
    column: str
    count: int
    digest: str


def spec_digest(algorithm: str, count: int, sources: tuple[str, ...]) -> str:
    text = f"{algorithm}|{count}|{','.join(sources)}"
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def _prefix(table: str, column: str) -> str:
    prefix = f"ck_{table}_{column}_shard"
    if len(prefix) + 20 > MAX_NAME:  # keep within Spanner's 128 characters
        prefix = "ck_" + hashlib.sha1(f"{table}.{column}".encode()).hexdigest()[:16] + "_shard"
    return prefix


def marker_for(sc: ShardColumn) -> Marker:
    """The marker a shard column declared in the models should have."""
    table = sc.column.table.name
    digest = spec_digest(sc.algorithm, sc.count, tuple(c.name for c in sc.sources))
    name = f"{_prefix(table, sc.name)}{sc.count}_{digest}"
    return Marker(name, table, sc.name, sc.count, digest)


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
    pattern = re.compile(re.escape(_prefix(table, column)) + r"(\d+)_([0-9a-f]{8})$")
    for name in constraint_names:
        m = pattern.match(name)
        if m:
            return Marker(name, table, column, int(m.group(1)), m.group(2))
    return None
