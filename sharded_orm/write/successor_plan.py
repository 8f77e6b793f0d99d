"""A key reshard's successor table: its declaration and how an old row becomes a new one.

``declare_successor(Event, Event16)`` (docs/migrations.md, 'Resharding a key') marks
``Events16`` as the table every write to ``Events`` must reach too until the contract;
:func:`plan` checks that the successor can be filled from the old table alone and says
how: the columns copied by name, the new shard columns computed from them, the new key,
and whether that key follows from the old key alone. The writes themselves are mirrored
by ``sharded_orm.write.successor``.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from sharded_orm.errors import ShardConfigError
from sharded_orm.schema.columns import ShardColumn, shard_columns, table_of

__all__ = ["SUCCESSOR_KEY", "MirrorPlan", "declare_successor", "old_tables", "plan", "successor_of"]

#: ``Table.info`` key: the table (or its name in the same MetaData) that every write to
#: this table is mirrored into.
SUCCESSOR_KEY = "sharded_orm.successor"


@dataclass(frozen=True)
class MirrorPlan:
    """How a row of ``old`` becomes a row of ``new``: the columns copied by name, the new
    shard columns computed from them, the new key."""

    old: sa.Table
    new: sa.Table
    copied: tuple[tuple[str, str], ...]  # (old column key, new column key)
    shards: tuple[ShardColumn, ...]  # the new table's shard columns
    new_key: tuple[sa.Column[Any], ...]
    old_key: tuple[sa.Column[Any], ...]
    #: the new key is a function of the old key alone (no non-key column feeds it), so
    #: the successor row of an old key is known without reading the old row
    follows_key: bool

    def new_row(self, old_row: Mapping[str, Any]) -> dict[str, Any]:
        """The new table's row (shards left to the write hook), from old values by key."""
        return {n: old_row[o] for o, n in self.copied if o in old_row}

    def new_key_of(self, old_row: Mapping[str, Any]) -> dict[str, Any]:
        """The new table's key of ``old_row`` (by new column key); the old row needs only
        its key columns when ``follows_key``."""
        row = self.new_row(old_row)
        by_key = {sc.key: sc for sc in self.shards}
        out = {}
        for c in self.new_key:
            sc = by_key.get(c.key)
            out[c.key] = sc.compute([row[k] for k in sc.source_keys]) if sc else row[c.key]
        return out


_plans: weakref.WeakKeyDictionary[sa.Table, tuple[sa.Table, int, MirrorPlan]] = (
    weakref.WeakKeyDictionary()
)
#: successor -> the one table it is the successor of
_succeeds: weakref.WeakKeyDictionary[sa.Table, sa.Table] = weakref.WeakKeyDictionary()
#: every table given a successor by ``declare_successor``
_olds: weakref.WeakSet[sa.Table] = weakref.WeakSet()


def plan(old: sa.Table, new: sa.Table) -> MirrorPlan:
    """Check that ``new`` can be filled from ``old`` alone, and say how (made once per
    pair of tables, again if a column is added)."""
    hit = _plans.get(old)
    size = len(old.c) + len(new.c)
    if hit is not None and hit[0] is new and hit[1] == size:
        return hit[2]
    made = _plan(old, new)
    _plans[old] = (new, size, made)
    return made


def _plan(old: sa.Table, new: sa.Table) -> MirrorPlan:
    shards = shard_columns(new)
    shard_names = {sc.name for sc in shards}
    if not shards or not any(sc.column.primary_key for sc in shards):
        raise ShardConfigError(
            f"{new.name} has no shard column in its primary key: a successor table is for a "
            "key reshard (for a non-key shard column, add a column: docs/migrations.md)"
        )
    missing = [
        c.name
        for c in new.c
        if c.name not in shard_names and c.name not in old.c and c.computed is None
    ]
    if missing:
        raise ShardConfigError(
            f"{new.name} has columns {missing} that {old.name} lacks: a successor holds the "
            "columns of its table (by name) and its own shard columns"
        )
    old_shards = {sc.name for sc in shard_columns(old)}
    new_pk = {c.name for c in new.primary_key.columns}
    lost = [c.name for c in old.primary_key.columns if c.name not in old_shards | new_pk]
    if lost:
        raise ShardConfigError(
            f"{new.name}'s primary key lacks {lost}, part of {old.name}'s: two rows of "
            f"{old.name} would be one row of {new.name}. A successor's key holds every key "
            "column of its table (its old shard aside) and its new shard"
        )
    copied = tuple(
        (old.c[c.name].key, c.key)
        for c in new.c
        if c.name not in shard_names and c.computed is None
    )
    old_pk = {c.name for c in old.primary_key.columns}
    follows = all(
        all(s.name in old_pk for s in sc.sources) if sc.name in new_pk else True for sc in shards
    ) and all(c.name in old_pk for c in new.primary_key.columns if c.name not in shard_names)
    return MirrorPlan(
        old, new, copied, shards, tuple(new.primary_key.columns),
        tuple(old.primary_key.columns), follows,
    )  # fmt: skip


def declare_successor(old: Any, new: Any) -> None:
    """From now on, every library write to ``old`` (a model or Table) also writes ``new``.

    Declare it beside the models for the time both tables exist (the expand of a key
    reshard until its contract); remove the line with the old model. A table has one
    successor at a time and a successor one old table: another declaration is refused
    (declaring the same pair again changes nothing)."""
    old_table, new_table = table_of(old), table_of(new)
    if old_table is new_table:
        raise ShardConfigError(f"{old_table.name} cannot be its own successor")
    plan(old_table, new_table)
    current = successor_of(old_table)
    if current is not None and current is not new_table:
        raise ShardConfigError(
            f"{old_table.name} already has the successor {current.name}; a second, "
            f"{new_table.name}, would take its place and {current.name} would miss every "
            "write from now on. A table has one successor at a time: finish that reshard "
            f"(op.retire_table) first, or remove declare_successor({old_table.name}, "
            f"{current.name})."
        )
    before = _succeeds.get(new_table)
    if before is not None and before is not old_table:
        raise ShardConfigError(
            f"{new_table.name} is already the successor of {before.name}; rows of "
            f"{old_table.name} and {before.name} cannot share it. Give each its own new table."
        )
    if successor_of(new_table) is not None or _succeeds.get(old_table) is not None:
        raise ShardConfigError(
            f"{old_table.name} -> {new_table.name} would chain two key reshards (a table "
            "that has a successor and is one): the writes mirrored into a successor are "
            "not mirrored again. Finish one reshard (its contract) before the next."
        )
    old_table.info[SUCCESSOR_KEY] = new_table
    _succeeds[new_table] = old_table
    _olds.add(old_table)


def old_tables() -> list[sa.Table]:
    """Tables given a successor by ``declare_successor`` (and still alive)."""
    return list(_olds) if _olds else []


def successor_of(table: Any) -> sa.Table | None:
    """The successor declared for ``table`` (a Table, model or ORM-annotated copy), if any."""
    info = getattr(table, "__dict__", {}).get("info")
    if not info:
        return None
    found = info.get(SUCCESSOR_KEY)
    if found is None or isinstance(found, sa.Table):
        return found
    if isinstance(found, str):
        named = table.metadata.tables.get(found)
        if named is None:
            raise ShardConfigError(
                f"{table.name}.info[{SUCCESSOR_KEY!r}] names {found!r}, which is not a table "
                "of the same MetaData; declare it (or give the Table itself)"
            )
        return named  # type: ignore[no-any-return]
    raise ShardConfigError(
        f"{table.name}.info[{SUCCESSOR_KEY!r}] must be a Table or a table name, got {found!r}"
    )
