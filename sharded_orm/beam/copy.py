"""``CopyTable``: a key reshard's copy on Apache Beam (Dataflow), for tables too large for
one client (docs/migrations.md, 'Resharding a key').

The old table is read in partitions of one consistent snapshot (:class:`ReadQuery`) and
every row goes through :class:`WriteSharded` into the new model's table: the new shard
computed by the library, ``insert_or_update`` (a retried bundle or a re-run rewrites the
same values), bad rows to the dead-letter output. Rows written after the snapshot are
the dual write's (``declare_successor``) or the contract's to copy; a migration's
``op.copy_table_rows(..., engine="external")`` then checks that none is missing.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam

from sharded_orm.beam.spanner_io import DEFAULT_READ_TIMEOUT, Database, ReadQuery
from sharded_orm.beam.write import WriteSharded
from sharded_orm.load.verify import quote
from sharded_orm.schema.columns import table_of
from sharded_orm.write.successor import plan

__all__ = ["CopyTable", "copy_query"]


def copy_query(source: Any, target: Any) -> tuple[str, list[str]]:
    """(the GoogleSQL reading ``source``'s copied columns, the target's keys for them)."""
    src, dst = table_of(source), table_of(target)
    mp = plan(src, dst)
    names = [src.c[o].name for o, _ in mp.copied]
    sql = f"SELECT {', '.join(map(quote, names))} FROM {quote(src.name, 'table name')}"
    return sql, [n for _, n in mp.copied]


def _as_row(values: list[Any], keys: list[str]) -> dict[str, Any]:
    return dict(zip(keys, values, strict=True))


class CopyTable(beam.PTransform[Any, Any]):
    """``pipeline | CopyTable(Event, Event16, project_id=..., instance_id=...,
    database_id=...)``: every row of the old model's table into the new model's.

    Returns what :class:`WriteSharded` returns (``written`` and ``dead_letter``). The new
    model must be importable by the workers (a module-level class). ``read_timeout``
    bounds the partitioning and each partition's read; ``commit_timeout`` (among
    ``write_kw``) each commit attempt."""

    def __init__(
        self,
        source: Any,
        target: Any,
        *,
        project_id: str,
        instance_id: str,
        database_id: str,
        credentials: Any = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        **write_kw: Any,
    ) -> None:
        super().__init__()
        self.sql, self.keys = copy_query(source, target)
        self.db = Database(project_id, instance_id, database_id, credentials)
        self.read_timeout = read_timeout
        self.write = WriteSharded(
            target, project_id=project_id, instance_id=instance_id, database_id=database_id,
            credentials=credentials, mode="insert_or_update", **write_kw,
        )  # fmt: skip

    def expand(self, root: Any) -> Any:
        return (
            root
            | "Read old table" >> ReadQuery(self.db, self.sql, timeout=self.read_timeout)
            | "As rows" >> beam.Map(_as_row, self.keys)
            | "Write new table" >> self.write
        )
