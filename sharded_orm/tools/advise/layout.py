"""The layout ``advise`` sizes: a table's shard column, the key space it leads, the read on it.

The key space is the ``ShardedIndex`` the shard column leads (or the table's key, when the
shard column leads it): its writes land at one tail per shard and per value of the parts
before the growing one (a tenant), so the busiest tail is what a count must spread. The
read is that key space's newest-first read of one tenant (or of everything, without one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from sharded_orm.errors import ShardConfigError
from sharded_orm.schema.columns import ShardColumn, shard_column, shard_columns, table_of
from sharded_orm.schema.indexes import ShardedIndex
from sharded_orm.tools.doctor.keys import role_of
from sharded_orm.tools.lint import index_parts

GROWING = ("time", "counter", "uuid7")


@dataclass(frozen=True)
class Layout:
    """What a shard count changes: ``shard`` leads ``parts`` (the index, or the key)."""

    table: sa.Table
    shard: ShardColumn
    index: str | None  # the ShardedIndex's name; None: the table's key
    parts: tuple[tuple[str, bool], ...]  # (column name, descending) after the shard
    tenant: str | None  # the part before the growing one that splits its tails, if any
    growing: str | None  # the growing part (time, counter)

    def variant(self, count: int) -> sa.Table:
        """The table (only the columns the layout needs) with ``count`` shards, in a MetaData
        of its own: where ``advise`` runs the merge to price a read."""
        md = sa.MetaData()
        keep = {c.name for c in self.table.primary_key.columns} | {p for p, _ in self.parts}
        keep |= {c.name for c in self.shard.sources}
        cols: list[Any] = []
        for c in self.table.columns:
            if c.name in keep and c.name != self.shard.name:
                cols.append(sa.Column(c.name, c.type, primary_key=c.primary_key, info=dict(c.info)))
        sources = [c.name for c in self.shard.sources]
        cols.append(
            shard_column(
                *sources, count=count, algorithm=self.shard.algorithm, name=self.shard.name,
                primary_key=self.shard.column.primary_key,
            ).column
        )  # fmt: skip
        items: list[Any] = []
        if self.index is not None:
            order = [sa.desc(p) if d else p for p, d in self.parts]
            items.append(ShardedIndex(self.index, *order, shard=self.shard.name))
        else:
            items.append(sa.PrimaryKeyConstraint(*[c.name for c in self.table.primary_key.columns]))
        return sa.Table(self.table.name, md, *cols, *items)


def layout_of(model: Any, column: str | None = None) -> Layout:
    """The layout of ``model``'s shard column ``column`` (default: its only one)."""
    table = table_of(model)
    found = shard_columns(table)
    if column is not None:
        found = tuple(sc for sc in found if column in (sc.name, sc.key))
    if not found:
        what = f"no shard column {column!r}" if column else "no shard column"
        raise ShardConfigError(
            f"{table.name} has {what}: advise sizes a shard column's count. A table without "
            "one gets it from `sharded-orm doctor --fix` (which writes the migration); give "
            "the model with the shard column"
        )
    if len(found) > 1:
        raise ShardConfigError(
            f"{table.name} has {len(found)} shard columns ({', '.join(s.name for s in found)}):"
            " name the one to size (column=..., --column)"
        )
    sc = found[0]
    index = None
    parts: list[tuple[Any, bool]] = []
    for ix in table.indexes:
        ip = index_parts(ix)
        if ip and ip[0][0] is sc.column:
            index, parts = str(ix.name), ip[1:]
            break
    else:
        pk = list(table.primary_key.columns)
        if not pk or pk[0] is not sc.column:
            raise ShardConfigError(
                f"shard column {table.name}.{sc.name} leads no ShardedIndex and not the key: "
                "nothing is sharded by it to size"
            )
        from sharded_orm.schema.keys import is_descending

        parts = [(c, is_descending(c)) for c in pk[1:]]
    roles = [role_of(c) for c, _ in parts]
    grow = next((i for i, r in enumerate(roles) if r in GROWING), None)
    tenant = None
    if grow is not None and grow > 0:
        tenant = parts[grow - 1][0].name
    return Layout(
        table, sc, index, tuple((c.name, d) for c, d in parts), tenant,
        parts[grow][0].name if grow is not None else None,
    )  # fmt: skip
