"""Reading SQLAlchemy statements: the bound values and equalities the write and read paths use.

Both the engine hook (writes) and the query planner (point lookups) need to know what a
statement binds; this is the one place that looks inside statement objects for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.sql import operators
from sqlalchemy.sql.dml import ValuesBase
from sqlalchemy.sql.elements import (
    BinaryExpression,
    BindParameter,
    BooleanClauseList,
    ClauseElement,
    ColumnClause,
)
from sqlalchemy.sql.schema import Column

from sharded_orm.errors import ShardConfigError

#: Returned where a value is SQL (or absent) rather than a Python value.
MISSING: Any = object()


class DefaultContext:
    """Stands in for SQLAlchemy's execution context when we evaluate a source's default.

    Context-sensitive defaults (``def f(ctx): ctx.get_current_parameters()``) see the row.
    """

    def __init__(self, row: Mapping[str, Any]) -> None:
        self.current_parameters = dict(row)

    def get_current_parameters(self, isolate_multiinsert_groups: bool = True) -> dict[str, Any]:
        return self.current_parameters


def literal_value(expr: Any, row: Mapping[str, Any] | None = None) -> Any:
    """The Python value behind a bound expression, or ``MISSING`` for real SQL."""
    if isinstance(expr, BindParameter):
        if row is not None and not expr.unique and expr.key in row:
            return row[expr.key]
        if expr.callable is not None:
            return expr.callable()
        return expr.value
    if isinstance(expr, ClauseElement):
        return MISSING
    return expr  # a plain Python value


def where_equalities(where: Any) -> dict[ColumnClause[Any], Any]:
    """``{column: bound expression}`` for each ``column = <bound value>`` ANDed in ``where``
    (table columns, and the ``sa.column()`` of a lightweight ``sa.table()``)."""
    found: dict[ColumnClause[Any], Any] = {}
    stack = [where] if where is not None else []
    while stack:
        clause = stack.pop()
        if isinstance(clause, BooleanClauseList) and clause.operator is operators.and_:
            stack.extend(clause.clauses)
        elif isinstance(clause, BinaryExpression) and clause.operator is operators.eq:
            left, right = clause.left, clause.right
            if isinstance(right, ColumnClause) and isinstance(left, BindParameter):
                left, right = right, left
            if isinstance(left, ColumnClause) and isinstance(right, BindParameter):
                found[left] = right
    return found


def column_key(k: Any) -> Any:
    """The column key a ``.values()``/``ON CONFLICT`` key stands for: a string as it is, a
    column by its ``.key``; None for anything else."""
    return k if isinstance(k, str) else getattr(k, "key", None)


def statement_values(stmt: ValuesBase) -> dict[str, Any]:
    """Values given with ``.values(...)`` (single row), keyed by column key."""
    # SQLAlchemy keeps .values() here (no public accessor exists); 2.0 keeps
    # ordered_values() apart, in _ordered_values, while 2.1 keeps both in _values
    raw = stmt._values or dict(getattr(stmt, "_ordered_values", None) or ())
    if not raw:
        return {}
    out = {}
    for k, v in raw.items():
        key = column_key(k)
        if key is not None:
            out[key] = v
    return out


def _python_value(generator: Any, row: Mapping[str, Any]) -> Any:
    """What a Python-side default or onupdate gives ``row``; MISSING for a SQL one."""
    if getattr(generator, "is_scalar", False):
        return generator.arg
    if getattr(generator, "is_callable", False):
        return generator.arg(DefaultContext(row))
    return MISSING


def evaluate_default(col: Column[Any], row: Mapping[str, Any]) -> Any:
    if col.default is None:
        return MISSING
    value = _python_value(col.default, row)
    if value is MISSING:
        raise ShardConfigError(
            f"column {col.name!r} is a shard source but its default is SQL or a sequence "
            "evaluated by the database, so the client cannot hash it; give the value explicitly"
        )
    return value


def evaluate_onupdate(col: Column[Any], row: Mapping[str, Any]) -> Any:
    """The value a source's Python ``onupdate`` gives this row (the hook sends it, so the
    stored source is the hashed one); SQL onupdates are refused at declaration."""
    value = _python_value(col.onupdate, row)
    if value is MISSING:
        raise ShardConfigError(
            f"column {col.name!r} is a shard source with a SQL onupdate; the client cannot hash it"
        )
    return value
