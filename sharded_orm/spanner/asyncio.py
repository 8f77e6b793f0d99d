"""Our Spanner dialect for SQLAlchemy's asyncio extension: ``spanner+spanner_async://``.

``create_async_engine("spanner+spanner_async:///projects/P/instances/I/databases/D")``
gives an :class:`~sqlalchemy.ext.asyncio.AsyncEngine` on :class:`AsyncSpannerDialect`, the
sync dialect of :mod:`.dialect` (every fix, deadline, commit deadline, shard hook and
dual write of it) with its DB-API calls moved off the event loop, the way SQLAlchemy
adapts a blocking driver (its ``sqlite+aiosqlite`` and ``postgresql+asyncpg`` names: the
dialect, then the async driver):

* each DB-API connection (our :class:`~.connection.ShardedConnection`) has ONE worker
  thread of its own (the Spanner DB-API connection is not safe for concurrent use); every
  call that may wait on Spanner (connect, execute, fetch, commit, rollback, close,
  reflection, an isolation level change that commits) runs there, in the caller's
  ``contextvars`` context (telemetry parents spans under the calling task), and the
  caller's greenlet awaits it through SQLAlchemy's ``await_`` (``await_only`` on 2.0);
* a statement's rows are fetched on the worker as part of its execution (its deadline
  covers both), then served from memory, as SQLAlchemy's adapted cursors do;
* the pool is :class:`~sqlalchemy.pool.AsyncAdaptedQueuePool`.

A task cancelled while its call runs on the worker gets ``CancelledError`` at once;
SQLAlchemy invalidates the connection (its pool slot is free again) and it is closed on
its worker as soon as the call under way ends: within the statement's ``timeout`` (or the
commit's ``commit_timeout``). docs/async.md has the sizing rules and an app.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy import exc
from sqlalchemy.engine.interfaces import AdaptedConnection
from sqlalchemy.pool import AsyncAdaptedQueuePool, Pool

from sharded_orm.greenlets import await_here
from sharded_orm.spanner.connection import connect as _connect
from sharded_orm.spanner.dialect import SpannerDialect, SpannerExecutionContext

_T = TypeVar("_T")

#: ``on_worker`` is True in a worker thread while it runs a call
_local = threading.local()


def _as_worker(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    _local.on_worker = True
    try:
        return fn(*args, **kwargs)
    finally:
        _local.on_worker = False


def on_worker() -> bool:
    """True in a connection's worker thread, running a call of the dialect."""
    return bool(getattr(_local, "on_worker", False))


