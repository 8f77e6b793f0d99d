"""Issue 46: ``create_async_engine("spanner+spanner_async:///...")`` on the emulator.

The async dialect (``sharded_orm.spanner.asyncio``) is the sync one with its DB-API calls
on one worker thread per connection: DDL through ``run_sync``, ORM flushes with shard
columns, the partial-source UPDATE, ``merged()``/``page()``, statement deadlines,
cancellation, and an event loop that stays responsive under 50 concurrent tasks.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import sqlalchemy as sa
from loop_watch import LoopWatch
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import (
    ShardedIndex,
    UTCDateTime,
    get_shard_column,
    merged,
    page,
    shard_column,
    sharded_select,
)

pytestmark = pytest.mark.emulator

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


class Base(DeclarativeBase):
    pass


class Event(Base):
    __tablename__ = "async_events"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    tenant: Mapped[str] = mapped_column(sa.String(20))
    kind: Mapped[str] = mapped_column(sa.String(20))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    s: Mapped[int] = shard_column("tenant", "kind", count=8)
    __table_args__ = (ShardedIndex("async_events_by_ts", sa.desc("ts"), shard="s"),)


def async_url(emulator: Any, database_id: str) -> str:
    return emulator.url(database_id).replace("spanner+spanner:", "spanner+spanner_async:", 1)


def make_engine(emulator: Any, database_id: str, **kw: Any) -> AsyncEngine:
    connect_args = {"client": emulator.client}
    return create_async_engine(async_url(emulator, database_id), connect_args=connect_args, **kw)


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(main())  # type: ignore[arg-type]


async def _created(emulator: Any, **kw: Any) -> AsyncEngine:
    engine = make_engine(emulator, emulator.create_database(), **kw)
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    return engine


def stored_shard(tenant: str, kind: str) -> int:
    return int(get_shard_column(Event, "s").compute([tenant, kind]))


def test_url_gives_the_async_dialect_with_the_sync_one_s_behaviour(spanner_emulator: Any) -> None:
    from sharded_orm.spanner.asyncio import AsyncSpannerDialect
    from sharded_orm.spanner.dialect import SpannerDialect

    engine = make_engine(spanner_emulator, "d1")
    dialect = engine.sync_engine.dialect
    assert type(dialect) is AsyncSpannerDialect and isinstance(dialect, SpannerDialect)
    assert dialect.is_async and dialect.name == "spanner+spanner"
    assert type(engine.sync_engine.pool).__name__ == "AsyncAdaptedQueuePool"
    with pytest.raises(sa.exc.ArgumentError, match="not a Spanner URL"):
        create_async_engine("spanner+spanner_async:///projects/p/databases/d").sync_engine.connect()


def test_create_all_orm_flush_and_partial_source_update(spanner_emulator: Any) -> None:
    async def main() -> None:
        engine = await _created(spanner_emulator)
        try:
            async with engine.connect() as conn:
                names = await conn.run_sync(lambda c: sa.inspect(c).get_table_names())
                assert "async_events" in names
            sessions = async_sessionmaker(engine, expire_on_commit=False)
            async with sessions.begin() as s:
                s.add_all([Event(id=i, tenant=f"t{i % 3}", kind="a", ts=T0) for i in range(6)])
            async with sessions.begin() as s:
                e = await s.get(Event, 1)
                assert e is not None
                e.kind = "b"  # one source of two: the shard follows
            async with engine.begin() as conn:  # Core, one source given
                await conn.execute(sa.update(Event).where(Event.id == 2).values(tenant="zz"))
            async with engine.connect() as conn:
                rows = (await conn.execute(sa.select(Event.__table__))).mappings().all()
            got = {r["id"]: (r["tenant"], r["kind"], r["s"]) for r in rows}
            assert got[1] == ("t1", "b", stored_shard("t1", "b"))
            assert got[2] == ("zz", "a", stored_shard("zz", "a"))
            for r in rows:
                assert r["s"] == stored_shard(r["tenant"], r["kind"])
        finally:
            await engine.dispose()

    run(main)


def test_merged_and_page_through_async_session(spanner_emulator: Any) -> None:
    async def main() -> None:
        engine = await _created(spanner_emulator)
        try:
            async with engine.begin() as conn:
                await conn.execute(
                    Event.__table__.insert(),
                    [
                        {
                            "id": i,
                            "tenant": f"t{i % 5}",
                            "kind": "k",
                            "ts": T0 + dt.timedelta(seconds=i),
                        }
                        for i in range(30)
                    ],
                )
            stmt = sharded_select(Event, index="async_events_by_ts").order_by(Event.ts.desc())
            async with AsyncSession(engine) as s:
                top = await merged(s, stmt, 4)
                assert [e.id for e in top] == [29, 28, 27, 26]
                first = await page(s, stmt, 10)
                second = await page(s, stmt, 10, first.next_cursor)
                assert [e.id for e in second.rows] == list(range(19, 9, -1))
        finally:
            await engine.dispose()

    run(main)


@pytest.fixture
def silent(spanner_emulator: Any, spanner_faults: Any) -> AsyncIterator[tuple[Any, str]]:
    database_id = spanner_emulator.create_database()
    try:
        yield spanner_faults, database_id
    finally:
        spanner_faults.clear()
        spanner_faults.come_back()


def test_statement_deadline_ends_a_silent_read_without_stalling_the_loop(
    spanner_emulator: Any, silent: tuple[Any, str]
) -> None:
    """The server holds the read until the client's event loop has turned (a read that
    blocked the loop would hold it until the read's deadline, after the watch gives up:
    noted), then goes silent: the statement ends at its deadline with an error that says
    it can be retried."""
    faults, database_id = silent
    through = faults.emulator(spanner_emulator)

    async def main() -> None:
        engine = make_engine(through, database_id, pool_size=1, max_overflow=0)
        watch = LoopWatch()
        try:
            wait = functools.partial(watch.wait_for_turns, "the silent read", timeout=2.5)
            faults.hang("ExecuteStreamingSql", 30, times=1, wait=wait)
            started = time.monotonic()
            with pytest.raises(sa.exc.OperationalError, match="can be retried"):
                async with engine.connect() as conn:
                    await conn.execute(sa.text("SELECT 1"), execution_options={"timeout": 3})
            assert time.monotonic() - started < 3 + 3.0
        finally:
            blocked = await watch.stop()
            await engine.dispose()
        assert watch.held == 1 and blocked == []
        assert faults.count("ExecuteStreamingSql", "gone while held") == 0

    run(main)


def test_a_cancelled_task_gives_its_connection_back(
    spanner_emulator: Any, silent: tuple[Any, str]
) -> None:
    """Cancelled while Spanner is silent: CancelledError at once, the connection
    invalidated and its pool slot free (pool_size=1), the next statement runs."""
    faults, database_id = silent
    through = faults.emulator(spanner_emulator)

    async def main() -> None:
        engine = make_engine(through, database_id, pool_size=1, max_overflow=0)
        try:
            # a task cancelled while Spanner is silent: cancelled at once, its connection
            # given back (pool_size=1: the next statement would wait for it otherwise)
            faults.hang("ExecuteStreamingSql", 30, times=1)

            async def read() -> None:
                async with engine.connect() as conn:
                    await conn.execute(sa.text("SELECT 1"), execution_options={"timeout": 2})

            task = asyncio.create_task(read())
            await asyncio.sleep(0.3)
            task.cancel()
            started = time.monotonic()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert time.monotonic() - started < 0.5
            assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
            async with engine.connect() as conn:
                assert (await conn.execute(sa.text("SELECT 7"))).scalar() == 7
        finally:
            await engine.dispose()

    run(main)


TASKS = 50


def test_fifty_concurrent_tasks_keep_the_event_loop_responsive(
    spanner_emulator: Any, silent: tuple[Any, str]
) -> None:
    """50 tasks read and write at once (the emulator runs one read-write transaction at a
    time: writes retry aborts). The server holds some of their reads and commits until
    the client's event loop has turned: a call that blocked the loop would be held until
    the watch gave up (noted) or until its own deadline (the proxy counts it "gone while
    held"). Every shard is stored right."""
    faults, database_id = silent
    through = faults.emulator(spanner_emulator)

    async def main() -> None:
        engine = make_engine(through, database_id, pool_size=10, max_overflow=0)
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        watch = LoopWatch()
        for method in ("ExecuteStreamingSql", "Commit"):
            wait = functools.partial(watch.wait_for_turns, method, timeout=5.0)
            faults.hold(method, wait, times=5)
        sessions = async_sessionmaker(engine, expire_on_commit=False)

        async def work(i: int) -> int:
            for attempt in range(40):
                try:
                    async with sessions.begin() as s:
                        s.add(Event(id=1000 + i, tenant=f"t{i}", kind="w", ts=T0))
                    break
                except sa.exc.DBAPIError:
                    await asyncio.sleep(0.02 * (attempt + 1))
            async with engine.connect() as conn:
                return int(
                    (
                        await conn.execute(sa.select(Event.s).where(Event.id == 1000 + i))
                    ).scalar_one()
                )

        try:
            shards = await asyncio.gather(*(work(i) for i in range(TASKS)))
        finally:
            blocked = await watch.stop()
            await engine.dispose()
        assert shards == [stored_shard(f"t{i}", "w") for i in range(TASKS)]
        assert watch.held == 10 and faults.pending == 0
        assert blocked == []
        assert faults.count("ExecuteStreamingSql", "gone while held") == 0
        assert faults.count("Commit", "gone while held") == 0

    run(main)


def test_run_through_sends_a_sync_body_through_the_async_adapter(
    spanner_engine: sa.Engine, spanner_async_engine: AsyncEngine
) -> None:
    """The plugin's async engine is on spanner_engine's database, and ``run_through``
    runs a sync body on it with every statement on the adapted cursor (the worker)."""
    from sharded_orm.testing.async_engines import run_through

    cursors: list[str] = []

    @sa.event.listens_for(spanner_async_engine.sync_engine, "before_cursor_execute")
    def seen(conn: Any, cursor: Any, *args: Any) -> None:
        cursors.append(type(cursor).__name__)

    def body(engine: sa.Engine, n: int) -> list[tuple[int, str]]:
        Base.metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(
                Event.__table__.insert(),
                [{"id": i, "tenant": f"t{i}", "kind": "k", "ts": T0} for i in range(n)],
            )
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.select(Event.id, Event.tenant))]

    assert sorted(run_through(spanner_async_engine, body, 3)) == [(0, "t0"), (1, "t1"), (2, "t2")]
    assert cursors and set(cursors) == {"AsyncAdaptedCursor"}
    with spanner_engine.connect() as conn:  # the same database
        assert conn.execute(sa.select(sa.func.count()).select_from(Event)).scalar() == 3
    with pytest.raises(sa.exc.IntegrityError):  # what the body raises, raised
        run_through(spanner_async_engine, body, 1)


