"""Alembic's implementation class for Spanner.

The Spanner dialect of sharded-orm registers for it a class that builds it when Alembic
makes a migration context (``sharded_orm.spanner.alembic_impl``), so env.py imports
nothing for it and an engine loads nothing of this package. It:

* keeps ``alembic_version`` keyed by ``version_num`` and writes a revision change as
  DELETE + INSERT (Spanner refuses an UPDATE of a key column), in one transaction;
* writes the revision on its own, an abort retried, when the migration's transaction
  holds no write (``.commit``); its own commits fail as one ``FAILED:`` line;
* leaves the connection's transaction handling to Alembic (``transaction_per_migration``,
  ``autocommit_block``): Spanner has no transactional DDL, so a schema change commits the
  driver's transaction before it, as MySQL does implicitly;
* **batches DDL** inside ``run_migrations``: consecutive DDL statements of a migration
  go to Spanner as one ``UpdateDatabaseDdl`` (Spanner's advice: each schema change is a
  long-running operation), sent before any data statement (a backfill, the version row
  Alembic writes after every migration), when ``op.get_bind()`` is used and before the
  connection's transaction commits (a rollback, from a failed migration, drops it: the
  migration runs again). Outside ``run_migrations`` (``Operations`` used
  directly) each statement is sent before the operation returns.
  ``config.attributes["sharded_orm.on_ddl_batch"]``, if set, is called with the
  statements of each batch sent;
* makes every DDL statement **safe to run again** after a partial failure: ``IF NOT
  EXISTS`` / ``IF EXISTS`` where Spanner has them (tables, indexes, ADD COLUMN, also in
  ``--sql`` output), an INFORMATION_SCHEMA check online where it has not (DROP COLUMN,
  CHECK constraints, stored columns);
* installs :class:`alembic_ext.reflection.SpannerInspector` and our ``render_item``;
* yields to an impl the app defined itself for ``spanner+spanner`` (``.impl_guard``);
* compares indexes on everything Spanner stores, and types with STRING(MAX)/BYTES(MAX)
  equal to an unsized ``String()``/``Text()``/``LargeBinary()``;
* refuses, with a message saying what to do, to drop a column an index or a shard
  marker still uses.
"""

from __future__ import annotations

import re
import warnings
import weakref
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, TextIO

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Dialect

from sharded_orm.checks import quote_identifier
from sharded_orm.limits import ddl_batches
from sharded_orm.spanner.alembic_impl import SpannerImpl as RegisteredImpl
from sharded_orm.spanner.mutations import database_of

from . import ops as _ops  # noqa: F401  (registers op.backfill_shard, op.alter_index_storing)
from . import reflection
from .commit import (
    commit_timeout,
    commit_within,
    one_line,
    revision_alone,
    version_change,
    watch_writes,
    write_revision_on,
)
from .compare import SpannerComparisons
from .data_errors import report_aborted_statements
from .errors import MigrationError
from .idempotent import idempotent_sql, is_ddl, is_text_ddl, rerunnable
from .render import chain_render_item
from .schema_change import SchemaChangeBusy, SchemaChangeTimeout, apply_ddl, ddl_timeouts

# Upstream's own deprecated calls, seen on every Alembic command: sqlalchemy-spanner's
# pool "reset" listener reads the DB-API's deprecated ``inside_transaction``, and its
# ``do_rollback`` the deprecated ``_ConnectionFairy.connection``. Neither is ours to
# change; ignored by exact message and the upstream module that raises them, nothing else.
warnings.filterwarnings(
    "ignore",
    message=r"This method is deprecated\. Use _spanner_transaction_started field",
    category=DeprecationWarning,
    module=r"google\.cloud\.spanner_dbapi\.connection",
)
warnings.filterwarnings(
    "ignore",
    message=r"The _ConnectionFairy\.connection attribute is deprecated",
    category=DeprecationWarning,
    module=r"google\.cloud\.sqlalchemy_spanner\.sqlalchemy_spanner",
)

#: ``Config.attributes`` key: called with the list of statements of each DDL batch sent.
DDL_BATCH_ATTRIBUTE = "sharded_orm.on_ddl_batch"


def _info_signature(info: reflection.IndexInfo) -> dict[str, Any]:
    return {
        "columns": list(info.columns),
        "unique": info.unique,
        "storing": sorted(info.storing),
        "null_filtered": info.null_filtered,
        "interleave_in": info.interleave_in,
    }


