"""Sharded range queries in ORM syntax, whose SQL is the SQL that runs.

``sharded_select(LogEntry, index="LogEntriesByCompany")`` is a ``Select`` (a subclass):
extend it with ``.where()``, ``.join()``, ``.order_by()``, ``.limit()``; execute it, print
it, use it as a subquery, in a CTE, a count or a union. Two things are part of it:

* the shard predicate, a SQL construct (:class:`ShardPredicate`) in its WHERE clause:
  ``shard BETWEEN 0 AND N-1`` (every shard), or ``shard = k`` when each source of the
  shard column is fixed by ``col == value`` (a point lookup). ``where()`` recomputes ``k``
  from the whole WHERE clause, and ``k`` is part of the statement's cache key, so two
  lookups with different values never share a compiled form. ``k`` is used only when each
  value maps exactly to what its column stores (``stored_value``) and the column compares
  byte for byte; otherwise the query reads every shard (right, only slower).
* on Spanner, the ``@{FORCE_INDEX=...}`` table hint for the index (rendered for the Spanner
  dialect only).

The index (or key) may be on a table the entity inherits from (joined inheritance:
``sharded_select(Child, index="ParentByTs")`` hints the parent's table in the join). A
NULL_FILTERED index holds no row with NULL in an indexed column, so it answers only a
statement that excludes NULL on each of its nullable columns: that is checked when the
statement compiles (:func:`sharded_orm.read.criteria.nulls_excluded`), a statement that
does not is refused with ``ShardConfigError``, and one that does carries the emulator's
``disable_query_null_filtered_index_check`` hint (the emulator cannot prove it; Spanner
ignores the hint). ``flag == True`` pins a point lookup as a bound ``True`` does.

Values the WHERE clause names with ``bindparam("x")`` are known only at execution: at the
top level, a hook recomputes ``k`` from the execution parameters; inside a subquery such a
statement reads every shard. ``expand(stmt, params=...)`` shows what runs with given values.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Index,
    Select,
    Table,
    and_,
    inspect,
    select,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import ColumnElement, UnaryExpression
from sqlalchemy.sql.visitors import InternalTraversal
from typing_extensions import Self

from sharded_orm.checks import check_identifier
from sharded_orm.errors import ShardConfigError, ShardingError, ShardTypeError, ShardValueError
from sharded_orm.read.criteria import boolean_equalities, nulls_excluded
from sharded_orm.schema.coerce import has_case_insensitive_collation, stored_value
from sharded_orm.schema.columns import ShardColumn, get_shard_column, is_shard_column, table_of
from sharded_orm.spanner.stock import refuse_stock

#: dialect names the FORCE_INDEX hint is given for (the stock one and ours render both)
_HINT_DIALECT = "spanner+spanner"
#: the emulator's table hint for a NULL_FILTERED index it cannot prove usable
EMULATOR_NULL_FILTER_HINT = "spanner_emulator.disable_query_null_filtered_index_check=true"


class ShardPredicate(ColumnElement[bool]):
    """``shard = k`` (``point`` set) or ``shard BETWEEN 0 AND N-1``, compiled by ``@compiles``.

    ``point`` and ``fixed`` are in the cache key: a compiled form is reused only for the
    same shard. ``fixed`` marks a shard chosen by the caller (a merge branch), which a
    later ``where()`` must not recompute.
    """

    __visit_name__ = "sharded_orm_shard_predicate"
    inherit_cache = True
    _is_implicitly_boolean = True  # a comparison: no "= 1" around it where booleans are ints
    _traverse_internals = [
        ("column", InternalTraversal.dp_clauseelement),
        ("count", InternalTraversal.dp_plain_obj),
        ("point", InternalTraversal.dp_plain_obj),
        ("fixed", InternalTraversal.dp_plain_obj),
        ("not_null", InternalTraversal.dp_clauseelement_tuple),
        ("index", InternalTraversal.dp_plain_obj),
        ("var", InternalTraversal.dp_plain_obj),
    ]
    type = Boolean()

    def __init__(
        self,
        column: Any,
        count: int,
        point: int | None,
        fixed: bool = False,
        not_null: tuple[Any, ...] = (),
        index: str | None = None,
        var: str | None = None,
    ) -> None:
        self.column = column
        self.count = count
        self.point = point
        self.fixed = fixed
        self.not_null = not_null  # a NULL_FILTERED index's nullable columns
        self.index = index
        #: ``shard = <var>``: the shard named by an enclosing query (a correlated branch)
        self.var = var


@compiles(ShardPredicate)
def _compile_predicate(element: ShardPredicate, compiler: Any, **kw: Any) -> str:
    refuse_stock(compiler.dialect, "A sharded read (sharded_select, merged(), page())")
    if element.not_null and compiler.stack:
        _check_nulls_excluded(element, compiler.stack[-1].get("selectable"))
    col = element.column
    point = element.point
    if element.var is not None:
        return f"{compiler.process(col, **kw)} = {element.var}"
    expr = col.between(0, element.count - 1) if point is None else col == point
    return str(compiler.process(expr, **kw))


def _check_nulls_excluded(pred: ShardPredicate, select_: Any) -> None:
    where = getattr(select_, "_where_criteria", ())
    excluded: set[Any] = set()
    for c in where:
        if not isinstance(c, ShardPredicate):
            excluded |= nulls_excluded(c)
    missing = [c for c in pred.not_null if c._deannotate() not in excluded]
    if missing:
        names = ", ".join(repr(c.name) for c in missing)
        raise ShardConfigError(
            f"index {pred.index!r} is NULL_FILTERED: it holds no row whose {names} is NULL, "
            "so it cannot answer a statement that does not exclude those rows (the answer "
            "would silently miss them). Exclude NULL in the WHERE clause (e.g. "
            f".where({missing[0].name}.is_not(None)), or any comparison on it), or read "
            "through another index or the primary key."
        )


def split_criteria(criteria: tuple[Any, ...]) -> tuple[list[Any], ShardPredicate | None]:
    rest = [c for c in criteria if not isinstance(c, ShardPredicate)]
    preds = [c for c in criteria if isinstance(c, ShardPredicate)]
    return rest, (preds[0] if preds else None)


@dataclass(frozen=True)
class ShardPlan:
    """Which shard column (and index) a sharded query fans out over, and in what order."""

    table: Table
    shard: ShardColumn
    index_name: str | None  # None: the primary key
    ordering: tuple[tuple[Any, bool], ...]  # (column, descending) after the shard, in order
    key: tuple[Any, ...]  # primary-key columns, the tie-break that makes the order total
    #: a NULL_FILTERED index: its nullable columns (after the shard), on each of which the
    #: statement must exclude NULL, or the index cannot give the unsharded answer
    not_null: tuple[Any, ...] = ()
    #: (column, shard source) pairs one attribute maps to under joined inheritance
    #: (``Child.id`` is ``PlanChildren.Id`` = ``PlanParents.Id``): equal in every row read
    same_as: tuple[tuple[Any, Any], ...] = ()

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
    not_null: tuple[Any, ...] = ()
    # (.get never loads a dialect: a read on SQLite does not import the Spanner client)
    spanner: Any = index.dialect_options.get("spanner", {})
    if spanner.get("null_filtered"):
        not_null = tuple(c for c, _ in parts[1:] if getattr(c, "nullable", False))
    return ShardPlan(
        table,
        get_shard_column(table, first.key),
        str(index.name),
        tuple(parts[1:]),
        tuple(table.primary_key.columns),
        not_null,
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


def _tables_of(entity: Any) -> list[Table]:
    """The entity's own table, then those it inherits from (joined inheritance), up to
    the root: an index or a key of a parent's table serves the subclass too."""
    if isinstance(entity, Table):
        return [entity]
    tables = [table_of(entity)]
    for mapper in inspect(entity).iterate_to_root():
        local = mapper.local_table
        if isinstance(local, Table) and local not in tables:
            tables.append(local)
    return tables


