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
from sharded_orm.memo import Memo

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
        shared: bool = False,
    ) -> None:
        # shared: the caller's dict itself, which it fills as each column is evaluated
        self.current_parameters = params if shared and isinstance(params, dict) else dict(params)
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


def prefetch_columns(table: Any, given: Any, *, isinsert: bool) -> list[Column[Any]]:
    """The columns of ``table`` whose Python ``default`` (INSERT) or ``onupdate`` (UPDATE)
    SQLAlchemy evaluates before a statement that does not give them (``given``: the column
    keys it gives), in SQLAlchemy's order: the table's."""
    out = []
    for col in getattr(table, "columns", ()):
        gen = col.default if isinsert else col.onupdate
        if col.key in given or gen is None:
            continue
        if getattr(gen, "is_scalar", False) or getattr(gen, "is_callable", False):
            out.append(col)
    return out


#: :func:`prefetch_columns` of each (table, INSERT?, keys given): the columns a write
#: evaluates depend on those alone, not on the row's values, so each shape of row is
#: planned once (its ``stats()`` count the plans made: misses, and reused: hits)
PREFETCH_PLANS: Memo[tuple[Any, int, bool, frozenset[str]], tuple[Column[Any], ...]] = Memo(
    "write.prefetch_plans", 512
)


def planned_prefetch(table: Any, given: frozenset[str], *, isinsert: bool) -> list[Column[Any]]:
    """:func:`prefetch_columns`, planned once per table, kind and set of keys given
    (:data:`PREFETCH_PLANS`; a column appended to the table is another plan)."""
    key = (table, len(table.c), isinsert, given)
    plan = PREFETCH_PLANS.get(key)
    if plan is None:
        plan = tuple(prefetch_columns(table, given, isinsert=isinsert))
        PREFETCH_PLANS.put(key, plan)
    return list(plan)


