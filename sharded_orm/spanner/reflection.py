"""Reflection that binds names: INFORMATION_SCHEMA queries with ``@parameters``.

sqlalchemy-spanner 1.20 pastes table, schema and sequence names into its reflection SQL
(``TABLE_NAME="{name}"``): a quote in a name broke the query, ``x" OR "1"="1`` turned
``has_table`` into True, and ``filter_names=[]`` rendered ``()`` (a syntax error). Here
every name travels as a query parameter, so reflection answers about any string, as
SQLAlchemy's contract says: no such table is ``False`` / an empty result / no entry in a
``get_multi_*`` answer, never an error about the name. The shapes of the answers are the
stock dialect's (its compliance suite checks them against SQLAlchemy's).

Queries run in a single-use read-only snapshot of the DB-API connection's database, as
the stock ones do (INFORMATION_SCHEMA cannot be read in a read-write transaction), with
the connection's read deadline (:mod:`sharded_orm.spanner.deadlines`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from google.cloud.spanner_v1 import param_types
from sqlalchemy.engine import Engine, ObjectKind
from sqlalchemy.exc import NoSuchTableError

from sharded_orm.spanner.deadlines import call_options, read_errors, timeout_of

_STRING = param_types.STRING
_NAMES = param_types.Array(param_types.STRING)  # type: ignore[no-untyped-call]

#: Table types each ObjectKind covers (Spanner has tables and views, no materialized views).
_TABLE_TYPES = {
    ObjectKind.ANY: ("BASE TABLE", "VIEW"),
    ObjectKind.TABLE: ("BASE TABLE",),
    ObjectKind.VIEW: ("VIEW",),
    ObjectKind.ANY_VIEW: ("VIEW",),
}


def _kind_filter(kind: ObjectKind | None) -> tuple[str, dict[str, Any], dict[str, Any]]:
    kind = ObjectKind.TABLE if kind is None else kind
    if kind == ObjectKind.MATERIALIZED_VIEW:
        raise NotImplementedError("Spanner does not support MATERIALIZED VIEWS")
    return (
        "t.table_type IN UNNEST(@table_types)",
        {"table_types": list(_TABLE_TYPES[kind])},
        {"table_types": _NAMES},
    )


def _filters(
    alias: str, schema: str | None, filter_names: Sequence[str] | None, kind: ObjectKind | None
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``WHERE`` conditions (constant text) and their parameters for a ``get_multi_*``."""
    where, params, types = _kind_filter(kind)
    clauses = [where, f"{alias}.table_schema = @schema", f"{alias}.table_catalog = ''"]
    params["schema"], types["schema"] = schema or "", _STRING
    if filter_names is not None:
        clauses.append(f"{alias}.table_name IN UNNEST(@names)")
        params["names"], types["names"] = list(filter_names), _NAMES
    return " AND ".join(clauses), params, types


def _rows(
    connection: Any,
    sql: str,
    params: dict[str, Any] | None = None,
    types: dict[str, Any] | None = None,
) -> list[list[Any]]:
    """Rows of ``sql`` with its names bound, read in a snapshot within the read deadline."""
    if isinstance(connection, Engine):
        with connection.connect() as conn:
            return _rows(conn, sql, params, types)
    database = connection.connection.driver_connection.database
    seconds = timeout_of(connection.get_execution_options())
    with read_errors(seconds), database.snapshot() as snapshot:
        rows = snapshot.execute_sql(sql, params=params, param_types=types, **call_options(seconds))
        return [list(row) for row in rows]


def _grouped(rows: Iterable[tuple[Any, Any, Any]]) -> dict[tuple[str | None, str], list[Any]]:
    """``{(schema or None, table): [info, ...]}`` from ``(schema, table, info)`` triples."""
    result: dict[tuple[str | None, str], list[Any]] = {}
    for schema, table, info in rows:
        result.setdefault((schema or None, table), []).append(info)
    return result


