"""sqlalchemy-spanner with its gaps closed: the ONE place our dialect fixes live.

``import sharded_orm`` registers this subclass, by module path (nothing is imported until
an engine or a ``spanner_*`` keyword needs it), under ``spanner+spanner`` and ``spanner``
in SQLAlchemy's dialect registry, the public hook for this. Each fix is an override in a
subclass, never a patch of the stock classes, and ``tests/test_dialect_fixes.py`` checks
that the stock dialect still has each gap, so we learn when upstream fixes one.

An engine on the stock class (made before ``import sharded_orm``, or on a stock dialect
the app registered itself) gets what needs no dialect class and is refused the rest:
``.stock``. What changes for an app, and why: docs/dialect.md.

Fixes (sqlalchemy-spanner 1.20):

1. ``PRIMARY KEY (...)`` lists column names unquoted and has no DESC parts: we quote them
   and render ``DESC`` for key parts declared descending (``sharded_orm.schema.keys``); the
   interleave parent's name is quoted too.
2. The dialect registers itself only as ``spanner.spanner`` and declares no
   ``construct_arguments``, so every ``spanner_*`` keyword warns "Can't validate argument"
   and a misspelt one is silently kept. We declare every keyword it honours (Table,
   Index, Column and ForeignKey/ForeignKeyConstraint ones): unknown ``spanner_*`` keywords
   raise ``ArgumentError``.
3. ``select().with_hint(t, "@{FORCE_INDEX=ix}", dialect_name="spanner")`` is dropped (only
   ``spanner+spanner`` or ``*`` render). We accept both names.
4. ``CREATE INDEX``: once the keywords are declared, the stock compiler would render
   ``STORING ()`` for an index without stored columns; ours renders each clause only when
   set.
5. ``BYTES`` values come back base64-encoded from the Spanner client; ``LargeBinary`` now
   returns the original bytes.
6. The DB-API maps only some of the client's errors, and none raised at commit: a child
   row whose interleave parent is missing fails with a bare ``google.api_core``
   ``NotFound``, which SQLAlchemy cannot wrap, so ``except sa.exc.IntegrityError`` (or
   ``DBAPIError``) misses it. We raise the DB-API's own class instead (constraint
   failures as ``IntegrityError``, bad statements as ``ProgrammingError``, the rest as
   ``OperationalError``), with the client's error as ``__cause__``. A DB-API error
   whose text is empty (the emulator's reasons print as ``[]``) is raised again with
   the client's message.
7. Identifiers: the stock preparer quotes with backticks but escapes nothing, so a name
   holding a backtick closes the quote, and the DB-API splits DDL at every ``;``: an index
   named ``ix` ON t (ts); DROP TABLE victim; CREATE INDEX `z`` dropped ``victim`` during
   ``create_all``. In queries we escape as GoogleSQL does (backslash escapes for backslash,
   backtick and control characters); in DDL every name must follow Spanner's naming rule
   (a letter, then letters, digits, ``_``) or it is refused with ``ShardConfigError``
   before anything is sent.
8. Spanner accepts at most 950 parameters per statement; SQLAlchemy's default batches
   (insertmanyvalues: 1,000 rows, 32,700 parameters) send an ORM flush of 200 rows of a
   5-column model as one 1,000-parameter INSERT. ``insertmanyvalues_max_parameters`` is
   set to 950, so SQLAlchemy sizes every batch under it; any other statement over the
   limit (``insert().values([...])`` with many rows, a long ``IN`` list) is refused before
   it is sent, with a ``ProgrammingError`` that says what to do instead.
9. Reflection pastes table, schema and sequence names into its INFORMATION_SCHEMA
   queries: ``has_table('x" OR "1"="1')`` answered True, a quote in a name sent broken
   SQL, ``filter_names=[]`` a syntax error. Our reflection (``.reflection``) binds every
   name as a query parameter and answers as SQLAlchemy's contract says, for any name.
10. A URL whose path is not ``projects/P/instances/I[/databases/D]`` crashed deep in
    ``create_engine`` (``'NoneType' object has no attribute 'group'``), and
    ``.../databases/`` was read as instance ``I/databases/``: such URLs are refused with
    an ``ArgumentError`` saying what a Spanner URL looks like.
11. Reads ran under the client's one-hour streaming timeout, and a stream cut with
    UNAVAILABLE was restarted without end: every statement now has a deadline, the
    ``timeout`` execution option (``.deadlines``), passed to the client per call.
12. A commit waited up to the client's hour on a silent server (and replayed an aborted
    transaction without end): every commit now ends within ``commit_timeout`` seconds
    (``create_engine(url, commit_timeout=60)``; ``.commits``), or fails saying its
    outcome is unknown, and the connection is discarded.
13. Our own DB-API connection and cursor (``.connection``): when Spanner aborts a
    transaction, the DB-API replays its statements on plain cursors, with no deadline (a
    silent server held a 4 s statement for the client's hour); the replay now runs under
    the deadline of the statement or commit that set it off, and ends with
    ``ReplayTimeout`` (the transaction was aborted: run it again).
14. The DB-API classifies every statement it executes with a ``sqlparse`` pass over the
    whole text (39 % of ``merged()``'s CPU at N = 64, k = 100): our cursor's
    classification is memoised per statement text (``.statements``).
15. Spanner requires a WHERE on UPDATE and DELETE, and the DB-API appends ``WHERE 1=1``
    to one without, at the very end of the text: after ``THEN RETURN ...``, so
    ``update(t).values(v=1).returning(t.c.id)`` (and ``delete(t).returning(...)``, an
    ORM ``update(Model)`` with ``synchronize_session="fetch"``) failed with a syntax
    error. Our compiler renders ``WHERE true`` for such a statement, so the DB-API adds
    nothing.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from google.api_core import exceptions as _api
from google.cloud.spanner_dbapi import exceptions as _dbapi
from google.cloud.sqlalchemy_spanner import sqlalchemy_spanner as _stock
from sqlalchemy import (
    Column,
    ForeignKeyConstraint,
    Index,
    LargeBinary,
    Table,
    exc,
    literal_column,
    true,
)
from sqlalchemy.engine import Dialect

from sharded_orm.checks import render_url
from sharded_orm.limits import SPANNER_PARAMETERS
from sharded_orm.schema.registry import engine_seen
from sharded_orm.spanner import SPANNER_DIALECT_NAMES

# Alembic finds its impl by dialect name: registered with the dialect, as
# sqlalchemy-cockroachdb does, so env.py needs no import; the impl itself loads only
# when Alembic builds one (see alembic_impl)
from sharded_orm.spanner import alembic_impl as alembic_impl
from sharded_orm.spanner.commits import (
    DEFAULT_COMMIT_TIMEOUT,
    CommitTimeout,
    check_commit_timeout,
    commit_within,
    is_abandoned,
)
from sharded_orm.spanner.databases import remember_database
from sharded_orm.spanner.ddl import ShardedSpannerDDLCompiler, SpannerIdentifierPreparer
from sharded_orm.spanner.deadlines import DeadlineCursor, read_errors, timeout_of
from sharded_orm.spanner.reflection import BoundReflection

_HINT_NAMES = ("*", *SPANNER_DIALECT_NAMES)

_URL_PATH = re.compile(
    r"projects/[A-Za-z0-9._:-]+/instances/[A-Za-z0-9_-]+(/databases/[A-Za-z0-9_-]+)?"
)

#: Spanner's limit on query parameters per statement (``sharded_orm.limits``).
MAX_PARAMETERS = SPANNER_PARAMETERS


class ShardedSpannerSQLCompiler(_stock.SpannerSQLCompiler):  # type: ignore[misc]
    def _setup_select_hints(self, select: Any) -> tuple[str, dict[Any, str]]:
        byfrom = {
            from_: hinttext % {"name": from_._compiler_dispatch(self, ashint=True)}
            for (from_, dialect), hinttext in select._hints.items()
            if dialect in _HINT_NAMES
        }
        return self.get_select_hint_text(byfrom), byfrom

    def visit_insert(self, insert_stmt: Any, *args: Any, **kw: Any) -> Any:
        """An INSERT given no values at all (a model whose only column is its IDENTITY
        key) names that column with ``DEFAULT``: Spanner has neither ``DEFAULT VALUES``
        nor ``() VALUES ()``. (An executemany of such rows SQLAlchemy already renders so,
        through ``supports_default_metavalue``.)"""
        if (
            not self.column_keys
            and not self.for_executemany
            and not insert_stmt._values
            and not insert_stmt._multi_values
            and insert_stmt.select is None
        ):
            for col in insert_stmt.table.columns:
                if col.identity is not None or col.server_default is not None:
                    insert_stmt = insert_stmt.values({col: literal_column("DEFAULT")})
                    break
        return super().visit_insert(insert_stmt, *args, **kw)

    def visit_update(self, update_stmt: Any, *args: Any, **kw: Any) -> Any:
        return super().visit_update(_with_a_where(update_stmt), *args, **kw)

    def visit_delete(self, delete_stmt: Any, *args: Any, **kw: Any) -> Any:
        return super().visit_delete(_with_a_where(delete_stmt), *args, **kw)


def _with_a_where(stmt: Any) -> Any:
    """An UPDATE or DELETE with no WHERE gets ``WHERE true``. Spanner requires a WHERE on
    both, and the DB-API adds ``WHERE 1=1`` to a statement in which ``sqlparse`` finds no
    top-level WHERE, at the end of the text: after ``THEN RETURN ...``, a syntax error
    (fix 15). With ours it finds one and adds nothing. Paid once per compiled statement."""
    if stmt.whereclause is None:
        return stmt.where(true())
    return stmt


class _Base64Bytes(LargeBinary):
    """BYTES arrive from the Spanner client base64-encoded: hand back the real bytes."""

    def result_processor(self, dialect: Dialect, coltype: object) -> Any:
        def process(value: Any) -> Any:
            if value is None:
                return None
            return base64.b64decode(value)

        return process


#: Client errors that mean a constraint said no (missing interleave parent, duplicate key,
#: a check or foreign key, a value out of range).
_INTEGRITY = (_api.NotFound, _api.AlreadyExists, _api.FailedPrecondition, _api.OutOfRange)


@contextmanager
def _dbapi_errors() -> Iterator[None]:
    """Raise the client's bare errors as the DB-API's classes, so SQLAlchemy wraps them."""
    try:
        yield
    except _dbapi.Error as e:
        # the DB-API wraps the client's error with its details only, often none (the
        # emulator's reason prints as "[]"): give the client's message instead
        cause = e.__cause__
        if str(e) in ("", "[]") and isinstance(cause, _api.GoogleAPICallError):
            raise type(e)(getattr(cause, "message", None) or str(cause)) from cause
        raise
    except _api.GoogleAPICallError as e:
        cls: type[Exception]
        if isinstance(e, _INTEGRITY):
            cls = _dbapi.IntegrityError
        elif isinstance(e, _api.InvalidArgument):
            cls = _dbapi.ProgrammingError
        else:
            cls = _dbapi.OperationalError
        raise cls(getattr(e, "message", None) or str(e)) from e


def _check_parameter_count(parameters: Any) -> None:
    """Refuse, before sending, a statement Spanner would refuse for its parameter count."""
    count = len(parameters) if parameters else 0
    if count > MAX_PARAMETERS:
        raise _dbapi.ProgrammingError(
            f"this statement has {count} parameters; Spanner accepts at most "
            f"{MAX_PARAMETERS} per statement. For many rows pass them as a list, "
            "conn.execute(table.insert(), rows), which is sent in batches under the limit "
            "(or use sharded_orm.bulk_load); split a long IN list, or use UNNEST(@array)."
        )


class SpannerExecutionContext(_stock.SpannerExecutionContext):  # type: ignore[misc]
    def create_cursor(self) -> Any:
        # one deadline per statement, from its ``timeout`` execution option
        seconds = timeout_of(self.execution_options)
        driver = self._dbapi_connection.driver_connection
        ours = getattr(driver, "deadline_cursor", None)
        if ours is not None:  # our connection (.connection): its replays are bounded too
            return ours(seconds)
        return DeadlineCursor(driver, seconds)


def _ini_seconds(value: Any) -> float | None:
    """An ini file's ``commit_timeout``: a number of seconds, or ``None``."""
    return None if value is None or str(value).strip().lower() == "none" else float(value)