def plan_for(entity: Any, index: str | None = None) -> ShardPlan:
    """The fan-out plan of ``entity`` through ``index`` (or its primary key), found on its
    own table or on a table it inherits from."""
    tables = _tables_of(entity)
    if index is None:
        led = [t for t in tables if _led_by_shard(t)]
        plan = _plan_for_key(led[0] if led else tables[0])
        return replace(plan, same_as=_inherited_equals(entity, plan)) if len(tables) > 1 else plan
    check_identifier(index)
    for table in tables:
        for ix in table.indexes:
            if ix.name == index:
                plan = _plan_for_index(table, ix)
                return (
                    replace(plan, same_as=_inherited_equals(entity, plan))
                    if table is not tables[0]
                    else plan
                )
    names = sorted({str(i.name) for t in tables for i in t.indexes})
    where = " or ".join(repr(t.name) for t in tables)
    raise ShardConfigError(
        f"{where} has no index named {index!r} (indexes: {', '.join(names) or 'none'})"
    )


def _inherited_equals(entity: Any, plan: ShardPlan) -> tuple[tuple[Any, Any], ...]:
    """Columns of a subclass's table that one attribute joins to a shard source."""
    sources = set(plan.shard.sources)
    pairs = []
    for prop in inspect(entity).column_attrs:
        cols = [c for c in prop.columns if isinstance(c, Column)]
        for src in (c for c in cols if c in sources):
            pairs += [(c, src) for c in cols if c is not src]
    return tuple(pairs)