_COLUMNS = """
SELECT col.table_schema, col.table_name, col.column_name, col.spanner_type,
       col.is_nullable, col.generation_expression, col.column_default
FROM information_schema.columns AS col
JOIN information_schema.tables AS t USING (table_catalog, table_schema, table_name)
WHERE {where}
ORDER BY col.table_catalog, col.table_schema, col.table_name, col.ordinal_position
"""

_INDEX_PARTS = """ARRAY(
    SELECT ic.{what} FROM information_schema.index_columns AS ic
    WHERE ic.index_name = i.index_name AND ic.table_catalog = i.table_catalog
      AND ic.table_schema = i.table_schema AND ic.table_name = i.table_name
      AND ic.column_ordering IS {null}
    ORDER BY ic.ordinal_position)"""

_INDEXES = f"""
SELECT i.table_schema, i.table_name, i.index_name,
       {_INDEX_PARTS.format(what="column_name", null="NOT NULL")},
       i.is_unique,
       {_INDEX_PARTS.format(what="column_ordering", null="NOT NULL")},
       {_INDEX_PARTS.format(what="column_name", null="NULL")}
FROM information_schema.indexes AS i
JOIN information_schema.tables AS t
  ON i.table_catalog = t.table_catalog AND i.table_schema = t.table_schema
 AND i.table_name = t.table_name
WHERE {{where}} AND i.index_type NOT IN ('PRIMARY_KEY', 'SEARCH')
  AND i.spanner_is_managed = FALSE
ORDER BY i.index_name
"""

_PRIMARY_KEYS = """
SELECT tc.table_schema, tc.table_name, kcu.column_name
FROM information_schema.table_constraints AS tc
JOIN information_schema.key_column_usage AS kcu
  USING (table_catalog, table_schema, constraint_name)
JOIN information_schema.tables AS t
  ON tc.table_catalog = t.table_catalog AND tc.table_schema = t.table_schema
 AND tc.table_name = t.table_name
WHERE {where} AND tc.constraint_type = 'PRIMARY KEY'
ORDER BY tc.table_catalog, tc.table_schema, tc.table_name, kcu.ordinal_position
"""

# One row per foreign key, each column pair once. INFORMATION_SCHEMA lists a unique
# constraint once per foreign key that uses it (the index Spanner manages for foreign keys
# to a non-key column): the stock query's joins on it doubled both the keys and their
# columns (two keys to one column reflected as four, each of two column pairs). The
# referenced table and columns are read by value, whatever the number of those rows.
_FOREIGN_KEYS = """
SELECT tc.table_schema, tc.table_name, tc.constraint_name,
  (SELECT ANY_VALUE(uq.table_name) FROM information_schema.table_constraints AS uq
   WHERE uq.constraint_catalog = rc.unique_constraint_catalog
     AND uq.constraint_schema = rc.unique_constraint_schema
     AND uq.constraint_name = rc.unique_constraint_name),
  rc.unique_constraint_schema,
  ARRAY(
    SELECT AS STRUCT kcu.column_name AS mine,
      (SELECT ANY_VALUE(kcu_uq.column_name)
       FROM information_schema.key_column_usage AS kcu_uq
       WHERE kcu_uq.constraint_catalog = rc.unique_constraint_catalog
         AND kcu_uq.constraint_schema = rc.unique_constraint_schema
         AND kcu_uq.constraint_name = rc.unique_constraint_name
         AND kcu_uq.ordinal_position = kcu.position_in_unique_constraint) AS theirs
    FROM information_schema.key_column_usage AS kcu
    WHERE kcu.constraint_catalog = tc.constraint_catalog
      AND kcu.constraint_schema = tc.constraint_schema
      AND kcu.constraint_name = tc.constraint_name
    ORDER BY kcu.ordinal_position)
FROM information_schema.table_constraints AS tc
JOIN information_schema.referential_constraints AS rc
  ON rc.constraint_catalog = tc.constraint_catalog
 AND rc.constraint_schema = tc.constraint_schema
 AND rc.constraint_name = tc.constraint_name
JOIN information_schema.tables AS t
  ON t.table_catalog = tc.table_catalog AND t.table_schema = tc.table_schema
 AND t.table_name = tc.table_name
WHERE {where} AND tc.constraint_type = 'FOREIGN KEY'
"""

