"""Schemas whose change ``doctor --fix`` cannot write as revisions, and the manual path.

Each is refused at ``--fix`` time, nothing written: a table in a named schema (the ops take
a bare table name); a key reshard of a table in an interleaved hierarchy, as child or as
parent (a child's key must start with its parent's; a parent cannot be renamed or dropped
under its children) or in a FOREIGN KEY either way (the contract's RENAME is refused while a
key names the table); a ``ShardedIndex`` in place of an interleaved index (it would start
with its shard, not the parent's key); a shard computed from a nullable column (a NULL has
no shard) or a commit-timestamp column (``PENDING_COMMIT_TIMESTAMP()`` has no value until
commit). What Spanner requires, and so what a hand-written change must do, is in each
message.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from sharded_orm.schema.interleave import parent_of


def unsupported(
    metadata: sa.MetaData,
    change: str,
    table: sa.Table,
    index: sa.Index | None,
    sources: list[Any],
) -> str | None:
    """Why ``change`` of ``table`` cannot be written as revisions, with what to do
    instead; None when it can."""
    if table.schema is not None:
        return _named_schema(change, table)
    if change == "key_reshard":
        why = _hierarchy(metadata, table) or _foreign_keys(metadata, table)
        if why is not None:
            return why
    if change in ("shard_index", "reshard_index") and index is not None:
        parent = parent_of(index)
        if parent is not None:
            return _interleaved_index(index, parent)
    for col in sources:
        if _commit_timestamp(col):
            return _from_commit_timestamp(change, table, col)
    for col in sources:
        if col.nullable:
            return _from_nullable(change, table, index, col)
    return None


def _hierarchy(metadata: sa.MetaData, table: sa.Table) -> str | None:
    parent = parent_of(table)
    key = ", ".join(c.name for c in table.primary_key.columns)
    if parent is not None:
        p = metadata.tables.get(parent)
        pkey = ", ".join(c.name for c in p.primary_key.columns) if p is not None else "?"
        return (
            f"table {table.name} is INTERLEAVE IN PARENT {parent}: Spanner requires its key "
            f"({key}) to start with {parent}'s key ({pkey}), so no shard column can lead "
            f"it, and a growing part there is {parent}'s hot spot too. No revision is "
            f"written. The manual path: reshard the hierarchy together, parent first: a "
            f"new {parent} keyed (ShardId, {pkey}) with ShardId = shard_column over "
            f"{parent}'s growing key part(s); a new {table.name} keyed (ShardId, {key}) "
            f"INTERLEAVE IN PARENT the new {parent}, its ShardId the same shard_column over "
            f"the same columns (it holds them: its key starts with them), so each child "
            f"lands with its parent. In the expand create both and op.copy_table_rows the "
            f"parent, then the child; in the contract op.retire_table the child, then the "
            f"parent. Run doctor --fix on {parent} alone only once no table is "
            "interleaved in it"
        )
    children = sorted(
        {t.name for t in metadata.tables.values() if parent_of(t) == table.name}
        | {
            str(ix.name)
            for t in metadata.tables.values()
            for ix in t.indexes
            if parent_of(ix) == table.name
        }
    )
    if children:
        return (
            f"table {table.name} has interleaved children ({', '.join(children)}): their "
            f"keys start with its key ({key}) and they live inside its rows, so it cannot "
            "move to a new table with a new key while they stay (Spanner refuses to "
            "rename or drop a parent, and a child's key must start with its new parent's). "
            "No revision is written. The manual path: reshard the hierarchy together: a "
            f"new {table.name} keyed (ShardId, {key}) with ShardId = shard_column over its "
            "growing key part(s), and each child re-created keyed (ShardId, <its key>) "
            "INTERLEAVE IN PARENT the new table with the same shard_column (the child "
            "holds the same columns), so each child lands with its parent; expand: create "
            "them and op.copy_table_rows the parent, then each child; contract: "
            "op.retire_table each child, then the parent"
        )
    return None


def _foreign_keys(metadata: sa.MetaData, table: sa.Table) -> str | None:
    out = sorted(
        f"{table.name}({', '.join(fk.column_keys)}) -> {_referred(fk)}"
        for fk in table.foreign_key_constraints
    )
    into = sorted(
        f"{t.name}({', '.join(fk.column_keys)}) -> {table.name}"
        for t in metadata.tables.values()
        if t is not table
        for fk in t.foreign_key_constraints
        if _referred(fk) == table.fullname
    )
    if not out and not into:
        return None
    what = "; ".join(into + out)
    return (
        f"table {table.name} is in a FOREIGN KEY ({what}): the key reshard moves its "
        "rows to a new table and retires this one (a RENAME, then DROP), which Spanner "
        "refuses while a foreign key names it, and the new table's constraints would need "
        "new names. No revision is written. The manual path, in the same expand and "
        f"contract: in the expand, give the new table the outgoing foreign keys under new "
        f"constraint names; in the contract, before op.retire_table: drop each foreign "
        f"key that references {table.name} (op.drop_constraint(name, table, "
        "type_='foreignkey')), then retire it, then re-create each pointing at the new "
        "table (op.create_foreign_key(name, table, <new table>, [...], [...])); in the "
        "models, point those ForeignKey()s at the new table"
    )


def _referred(fk: sa.ForeignKeyConstraint) -> str:
    """The full name of the table a foreign key names (declared in the models or not)."""
    return fk.elements[0].target_fullname.rsplit(".", 1)[0] if fk.elements else "?"


def _commit_timestamp(col: Any) -> bool:
    return bool(getattr(col, "dialect_kwargs", {}).get("spanner_allow_commit_timestamp"))


def _named_schema(change: str, table: sa.Table) -> str:
    return (
        f"table {table.schema}.{table.name} is in the named schema {table.schema}: the "
        f"revisions doctor --fix writes ({change}) name tables without a schema "
        "(op.backfill_shard, op.copy_table_rows and op.retire_table take a bare table name), "
        f"so they would act outside {table.schema}. No revision is written. The manual path: "
        f"write the revision by hand with schema={table.schema!r} on each op.create_table / "
        "op.add_column / op.create_index / op.drop_index, and copy or backfill the rows "
        f"with SQL naming {table.schema}.{table.name}; see docs/migrations.md"
    )


def _interleaved_index(index: sa.Index, parent: str) -> str:
    return (
        f"index {index.name} is INTERLEAVE IN {parent}: Spanner requires an interleaved index "
        f"to start with {parent}'s key, and a ShardedIndex starts with its shard column, so "
        "its replacement cannot stay interleaved. No revision is written. The manual path: "
        "declare the ShardedIndex without interleave_in (a global index: its shard spreads "
        "the writes; reads merge the shards), write its revision with alembic revision "
        "--autogenerate, or drop interleave_in from the index and run doctor --fix again"
    )


def _from_commit_timestamp(change: str, table: sa.Table, col: Any) -> str:
    return (
        f"column {table.name}.{col.name} is a commit timestamp (allow_commit_timestamp): the "
        f"app writes it as PENDING_COMMIT_TIMESTAMP(), whose value exists only once Spanner "
        f"commits, and the {change} would compute a shard from it in the client, so every "
        "such INSERT would be refused. No revision is written. What to do: shard by a "
        "column the app writes with the row instead (an id, a tenant): e.g. "
        f"shard_column('<id column>', count=N) and ShardedIndex(<name>, {col.name!r}, "
        "shard=<its name>): writes spread, and merged()/page() still read the index in "
        f"{col.name} order"
    )


def _from_nullable(change: str, table: sa.Table, index: sa.Index | None, col: Any) -> str:
    where = f" (the index {index.name} keeps a NULL row out when NULL_FILTERED)" if index else ""
    return (
        f"column {table.name}.{col.name} is nullable{where}: a NULL has no shard, so the "
        f"{change}'s backfill would stop at the first row holding NULL and the new model "
        f"would refuse every INSERT without {col.name}. No revision is written. What to do: "
        f"if {col.name} never holds NULL, make it NOT NULL first: fill any NULLs "
        f"(UPDATE ... SET {col.name} = <value> WHERE {col.name} IS NULL), declare it "
        "nullable=False in the model and write that revision (Spanner refuses to change "
        "the nullability of an indexed column: drop the index, alter the column, re-create "
        "the index, in one revision), then run doctor --fix again. If NULLs are part of the "
        "data, shard by a column that always has a value (an id) instead"
    )