class _Worker:
    """The one thread of one DB-API connection: calls run there in order, one at a time."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sharded-orm-spanner")

    async def call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        loop = asyncio.get_running_loop()
        # the caller's context: its telemetry span, its contextvars (a copy per call)
        run = functools.partial(contextvars.copy_context().run, _as_worker, fn, *args, **kwargs)
        return await loop.run_in_executor(self._executor, run)

    def run(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """``fn(*args, **kwargs)`` on the worker, awaited from SQLAlchemy's greenlet."""
        result: _T = await_here(self.call(fn, *args, **kwargs))
        return result

    def later(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` on the worker after what is under way; nobody waits for it."""
        with contextlib.suppress(RuntimeError):  # RuntimeError: the worker is stopped
            self._executor.submit(contextvars.copy_context().run, fn, *args)

    def stop(self) -> None:
        """No new calls; the thread ends after the calls already given to it."""
        self._executor.shutdown(wait=False)


def _on_its_worker(worker: _Worker, call: Callable[[], None]) -> None:
    """``call`` on ``worker``, awaited; here if this is the worker, or if no greenlet can
    await it (a connection closed by garbage collection, outside the event loop)."""
    if on_worker():
        call()
        return
    try:
        worker.run(call)
    except exc.MissingGreenlet:
        call()


class AsyncAdaptedCursor:
    """A DB-API cursor over our sync cursor (:class:`~.connection.ShardedCursor`) whose
    execution (and fetch of its rows) runs on the connection's worker."""

    __slots__ = ("_adapted", "_cursor", "_rows", "description", "rowcount", "arraysize")

    def __init__(self, adapted: AsyncAdaptedConnection, cursor: Any) -> None:
        object.__setattr__(self, "_adapted", adapted)
        object.__setattr__(self, "_cursor", cursor)
        object.__setattr__(self, "_rows", deque())
        object.__setattr__(self, "description", None)
        object.__setattr__(self, "rowcount", -1)
        object.__setattr__(self, "arraysize", 1)

    # what the dialect reads or sets on its cursor (``connection``, ``deadline_seconds``,
    # ``request_tag``, ``lastrowid``...) is the sync cursor's
    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in AsyncAdaptedCursor.__slots__:
            object.__setattr__(self, name, value)
        else:
            setattr(self._cursor, name, value)

    def _run(self, method: str, statement: Any, parameters: Any, fetch: bool) -> Any:
        # on the worker: the statement, then its rows, under the cursor's deadline
        cursor = self._cursor
        getattr(cursor, method)(statement, parameters)
        description = cursor.description
        rows = cursor.fetchall() if fetch and description else ()
        return description, cursor.rowcount, rows

    def _done(self, outcome: Any) -> None:
        description, rowcount, rows = outcome
        self.description = description
        self.rowcount = rowcount
        self._rows = deque(rows)

    def execute(self, statement: Any, parameters: Any = None) -> None:
        self._rows = deque()
        self._done(self._adapted.run(self._run, "execute", statement, parameters, True))

    def executemany(self, statement: Any, seq_of_parameters: Any) -> None:
        self._rows = deque()
        self._done(self._adapted.run(self._run, "executemany", statement, seq_of_parameters, False))

    def fetchone(self) -> Any:
        return self._rows.popleft() if self._rows else None

    def fetchmany(self, size: int | None = None) -> list[Any]:
        count = self.arraysize if size is None else size
        rows = self._rows
        return [rows.popleft() for _ in range(min(count, len(rows)))]

    def fetchall(self) -> list[Any]:
        rows = list(self._rows)
        self._rows.clear()
        return rows

    def __iter__(self) -> Any:
        while self._rows:
            yield self._rows.popleft()

    async def _async_soft_close(self) -> None:
        """SQLAlchemy's asyncio results call this (its adapted cursors' hook): the rows
        are in memory already, nothing waits."""

    def close(self) -> None:
        self._rows.clear()
        # after whatever the worker still runs for this cursor (a cancelled call)
        self._adapted.worker.later(self._cursor.close)

    def setinputsizes(self, *sizes: Any) -> None:
        pass

    def setoutputsize(self, size: Any, column: Any = None) -> None:
        pass


class AsyncAdaptedConnection(AdaptedConnection):
    """The DB-API connection SQLAlchemy's pool holds for an async engine: our
    :class:`~.connection.ShardedConnection` (``driver_connection``, also ``connection``
    as the stock dialect and its pool ``reset`` hook read it) with its worker thread.
    Attributes (``read_only``, ``staleness``, ``autocommit``...) are the driver's."""

    __slots__ = ("worker",)
    worker: _Worker

    def __init__(self, driver: Any, worker: _Worker) -> None:
        object.__setattr__(self, "_connection", driver)
        object.__setattr__(self, "worker", worker)

    @property
    def connection(self) -> Any:
        return self._connection

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("_connection", "worker"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._connection, name, value)

    def run(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return self.worker.run(fn, *args, **kwargs)

    def cursor(self) -> AsyncAdaptedCursor:
        return AsyncAdaptedCursor(self, self._connection.cursor())

    def commit(self) -> None:
        self.run(self.driver_connection.commit)

    def rollback(self) -> None:
        self.run(self.driver_connection.rollback)

    def close(self) -> None:
        try:
            self.run(self._connection.close)
        finally:
            self.worker.stop()

    def terminate(self) -> None:
        """Close without waiting (a cancelled task, a connection invalidated outside the
        event loop): after the call under way, which its deadline bounds."""
        self.worker.later(self._connection.close)
        self.worker.stop()


def _adapted(dbapi_connection: Any) -> AsyncAdaptedConnection:
    """The adapted connection, given it or SQLAlchemy's pool proxy (``_ConnectionFairy``)."""
    if isinstance(dbapi_connection, AsyncAdaptedConnection):
        return dbapi_connection
    adapted = dbapi_connection.dbapi_connection
    if not isinstance(adapted, AsyncAdaptedConnection):
        raise exc.InvalidRequestError(
            f"{type(adapted).__name__} is not a connection of the async Spanner dialect"
        )
    return adapted


class AsyncSpannerExecutionContext(SpannerExecutionContext):
    def create_cursor(self) -> Any:
        # the sync dialect's cursor (deadline, bounded replays), adapted to the worker
        return AsyncAdaptedCursor(self._dbapi_connection.dbapi_connection, super().create_cursor())


def _on_worker(name: str) -> Callable[..., Any]:
    """A reflection method of the sync dialect run on the connection's worker (its
    single-use snapshots wait on Spanner)."""
    sync = getattr(SpannerDialect, name)

    @functools.wraps(sync)
    def method(self: AsyncSpannerDialect, connection: Any, *args: Any, **kw: Any) -> Any:
        fairy = getattr(connection, "connection", None)
        adapted = getattr(fairy, "dbapi_connection", None)
        if not isinstance(adapted, AsyncAdaptedConnection) or on_worker():
            return sync(self, connection, *args, **kw)
        return adapted.run(sync, self, connection, *args, **kw)

    return method


class AsyncSpannerDialect(SpannerDialect):
    """:class:`~.dialect.SpannerDialect` for ``create_async_engine``: the same dialect,
    its DB-API calls on one worker thread per connection, awaited (module docstring)."""

    driver = "spanner_async"
    is_async = True
    supports_statement_cache = True
    supports_server_side_cursors = False
    execution_ctx_cls = AsyncSpannerExecutionContext

    @classmethod
    def import_dbapi(cls) -> Any:
        return SpannerDialect.import_dbapi()

    @classmethod
    def get_pool_class(cls, url: Any) -> type[Pool]:
        return AsyncAdaptedQueuePool

    def connect(self, *cargs: Any, **cparams: Any) -> AsyncAdaptedConnection:
        worker = _Worker()
        try:
            driver = worker.run(_connect, *cargs, **cparams)
        except BaseException:
            worker.stop()
            raise
        # a rollback made by someone else than this dialect (sqlalchemy-spanner's pool
        # ``reset`` hook, on every Pool, rolls the driver back itself) runs on the worker
        driver.run_owned = functools.partial(_on_its_worker, worker)
        return AsyncAdaptedConnection(driver, worker)

    def get_driver_connection(self, connection: Any) -> Any:
        return connection._connection

    # what the sync dialect does with a DB-API connection, done on its worker with the
    # driver's connection (commit_within's own thread and deadline included)
    def do_commit(self, dbapi_connection: Any) -> None:
        adapted = _adapted(dbapi_connection)
        adapted.run(SpannerDialect.do_commit, self, adapted.driver_connection)

    def do_rollback(self, dbapi_connection: Any) -> None:
        adapted = _adapted(dbapi_connection)
        adapted.run(SpannerDialect.do_rollback, self, adapted.driver_connection)

    def do_close(self, dbapi_connection: Any) -> None:
        adapted = _adapted(dbapi_connection)
        try:
            adapted.run(SpannerDialect.do_close, self, adapted.driver_connection)
        except exc.MissingGreenlet:  # closed outside the event loop (garbage collection)
            adapted.worker.later(SpannerDialect.do_close, self, adapted.driver_connection)
        finally:
            adapted.worker.stop()

    def do_terminate(self, dbapi_connection: Any) -> None:
        adapted = _adapted(dbapi_connection)
        adapted.worker.later(SpannerDialect.do_close, self, adapted.driver_connection)
        adapted.worker.stop()

    def set_isolation_level(self, dbapi_connection: Any, level: Any) -> None:
        # switching to AUTOCOMMIT inside a transaction commits it
        adapted = _adapted(dbapi_connection)
        adapted.run(SpannerDialect.set_isolation_level, self, adapted.driver_connection, level)

    def get_isolation_level(self, dbapi_connection: Any) -> Any:
        return SpannerDialect.get_isolation_level(
            self, _adapted(dbapi_connection).driver_connection
        )

    has_table = _on_worker("has_table")
    has_sequence = _on_worker("has_sequence")
    get_schema_names = _on_worker("get_schema_names")
    get_table_names = _on_worker("get_table_names")
    get_view_names = _on_worker("get_view_names")
    get_sequence_names = _on_worker("get_sequence_names")
    get_view_definition = _on_worker("get_view_definition")
    get_unique_constraints = _on_worker("get_unique_constraints")
    get_multi_columns = _on_worker("get_multi_columns")
    get_multi_indexes = _on_worker("get_multi_indexes")
    get_multi_pk_constraint = _on_worker("get_multi_pk_constraint")
    get_multi_foreign_keys = _on_worker("get_multi_foreign_keys")


dialect = AsyncSpannerDialect
