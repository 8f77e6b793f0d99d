"""The total order a sharded read is merged and paged in, and SQL conditions over it.

The order is the index's ordering, then the primary key of the sharded table, then (for
a statement with joins and no DISTINCT) the primary key of each joined table: a join can
repeat a row of the sharded table, and only the joined rows' keys tell the copies apart.
Columns pinned by ``col == value`` are constant and left out.

NULL sorts as the smallest value, as SQLite and Spanner order it (NULLs first ascending,
last descending; checked on the emulator). Dialects that sort NULL high are refused when
an ordering column is nullable.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Boolean, and_, false, literal, or_, true
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import Label, UnaryExpression
from sqlalchemy.sql.selectable import Join

from sharded_orm.errors import ShardConfigError, UnsupportedOnDialectError
from sharded_orm.read.plan import ShardPlan, ShardPredicate, plan_of

_NULLS_HIGH = frozenset({"postgresql", "oracle"})


class _Desc:
    """Inverts the order of a value inside a sort key."""

    __slots__ = ("v",)

    def __init__(self, v: Any) -> None:
        self.v = v

    def __lt__(self, other: _Desc) -> bool:
        return bool(other.v < self.v)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and bool(self.v == other.v)

    def __hash__(self) -> int:
        return hash(self.v)


def _ascending(v: Any) -> tuple[Any, ...]:
    """A value as the database orders it: NULL first, then by value."""
    if v is None:
        return (0,)
    if isinstance(v, dt.datetime):
        # Spanner timestamps carry nanoseconds that datetime comparison ignores
        return (1, v, getattr(v, "nanosecond", 0))
    return (1, v)


def sort_key(columns: Sequence[tuple[Any, bool]], values: Sequence[Any]) -> tuple[Any, ...]:
    """A Python key that orders ``values`` the way the database orders ``columns``."""
    return tuple(
        _Desc(_ascending(v)) if desc else _ascending(v)
        for (_, desc), v in zip(columns, values, strict=True)
    )


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
    return {plain(c) for c in where_equalities(and_(*rest) if rest else None)}


def tables_of(frm: Any) -> list[Any]:
    """The tables (or other FROMs) a FROM joins, left to right."""
    frm = plain(frm)
    if isinstance(frm, Join):
        return tables_of(frm.left) + tables_of(frm.right)
    return [frm]


def without_options(stmt: Any) -> Any:
    """``stmt`` without its loader options: the user's own FROMs, no eager-load joins."""
    bare = stmt.options()
    bare._with_options = ()
    return bare


def _joined_keys(plan: ShardPlan, stmt: Any) -> list[Any]:
    keys: list[Any] = []
    for frm in without_options(stmt).get_final_froms():
        for t in tables_of(frm):
            if t is plan.table:
                continue
            pk = list(getattr(t, "primary_key", None) or ())
            if not pk:
                raise ShardConfigError(
                    f"merged()/page() cannot order the rows of a join with "
                    f"{getattr(t, 'name', t)!r}: it has no primary key to tell its rows apart. "
                    "Join a table, or select DISTINCT columns that hold the key of "
                    f"{plan.table.name!r}."
                )
            keys += [plain(c) for c in pk]
    return keys


def order_columns(stmt: Any) -> list[tuple[Any, bool]]:
    """(column, descending) that a ``sharded_select`` is merged and paged by.

    Raises ``ShardConfigError`` when the statement's ORDER BY is not a prefix of it.
    """
    plan = require_plan(stmt, "order_columns")
    pinned = _pinned(stmt)
    wanted = [(c, d) for c, d in plan.sort_columns if c not in pinned]
    if not stmt._distinct:
        seen = {c for c, _ in wanted}
        for c in _joined_keys(plan, stmt):
            if c not in pinned and c not in seen:
                wanted.append((c, False))
                seen.add(c)
    given = []
    for clause in stmt._order_by_clauses:
        desc = isinstance(clause, UnaryExpression) and clause.modifier is operators.desc_op
        asc = isinstance(clause, UnaryExpression) and clause.modifier is operators.asc_op
        col = plain(clause.element if desc or asc else clause)
        if col not in pinned:  # a constant orders nothing
            given.append((col, desc))
    for i, (col, desc) in enumerate(given):
        if i >= len(wanted) or col is not wanted[i][0] or desc != wanted[i][1]:
            text = ", ".join(f"{c.name}{' DESC' if d else ''}" for c, d in wanted)
            raise ShardConfigError(
                f"ORDER BY cannot be served by {plan.index_name or 'the primary key'} of "
                f"{plan.table.name!r}: it serves ({text}) or a prefix of it. Merging any "
                "other order would mean reading and sorting every matching row; order by "
                "the index, or pass index= naming an index in the order you want."
            )
    return wanted


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


def _bound(col: Any, v: Any) -> Any:
    """``v`` as a bound parameter of ``col``'s type (its bind processing included)."""
    return literal(v, col.type)


def _nullable(col: Any) -> bool:
    return bool(getattr(col, "nullable", True))


def _is_null(v: Any) -> Any:
    """Whether ``v`` is NULL, as a bound BOOL (Spanner cannot type ``@p IS NULL``)."""
    return literal(v is None, Boolean())


# For a nullable column the conditions take whether the value is NULL as a bound flag,
# so the statement has one shape whether a cursor's value is NULL or not.


def _after_one(col: Any, desc: bool, v: Any) -> Any:
    """Strictly after ``v`` in ``col``'s direction (NULL is smallest)."""
    p = _bound(col, v)
    if not _nullable(col):
        return col < p if desc else col > p
    if not desc:
        return or_(col > p, and_(_is_null(v), col.is_not(None)))
    return or_(col < p, and_(col.is_(None), ~_is_null(v)))


def _equal(col: Any, v: Any) -> Any:
    p = _bound(col, v)
    if not _nullable(col):
        return col == p
    return or_(col == p, and_(col.is_(None), _is_null(v)))


def after_condition(columns: Sequence[tuple[Any, bool]], values: Sequence[Any]) -> Any:
    """Rows strictly after ``values`` in the order of ``columns`` (keyset continuation)."""
    ors = []
    for i, (col, desc) in enumerate(columns):
        eqs = [_equal(c, v) for (c, _), v in zip(columns[:i], values[:i], strict=True)]
        ors.append(and_(*eqs, _after_one(col, desc, values[i])))
    return or_(*ors) if ors else false()


def _at_or_before_one(col: Any, desc: bool, v: Any) -> Any:
    """At or before ``v`` in ``col``'s direction (NULL is smallest)."""
    p = _bound(col, v)
    if not _nullable(col):
        return col >= p if desc else col <= p
    if desc:
        return or_(col >= p, _is_null(v))
    return or_(col <= p, col.is_(None))


def at_or_before_condition(columns: Sequence[tuple[Any, bool]], values: Sequence[Any]) -> Any:
    """Rows at or before ``values`` in the order of ``columns`` (the merge's upper bound)."""
    ors = []
    last = len(columns) - 1
    for i, (col, desc) in enumerate(columns):
        eqs = [_equal(c, v) for (c, _), v in zip(columns[:i], values[:i], strict=True)]
        if i == last:
            ors.append(and_(*eqs, _at_or_before_one(col, desc, values[i])))
        else:  # strictly before in one direction is strictly after in the other
            ors.append(and_(*eqs, _after_one(col, not desc, values[i])))
    return or_(*ors) if ors else true()
