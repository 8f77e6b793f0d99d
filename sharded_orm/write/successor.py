"""Writes to both tables of a key reshard while the models declare both.

A shard column in the primary key cannot be recomputed in place: a key reshard copies
the table into a new one whose key holds the new shard (docs/migrations.md, 'Resharding a
key'). Between the expand and the contract, every library write to the old table must
reach the new one too, in the same transaction, or the copy chases writers forever.
``declare_successor(Event, Event16)`` says so; from then on, on every watched engine
(``sharded_orm.write.engine_hook``):

* an INSERT into the old table (ORM flush, ``session.execute(insert(M), rows)``, Core
  ``insert()`` with parameters, ``bulk_insert_mappings``) is followed by the same rows
  written into the new one as an upsert (``INSERT OR UPDATE`` on Spanner), the new shard
  computed by the new table's spec;
* a DELETE first deletes the rows it matches from the new table (by their new key);
* an UPDATE reads the rows it matches (same WHERE, same parameters) before it runs, and
  afterwards writes their new state into the new table.

A table with no successor pays one dictionary look-up per statement. Writes the library
cannot mirror (``INSERT ... FROM SELECT``, a multi-row ``VALUES`` list, SQL expressions as
values) are refused with what to do instead. ``bulk_load`` writes both tables in each of
its commits (``sharded_orm.load``).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.dml import Delete, Insert, Update
from sqlalchemy.sql.elements import ClauseElement

from sharded_orm.errors import ShardConfigError
from sharded_orm.schema.columns import ShardColumn, shard_columns, table_of
from sharded_orm.spanner import is_spanner
from sharded_orm.write.sql import MISSING, literal_value, statement_values
from sharded_orm.write.targets import statement_table

__all__ = ["SUCCESSOR_KEY", "MirrorPlan", "declare_successor", "listen", "successor_of"]

#: ``Table.info`` key: the table (or its name in the same MetaData) that every write to
#: this table is mirrored into.
SUCCESSOR_KEY = "sharded_orm.successor"
_PENDING = "sharded_orm.successor_pending"
#: key values per ``OR``-ed lookup when reading rows back by key
_CHUNK = 200


@dataclass(frozen=True)
class MirrorPlan:
    """How a row of ``old`` becomes a row of ``new``: the columns copied by name, the new
    shard columns computed from them, the new key."""

    old: sa.Table
    new: sa.Table
    copied: tuple[tuple[str, str], ...]  # (old column key, new column key)
    shards: tuple[ShardColumn, ...]  # the new table's shard columns
    new_key: tuple[sa.Column[Any], ...]

    def new_row(self, old_row: Mapping[str, Any]) -> dict[str, Any]:
        """The new table's row (shards left to the write hook), from old values by key."""
        return {n: old_row[o] for o, n in self.copied if o in old_row}

    def new_key_of(self, old_row: Mapping[str, Any]) -> dict[str, Any]:
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
    missing = [c.name for c in new.c if c.name not in shard_names and c.name not in old.c]
    if missing:
        raise ShardConfigError(
            f"{new.name} has columns {missing} that {old.name} lacks: a successor holds the "
            "columns of its table (by name) and its own shard columns"
        )
    copied = tuple((old.c[c.name].key, c.key) for c in new.c if c.name not in shard_names)
    return MirrorPlan(old, new, copied, shards, tuple(new.primary_key.columns))


def declare_successor(old: Any, new: Any) -> None:
    """From now on, every library write to ``old`` (a model or Table) also writes ``new``.

    Declare it beside the models for the time both tables exist (the expand of a key
    reshard until its contract); remove the line with the old model."""
    old_table, new_table = table_of(old), table_of(new)
    if old_table is new_table:
        raise ShardConfigError(f"{old_table.name} cannot be its own successor")
    plan(old_table, new_table)
    old_table.info[SUCCESSOR_KEY] = new_table


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


def _target(elem: Any) -> tuple[sa.Table, sa.Table] | None:
    if not isinstance(elem, (Insert, Update, Delete)):
        return None
    table = statement_table(elem)
    if isinstance(table, sa.Table) and table._annotations:
        table = table._deannotate()
    new = successor_of(table)
    return None if new is None else (table, new)


