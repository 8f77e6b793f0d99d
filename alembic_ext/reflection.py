"""Reading Spanner schemas back: what sqlalchemy-spanner's reflection leaves out.

sqlalchemy-spanner 1.20 reflects indexes and keys, but:

* ``get_pk_constraint`` returns no ``name``; Alembic >= 1.18 autogenerate reads it and
  fails with ``KeyError: 'name'``;
* index ``column_sorting`` values are plain strings (``"desc"``), while SQLAlchemy and
  Alembic expect tuples (``("desc",)``), so DESC index columns come back ascending;
* ``NULL_FILTERED`` and ``INTERLEAVE IN`` of an index are not reflected at all;
* ``get_multi_*(filter_names=[])`` (autogenerate on an empty database) sends
  ``IN ()``, a syntax error;
* it reads past the DB-API, which holds a transaction's DDL until its next statement:
  a table created in a transaction was missing from that connection's inspector;
* a table with no key columns (``PRIMARY KEY ()``) reflected without
  ``constrained_columns``.

:class:`SpannerInspector` fixes these on the inspector, SQLAlchemy's public per-dialect
hook (``Dialect.inspector``), by post-processing the stock results with one
INFORMATION_SCHEMA query. ``alembic_ext.impl`` installs it on the migration's dialect
(:func:`install_inspector`); ``tests/test_alembic_reflection.py`` checks the stock gaps
are still there. The ``read_*`` functions read what Alembic has no notion of: key order,
table interleave, generated-column expressions and shard markers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.engine.reflection import Inspector
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import UnaryExpression

from sharded_orm.spanner import is_spanner

#: Name Spanner gives every primary key in INFORMATION_SCHEMA.
PRIMARY_KEY_NAME = "PRIMARY_KEY"


def _rows(conn: Connection, sql: str, **params: Any) -> list[Any]:
    return list(conn.execute(sa.text(sql), params).all())


@dataclass(frozen=True)
class IndexInfo:
    """A Spanner index as stored: what the database really has."""

    table: str
    name: str
    columns: tuple[tuple[str, bool], ...]  # (column, descending), in key order
    unique: bool
    null_filtered: bool
    storing: frozenset[str]
    interleave_in: str | None


def read_indexes(conn: Connection, table: str | None = None) -> dict[tuple[str, str], IndexInfo]:
    """Secondary indexes, keyed by (table, index), from INFORMATION_SCHEMA."""
    where = " AND i.TABLE_NAME = :t" if table is not None else ""
    params: dict[str, Any] = {"t": table} if table is not None else {}
    heads = _rows(
        conn,
        "SELECT i.TABLE_NAME, i.INDEX_NAME, i.IS_UNIQUE, i.IS_NULL_FILTERED, i.PARENT_TABLE_NAME "
        "FROM INFORMATION_SCHEMA.INDEXES AS i "
        "WHERE i.TABLE_SCHEMA = '' AND i.INDEX_TYPE = 'INDEX'" + where,
        **params,
    )
    cols = _rows(
        conn,
        "SELECT i.TABLE_NAME, i.INDEX_NAME, i.COLUMN_NAME, i.ORDINAL_POSITION, "
        "i.COLUMN_ORDERING FROM INFORMATION_SCHEMA.INDEX_COLUMNS AS i "
        "WHERE i.TABLE_SCHEMA = '' AND i.INDEX_TYPE = 'INDEX'" + where,
        **params,
    )
    keyed: dict[tuple[str, str], list[tuple[int, str, bool]]] = {}
    stored: dict[tuple[str, str], set[str]] = {}
    for t, ix, col, pos, ordering in cols:
        if pos is None:
            stored.setdefault((t, ix), set()).add(col)
        else:
            keyed.setdefault((t, ix), []).append((pos, col, ordering == "DESC"))
    out = {}
    for t, ix, unique, null_filtered, parent in heads:
        parts = tuple((c, d) for _, c, d in sorted(keyed.get((t, ix), [])))
        out[(t, ix)] = IndexInfo(
            t, ix, parts, bool(unique), bool(null_filtered),
            frozenset(stored.get((t, ix), ())), parent or None,
        )  # fmt: skip
    return out


def read_primary_key(conn: Connection, table: str) -> list[tuple[str, bool]]:
    """The key of ``table`` as (column, descending), in key order."""
    rows = _rows(
        conn,
        "SELECT COLUMN_NAME, COLUMN_ORDERING FROM INFORMATION_SCHEMA.INDEX_COLUMNS "
        "WHERE TABLE_SCHEMA = '' AND TABLE_NAME = :t AND INDEX_TYPE = 'PRIMARY_KEY' "
        "ORDER BY ORDINAL_POSITION",
        t=table,
    )
    return [(c, o == "DESC") for c, o in rows]


def read_table_parent(conn: Connection, table: str) -> tuple[str | None, bool]:
    """(interleave parent, ON DELETE CASCADE) of ``table``."""
    rows = _rows(
        conn,
        "SELECT PARENT_TABLE_NAME, ON_DELETE_ACTION FROM INFORMATION_SCHEMA.TABLES "
        "WHERE TABLE_SCHEMA = '' AND TABLE_NAME = :t",
        t=table,
    )
    if not rows:
        return None, False
    parent, action = rows[0]
    return (parent or None), action == "CASCADE"


def read_generated_columns(conn: Connection, table: str) -> dict[str, str]:
    """Column name -> GENERATION_EXPRESSION for the generated columns of ``table``."""
    rows = _rows(
        conn,
        "SELECT COLUMN_NAME, GENERATION_EXPRESSION FROM INFORMATION_SCHEMA.COLUMNS "
        "WHERE TABLE_SCHEMA = '' AND TABLE_NAME = :t AND IS_GENERATED = 'ALWAYS'",
        t=table,
    )
    return {c: e for c, e in rows if e is not None}


def read_check_constraints(conn: Connection, table: str) -> dict[str, str]:
    """Constraint name -> CHECK clause, for the CHECK constraints of ``table``."""
    rows = _rows(
        conn,
        "SELECT tc.CONSTRAINT_NAME, cc.CHECK_CLAUSE "
        "FROM INFORMATION_SCHEMA.TABLE_CONSTRAINTS AS tc "
        "JOIN INFORMATION_SCHEMA.CHECK_CONSTRAINTS AS cc "
        "ON cc.CONSTRAINT_NAME = tc.CONSTRAINT_NAME AND cc.CONSTRAINT_SCHEMA = tc.TABLE_SCHEMA "
        "WHERE tc.TABLE_SCHEMA = '' AND tc.TABLE_NAME = :t AND tc.CONSTRAINT_TYPE = 'CHECK'",
        t=table,
    )
    # Spanner lists each NOT NULL as an implicit CK_IS_NOT_NULL_<table>_<column> check
    return {n: c for n, c in rows if not n.startswith("CK_IS_NOT_NULL_")}


def index_signature(index: sa.Index) -> dict[str, Any]:
    """Everything Spanner stores about an index, in comparable form."""
    parts = []
    for expr in index.expressions:
        desc = isinstance(expr, UnaryExpression) and expr.modifier is operators.desc_op
        inner = expr.element if isinstance(expr, UnaryExpression) else expr
        parts.append((str(getattr(inner, "name", inner)), desc))
    # membership first: a lookup of a missing dialect would try to load it
    opts: Any = index.dialect_options["spanner"] if "spanner" in index.dialect_options else {}  # noqa: SIM401
    storing = opts.get("storing") or ()
    return {
        "columns": parts,
        "unique": bool(index.unique),
        "storing": sorted(s if isinstance(s, str) else s.name for s in storing),
        "null_filtered": bool(opts.get("null_filtered")),
        "interleave_in": opts.get("interleave_in") or None,
    }


def check_names(conn: Connection, table: str, inspector: Inspector | None = None) -> list[str]:
    """Names of ``table``'s CHECK constraints (the shard markers are among them): from
    INFORMATION_SCHEMA on Spanner, else from ``inspector`` (default: a new one on
    ``conn``); none where the dialect cannot reflect them."""
    if is_spanner(conn):
        return list(read_check_constraints(conn, table))
    try:
        found = (inspector or sa.inspect(conn)).get_check_constraints(table)
    except NotImplementedError:
        return []
    return [str(c["name"]) for c in found if c.get("name")]


def normalize_sql(sql: str) -> str:
    """An expression with quoting, case and spacing removed: for comparing, not running."""
    return "".join(ch for ch in sql.lower() if ch not in ' \t\r\n`"()')


# ----------------------------------------------------------------------------- inspector


def apply_pending_ddl(bind: Any) -> None:
    """Send the DDL the DB-API still holds for ``bind`` (a Connection), if any.

    In a transaction the Spanner DB-API queues DDL until the next statement or commit;
    the stock reflection reads in a snapshot of its own, past the DB-API, so a table
    just created on this connection was missing from its own inspector. The DB-API's
    own flush (``run_prior_DDL_statements``) runs first, as its next statement would.
    """
    if not isinstance(bind, Connection) or bind.closed or bind.invalidated:
        return
    driver = bind.connection.driver_connection
    run = getattr(driver, "run_prior_DDL_statements", None)
    if run is not None:
        run()


def _skip_empty(name: str) -> Any:
    """``get_multi_<x>(filter_names=[])``: the stock dialect sends ``IN ()``, a syntax error."""

    def method(self: Inspector, schema: str | None = None, **kw: Any) -> Any:
        if kw.get("filter_names") is not None and not list(kw["filter_names"]):
            return {}
        apply_pending_ddl(self.bind)
        return getattr(super(SpannerInspector, self), name)(schema, **kw)

    method.__name__ = name
    return method


def _after_pending_ddl(name: str) -> Any:
    """The stock inspector method ``name``, run after the connection's pending DDL."""

    def method(self: Inspector, *args: Any, **kw: Any) -> Any:
        apply_pending_ddl(self.bind)
        return getattr(super(SpannerInspector, self), name)(*args, **kw)

    method.__name__ = name
    return method