def _led_by_shard(table: Table) -> bool:
    pk = list(table.primary_key.columns)
    return bool(pk) and is_shard_column(pk[0])


def point_of(plan: ShardPlan, criteria: Any, params: dict[str, Any] | None = None) -> int | None:
    """The one shard the WHERE criteria pin, or None when the query must read them all.

    Without ``params`` (compile time) a source compared with a named ``bindparam`` is
    unknown: its value may be given at execution. Each value must map exactly to what
    its column stores, and the column must compare byte for byte: the database compares
    stored values, so the hash has to be taken of them.
    """
    from sharded_orm.write.sql import MISSING, literal_value, where_equalities

    if isinstance(criteria, (tuple, list)):
        rest, _ = split_criteria(tuple(criteria))
        where = and_(*rest) if rest else None
    else:
        where = criteria
    eqs = {c._deannotate(): v for c, v in where_equalities(where).items()}
    eqs.update((c, v) for c, v in boolean_equalities(where).items() if c not in eqs)
    for col, src in plan.same_as:
        if col in eqs and src not in eqs:
            eqs[src] = eqs[col]
    values = []
    coercers = plan.shard.coercers
    for i, src in enumerate(plan.shard.sources):
        bind = eqs.get(src)
        if bind is None or has_case_insensitive_collation(src):
            return None
        if params is None and not getattr(bind, "unique", True):
            return None  # a named bindparam: its value may come at execution
        v = literal_value(bind, params or {})
        if v is MISSING or v is None:
            return None
        try:  # the shard column's own coercion: its naive-datetime policy included
            values.append(coercers[i](v) if coercers else stored_value(src, v))
        except ShardingError:
            return None  # the database converts it some other way: read every shard
    return plan.shard.compute(values)


class ShardedSelect(Select[Any]):
    """A ``Select`` that carries its shard predicate and plan (see the module docstring)."""

    inherit_cache = True
    _sharded_plan: ShardPlan

    def _with_predicate(self, point: int | None, fixed: bool, var: str | None = None) -> Self:
        rest, _ = split_criteria(self._where_criteria)
        plan = self._sharded_plan
        pred = ShardPredicate(
            plan.shard.column, plan.shard.count, point, fixed, plan.not_null, plan.index_name, var
        )
        self._where_criteria = (pred, *rest)
        return self

    def _refresh(self, params: dict[str, Any] | None = None) -> Self:
        _, pred = split_criteria(self._where_criteria)
        if pred is not None and pred.fixed:
            return self
        point = point_of(self._sharded_plan, self._where_criteria, params)
        return self._with_predicate(point, False)

    def where(self, *whereclause: Any) -> Self:
        return super().where(*whereclause)._refresh()

    def _execute_on_connection(
        self, connection: Any, distilled_params: Any, execution_options: Any
    ) -> Any:
        """Run with parameters (``.params()`` or at execution), the statement settles its
        point shard from them first.

        The statement's own hook into ``Connection.execute`` (Core and ORM), so no
        ``Engine`` listener is needed and other statements pay nothing."""
        # values given to .params() (SQLAlchemy 2.1 keeps them on the statement: params()
        # is not overridden, it is SQLAlchemy's own), then those given at execution
        given = dict(getattr(self, "_params", None) or {})
        if distilled_params and len(distilled_params) == 1 and distilled_params[0]:
            given.update(distilled_params[0])
        stmt: Select[Any] = expand(self, None, given) if given else self
        return Select._execute_on_connection(stmt, connection, distilled_params, execution_options)

    def for_shard(self, shard: int) -> Self:
        """This statement restricted to one shard (one branch of a merge)."""
        return self._generate()._with_predicate(shard, True)

    def for_shard_named(self, var: str) -> Self:
        """This statement restricted to the shard an enclosing query names ``var`` (the
        correlated branch of a merge on Spanner: one text for every shard count)."""
        return self._generate()._with_predicate(None, True, var)

    def without_plan(self, where: bool = True) -> Select[Any]:
        """A plain ``Select``: this statement without its shard predicate and index hint
        (and, ``where`` False, without its WHERE clause).

        For the rows statement of a merge, joined on the primary key to branches that
        carry them: there the hint would make Spanner find each row through the index
        (reading the whole range), and the rest is text the DB-API parses for nothing.
        """
        rest, _ = split_criteria(self._where_criteria)
        plain: Select[Any] = Select.__new__(Select)
        plain.__dict__ = self._generate().__dict__
        del plain.__dict__["_sharded_plan"]
        plain._where_criteria = tuple(rest) if where else ()
        ours = (self._sharded_plan.table, _HINT_DIALECT)
        plain._hints = type(plain._hints)({k: v for k, v in plain._hints.items() if k != ours})
        return plain

    @property
    def point_shard(self) -> int | None:
        """The one shard this statement reads, or None when it reads every shard."""
        _, pred = split_criteria(self._where_criteria)
        return pred.point if pred is not None else None