# The UNIQUE constraints an app can hold: Spanner has no UNIQUE constraint DDL (the
# dialect refuses one: unique indexes are reflected as indexes), so the ones listed are
# those of the unique indexes Spanner manages for foreign keys to non-key columns. Those
# are the foreign keys' (made and dropped with them, refused by DROP), as the managed
# indexes get_indexes leaves out are; a constraint is listed once (INFORMATION_SCHEMA has
# it once per foreign key using it), with its columns in order.
_UNIQUE = """
SELECT tc.constraint_name,
  ARRAY(SELECT DISTINCT AS STRUCT kcu.ordinal_position, kcu.column_name
        FROM information_schema.key_column_usage AS kcu
        WHERE kcu.constraint_catalog = tc.constraint_catalog
          AND kcu.constraint_schema = tc.constraint_schema
          AND kcu.constraint_name = tc.constraint_name)
FROM information_schema.table_constraints AS tc
WHERE tc.table_name = @name AND tc.table_schema = @schema
  AND tc.constraint_type = 'UNIQUE' AND tc.constraint_name IS NOT NULL
  AND NOT EXISTS (
    SELECT 1 FROM information_schema.indexes AS i
    WHERE i.table_schema = tc.table_schema AND i.table_name = tc.table_name
      AND i.index_name = tc.constraint_name AND i.spanner_is_managed)
"""