class SpannerInspector(Inspector):
    """The stock inspector with the reflection gaps above filled."""

    get_multi_columns = _skip_empty("get_multi_columns")
    get_multi_foreign_keys = _skip_empty("get_multi_foreign_keys")
    get_multi_unique_constraints = _skip_empty("get_multi_unique_constraints")
    get_multi_table_comment = _skip_empty("get_multi_table_comment")
    get_multi_check_constraints = _skip_empty("get_multi_check_constraints")
    get_multi_table_options = _skip_empty("get_multi_table_options")
    get_table_names = _after_pending_ddl("get_table_names")
    has_table = _after_pending_ddl("has_table")
    get_columns = _after_pending_ddl("get_columns")
    get_foreign_keys = _after_pending_ddl("get_foreign_keys")
    get_unique_constraints = _after_pending_ddl("get_unique_constraints")
    get_check_constraints = _after_pending_ddl("get_check_constraints")

    def _fix_pk(self, pk: dict[str, Any]) -> dict[str, Any]:
        """SQLAlchemy's contract: ``constrained_columns`` and ``name`` always present;
        a table without key columns (``PRIMARY KEY ()``) has ``[]`` and ``None``."""
        if pk.get("constrained_columns"):
            pk.setdefault("name", PRIMARY_KEY_NAME)
        else:
            pk["constrained_columns"] = []
            pk.setdefault("name", None)
        return pk

    def get_pk_constraint(self, table_name: str, schema: str | None = None, **kw: Any) -> Any:
        apply_pending_ddl(self.bind)
        return self._fix_pk(dict(super().get_pk_constraint(table_name, schema, **kw)))

    def get_multi_pk_constraint(  # type: ignore[override]
        self, schema: str | None = None, **kw: Any
    ) -> Any:
        if kw.get("filter_names") is not None and not list(kw["filter_names"]):
            return {}
        apply_pending_ddl(self.bind)
        found = super().get_multi_pk_constraint(schema, **kw)
        return {k: self._fix_pk(dict(v)) for k, v in found.items()}

    def _fix_indexes(self, table: str, indexes: Iterable[Any]) -> list[Any]:
        real = self._real_indexes()
        out = []
        for ix in indexes:
            ix = dict(ix)
            sorting = {
                c: (s,) if isinstance(s, str) else tuple(s)
                for c, s in (ix.get("column_sorting") or {}).items()
            }
            sorting = {c: s for c, s in sorting.items() if s != ("asc",)}
            if sorting:
                ix["column_sorting"] = sorting
            else:
                ix.pop("column_sorting", None)
            info = real.get((table, ix["name"]))
            opts = dict(ix.get("dialect_options") or {})
            if info is not None:
                if info.null_filtered:
                    opts["spanner_null_filtered"] = True
                if info.interleave_in:
                    opts["spanner_interleave_in"] = info.interleave_in
            ix["dialect_options"] = opts
            out.append(ix)
        return out

    def _real_indexes(self) -> dict[tuple[str, str], IndexInfo]:
        cached = self.info_cache.get("sharded_orm_indexes")
        if cached is None:
            with self._operation_context() as conn:
                cached = read_indexes(conn)
            self.info_cache["sharded_orm_indexes"] = cached
        return cached  # type: ignore[no-any-return,unused-ignore]

    def get_indexes(self, table_name: str, schema: str | None = None, **kw: Any) -> Any:
        apply_pending_ddl(self.bind)
        return self._fix_indexes(table_name, super().get_indexes(table_name, schema, **kw))

    def get_multi_indexes(  # type: ignore[override]
        self, schema: str | None = None, **kw: Any
    ) -> Any:
        if kw.get("filter_names") is not None and not list(kw["filter_names"]):
            return {}
        apply_pending_ddl(self.bind)
        found = super().get_multi_indexes(schema, **kw)
        return {k: self._fix_indexes(k[1], v) for k, v in found.items()}


def install_inspector(dialect: Dialect) -> None:
    """Make ``inspect(engine_or_connection)`` on ``dialect`` return a SpannerInspector.

    Uses SQLAlchemy's ``Dialect.inspector`` hook on this dialect instance only, and
    leaves alone a dialect that already brings its own inspector.
    """
    current = getattr(dialect, "inspector", None)
    if current is None or current is Inspector:
        dialect.inspector = SpannerInspector  # type: ignore[attr-defined]


def read_columns(conn: Connection, table: str) -> list[str]:
    """Column names of ``table``, in order."""
    rows = _rows(
        conn,
        "SELECT COLUMN_NAME FROM INFORMATION_SCHEMA.COLUMNS "
        "WHERE TABLE_SCHEMA = '' AND TABLE_NAME = :t ORDER BY ORDINAL_POSITION",
        t=table,
    )
    return [c for (c,) in rows]