def _quiet_autocommit(connection: Connection) -> None:
    """On an AUTOCOMMIT connection (sqlalchemy-spanner's env.py recipe), no commit warning.

    In autocommit mode the DB-API commits each statement itself, and warns "This method
    is non-operational as a transaction has not been started" at every commit and
    rollback Alembic (and the pool) then make, which have nothing to do: a line per
    migration, on every command. sqlalchemy-spanner's ``ignore_transaction_warnings``
    execution option turns exactly that warning off on this connection; nothing else
    changes (docs/migrations.md says why AUTOCOMMIT can go).
    """
    driver: Any = connection.connection.driver_connection
    if driver is not None and getattr(driver, "autocommit", False):
        connection.execution_options(ignore_transaction_warnings=True)


class SpannerImpl(SpannerComparisons, RegisteredImpl):
    """Alembic impl for sqlalchemy-spanner (see the module docstring).

    Not registered itself (no ``__dialect__``): Alembic finds
    :class:`sharded_orm.spanner.alembic_impl.SpannerImpl`, which builds this class when
    a migration context is made, so an engine loads none of ``alembic_ext``. An app's
    own impl is honoured, never silently replaced (.impl_guard).
    """

    sharded_orm_impl = True  # .impl_guard.MARK
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
        if connection is not None and not as_sql:
            _quiet_autocommit(connection)
        context_opts["render_item"] = chain_render_item(context_opts.get("render_item"))
        self.pending_ddl: list[str] = []
        #: statements of each UpdateDatabaseDdl this impl sent, in order
        self.ddl_batches: list[list[str]] = []
        # names dropped / added by statements still in the pending batch
        self._dropped: set[tuple[str, ...]] = set()
        self._added: set[tuple[str, ...]] = set()
        # DDL is batched only inside run_migrations (between start_migrations and the
        # commit of each migration's transaction); outside it, each statement is sent
        # before the operation returns (Operations used directly, test fixtures)
        self._migrating = False
        self._batching = False
        #: the driver's transaction may hold a write: the revision then joins it (atomic)
        self._writes_pending = connection is not None and not as_sql and connection.in_transaction()
        if connection is not None and not as_sql:
            watch_writes(connection, self)
            report_aborted_statements(connection)  # an aborted data statement: FAILED:

    def version_table_impl(self, **kw: Any) -> sa.Table:
        self._version_table = super().version_table_impl(**kw)
        return self._version_table

    # -- batching

    def start_migrations(self) -> None:
        """Alembic's hook at the start of ``run_migrations``: batch DDL from here on.

        The batch is sent before any data statement (the version row Alembic writes at
        the end of every migration among them) and before the connection's transaction
        ends, so nothing queued outlives the migration that queued it.
        """
        super().start_migrations()
        if self.as_sql or self.connection is None or self._migrating:
            return
        version = self._version_table
        if version is not None and not sa.inspect(self.connection).has_table(
            version.name, schema=version.schema
        ):  # created here, where a busy database is waited for, not by the DB-API at commit
            self._exec(sa.schema.CreateTable(version))
        self._migrating = self._batching = True
        impl = weakref.ref(self)

        def transaction_commits(conn: Connection) -> None:
            me = impl()
            if me is not None:
                me._batching = False
                me.flush_ddl()
                # bounded, a failure one FAILED: line (SQLAlchemy's commit: nothing left)
                me._end_driver_transaction("when its transaction commits")

        def transaction_rolls_back(conn: Connection) -> None:
            # a migration failed before its version row was written: its queued DDL
            # is not sent (an error is on its way up); `alembic upgrade` runs the
            # migration again, and every statement is safe to repeat
            me = impl()
            if me is not None:
                me._batching = False
                me.pending_ddl.clear()
                me._dropped.clear()
                me._added.clear()

        def transaction_begins(conn: Connection) -> None:
            me = impl()
            if me is not None:
                me._batching = me._migrating

        event.listen(self.connection, "commit", transaction_commits)
        event.listen(self.connection, "rollback", transaction_rolls_back)
        event.listen(self.connection, "begin", transaction_begins)

    @property
    def bind(self) -> Connection | None:
        """The connection, with pending DDL applied (``op.get_bind()`` reads see it)."""
        self.flush_ddl()
        return self.connection

    def flush_ddl(self) -> None:
        """Send the pending DDL statements as one ``UpdateDatabaseDdl`` and wait for it."""
        if not self.pending_ddl:
            return
        statements, self.pending_ddl = self.pending_ddl, []
        self._dropped.clear()
        self._added.clear()
        assert self.connection is not None
        database = database_of(self.connection)
        limits = ddl_timeouts(self._attributes())
        hook: Callable[[list[str]], None] | None = self._attributes().get(DDL_BATCH_ATTRIBUTE)
        self._end_driver_transaction()
        for batch in ddl_batches(statements):  # each under Spanner's request size
            try:  # bounded: the client's update_ddl().result() waits for hours
                apply_ddl(database, batch, **limits)
            except (SchemaChangeTimeout, SchemaChangeBusy):
                raise
            except Exception as exc:
                listed = "; ".join(batch)
                raise MigrationError(
                    f"Spanner refused a schema change: {one_line(exc)}. Earlier batches, and "
                    "statements of this one before the failing one, may be applied. Fix the "
                    "cause and run `alembic upgrade` again: every statement is safe to repeat."
                    f" The batch: {listed[:2000]}"
                ) from exc
            self.ddl_batches.append(batch)
            if hook is not None:
                hook(list(batch))

    def _end_driver_transaction(self, when: str = "before its next schema change") -> None:
        """Commit the driver's open Spanner transaction, if any, before a schema change.

        Spanner has no transactional DDL: as on MySQL, a schema change ends the
        transaction before it (the emulator refuses one while a read-write transaction
        is open). Done at the DB-API level, as a database's implicit commit is: the
        SQLAlchemy transaction (Alembic's per-migration one) stays open and commits the
        statements after the DDL. Nothing to do in autocommit mode.
        """
        assert self.connection is not None
        driver: Any = self.connection.connection.driver_connection
        if driver is not None and not driver.autocommit and self.connection.in_transaction():
            self._writes_pending = False  # committed, or failed: ended either way
            seconds = commit_timeout(self._attributes(), self.dialect)
            commit_within(driver.commit, seconds, driver, when=when)

    @staticmethod
    def _attributes() -> dict[str, Any]:
        """``Config.attributes`` of the running Alembic command, if any."""
        from alembic import context

        try:
            config = context.config
        except (NameError, AttributeError):  # not run by an Alembic command
            return {}
        return getattr(config, "attributes", None) or {}

    def _exec(self, construct: Any, *args: Any, **kw: Any) -> Any:
        if isinstance(construct, str):
            construct = sa.text(construct)
        if is_ddl(construct):
            # safe to send again: the construct's own IF [NOT] EXISTS flag, or for DDL
            # given as text, the clause added to its head (.idempotent)
            if is_text_ddl(construct):
                sql = idempotent_sql(str(construct.compile(dialect=self.dialect)).strip())
            else:
                sql = str(rerunnable(construct).compile(dialect=self.dialect)).strip()
            if self.as_sql:
                self.static_output(sql.replace("\t", "    ") + self.command_terminator)
            else:
                self.pending_ddl.append(sql)
                if not self._batching:
                    self.flush_ddl()  # applied before the operation returns
            return None
        if not self.as_sql:
            self.flush_ddl()
        version_table = self.context_opts.get("version_table", "alembic_version")
        table: Any = getattr(construct, "table", None)
        is_version = getattr(table, "name", None) == version_table
        if is_version and isinstance(construct, (sa.Update, sa.Insert, sa.Delete)):
            from_, to_ = version_change(construct, str(construct.compile(dialect=self.dialect)))
            if not self.as_sql and revision_alone(self.connection, self._writes_pending):
                seconds = commit_timeout(self._attributes(), self.dialect)
                found = write_revision_on(self.connection, table, from_, to_, seconds=seconds)
                return SimpleNamespace(rowcount=found)  # what Alembic reads of a result
            if not isinstance(construct, sa.Update):
                return super()._exec(construct, *args, **kw)
            col = table.c.version_num
            result = super()._exec(table.delete().where(col == sa.literal(from_)), *args, **kw)
            super()._exec(table.insert().values(version_num=sa.literal(to_)), *args, **kw)
            return result
        return super()._exec(construct, *args, **kw)

    def end_transaction(self) -> None:
        """Before a step that writes in its own transactions (``op.backfill_shard``, a key
        reshard's copy): pending DDL sent, the driver's open transaction committed, as
        before a schema change. The SQLAlchemy transaction, Alembic's or the caller's,
        stays open for what follows (see :mod:`alembic_ext.steps`)."""
        self.flush_ddl()
        self._end_driver_transaction("before a step that writes in its own transactions")

    # -- existence checks (online) for statements Spanner has no IF [NOT] EXISTS for

    def _online(self) -> Connection | None:
        return None if self.as_sql else self.connection

    def _column_exists(self, conn: Connection, table: str, column: str) -> bool:
        if ("column", table, column) in self._dropped:
            return False
        if ("column", table, column) in self._added:
            return True
        return column in reflection.read_columns(conn, table)

    def _constraint_exists(self, conn: Connection, table: str, name: str) -> bool:
        if ("constraint", name) in self._dropped:
            return False
        if ("constraint", name) in self._added:
            return True
        return name in reflection.read_check_constraints(conn, table)

    def add_column(self, table_name: str, column: sa.Column[Any], **kw: Any) -> None:
        self._added.add(("column", table_name, column.name))
        self._dropped.discard(("column", table_name, column.name))
        super().add_column(table_name, column, **kw)

    def drop_column(self, table_name: str, column: sa.Column[Any], **kw: Any) -> None:
        # Spanner has no DROP COLUMN IF EXISTS (a syntax error): the check below does it
        kw.pop("if_exists", None)
        conn = self._online()
        if conn is not None:
            if not self._column_exists(conn, table_name, column.name):
                return  # already dropped by an earlier, interrupted run
            self._check_column_unused(conn, table_name, column.name)
            self._dropped.add(("column", table_name, column.name))
        super().drop_column(table_name, column, **kw)

    def add_constraint(self, const: Any, **kw: Any) -> None:
        conn = self._online()
        table = getattr(getattr(const, "table", None), "name", None)
        name = getattr(const, "name", None)
        if conn is not None and table and isinstance(name, str):
            if self._constraint_exists(conn, table, name):
                return
            self._added.add(("constraint", name))
        super().add_constraint(const, **kw)

    def drop_constraint(self, const: Any, **kw: Any) -> None:
        conn = self._online()
        table = getattr(getattr(const, "table", None), "name", None)
        name = getattr(const, "name", None)
        if conn is not None and table and isinstance(name, str):
            if not self._constraint_exists(conn, table, name):
                return
            self._dropped.add(("constraint", name))
        super().drop_constraint(const, **kw)

    def drop_index(self, index: Any, **kw: Any) -> None:
        self._check_index_unneeded(index)
        self._dropped.add(("index", str(index.name)))
        super().drop_index(index, **kw)

    def _check_index_unneeded(self, index: Any) -> None:
        """On upgrade, refuse to drop an index that the models declare exactly as it
        exists: sharded queries through it would fail (a changed index, dropped to be
        re-created, differs from the model, so it passes)."""
        conn = self._online()
        fn = getattr(self.context_opts.get("fn"), "__name__", "")
        mds = _ops.metadata_list(self.context_opts.get("target_metadata"))
        if conn is None or fn != "upgrade" or not mds:
            return
        declared = [
            i for m in mds for t in m.tables.values() for i in t.indexes if i.name == index.name
        ]
        if not declared:
            return
        real = [i for i in reflection.read_indexes(conn).values() if i.name == index.name]
        if real and _info_signature(real[0]) == reflection.index_signature(declared[0]):
            raise MigrationError(
                f"cannot drop index {index.name}: the models still declare it, unchanged, so "
                "sharded_select(index=...) and FORCE_INDEX through it would fail. Remove it "
                "from the models first (and switch its readers to its replacement)."
            )

    def alter_index_storing(self, index: str, add: list[str], drop: list[str]) -> None:
        """``ALTER INDEX ... ADD|DROP STORED COLUMN``, each skipped when already done."""
        conn = self._online()
        stored: set[str] | None = None
        if conn is not None:
            found = [i for i in reflection.read_indexes(conn).values() if i.name == index]
            stored = set(found[0].storing) if found else None

        def q(name: str) -> str:  # pasted into text: checked and quoted by the dialect
            return quote_identifier(self.dialect, name, "index or column name")

        for col in add:
            if stored is None or col not in stored:
                self._exec(sa.text(f"ALTER INDEX {q(index)} ADD STORED COLUMN {q(col)}"))
        for col in drop:
            if stored is None or col in stored:
                self._exec(sa.text(f"ALTER INDEX {q(index)} DROP STORED COLUMN {q(col)}"))

    def _check_column_unused(self, conn: Connection, table_name: str, column: str) -> None:
        users = [
            info.name
            for info in reflection.read_indexes(conn, table_name).values()
            if ("index", info.name) not in self._dropped
            and (column in {c for c, _ in info.columns} or column in info.storing)
        ]
        if users:
            raise MigrationError(
                f"cannot drop {table_name}.{column}: index(es) {', '.join(users)} "
                "still use it. Drop them first in this migration, e.g. "
                f"op.drop_index({users[0]!r}, table_name={table_name!r}); for a shard "
                "column, keep it until no index is led by it."
            )
        checks = [
            name
            for name, clause in reflection.read_check_constraints(conn, table_name).items()
            if ("constraint", name) not in self._dropped
            and re.search(rf"\b{re.escape(column)}\b", clause)
        ]
        if checks:
            raise MigrationError(
                f"cannot drop {table_name}.{column}: CHECK constraint(s) "
                f"{', '.join(checks)} still use it (a shard marker, if named ck_..._shard...). "
                f"Drop it first: op.drop_constraint({checks[0]!r}, {table_name!r}, "
                "type_='check')."
            )
