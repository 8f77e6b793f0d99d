"""Alembic's implementation class for Spanner: what env.py used to have to carry.

Importing ``alembic_ext`` registers :class:`SpannerImpl` for the ``spanner+spanner``
dialect (Alembic finds impls by dialect name: without one, ``MigrationContext.configure``
fails with ``KeyError: 'spanner+spanner'``). It:

* keeps ``alembic_version`` keyed by ``version_num`` (Spanner needs a key, and branches
  need several rows), and writes a revision change as DELETE + INSERT, because Spanner
  refuses an UPDATE of a key column; so the usual ``version_table_pk=False`` workaround
  is not needed;
* runs migrations in autocommit mode: Spanner has no transactional DDL, and refuses a
  DDL batch while the same connection holds a read-write transaction;
* installs :class:`alembic_ext.reflection.SpannerInspector` on the migration's dialect
  and :func:`alembic_ext.render.render_item` (before any ``render_item`` of the user);
* compares indexes on everything Spanner stores: columns, order, DESC, UNIQUE, STORING,
  NULL_FILTERED and INTERLEAVE IN (Alembic's default looks at names and UNIQUE only);
* refuses, with a message saying what to do, to drop a column an index or a shard
  marker still uses.
"""

from __future__ import annotations

import re
from typing import Any, TextIO

import sqlalchemy as sa
from alembic.ddl._autogen import ComparisonResult
from alembic.ddl.impl import DefaultImpl
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import UnaryExpression

from sharded_orm.errors import ShardConfigError

from . import reflection
from .render import chain_render_item

_VERSION_UPDATE = re.compile(
    r"SET\s+\S*version_num\S*\s*=\s*'([^']+)'.*WHERE.*version_num\S*\s*=\s*'([^']+)'",
    re.IGNORECASE | re.DOTALL,
)


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


class SpannerImpl(DefaultImpl):
    """Alembic impl for sqlalchemy-spanner (see the module docstring)."""

    __dialect__ = "spanner+spanner"
    transactional_ddl = False

    def __init__(
        self,
        dialect: Dialect,
        connection: Connection | None,
        as_sql: bool,
        transactional_ddl: bool | None,
        output_buffer: TextIO | None,
        context_opts: dict[str, Any],
    ) -> None:
        super().__init__(
            dialect, connection, as_sql, transactional_ddl, output_buffer, context_opts
        )
        reflection.install_inspector(dialect)
        if connection is not None and not as_sql and not connection.in_transaction():
            # Spanner has no transactional DDL, and a DDL batch is refused while the
            # connection holds a read-write transaction (from reading alembic_version):
            # run migrations statement by statement, each committed as it runs.
            connection.execution_options(isolation_level="AUTOCOMMIT")
        context_opts["render_item"] = chain_render_item(context_opts.get("render_item"))

    # -- alembic_version

    def _exec(self, construct: Any, *args: Any, **kw: Any) -> Any:
        version_table = self.context_opts.get("version_table", "alembic_version")
        table: Any = getattr(construct, "table", None)
        if isinstance(construct, sa.Update) and getattr(table, "name", None) == version_table:
            sql = str(construct.compile(dialect=self.dialect))
            m = _VERSION_UPDATE.search(sql)
            if m is None:  # pragma: no cover - Alembic changed how it writes the version
                raise ShardConfigError(f"unexpected alembic_version update: {sql}")
            to_, from_ = m.group(1), m.group(2)
            col = table.c.version_num
            result = super()._exec(table.delete().where(col == sa.literal_column(f"'{from_}'")))
            super()._exec(table.insert().values(version_num=sa.literal_column(f"'{to_}'")))
            return result
        return super()._exec(construct, *args, **kw)

    # -- autogenerate

    def compare_indexes(self, metadata_index: sa.Index, reflected_index: sa.Index) -> Any:
        meta, real = index_signature(metadata_index), index_signature(reflected_index)
        diffs = [f"{key} {real[key]!r} to {meta[key]!r}" for key in meta if meta[key] != real[key]]
        return ComparisonResult.Different(diffs) if diffs else ComparisonResult.Equal()

    # -- guards

    def drop_column(self, table_name: str, column: sa.Column[Any], **kw: Any) -> None:
        conn = self.connection
        if conn is not None and not self.as_sql:
            users = [
                info.name
                for info in reflection.read_indexes(conn, table_name).values()
                if column.name in {c for c, _ in info.columns} or column.name in info.storing
            ]
            if users:
                raise ShardConfigError(
                    f"cannot drop {table_name}.{column.name}: index(es) {', '.join(users)} "
                    "still use it. Drop them first in this migration, e.g. "
                    f"op.drop_index({users[0]!r}, table_name={table_name!r}); for a shard "
                    "column, keep it until no index is led by it."
                )
            checks = [
                name
                for name, clause in reflection.read_check_constraints(conn, table_name).items()
                if re.search(rf"\b{re.escape(column.name)}\b", clause)
            ]
            if checks:
                raise ShardConfigError(
                    f"cannot drop {table_name}.{column.name}: CHECK constraint(s) "
                    f"{', '.join(checks)} still use it (a shard marker, if named ck_..._shard...). "
                    f"Drop it first: op.drop_constraint({checks[0]!r}, {table_name!r}, "
                    "type_='check')."
                )
        super().drop_column(table_name, column, **kw)
