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


class ContextAttributeError(ShardConfigError, AttributeError):
    """A default's callable read something of :class:`DefaultContext` it does not offer
    (an ``AttributeError`` too, so ``getattr(ctx, name, None)`` still works)."""


class DefaultContext:
    """Stands in for SQLAlchemy's execution context when the write path evaluates a
    column's Python ``default``/``onupdate`` ahead of SQLAlchemy (to hash and send the
    value the row stores).

    A context-sensitive callable (``def f(ctx): ...``) reads of it what SQLAlchemy's own
    context gives at that point: ``get_current_parameters()`` / ``current_parameters``,
    the statement's parameters as values (never the statement's ``BindParameter``
    objects) keyed by column key; ``current_column``; ``isinsert`` / ``isupdate``; and
    the ``connection``, ``dialect``, ``engine`` and ``execution_options`` of the write
    when it runs on one. Anything else is refused with the reason, not an
    ``AttributeError``."""

    isdelete = False

    def __init__(
        self,
        params: Mapping[str, Any],
        column: Column[Any] | None = None,
        *,
        isinsert: bool = True,
        connection: Any = None,
    ) -> None:
        self.current_parameters = dict(params)
        self.current_column = column
        self.isinsert = isinsert
        self.isupdate = not isinsert
        self.connection = self.root_connection = connection
        self.dialect = getattr(connection, "dialect", None)
        self.engine = getattr(connection, "engine", None)
        self.execution_options = (
            connection.get_execution_options() if connection is not None else {}
        )

    def get_current_parameters(self, isolate_multiinsert_groups: bool = True) -> dict[str, Any]:
        return self.current_parameters

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        col = getattr(self.__dict__.get("current_column"), "name", "?")
        kind = "default" if self.__dict__.get("isinsert", True) else "onupdate"
        raise ContextAttributeError(
            f"the {kind} of shard source {col!r} reads "
            f"context.{name}, which sharded-orm's context does not offer: it evaluates the "
            "callable before the statement runs, to hash the value the row stores, and offers "
            "get_current_parameters(), current_parameters, current_column, isinsert, "
            "isupdate, connection, dialect, engine and execution_options. Compute the value "
            "from those, or give the source's value in the statement."
        )


def row_parameters(row: Mapping[str, Any], stmt_values: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters SQLAlchemy's context shows a default of ``row``: the statement's
    ``.values()`` as the values they bind, the row's own parameters over them (a SQL
    expression, in either, is no parameter)."""
    out = {}
    for k, v in stmt_values.items():
        value = literal_value(v, row)
        if value is not MISSING:
            out[k] = value
    for k, v in row.items():
        if isinstance(v, ClauseElement):  # a multi-row VALUES list's SQL
            out.pop(k, None)
        else:
            out[k] = v
    return out


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


def _python_value(generator: Any, context: DefaultContext) -> Any:
    """What a Python-side default or onupdate gives; MISSING for a SQL one."""
    if getattr(generator, "is_scalar", False):
        return generator.arg
    if getattr(generator, "is_callable", False):
        return generator.arg(context)
    return MISSING


def evaluate_default(col: Column[Any], row: Mapping[str, Any], connection: Any = None) -> Any:
    """The value a source's Python ``default`` gives the INSERT row whose parameters
    (values, by column key: :func:`row_parameters`) are ``row``."""
    if col.default is None:
        return MISSING
    value = _python_value(col.default, DefaultContext(row, col, connection=connection))
    if value is MISSING:
        raise ShardConfigError(
            f"column {col.name!r} is a shard source but its default is SQL or a sequence "
            "evaluated by the database, so the client cannot hash it; give the value explicitly"
        )
    return value


def evaluate_onupdate(col: Column[Any], row: Mapping[str, Any], connection: Any = None) -> Any:
    """The value a source's Python ``onupdate`` gives the UPDATE row whose parameters
    (values, by column key: :func:`row_parameters`) are ``row`` (the hook sends it, so
    the stored source is the hashed one). A SQL one (a client-computed shard of a
    ``server_side=True`` column off Spanner: declaration refuses it elsewhere) is refused
    unless the UPDATE sets the source itself."""
    value = _python_value(
        col.onupdate, DefaultContext(row, col, isinsert=False, connection=connection)
    )
    if value is MISSING:
        raise ShardConfigError(
            f"column {col.name!r} is a shard source with a SQL onupdate ({col.onupdate!r}), "
            "which the database computes during the UPDATE, and on this database sharded-orm "
            "computes the shard in the client (server_side=True shards are computed by "
            "Spanner alone), so it cannot hash it. Set the source's value in the UPDATE, or "
            "give it a Python onupdate (a callable)."
        )
    return value