class StatementDefaults:
    """Evaluates the Python defaults (INSERT) or onupdates (UPDATE) of one statement's rows
    exactly as SQLAlchemy's execution context would (``_process_execute_defaults``), ahead
    of it, so the write path can hash and send what the row will store.

    Each row's context shows what SQLAlchemy's shows: the statement compiled for the keys
    the rows give, its parameters as ``construct_params`` builds them for the row (the
    WHERE clause's bound values under their compiled names, e.g. ``id_1``; each column
    still to be evaluated as None), and every column evaluated in the compiled statement's
    prefetch order (the table's), each seeing the ones evaluated before it. Every column
    evaluated is returned, to be sent with the row (SQLAlchemy then evaluates none of them
    again: the value a source's callable saw is the one stored). The statement is compiled
    once per set of row keys; without a statement (or a dialect) the parameters are the
    row's and ``.values()``'s values by column key (:func:`row_parameters`), and the
    columns are planned once per table and set of keys given (:func:`planned_prefetch`).

    ``multi_values``: the rows are those of one multi-row VALUES list, whose first row
    gives these keys; SQLAlchemy's context then shows each column, of every row, the
    row's values of those keys and the column itself as None, and nothing evaluated
    before it."""

    def __init__(
        self,
        table: Any,
        statement: Any,
        stmt_values: Mapping[str, Any],
        *,
        isinsert: bool,
        connection: Any = None,
        multi_values: tuple[str, ...] | None = None,
    ) -> None:
        self.table = table
        self.multi_values = multi_values
        self.statement = statement
        self.stmt_values = stmt_values
        self.isinsert = isinsert
        self.connection = connection
        self._plans: dict[tuple[str, ...], tuple[Any, list[Column[Any]]]] = {}

    def serves(self, connection: Any, stmt_values: Mapping[str, Any]) -> bool:
        """True if these defaults are those of a write on ``connection`` with
        ``.values()`` ``stmt_values`` (the same mapping, or none on either side)."""
        return connection is self.connection and (
            stmt_values is self.stmt_values or not (stmt_values or self.stmt_values)
        )

    def _plan(self, row: Mapping[str, Any]) -> tuple[Any, list[Column[Any]]]:
        keys = tuple(row)
        plan = self._plans.get(keys)
        if plan is None:
            dialect = getattr(self.connection, "dialect", None)
            compiled = None
            if self.statement is not None and dialect is not None:
                compiled = self.statement.compile(dialect=dialect, column_keys=list(keys))
                columns = list(
                    compiled.insert_prefetch if self.isinsert else compiled.update_prefetch
                )
            else:
                given = frozenset((*keys, *self.stmt_values))
                columns = planned_prefetch(self.table, given, isinsert=self.isinsert)
            plan = self._plans[keys] = (compiled, columns)
        return plan

    def evaluate(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """``{column key: value}`` of every column SQLAlchemy would evaluate for ``row``."""
        compiled, columns = self._plan(row)
        if not columns:
            return {}
        if self.multi_values is not None:
            return self._isolated(row, columns, self.multi_values)
        if compiled is not None:
            params = compiled.construct_params(dict(row), escape_names=False)
        else:
            params = row_parameters(row, self.stmt_values)
            for col in columns:
                params[col.key] = None
        context = DefaultContext(
            params, None, isinsert=self.isinsert, connection=self.connection, shared=True
        )
        out = {}
        for col in columns:
            context.current_column = col
            gen = col.default if self.isinsert else col.onupdate
            value = params[col.key] = _python_value(gen, context)
            out[col.key] = value
        return out

    def _isolated(
        self, row: Mapping[str, Any], columns: list[Column[Any]], keys: tuple[str, ...]
    ) -> dict[str, Any]:
        out = {}
        for col in columns:
            params = {k: row[k] for k in keys if k in row}
            params[col.key] = None
            context = DefaultContext(
                params, col, isinsert=self.isinsert, connection=self.connection, shared=True
            )
            gen = col.default if self.isinsert else col.onupdate
            out[col.key] = _python_value(gen, context)
        return out


class RowDefaults:
    """The :class:`StatementDefaults` of the statement whose rows a ``RowShards`` fills
    (:meth:`use_statement`, :meth:`use_multi_values`; none set: built from the table).

    One is made per statement, not per row: with no statement set, the one last made is
    used again while the rows come with the same connection and ``.values()`` (a shared
    filler's: :meth:`end_write` lets go of its connection between writes)."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self.statement: Any = None
        #: the first row's keys of the multi-row VALUES list being filled (None: not one)
        self.multi_values: tuple[str, ...] | None = None
        self._cached: dict[bool, StatementDefaults] = {}

    def use_statement(self, statement: Any, table: Any) -> None:
        """The single-row-VALUES INSERT or the UPDATE whose rows are filled: its defaults'
        context shows that statement's parameters (its WHERE clause's too)."""
        self.statement, self.table = statement, table
        self._cached.clear()

    def use_multi_values(self, first_keys: tuple[str, ...]) -> None:
        """The rows filled next are those of one multi-row VALUES list whose first row
        gives ``first_keys``."""
        self.multi_values = first_keys
        self._cached.clear()

    def end_write(self) -> None:
        """The write whose rows were filled is over: drop what was made for it (its
        connection with it); the columns planned stay (:data:`PREFETCH_PLANS`)."""
        self._cached.clear()

    def evaluate(
        self,
        row: Mapping[str, Any],
        stmt_values: Mapping[str, Any],
        *,
        isinsert: bool,
        connection: Any,
    ) -> dict[str, Any]:
        """Every Python default (INSERT) or onupdate (UPDATE) SQLAlchemy would evaluate
        for ``row``, evaluated as it would."""
        found = self._cached.get(isinsert)
        if found is None or (self.statement is None and not found.serves(connection, stmt_values)):
            found = self._cached[isinsert] = StatementDefaults(
                self.table,
                self.statement,
                stmt_values,
                isinsert=isinsert,
                connection=connection,
                multi_values=self.multi_values,
            )
        return found.evaluate(row)

    def with_evaluated(
        self,
        row: dict[str, Any],
        stmt_values: Mapping[str, Any],
        *,
        isinsert: bool,
        connection: Any,
    ) -> dict[str, Any]:
        """``row`` with every value :meth:`evaluate` gives (in the order SQLAlchemy runs
        them, each seeing what its context would), to be sent: what each saw is stored."""
        found = self.evaluate(row, stmt_values, isinsert=isinsert, connection=connection)
        return {**row, **{k: v for k, v in found.items() if k not in stmt_values}}


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