def test_the_stock_pool_reset_hook_rolls_back_on_the_worker(
    spanner_emulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sqlalchemy-spanner's pool ``reset`` hook (on every Pool) rolls back a driver that
    is still in a transaction when its connection goes back to the pool. Through the
    async engine that rollback runs on the connection's worker, not on the event loop."""
    import threading

    from google.cloud.spanner_dbapi.connection import Connection

    threads: list[str] = []
    stock_rollback = Connection.rollback

    def spy(self: Any) -> None:
        threads.append(threading.current_thread().name)
        stock_rollback(self)

    monkeypatch.setattr(Connection, "rollback", spy)

    async def main() -> None:
        engine = await _created(spanner_emulator, pool_size=1, max_overflow=0)
        try:
            async with engine.connect() as conn:

                def driver_transaction(sync_conn: sa.Connection) -> bool:
                    # a statement SQLAlchemy does not know of: the driver begins a
                    # transaction, SQLAlchemy has none to roll back at close
                    adapted = sync_conn.connection.dbapi_connection
                    assert adapted is not None
                    cursor = adapted.cursor()
                    cursor.execute("SELECT 1")
                    cursor.fetchall()
                    return bool(adapted.driver_connection.inside_transaction)

                assert await conn.run_sync(driver_transaction)
                threads.clear()
            # the connection is back in the pool: rolled back, on the worker only
            assert threads and all(t.startswith("sharded-orm-spanner") for t in threads), threads
            async with engine.connect() as conn:  # the pooled connection works again
                assert (await conn.execute(sa.text("SELECT 1"))).scalar() == 1
        finally:
            await engine.dispose()

    run(main)
