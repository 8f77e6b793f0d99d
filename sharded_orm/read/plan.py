"""Sharded range queries in ORM syntax.

``sharded_select(LogEntry, index="LogEntriesByCompany")`` is an ordinary ``Select``; extend
it with ``.where()``, ``.order_by()``, ``.limit()``. When it executes, sharded-orm adds

* the shard predicate: ``shard BETWEEN 0 AND N-1`` (every shard), or ``shard = k`` when
  each source of the shard column is fixed by ``col == value`` in the WHERE clause (a
  point lookup, computed with the same hash the writes used);
* on Spanner, the ``@{FORCE_INDEX=...}`` table hint for the index; nothing elsewhere.

The additions are made at execution (by the hook in ``sharded_orm.write.engine_hook``), not at
compile time: a point lookup's shard depends on bound values, which SQLAlchemy's compiled
cache must never freeze. ``expand(stmt, dialect)`` shows the statement as it will run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Index, Select, Table, event, inspect, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import UnaryExpression

from sharded_orm.checks import check_identifier
from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.schema.columns import ShardColumn, get_shard_column, is_shard_column, table_of

OPTION = "sharded_orm_plan"


@dataclass(frozen=True)
class ShardPlan:
    """Which shard column (and index) a sharded query fans out over, and in what order."""

    table: Table
    shard: ShardColumn
    index_name: str | None  # None: the primary key
    ordering: tuple[tuple[Any, bool], ...]  # (column, descending) after the shard, in order
    key: tuple[Any, ...]  # primary-key columns, the tie-break that makes the order total

    @property
    def sort_columns(self) -> list[tuple[Any, bool]]:
        """The index ordering followed by the key columns it doesn't already hold.

        That is the order Spanner keeps index entries in within one shard (an index
        entry carries the key, ascending), and it is total: no two rows tie.
        """
        seen = {c for c, _ in self.ordering}
        return list(self.ordering) + [(c, False) for c in self.key if c not in seen]


def _split(expr: Any) -> tuple[Any, bool]:
    """(column, descending) of one index expression."""
    if isinstance(expr, UnaryExpression) and expr.modifier in (operators.desc_op, operators.asc_op):
        return expr.element, expr.modifier is operators.desc_op
    return expr, False


def _plan_for_index(table: Table, index: Index) -> ShardPlan:
    # Read generically (any Index led by a shard column works, not only ShardedIndex):
    # first expression = the shard, the rest = the ordering, DESC from the modifier.
    parts = [_split(e) for e in index.expressions]
    first, _ = parts[0]
    if not is_shard_column(first):
        raise ShardConfigError(
            f"index {index.name!r} of {table.name!r} is not led by a shard column; "
            "use a ShardedIndex (or an index whose first column is a shard_column)"
        )
    return ShardPlan(
        table,
        get_shard_column(table, first.key),
        str(index.name),
        tuple(parts[1:]),
        tuple(table.primary_key.columns),
    )


def _plan_for_key(table: Table) -> ShardPlan:
    from sharded_orm.schema.keys import is_descending

    pk = list(table.primary_key.columns)
    if not pk or not is_shard_column(pk[0]):
        raise ShardConfigError(
            f"the primary key of {table.name!r} is not led by a shard column; pass index= "
            "naming a sharded index"
        )
    ordering = tuple((c, is_descending(c)) for c in pk[1:])
    return ShardPlan(table, get_shard_column(table, pk[0].key), None, ordering, tuple(pk))


def plan_for(entity: Any, index: str | None = None) -> ShardPlan:
    """The fan-out plan of ``entity`` through ``index`` (or its primary key)."""
    table = table_of(entity)
    if index is None:
        return _plan_for_key(table)
    check_identifier(index)
    for ix in table.indexes:
        if ix.name == index:
            return _plan_for_index(table, ix)
    raise ShardConfigError(
        f"{table.name!r} has no index named {index!r} "
        f"(indexes: {', '.join(sorted(str(i.name) for i in table.indexes)) or 'none'})"
    )


def sharded_select(entity: Any, *, index: str | None = None) -> Select[Any]:
    """``select(entity)`` that fans out over the shards of ``index`` (or of the key).

    ``entity`` is a mapped class or a ``Table``; ``index`` names an index of its table
    led by a shard column. The result is a plain ``Select``: add ``.where()``,
    ``.order_by()``, ``.limit()``, execute it, or hand it to ``merged`` / ``page``.
    """
    if isinstance(entity, Table):
        plan = plan_for(entity, index)
        return select(entity).execution_options(**{OPTION: plan})
    insp = inspect(entity, raiseerr=False)
    if not getattr(insp, "is_mapper", False):
        # an alias would get the shard predicate on the base table: a cross join
        alias = " (an alias: select from the class itself)" if insp is not None else ""
        raise ShardTypeError(
            f"sharded_select takes a mapped class or a Table, got {entity!r}{alias}"
        )
    plan = plan_for(entity, index)
    return select(entity).execution_options(**{OPTION: plan})


def plan_of(stmt: Any) -> ShardPlan | None:
    """The plan ``sharded_select`` attached to ``stmt``, or None for any other statement."""
    opts = getattr(stmt, "_execution_options", None)
    return opts.get(OPTION) if opts else None


def point_shard(plan: ShardPlan, stmt: Any, params: dict[str, Any] | None = None) -> int | None:
    """The single shard a WHERE clause pins, or None when it spans several."""
    from sharded_orm.write.sql import MISSING, literal_value, where_equalities

    eqs = {c._deannotate(): v for c, v in where_equalities(stmt.whereclause).items()}
    values = []
    for src in plan.shard.sources:
        if src not in eqs:
            return None
        v = literal_value(eqs[src], params or {})
        if v is MISSING or v is None:
            return None
        values.append(v)
    return plan.shard.compute(values)


def expand(
    stmt: Any,
    dialect: Any = None,
    params: dict[str, Any] | None = None,
    *,
    shard: int | None = None,
) -> Any:
    """The statement as it runs: shard predicate added, FORCE_INDEX hint on Spanner.

    ``shard`` restricts it to one shard (what the merge sends per branch); otherwise a
    point lookup reads its one shard and anything else the whole range.
    """
    from sharded_orm.spanner import is_spanner

    plan = plan_of(stmt)
    if plan is None:
        return stmt
    col = plan.shard.column
    k = shard if shard is not None else point_shard(plan, stmt, params)
    cond = col == k if k is not None else col.between(0, plan.shard.count - 1)
    new = stmt.where(cond).execution_options(**{OPTION: None})
    if plan.index_name is not None and dialect is not None and is_spanner(dialect):
        # Keyed by this dialect's own name, so the hint renders whatever name the dialect
        # registered under (the stock one drops hints given as plain "spanner").
        hint = f"@{{FORCE_INDEX={check_identifier(plan.index_name)}}}"
        new = new.with_hint(plan.table, hint, dialect.name)
    return new


def _expand_on_execute(
    conn: Connection,
    elem: Any,
    multiparams: list[dict[str, Any]],
    params: dict[str, Any],
    execution_options: Any,
) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    """sharded_select(...): add the shard predicate and, on Spanner, the index hint."""
    if isinstance(elem, Select) and elem._execution_options.get(OPTION) is not None:
        return expand(elem, conn.dialect, params), multiparams, params
    return elem, multiparams, params


event.listen(Engine, "before_execute", _expand_on_execute, retval=True)
