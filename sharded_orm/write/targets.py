"""Which sharded table a statement writes, however it names it.

* the declared ``Table`` (or an annotated ORM copy of it): its own shard columns;
* an ORM statement through a subclass under joined inheritance: SQLAlchemy runs one
  statement per table and says which in the statement's ``_emit_insert_table`` /
  ``_emit_update_table`` annotation (the statement's ``.table`` is the subclass's);
* a reflected ``Table``, a ``to_metadata`` copy, a lightweight ``sa.table()``: the declared
  table of the same schema and name (``sharded_orm.schema.registry``), its shard columns
  re-keyed to the statement's own columns.
"""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy import column as _column_clause
from sqlalchemy.sql.expression import TableClause
from sqlalchemy.sql.schema import Table

from sharded_orm.errors import ShardConfigError
from sharded_orm.memo import Memo
from sharded_orm.schema.columns import ShardColumn, is_shard_column, shard_columns
from sharded_orm.schema.registry import declared_tables

#: declared tables -> (column count, layout); kept here, not in ``Table.info``, so a
#: table that is not ours is never touched
_tables: weakref.WeakKeyDictionary[Table, tuple[int, tuple[ShardColumn, ...]]] = (
    weakref.WeakKeyDictionary()
)
_NONE: tuple[ShardColumn, ...] = ()
#: lightweight tables (no .info): id -> (the table, its column count, its resolved layout)
_light: Memo[int, tuple[TableClause, int, tuple[ShardColumn, ...]]] = Memo(
    "write.light_tables", 1024
)


def statement_table(elem: Any) -> Any:
    """The table an INSERT/UPDATE really writes (the ORM's per-table annotation first)."""
    ann = elem._annotations  # SQLAlchemy's ORM persistence marks the real target here
    if ann:
        target = ann.get("_emit_update_table")
        if target is None:
            target = ann.get("_emit_insert_table")
        if target is not None:
            return target
    return elem.table


def write_shards(table: Any) -> tuple[ShardColumn, ...]:
    """The shard columns a write to ``table`` must fill, keyed by ``table``'s column keys."""
    if isinstance(table, Table):
        if table._annotations:  # the ORM's annotated copy: the cache holds the original
            table = table._deannotate()
        cached = _tables.get(table)
        if cached is not None and cached[0] == len(table.columns):
            return cached[1]
        if any(is_shard_column(c) for c in table.columns):
            shards = shard_columns(table)
        else:
            shards = _foreign(table)
        _tables[table] = (len(table.columns), shards)
        return shards
    if isinstance(table, TableClause):
        hit = _light.get(id(table))
        if hit is not None and hit[0] is table and hit[1] == len(table.c):
            return hit[2]
        shards = _foreign(table)
        _light.put(id(table), (table, len(table.c), shards))
        return shards
    return _NONE


def _layout(sc: ShardColumn) -> tuple[Any, ...]:
    return (sc.name, tuple(c.name for c in sc.sources), sc.count, sc.algorithm, sc.server_side)


def _foreign(table: TableClause) -> tuple[ShardColumn, ...]:
    """The declared layout of a same-named table, re-keyed to ``table``'s columns."""
    schema = getattr(table, "schema", None)
    candidates = [t for t in declared_tables(schema, table.name) if t is not table]
    if not candidates:
        return _NONE
    by_name = {c.name: c for c in table.c}
    complete = isinstance(table, Table)
    layouts = []
    for declared in candidates:
        shards = shard_columns(declared)
        if complete and not all(
            sc.name in by_name and all(s.name in by_name for s in sc.sources) for sc in shards
        ):
            continue  # a reflected table without those columns is another table
        layouts.append(shards)
    if not layouts:
        return _NONE
    if len({tuple(_layout(sc) for sc in shards) for shards in layouts}) > 1:
        raise ShardConfigError(
            f"table {table.name!r} is declared sharded by several MetaData with different "
            "shard columns, so a write through this undeclared table object cannot be "
            "checked. Write through the declared model or Table."
        )
    return tuple(_rekey(sc, by_name) for sc in layouts[0])


def _rekey(sc: ShardColumn, by_name: dict[str, Any]) -> ShardColumn:
    def own(col: Any) -> Any:
        return by_name.get(col.name) if col.name in by_name else _column_clause(col.name)

    return ShardColumn(
        own(sc.column),
        sc.spec,
        tuple(own(c) for c in sc.sources),
        sc.shard_fn,
        sc.coercers,
        sc.loose,
        sc.sends,
    )