def sharded_select(entity: Any, *, index: str | None = None) -> ShardedSelect:
    """``select(entity)`` that fans out over the shards of ``index`` (or of the key).

    ``entity`` is a mapped class or a ``Table``; ``index`` names an index of its table
    led by a shard column. The result is a ``Select``: add ``.where()``, ``.join()``,
    ``.order_by()``, ``.limit()``, execute it, compose it, or hand it to ``merged`` / ``page``.
    """
    if not isinstance(entity, Table):
        insp = inspect(entity, raiseerr=False)
        if not getattr(insp, "is_mapper", False):
            # an alias would get the shard predicate on the base table: a cross join
            alias = " (an alias: select from the class itself)" if insp is not None else ""
            raise ShardTypeError(
                f"sharded_select takes a mapped class or a Table, got {entity!r}{alias}"
            )
    plan = plan_for(entity, index)
    base: Select[Any] = select(entity)
    if plan.index_name is not None:
        hint = f"FORCE_INDEX={check_identifier(plan.index_name)}"
        if plan.not_null:
            # the statement is checked to exclude NULL where the index does (at compile);
            # the emulator cannot prove that itself and asks for this hint, which Spanner
            # ignores
            hint += f", {EMULATOR_NULL_FILTER_HINT}"
        hint = f"@{{{hint}}}"
        base = base.with_hint(plan.table, hint, _HINT_DIALECT)
    stmt = ShardedSelect.__new__(ShardedSelect)
    stmt.__dict__.update(base.__dict__)
    stmt._sharded_plan = plan
    return stmt._with_predicate(None, False)


def plan_of(stmt: Any) -> ShardPlan | None:
    """The plan of a ``sharded_select`` statement, or None for any other statement."""
    return getattr(stmt, "_sharded_plan", None) if isinstance(stmt, ShardedSelect) else None


def expand(
    stmt: Any,
    dialect: Any = None,
    params: dict[str, Any] | None = None,
    *,
    shard: int | None = None,
) -> Any:
    """The statement as it runs with these execution ``params`` (or on one ``shard``).

    The shard predicate and the hint are already part of a ``sharded_select``; this only
    settles the point shard from values given at execution. ``dialect`` is accepted for
    compatibility (the hint renders for Spanner only, whatever it is).
    """
    if not isinstance(stmt, ShardedSelect):
        raise (ShardTypeError if stmt is None else ShardConfigError)(
            f"expand() takes a statement made by sharded_select(...), got {stmt!r}"
        )
    if shard is not None:
        count = stmt._sharded_plan.shard.count
        if not isinstance(shard, int) or isinstance(shard, bool):
            raise ShardTypeError(f"shard must be an int in [0, {count}), got {shard!r}")
        if not 0 <= shard < count:
            raise ShardValueError(f"shard must be in [0, {count}), got {shard}")
        return stmt.for_shard(shard)
    if params:
        return stmt._generate()._refresh(params)
    return stmt