def _upsert(conn: Connection, mp: MirrorPlan, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    stmt = sa.insert(mp.new)
    if is_spanner(conn.dialect):
        stmt = stmt.prefix_with("OR UPDATE")
    elif conn.dialect.name == "sqlite":
        stmt = stmt.prefix_with("OR REPLACE")
    else:  # no portable upsert: the same effect in two statements
        _delete_new(conn, mp, rows)
    conn.execute(stmt, rows)


def _delete_new(conn: Connection, mp: MirrorPlan, rows: Sequence[Mapping[str, Any]]) -> None:
    keys = [mp.new_key_of(r) for r in rows]
    if not keys:
        return
    stmt = sa.delete(mp.new).where(*[c == sa.bindparam(f"k_{c.key}") for c in mp.new_key])
    conn.execute(stmt, [{f"k_{k}": v for k, v in key.items()} for key in keys])


def _old_rows(conn: Connection, mp: MirrorPlan, where: Any, params: Any) -> list[dict[str, Any]]:
    stmt = sa.select(*mp.old.c)
    if where is not None:
        stmt = stmt.where(where)
    return [dict(r) for r in conn.execute(stmt, params or {}).mappings()]


def _rows_by_key(conn: Connection, mp: MirrorPlan, keys: list[dict[str, Any]]) -> list[Any]:
    pk = list(mp.old.primary_key.columns)
    out: list[dict[str, Any]] = []
    for i in range(0, len(keys), _CHUNK):
        chunk = keys[i : i + _CHUNK]
        where = sa.or_(*[sa.and_(*[c == k[c.key] for c in pk]) for k in chunk])
        out.extend(_old_rows(conn, mp, where, None))
    return out


def _refuse_unmirrorable(elem: Insert, table: sa.Table) -> None:
    if elem.select is not None:
        raise ShardConfigError(
            f"{table.name} has a successor table (a key reshard is under way): an INSERT ... "
            "FROM SELECT cannot be mirrored into it. Insert the rows as parameters "
            "(conn.execute(insert(t), rows)) until the contract."
        )
    for k, v in statement_values(elem).items():
        if isinstance(v, ClauseElement) and literal_value(v) is MISSING:
            raise ShardConfigError(
                f"{table.name} has a successor table (a key reshard is under way): the "
                f"INSERT sets {k!r} to a SQL expression, which cannot be copied into it. "
                "Give the value as a parameter until the contract."
            )


def _before_execute(
    conn: Connection, elem: Any, multiparams: Any, params: Any, execution_options: Any
) -> None:
    target = _target(elem)
    if target is None:
        return
    old, new = target
    if isinstance(elem, Insert):
        _refuse_unmirrorable(elem, old)
        return
    mp = plan(old, new)
    sets = multiparams or [params]
    before = [r for p in sets for r in _old_rows(conn, mp, elem.whereclause, p)]
    if isinstance(elem, Delete):
        _delete_new(conn, mp, before)
    else:
        conn.info.setdefault(_PENDING, []).append((elem, before))


def _inserted_rows(mp: MirrorPlan, result: Any) -> list[dict[str, Any]]:
    """The rows an INSERT sent, defaults included: the execution context's parameters."""
    context = getattr(result, "context", None)
    compiled = getattr(context, "compiled_parameters", None) or []
    keys = [c.key for c in mp.old.primary_key.columns]
    rows = [dict(p) for p in compiled]
    if not rows or any(k not in r for r in rows for k in keys):
        raise ShardConfigError(
            f"{mp.old.name} has a successor table (a key reshard is under way) and this "
            "INSERT's rows cannot be read back to copy them (a multi-row VALUES list?). "
            "Insert the rows as parameters (conn.execute(insert(t), rows)) until the contract."
        )
    return rows


def _after_execute(
    conn: Connection,
    elem: Any,
    multiparams: Any,
    params: Any,
    execution_options: Any,
    result: Any,
) -> None:
    target = _target(elem)
    if target is None:
        return
    mp = plan(*target)
    if isinstance(elem, Insert):
        _upsert(conn, mp, [mp.new_row(r) for r in _inserted_rows(mp, result)])
    elif isinstance(elem, Update):
        pending = conn.info.get(_PENDING) or []
        while pending:
            stmt, before = pending.pop()
            if stmt is elem:
                break
        else:
            return
        pk = [c.key for c in mp.old.primary_key.columns]
        after = _rows_by_key(conn, mp, [{k: r[k] for k in pk} for r in before])
        now = {tuple(mp.new_key_of(r).values()) for r in after}
        gone = [r for r in before if tuple(mp.new_key_of(r).values()) not in now]
        _delete_new(conn, mp, gone)
        _upsert(conn, mp, [mp.new_row(r) for r in after])


def _forget(conn: Connection, *args: Any) -> None:
    conn.info.pop(_PENDING, None)


def listen(engine: Engine) -> None:
    """Mirror writes to tables with a successor on ``engine`` (``engine_hook.watch``)."""
    sa.event.listen(engine, "before_execute", _before_execute)
    sa.event.listen(engine, "after_execute", _after_execute)
    sa.event.listen(engine, "handle_error", _on_error)


def _on_error(ctx: Any) -> None:
    if ctx.connection is not None:
        _forget(ctx.connection)
