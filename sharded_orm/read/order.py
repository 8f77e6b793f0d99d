"""The total order a sharded read is merged and paged in, and SQL conditions over it.

The order is the index's ordering, then the primary key of the sharded table, then (for
a statement with joins and no DISTINCT) the primary key of each joined table: a join can
repeat a row of the sharded table, and only the joined rows' keys tell the copies apart.
Columns pinned by ``col == value`` (a Boolean one also by ``flag``, ``~flag``, ``flag ==
True``, ``flag.is_(False)``..., any by ``col IS NULL``) are constant and left out.

NULL sorts as the smallest value, as SQLite and Spanner order it (NULLs first ascending,
last descending; checked on the emulator). Dialects that sort NULL high are refused when
an ordering column is nullable.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    Table,
    TypeDecorator,
    and_,
    bindparam,
    false,
    literal,
    or_,
    true,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import (
    ColumnElement,
    Label,
    UnaryExpression,
    _label_reference,
    _textual_label_reference,
)
from sqlalchemy.sql.selectable import Join
from sqlalchemy.sql.visitors import InternalTraversal

from sharded_orm.errors import ShardConfigError, UnsupportedOnDialectError
from sharded_orm.memo import Memo
from sharded_orm.read.criteria import boolean_equalities, null_pins
from sharded_orm.read.joins import check_joins, proven_key, without_options
from sharded_orm.read.plan import ShardPlan, ShardPredicate, plan_of

_NULLS_HIGH = frozenset({"postgresql", "oracle"})


def plain(expr: Any) -> Any:
    """A column without ORM annotations (and without a label)."""
    if isinstance(expr, Label):
        expr = expr.element
    return expr._deannotate() if hasattr(expr, "_deannotate") else expr


def require_plan(stmt: Any, who: str) -> ShardPlan:
    plan = plan_of(stmt)
    if plan is None:
        raise ShardConfigError(f"{who}() needs a statement made by sharded_select(...)")
    return plan


def _pinned(stmt: Any) -> set[Any]:
    from sharded_orm.write.sql import where_equalities

    rest = [c for c in stmt._where_criteria if not isinstance(c, ShardPredicate)]
    where = and_(*rest) if rest else None
    # ``col == value``, a Boolean column pinned as SQLAlchemy writes it (``flag``,
    # ``flag == True``, ``flag.is_(True)``, ``~flag``...), ``col IS NULL``: one value in
    # every row
    eqs = {plain(c) for c in where_equalities(where)}
    return eqs | set(boolean_equalities(where)) | null_pins(where)


def tables_of(frm: Any) -> list[Any]:
    """The tables (or other FROMs) a FROM joins, left to right."""
    frm = plain(frm)
    if isinstance(frm, Join):
        return tables_of(frm.left) + tables_of(frm.right)
    return [frm]


#: final_froms by statement shape (SQLAlchemy's cache key), for FROMs that are all tables
_FROMS: Memo[Any, list[Any]] = Memo("read.final_froms", 512)


def final_froms(stmt: Any) -> list[Any]:
    """The tables (and other FROMs) of ``stmt`` without its loader options, joins
    flattened (``tables_of``).

    SQLAlchemy finds them by compiling the statement (about 0.3 ms, a tenth of a small
    merge's client CPU), so they are kept by the statement's cache key, which holds each
    table itself: once per statement shape. Not where a FROM is an alias or a subquery:
    two anonymous aliases of one table share a cache key.
    """
    return froms_and_key(stmt)[0]


def froms_and_key(stmt: Any) -> tuple[list[Any], Any]:
    """``final_froms(stmt)`` and the cache key of ``stmt`` without its options (None for
    a statement SQLAlchemy cannot cache): its bound parameters are the statement's."""
    bare = without_options(stmt)
    key = bare._generate_cache_key()
    if key is not None and (kept := _FROMS.get(key.key)) is not None:
        return list(kept), key
    finals = bare.get_final_froms()
    plan = plan_of(stmt)
    if plan is not None:
        for frm in finals:
            check_joins(plain(frm), plan.table)
    froms = [t for frm in finals for t in tables_of(frm)]
    if key is not None and all(isinstance(t, Table) for t in froms):
        _FROMS.put(key.key, froms)
    return list(froms), key


def _joined_keys(plan: ShardPlan, froms: Sequence[Any]) -> list[Any]:
    keys: list[Any] = []
    for frm in froms:
        for t in tables_of(frm):
            if t is plan.table:
                continue
            pk = proven_key(t)
            if not pk:
                raise ShardConfigError(
                    f"merged()/page() cannot order the rows of a join with "
                    f"{getattr(t, 'name', t)!r}: it has no primary key to tell its rows apart "
                    "(a subquery has one when it selects the whole key of its one table, or "
                    "groups by columns it selects). Join a table, or select DISTINCT columns "
                    f"that hold the key of {plan.table.name!r}."
                )
            keys += [plain(c) for c in pk]
    return keys


def _distinct_columns(stmt: Any, plan: ShardPlan) -> list[Any]:
    """The selected columns of other tables than ours: DISTINCT rows are unique over the
    select list, so these tell apart the rows one row of ours gives with a join (they
    are selected, so ordering by them changes nothing DISTINCT removes)."""
    out = []
    for c in stmt.selected_columns:
        col = plain(c)
        if all(t is plan.table for t in getattr(col, "_from_objects", ())):
            continue
        if not isinstance(col, Column):
            raise ShardConfigError(
                f"merged()/page() cannot order the DISTINCT rows of {plan.table.name!r} by "
                f"{col}: an expression over a joined table can repeat one of its rows with "
                "other values. Select the joined table's columns themselves, or drop DISTINCT."
            )
        out.append(col)
    return out


def order_columns(stmt: Any) -> list[tuple[Any, bool]]:
    """(column, descending) that a ``sharded_select`` is merged and paged by.

    Raises ``ShardConfigError`` when the statement's ORDER BY is not a prefix of it.
    """
    require_plan(stmt, "order_columns")  # its error first, then the FROMs
    return order_over(stmt, final_froms(stmt) if not stmt._distinct else [])


def order_over(stmt: Any, froms: Sequence[Any]) -> list[tuple[Any, bool]]:
    """``order_columns(stmt)`` given ``final_froms(stmt)`` (a read computes those once)."""
    plan = require_plan(stmt, "order_columns")
    pinned = _pinned(stmt)
    wanted = [(c, d) for c, d in plan.sort_columns if c not in pinned]
    seen = {c for c, _ in wanted}
    ties = _distinct_columns(stmt, plan) if stmt._distinct else _joined_keys(plan, froms)
    for c in ties:
        if c not in pinned and c not in seen:
            wanted.append((c, False))
            seen.add(c)
    given = []
    for clause in stmt._order_by_clauses:
        col, desc, nulls_first = _order_term(stmt, clause)
        if col not in pinned:  # a constant orders nothing
            given.append((col, desc, nulls_first))
    for i, (col, desc, nulls_first) in enumerate(given):
        if i < len(wanted) and col is wanted[i][0] and desc == wanted[i][1]:
            if nulls_first is not None and nulls_first == desc and _can_be_null(col, plan):
                first, last = ("FIRST", "LAST") if desc else ("LAST", "FIRST")
                raise ShardConfigError(
                    f"ORDER BY {col.name}{' DESC' if desc else ''} NULLS {first} cannot be "
                    f"served by {plan.index_name or 'the primary key'} of "
                    f"{plan.table.name!r}: it keeps NULL {last.lower()} in that direction "
                    "(NULL sorts as the smallest value, as SQLite and Spanner order it), and "
                    "any other place would mean reading and sorting every matching row. "
                    f"Write NULLS {last}, or leave the NULLS placement out."
                )
            continue
        text = ", ".join(f"{c.name}{' DESC' if d else ''}" for c, d in wanted)
        raise ShardConfigError(
            f"ORDER BY cannot be served by {plan.index_name or 'the primary key'} of "
            f"{plan.table.name!r}: it serves ({text}) or a prefix of it. Merging any "
            "other order would mean reading and sorting every matching row; order by "
            "the index (its columns, labels of them, NULLS placed where the index keeps "
            "them), or pass index= naming an index in the order you want."
        )
    return wanted


def _order_term(stmt: Any, clause: Any) -> tuple[Any, bool, bool | None]:
    """(column, descending, NULLS FIRST: True, NULLS LAST: False, not said: None) of one
    ORDER BY term: a column, a label of it (or its name), with ASC/DESC and NULLS."""
    desc, nulls_first = False, None
    while True:
        if isinstance(clause, _textual_label_reference):  # order_by("name")
            clause = stmt.selected_columns.get(clause.element, clause)
            if isinstance(clause, _textual_label_reference):
                return clause, desc, nulls_first  # no such column: refused as it is
        elif isinstance(clause, _label_reference):
            clause = clause.element
        elif isinstance(clause, UnaryExpression) and clause.modifier in _NULLS:
            nulls_first = clause.modifier is operators.nulls_first_op
            clause = clause.element
        elif isinstance(clause, UnaryExpression) and clause.modifier in _DIRECTIONS:
            desc = clause.modifier is operators.desc_op
            clause = clause.element
        elif isinstance(clause, Label):
            clause = clause.element
        else:
            return plain(clause), desc, nulls_first


_NULLS = (operators.nulls_first_op, operators.nulls_last_op)
_DIRECTIONS = (operators.desc_op, operators.asc_op)


def _can_be_null(col: Any, plan: ShardPlan) -> bool:
    """Whether ``col`` can be NULL in the statement's rows (an outer join makes a joined
    table's column NULL however it is declared)."""
    return getattr(col, "table", None) is not plan.table or bool(getattr(col, "nullable", True))


def check_nulls(dialect: Any, columns: Sequence[tuple[Any, bool]]) -> None:
    """Refuse a dialect that sorts NULL high when an ordering column can be NULL."""
    if getattr(dialect, "name", "") in _NULLS_HIGH:
        nullable = [c.name for c, _ in columns if getattr(c, "nullable", True)]
        if nullable:
            raise UnsupportedOnDialectError(
                f"{dialect.name} sorts NULL after every value; merged()/page() assume NULL "
                f"first (SQLite, Spanner). Make {', '.join(nullable)} NOT NULL."
            )


# ----------------------------------------------------------------------------- keyset


class EnumName(str):
    """An Enum member's name, read back from a cursor: bound as that member of the
    column's enum class (an Enum stored by value, ``values_callable``, does not store
    the name)."""


@dataclass(frozen=True)
class Slot:
    """A sort value given at execution, as the parameter ``name`` (and whether it is
    NULL, NaN: ``name`` + "n", + "x"; ``slot_values`` gives all three).

    A condition over slots has one text whatever the values: built once, it is reused
    with each read's values (``sharded_orm.read.branches``, the statement shapes)."""

    name: str


def slots(prefix: str, count: int) -> list[Slot]:
    """``count`` slots named ``prefix0``, ``prefix1``..."""
    return [Slot(f"{prefix}{i}") for i in range(count)]


def slot_values(
    columns: Sequence[tuple[Any, bool]], prefix: str, values: Sequence[Any]
) -> dict[str, Any]:
    """The execution parameters of the slots ``prefix<i>`` holding ``values``."""
    params: dict[str, Any] = {}
    for i, ((col, _), v) in enumerate(zip(columns, values, strict=True)):
        params[f"{prefix}{i}"] = _stored(col, v)
        params[f"{prefix}{i}n"] = v is None
        params[f"{prefix}{i}x"] = isinstance(v, float) and math.isnan(v)
    return params


def _bound(col: Any, v: Any) -> Any:
    """``v`` as a bound parameter of ``col``'s type (its bind processing included), or
    as it is when it is SQL already (a bound the statement finds itself)."""
    if isinstance(v, ColumnElement):
        return v
    if isinstance(v, Slot):
        return bindparam(v.name, type_=col.type)
    return literal(_stored(col, v), col.type)


def _stored(col: Any, v: Any) -> Any:
    """``v`` as ``col`` binds it: an enum member given by name becomes the member."""
    if isinstance(v, EnumName):
        t = col.type.impl_instance if isinstance(col.type, TypeDecorator) else col.type
        members = getattr(t, "enum_class", None)
        if members is not None and v in members.__members__:
            v = members[v]
    return v


def _nullable(col: Any, joined: Collection[int]) -> bool:
    """Whether ``col`` can be NULL in the statement's rows: declared so, or a key of a
    joined table (``joined``, by ``id``), which an outer join makes NULL where no row
    matched however it is declared."""
    return id(col) in joined or bool(getattr(col, "nullable", True))


def joined_columns(columns: Sequence[tuple[Any, bool]], table: Any) -> frozenset[int]:
    """The ``id`` of each order column that is not ``table``'s (the sharded table's)."""
    return frozenset(id(c) for c, _ in columns if getattr(c, "table", None) is not table)


def _is_null(v: Any) -> Any:
    """Whether ``v`` is NULL, as a bound BOOL (Spanner cannot type ``@p IS NULL``)."""
    if isinstance(v, Slot):
        return bindparam(f"{v.name}n", type_=Boolean())
    return v.is_(None) if isinstance(v, ColumnElement) else literal(v is None, Boolean())


class IsNan(ColumnElement[bool]):
    """``IS_NAN(col)`` on Spanner, which orders NaN after NULL and before every number;
    FALSE elsewhere (SQLite stores a NaN as NULL)."""

    __visit_name__ = "sharded_orm_is_nan"
    inherit_cache = True
    _is_implicitly_boolean = True
    _traverse_internals = [("col", InternalTraversal.dp_clauseelement)]
    type = Boolean()

    def __init__(self, col: Any) -> None:
        self.col = col


@compiles(IsNan)
def _compile_is_nan(element: IsNan, compiler: Any, **kw: Any) -> str:
    if str(compiler.dialect.name).startswith("spanner"):
        return f"IS_NAN({compiler.process(element.col, **kw)})"
    return str(compiler.process(false(), **kw))


def _floating(col: Any) -> bool:
    # the type itself, not its ``_type_affinity``: SQLAlchemy 2.0 gives Float's as Numeric
    t = getattr(col, "type", None)
    if isinstance(t, TypeDecorator):
        t = t.impl_instance
    return isinstance(t, Float)


def _is_nan(v: Any) -> Any:
    if isinstance(v, ColumnElement):
        return IsNan(v)
    if isinstance(v, Slot):
        return bindparam(f"{v.name}x", type_=Boolean())
    return literal(isinstance(v, float) and math.isnan(v), Boolean())


# For a nullable column the conditions take whether the value is NULL as a bound flag,
# and for a float column whether it is NaN, so the statement has one shape whatever the
# cursor's values (a value that is SQL, a bound the statement finds itself, is tested
# there: ``IS NULL``, ``IS_NAN``). The database's order, NULL < NaN < every number
# ascending (Spanner), is written out in SQL: no value is compared in Python, and NaN,
# which compares false with everything, is told by IS_NAN.


def _after_one(col: Any, desc: bool, v: Any, joined: Collection[int]) -> Any:
    """Strictly after ``v`` in ``col``'s direction (NULL is smallest, then NaN)."""
    p = _bound(col, v)
    terms = [col < p if desc else col > p]
    nullable = _nullable(col, joined)
    if nullable:
        terms.append(
            and_(col.is_(None), ~_is_null(v)) if desc else and_(_is_null(v), col.is_not(None))
        )
    if _floating(col):
        if desc:  # NaN follows every number: after v unless v is NaN or NULL
            terms.append(and_(IsNan(col), ~_is_nan(v), ~_is_null(v)))
        else:  # after NaN: every number
            terms.append(and_(_is_nan(v), ~IsNan(col)))
    return terms[0] if len(terms) == 1 else or_(*terms)


def _equal(col: Any, v: Any, joined: Collection[int]) -> Any:
    p = _bound(col, v)
    terms = [col == p]
    if _nullable(col, joined):
        terms.append(and_(col.is_(None), _is_null(v)))
    if _floating(col):
        terms.append(and_(IsNan(col), _is_nan(v)))
    return terms[0] if len(terms) == 1 else or_(*terms)


def after_condition(
    columns: Sequence[tuple[Any, bool]], values: Sequence[Any], joined: Collection[int] = ()
) -> Any:
    """Rows strictly after ``values`` in the order of ``columns`` (keyset continuation);
    ``joined``: see ``joined_columns``."""
    ors = []
    for i, (col, desc) in enumerate(columns):
        eqs = [_equal(c, v, joined) for (c, _), v in zip(columns[:i], values[:i], strict=True)]
        ors.append(and_(*eqs, _after_one(col, desc, values[i], joined)))
    return or_(*ors) if ors else false()


def _at_or_before_one(col: Any, desc: bool, v: Any, joined: Collection[int]) -> Any:
    """At or before ``v`` in ``col``'s direction (NULL is smallest, then NaN)."""
    p = _bound(col, v)
    terms = [col >= p if desc else col <= p]
    if _nullable(col, joined):
        terms.append(_is_null(v) if desc else col.is_(None))
    if _floating(col):
        if desc:  # at or before NaN: every row but NULL
            terms.append(and_(_is_nan(v), col.is_not(None)))
        else:  # NaN precedes every number
            terms.append(and_(IsNan(col), ~_is_null(v)))
    return terms[0] if len(terms) == 1 else or_(*terms)


def at_or_before_condition(
    columns: Sequence[tuple[Any, bool]], values: Sequence[Any], joined: Collection[int] = ()
) -> Any:
    """Rows at or before ``values`` in the order of ``columns`` (the merge's upper bound);
    ``joined``: see ``joined_columns``."""
    ors = []
    last = len(columns) - 1
    for i, (col, desc) in enumerate(columns):
        eqs = [_equal(c, v, joined) for (c, _), v in zip(columns[:i], values[:i], strict=True)]
        if i == last:
            ors.append(and_(*eqs, _at_or_before_one(col, desc, values[i], joined)))
        else:  # strictly before in one direction is strictly after in the other
            ors.append(and_(*eqs, _after_one(col, not desc, values[i], joined)))
    return or_(*ors) if ors else true()