class BoundReflection:
    """Reflection methods of our dialect: the stock answers, names bound as parameters."""

    if TYPE_CHECKING:

        def _designate_type(self, spanner_type: str) -> Any: ...  # the stock dialect's

    def get_multi_columns(
        self,
        connection: Any,
        schema: str | None = None,
        filter_names: Sequence[str] | None = None,
        scope: Any = None,
        kind: ObjectKind | None = None,
        **kw: Any,
    ) -> dict[tuple[str | None, str], list[Any]]:
        where, params, types = _filters("col", schema, filter_names, kind)
        rows = _rows(connection, _COLUMNS.format(where=where), params, types)
        return _grouped((r[0], r[1], self._column(r)) for r in rows)

    def _column(self, row: list[Any]) -> dict[str, Any]:
        info = {
            "name": row[2],
            "type": self._designate_type(row[3]),
            "nullable": row[4] == "YES",
            "default": row[6],
        }
        if row[5] is not None:
            info["computed"] = {"persisted": True, "sqltext": row[5]}
        return info

    def get_multi_indexes(
        self,
        connection: Any,
        schema: str | None = None,
        filter_names: Sequence[str] | None = None,
        scope: Any = None,
        kind: ObjectKind | None = None,
        **kw: Any,
    ) -> dict[tuple[str | None, str], list[Any]]:
        where, params, types = _filters("i", schema, filter_names, kind)
        rows = _rows(connection, _INDEXES.format(where=where), params, types)
        return _grouped((r[0], r[1], _index(r)) for r in rows)

    def get_multi_pk_constraint(
        self,
        connection: Any,
        schema: str | None = None,
        filter_names: Sequence[str] | None = None,
        scope: Any = None,
        kind: ObjectKind | None = None,
        **kw: Any,
    ) -> dict[tuple[str | None, str], dict[str, Any]]:
        where, params, types = _filters("tc", schema, filter_names, kind)
        rows = _rows(connection, _PRIMARY_KEYS.format(where=where), params, types)
        return {
            key: {"constrained_columns": columns}
            for key, columns in _grouped((r[0], r[1], r[2]) for r in rows).items()
        }

    def get_multi_foreign_keys(
        self,
        connection: Any,
        schema: str | None = None,
        filter_names: Sequence[str] | None = None,
        scope: Any = None,
        kind: ObjectKind | None = None,
        **kw: Any,
    ) -> dict[tuple[str | None, str], list[Any]]:
        where, params, types = _filters("tc", schema, filter_names, kind)
        rows = _rows(connection, _FOREIGN_KEYS.format(where=where), params, types)
        return _grouped((r[0], r[1], _foreign_key(r)) for r in rows)

    def get_table_names(self, connection: Any, schema: str | None = None, **kw: Any) -> list[str]:
        sql = (
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_type = 'BASE TABLE' AND table_schema = @schema"
        )
        return [r[0] for r in _rows(connection, sql, *_schema(schema))]

    def get_view_names(self, connection: Any, schema: str | None = None, **kw: Any) -> list[str]:
        sql = "SELECT table_name FROM information_schema.views WHERE table_schema = @schema"
        return [r[0] for r in _rows(connection, sql, *_schema(schema))]

    def get_sequence_names(
        self, connection: Any, schema: str | None = None, **kw: Any
    ) -> list[str]:
        sql = "SELECT name FROM information_schema.sequences WHERE schema = @schema"
        return [r[0] for r in _rows(connection, sql, *_schema(schema))]

    def get_view_definition(
        self, connection: Any, view_name: str, schema: str | None = None, **kw: Any
    ) -> str:
        sql = (
            "SELECT view_definition FROM information_schema.views "
            "WHERE table_schema = @schema AND table_name = @name"
        )
        rows = _rows(connection, sql, *_schema(schema, view_name))
        if not rows:
            raise NoSuchTableError(f"{schema or ''}.{view_name}")
        return str(rows[0][0])

    def get_unique_constraints(
        self, connection: Any, table_name: str, schema: str | None = None, **kw: Any
    ) -> list[dict[str, Any]]:
        found: dict[str, list[Any]] = {}
        for name, parts in _rows(connection, _UNIQUE, *_schema(schema, table_name)):
            found.setdefault(name, list(parts))
        return [
            {"name": name, "column_names": [p[1] for p in sorted(parts)]}
            for name, parts in sorted(found.items())
        ]

    def has_table(
        self, connection: Any, table_name: str, schema: str | None = None, **kw: Any
    ) -> bool:
        sql = (
            "SELECT true FROM information_schema.tables "
            "WHERE table_schema = @schema AND table_name = @name LIMIT 1"
        )
        return bool(_rows(connection, sql, *_schema(schema, table_name)))

    def has_sequence(
        self, connection: Any, sequence_name: str, schema: str | None = None, **kw: Any
    ) -> bool:
        sql = (
            "SELECT true FROM information_schema.sequences "
            "WHERE name = @name AND schema = @schema LIMIT 1"
        )
        return bool(_rows(connection, sql, *_schema(schema, sequence_name)))


def _schema(schema: str | None, name: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    params: dict[str, Any] = {"schema": schema or ""}
    types: dict[str, Any] = {"schema": _STRING}
    if name is not None:
        params["name"], types["name"] = name, _STRING
    return params, types


def _index(row: list[Any]) -> dict[str, Any]:
    columns, storing = row[3], row[6]
    return {
        "name": row[2],
        "column_names": columns,
        "unique": row[4],
        "column_sorting": {c: o.lower() for c, o in zip(columns, row[5] or [], strict=False) if o},
        "include_columns": storing or [],
        "dialect_options": {"spanner_storing": storing} if storing else {},
    }


def _foreign_key(row: list[Any]) -> dict[str, Any]:
    pairs = row[5]
    return {
        "name": row[2],
        "referred_table": row[3],
        "referred_schema": row[4] or None,
        "referred_columns": [p[1] for p in pairs],
        "constrained_columns": [p[0] for p in pairs],
    }