def _deadline_of(cursor: Any) -> float | None:
    return getattr(cursor, "deadline_seconds", None)


class SpannerDialect(BoundReflection, _stock.SpannerDialect):  # type: ignore[misc]
    """sqlalchemy-spanner's dialect with sharded-orm's fixes (see the module docstring)."""

    supports_statement_cache = True  # SQLAlchemy asks every subclass to say so itself
    sharded_orm_dialect = True  # .stock.MARK: an engine on this class is one of ours
    ddl_compiler = ShardedSpannerDDLCompiler
    statement_compiler = ShardedSpannerSQLCompiler
    colspecs = {**_stock.SpannerDialect.colspecs, LargeBinary: _Base64Bytes}
    preparer = SpannerIdentifierPreparer
    execution_ctx_cls = SpannerExecutionContext
    insertmanyvalues_max_parameters = MAX_PARAMETERS
    # A row given no values (a model whose only column is its IDENTITY key) is inserted
    # as ``INSERT INTO t (id) VALUES (DEFAULT)``; the stock dialect says it supports an
    # empty insert, which SQLAlchemy renders as ``() VALUES ()``, a syntax error on Spanner.
    supports_default_metavalue = True
    supports_empty_insert = False
    # every keyword the stock dialect reads (tests/test_dialect_fixes.py finds them in its
    # source): declaring any switches on SQLAlchemy's validation of all ``spanner_*`` ones
    construct_arguments = [
        (Table, {"interleave_in": None, "interleave_on_delete_cascade": False}),
        (Index, {"storing": None, "null_filtered": False, "interleave_in": None}),
        (Column, {"allow_commit_timestamp": False, "exclude_from_returning": False}),
        (ForeignKeyConstraint, {"not_enforced": False}),
    ]
    # ``sqlalchemy.commit_timeout = 30`` in an ini file (engine_from_config) is a number
    engine_config_types = {
        **_stock.SpannerDialect.engine_config_types,
        "commit_timeout": _ini_seconds,
    }

    def __init__(self, commit_timeout: float | None = DEFAULT_COMMIT_TIMEOUT, **kw: Any) -> None:
        super().__init__(**kw)
        #: seconds every commit may take (``create_engine(url, commit_timeout=...)``)
        self.commit_timeout = check_commit_timeout(commit_timeout)

    def create_connect_args(self, url: Any) -> Any:
        if not isinstance(url.database, str) or not _URL_PATH.fullmatch(url.database):
            raise exc.ArgumentError(
                f"not a Spanner URL: {render_url(url)!r}; give "
                "spanner+spanner:///projects/<project>/instances/<instance>/databases/<database>"
            )
        return super().create_connect_args(url)

    @classmethod
    def engine_created(cls, engine: Any) -> None:
        """Every Spanner engine is one sharded-orm has something to do with: its writes
        to sharded tables are checked from the first statement (per engine, no global
        listener)."""
        super().engine_created(engine)
        engine_seen(engine)
        remember_database(engine)  # the id pools and load tools reach it without a checkout

    @classmethod
    def import_dbapi(cls) -> Any:
        return _stock.SpannerDialect.import_dbapi()

    def connect(self, *cargs: Any, **cparams: Any) -> Any:
        # our DB-API connection (.connection): replays of an aborted transaction keep
        # the deadline of the call that set them off. Imported here, at the first
        # connect: an engine that never connects does not load it (issue 45)
        from sharded_orm.spanner.connection import connect

        return connect(*cargs, **cparams)

    def do_execute(self, cursor: Any, statement: Any, parameters: Any, context: Any = None) -> None:
        _check_parameter_count(parameters)
        with _dbapi_errors(), read_errors(_deadline_of(cursor)):
            super().do_execute(cursor, statement, parameters, context)

    def do_executemany(
        self, cursor: Any, statement: Any, parameters: Any, context: Any = None
    ) -> None:
        with _dbapi_errors(), read_errors(_deadline_of(cursor)):
            super().do_executemany(cursor, statement, parameters, context)

    def do_execute_no_params(self, cursor: Any, statement: Any, context: Any = None) -> None:
        with _dbapi_errors(), read_errors(_deadline_of(cursor)):
            super().do_execute_no_params(cursor, statement, context)

    def do_commit(self, dbapi_connection: Any) -> None:
        driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
        with _dbapi_errors():
            commit_within(
                lambda: super(SpannerDialect, self).do_commit(dbapi_connection),
                self.commit_timeout,
                driver,
            )

    def is_disconnect(self, e: Any, connection: Any, cursor: Any) -> bool:
        # a commit abandoned at its deadline still runs on this connection: discard it
        return isinstance(e, CommitTimeout) or bool(super().is_disconnect(e, connection, cursor))

    def do_close(self, dbapi_connection: Any) -> None:
        if is_abandoned(dbapi_connection):
            return  # its close would roll back on the server that did not answer the commit
        super().do_close(dbapi_connection)
