"""What autogenerate refuses, each with a message saying what to write instead.

Raised as :class:`~alembic_ext.errors.MigrationError`, which Alembic's CLI prints as one
``FAILED:`` line.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic.operations import ops
from sqlalchemy.engine import Connection

from sharded_orm.schema.columns import ShardColumn
from sharded_orm.schema.keys import is_descending

from . import reflection
from .errors import MigrationError
from .ops import AddShardColumnOp, DropShardColumnOp


def check_reshard(
    table: sa.Table | None, name: str, found: list[ops.MigrateOperation], *, split: bool = False
) -> None:
    """A reshard is an expand (one revision) and a contract (a later one), never both, and
    never drops an index that readers use before its replacement exists. ``split``: env.py
    uses ``alembic_ext.split_reshard``, which writes a one-step change as the two."""
    added = [o.column.name for o in found if type(o) is AddShardColumnOp]
    removed = [o.column.name for o in found if isinstance(o, DropShardColumnOp)]
    if added and removed and not split:
        raise MigrationError(
            f"{name}: this revision would add shard column {added[0]} and drop "
            f"{removed[0]}: a reshard in one revision leaves readers of the old index "
            "without it while they still run. Keep the old shard column and its index "
            "in the model for now: autogenerate writes the expand (add, backfill, new "
            "index); upgrade, deploy code that reads the new index, then remove the old "
            "ones from the model and autogenerate the contract (docs/migrations.md). Or "
            "pass process_revision_directives=alembic_ext.split_reshard to "
            "context.configure in env.py: autogenerate then writes the two revisions."
        )
    if not added or table is None:
        return
    dropped = {o.index_name for o in found if isinstance(o, ops.DropIndexOp)}
    for o in found:
        if not isinstance(o, ops.CreateIndexOp) or o.index_name not in dropped:
            continue
        real = next((i for i in table.indexes if i.name == o.index_name), None)
        first = next(iter(real.expressions), None) if real is not None else None
        lead = getattr(getattr(first, "element", first), "name", None)
        if lead in added:
            raise MigrationError(
                f"index {o.index_name} keeps its name but is now led by the new shard "
                f"column {lead}: it would be dropped before its replacement is built, and "
                "sharded queries through it would fail for the whole backfill. Give the "
                f"new index a new name (e.g. {o.index_name}V2), keep the old index in the "
                "model, and drop it in the contract revision."
            )


def check_not_null_unindexed(
    conn: Connection, table: str, found: list[ops.MigrateOperation]
) -> None:
    """Spanner refuses to change NOT NULL of a column an index holds ("Changing NOT NULL
    constraints on column C is not allowed because it affects index I"): say so at
    autogenerate, with what to do, rather than at upgrade, half way through."""
    changed = [
        o.column_name
        for o in found
        if isinstance(o, ops.AlterColumnOp) and o.modify_nullable is not None
    ]
    if not changed:
        return
    dropped = {o.index_name for o in found if isinstance(o, ops.DropIndexOp)}
    for info in reflection.read_indexes(conn, table).values():
        if info.name in dropped:
            continue
        for column in changed:
            if column in {c for c, _ in info.columns}:
                raise MigrationError(
                    f"{table}.{column}: Spanner cannot change NOT NULL of a column that index "
                    f"{info.name} holds. Keep the column as the database has it (for a shard "
                    "column made nullable=True with its index in the same revision, keep "
                    "nullable=True: the library fills it on every write), or drop the index "
                    "in this revision and create it again after (it is missing meanwhile). "
                    "For a first shard column, add its ShardedIndex in the revision that "
                    "makes it NOT NULL (docs/adopting.md)."
                )


def _key_text(key: list[tuple[str, bool]]) -> str:
    return "(" + ", ".join(n + (" DESC" if d else "") for n, d in key) + ")"


def check_key_and_parent(conn: Connection, table: sa.Table) -> None:
    """Spanner cannot change a table's key or its parent: a difference stops autogenerate
    (and ``alembic check``) with what to do."""
    real_key = reflection.read_primary_key(conn, table.name)
    model_key = [(c.name, is_descending(c)) for c in table.primary_key.columns]
    real_parent = reflection.read_table_parent(conn, table.name)[0]
    model_parent = table.kwargs.get("spanner_interleave_in") or None
    what = []
    if real_key != model_key:
        what.append(f"primary key {_key_text(real_key)} -> {_key_text(model_key)}")
    if real_parent != model_parent:
        what.append(f"INTERLEAVE IN PARENT {real_parent} -> {model_parent}")
    if what:
        raise MigrationError(
            f"table {table.name}: {'; '.join(what)} (database -> model). Spanner cannot "
            "change a table's key or its parent in place: create a new table with the new "
            "layout, copy the rows, switch readers and writers, then drop the old table."
        )


def in_place_error(table: str, sc: ShardColumn, found: str) -> MigrationError:
    """A shard column whose spec changed under the same name."""
    base = sc.name.rstrip("0123456789") or sc.name
    head = (
        f"shard column {table}.{sc.name} is declared with count={sc.count}, "
        f"algorithm={sc.algorithm!r}, sources={list(sc.source_keys)}, but {found}."
    )
    if sc.column.primary_key:
        return MigrationError(
            f"{head} It is part of the primary key, and Spanner cannot change or add key "
            "columns of a table: there is no backfill path. Create a new table with the new "
            "key, copy the rows, and switch to it (docs/migrations.md, 'Resharding a key')."
        )
    return MigrationError(
        f"{head} A shard column cannot be recomputed in place: rows already stored under "
        "the old spec would be invisible to every sharded query while it runs, and Spanner "
        "cannot rename a column. Declare the new layout as a NEW shard column (e.g. "
        f"name='{base}V2') with its own ShardedIndex under a new name, keep the old column "
        "and index in the model, and autogenerate: that revision is the expand. Once every "
        "reader uses the new index, remove the old ones from the model and autogenerate the "
        "contract (docs/migrations.md, 'Resharding')."
    )
