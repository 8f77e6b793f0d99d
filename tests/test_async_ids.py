"""Pooled ids on async engines (issue 46): a reservation never blocks the event loop.

An ``AsyncSession`` flush computes a ``default=seq`` column in SQLAlchemy's greenlet, on
the event loop's thread. A pooled sequence's reservation (Spanner's client through
``RawSpanner``, or a sync driver) used to run right there, stalling every task of the
loop for a round trip (a slow server: for as long as it is slow); and a reservation that
awaited (an async driver's ``TableSequence``) held a ``threading.Lock`` across its
``await``, so the next task asking for an id blocked the loop's thread on that lock:
frozen until the deadline. Now the lock is held only to take values and register the
refill; the reservation runs on a thread (or awaits by itself) and the others wait for
it without blocking the loop. One reservation per block still.

Each test runs its event loop in a thread joined with a timeout: a deadlock fails, it
never hangs the suite.
"""

from __future__ import annotations

import asyncio
import functools
import math
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loop_watch import LoopWatch
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.util import greenlet_spawn

from sharded_orm import SpannerSequence, TableSequence
from sharded_orm.retry import RetryError

TASKS = 50


def run_bounded(main: Callable[[], Awaitable[None]], limit: float = 120.0) -> None:
    """``asyncio.run(main())`` in a thread: a loop still stuck after ``limit`` s fails."""
    failed: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(main())  # type: ignore[arg-type]
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"the event loop was still stuck after {limit} s (deadlock)"
    if failed:
        raise failed[0]


def item_model(seq: Any) -> tuple[sa.MetaData, type[Any]]:
    """A model whose primary key comes from ``seq`` as a column default."""

    class Base(DeclarativeBase):
        pass

    class Item(Base):
        __tablename__ = "async_id_items"
        id: Mapped[int] = mapped_column(
            sa.BigInteger, primary_key=True, autoincrement=False, default=seq
        )
        task: Mapped[int] = mapped_column(sa.BigInteger)

    return Base.metadata, Item


async def insert_items(engine: AsyncEngine, model: type[Any], tasks: int, retry: bool) -> list[int]:
    """``tasks`` concurrent tasks, each flushing one row in its own AsyncSession; the ids
    the flushes gave them. ``retry``: a write the emulator aborts is tried again."""
    sessions = async_sessionmaker(engine, expire_on_commit=False)

    async def one(i: int) -> int:
        for attempt in range(60):
            try:
                async with sessions.begin() as session:
                    item = model(task=i)
                    session.add(item)
                return int(item.id)
            except sa.exc.DBAPIError:  # the emulator runs one read-write transaction at once
                if not retry:
                    raise
                await asyncio.sleep(0.02 * min(attempt + 1, 10))
        raise AssertionError(f"task {i}: its row was never written")

    return list(await asyncio.gather(*(one(i) for i in range(tasks))))


async def stored(engine: AsyncEngine, model: type[Any]) -> list[tuple[int, int]]:
    """The rows stored, as sorted (task, id) pairs."""
    async with engine.connect() as conn:
        rows = await conn.execute(sa.select(model.task, model.id))
        return sorted((int(task), int(id_)) for task, id_ in rows)


# ------------------------------------------------------------------------------ SQLite


def test_an_awaiting_reservation_holds_no_lock_the_next_task_blocks_on(tmp_path: Path) -> None:
    """TableSequence on an aiosqlite engine: its reservation awaits the driver. Before,
    it awaited holding the pool's threading lock; the next task's next_id() blocked the
    loop's thread on it, so the first never resumed: every flush ended with 'held the
    pool's lock' after the deadline. Now 50 tasks get distinct ids, all stored, with one
    reservation per block (a blocked loop shows as those errors, or as the thread join's
    timeout)."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'items.db'}"

    async def main() -> None:
        # a reservation off Spanner takes a connection of the engine's pool while the
        # flushes waiting for it hold theirs: the pool must have one to spare
        engine = create_async_engine(url, connect_args={"timeout": 30}, pool_size=TASKS + 1)
        seq = TableSequence(engine.sync_engine, "items", block_size=3, deadline=5)
        metadata, item = item_model(seq)
        try:
            async with engine.begin() as conn:
                await conn.run_sync(metadata.create_all)
                await conn.run_sync(seq.table.create)
            ids = await insert_items(engine, item, TASKS, retry=False)
            rows = await stored(engine, item)
        finally:
            await engine.dispose()
        assert len(set(ids)) == TASKS
        assert rows == list(enumerate(ids))
        assert seq.reservations == math.ceil(TASKS / 3)  # one reservation per block

    run_bounded(main)


class Slowed:
    """Every statement of ``engine`` waits first: ``seconds`` (a slow server), or, once
    ``watch`` is set, until the event loop has turned (a server that answers when the
    loop is seen free; a statement run on the loop's thread is noted at once)."""

    def __init__(self, engine: sa.Engine, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.watch: LoopWatch | None = None
        sa.event.listen(engine, "before_cursor_execute", self._wait)

    def _wait(self, *args: Any) -> None:
        if self.watch is not None:
            self.watch.wait_for_turns("a reservation's statement")
        time.sleep(self.seconds)


def test_a_slow_blocking_reservation_runs_off_the_loop(tmp_path: Path) -> None:
    """A TableSequence on a sync engine (a blocking driver) as the default of an async
    engine's flush: its reservation used to run on the loop's thread, stalling every task
    for as long as the server took; now it runs on a thread and the flush awaits it. Each
    of its statements waits until the loop has turned, which it could not if it ran on
    the loop's thread (noted at once)."""
    ids_engine = sa.create_engine(f"sqlite:///{tmp_path / 'ids.db'}")
    seq = TableSequence(ids_engine, "items", block_size=2)
    seq.create_table()
    slowed = Slowed(ids_engine)  # a reservation: a SELECT, then an INSERT or UPDATE
    metadata, item = item_model(seq)

    async def main() -> None:
        engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'items.db'}")
        try:
            async with engine.begin() as conn:
                await conn.run_sync(metadata.create_all)
            watch = slowed.watch = LoopWatch()
            ids = await insert_items(engine, item, 4, retry=False)
            blocked = await watch.stop()
            rows = await stored(engine, item)
        finally:
            await engine.dispose()
        assert sorted(ids) == [1, 2, 3, 4] and rows == list(enumerate(ids))
        assert seq.reservations == 2 and watch.held == 4  # two statements each
        assert blocked == []

    try:
        run_bounded(main)
    finally:
        ids_engine.dispose()


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(block=st.integers(1, 6), tasks=st.integers(1, 24))
def test_concurrent_refills_take_one_reservation_per_block(
    tmp_path: Path, block: int, tasks: int
) -> None:
    """Tasks asking at once while the pool is empty: one reservation runs, the others
    wait for it (no spare block): ceil(tasks / block) reservations, distinct values."""
    ids_engine = sa.create_engine(f"sqlite:///{tmp_path / f'ids-{block}-{tasks}.db'}")
    seq = TableSequence(ids_engine, "s", block_size=block, deadline=10)
    seq.create_table()
    Slowed(ids_engine, 0.002)
    values: list[int] = []

    async def main() -> None:
        values.extend(await asyncio.gather(*(greenlet_spawn(seq.next_id) for _ in range(tasks))))

    try:
        run_bounded(main, limit=60)
    finally:
        ids_engine.dispose()
    assert sorted(values) == list(range(1, tasks + 1))
    assert seq.reservations == math.ceil(tasks / block)


def test_a_task_waiting_for_a_stuck_reservation_gets_a_clear_error(tmp_path: Path) -> None:
    """A reservation slower than the waiter's deadline: the waiter ends at its deadline
    with an error saying why, the loop runs on, the reservation's values stay usable."""
    ids_engine = sa.create_engine(f"sqlite:///{tmp_path / 'ids.db'}")
    seq = TableSequence(ids_engine, "s", block_size=2, deadline=0.6)
    seq.create_table()
    slowed = Slowed(ids_engine, 0.5)  # a reservation takes 1 s: more than the waiter's 0.6 s

    async def main() -> None:
        watch = slowed.watch = LoopWatch()
        seq.deadline = 3.0  # the first caller may wait long enough
        first = asyncio.create_task(greenlet_spawn(seq.next_id))
        await asyncio.sleep(0.1)
        seq.deadline = 0.6
        started = time.monotonic()
        with pytest.raises(RetryError, match="held the pool's lock"):
            await greenlet_spawn(seq.next_id)
        assert time.monotonic() - started < 0.6 + 0.3
        assert await first == 1 and await greenlet_spawn(seq.next_id) == 2
        assert await watch.stop() == [] and watch.held == 2

    try:
        run_bounded(main, limit=30)
    finally:
        ids_engine.dispose()


def test_an_async_engine_is_taken_and_next_id_async_awaits(tmp_path: Path) -> None:
    """``TableSequence(async_engine)`` reserves through its sync engine; a coroutine
    awaits ``next_id_async()``."""
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'ids.db'}")
    seq = TableSequence(engine, "s", block_size=2)
    assert seq.engine is engine.sync_engine
    with pytest.raises(Exception, match="Spanner engine, got 'sqlite'.*use TableSequence"):
        SpannerSequence(engine, "s")

    async def main() -> None:
        try:
            async with engine.begin() as conn:
                await conn.run_sync(seq.table.create)
            got = await asyncio.gather(*(seq.next_id_async() for _ in range(5)))
            assert sorted(got) == [1, 2, 3, 4, 5] and seq.reservations == 3
        finally:
            await engine.dispose()

    run_bounded(main, limit=30)


# ------------------------------------------------------------------------------ Spanner


def spanner_engine(emulator: Any, database_id: str, **kw: Any) -> AsyncEngine:
    url = emulator.url(database_id).replace("spanner+spanner:", "spanner+spanner_async:", 1)
    return create_async_engine(url, connect_args={"client": emulator.client}, **kw)


def make_sequence(kind: str, engine: AsyncEngine, **kw: Any) -> SpannerSequence | TableSequence:
    if kind == "spanner":
        return SpannerSequence(engine.sync_engine, "item_ids", **kw)
    return TableSequence(engine.sync_engine, "item_ids", **kw)


async def create_tables(engine: AsyncEngine, metadata: sa.MetaData, seq: Any) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        if isinstance(seq, TableSequence):
            await conn.run_sync(seq.table.create)


KINDS = ["spanner", "table"]


@pytest.mark.emulator
@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_fifty_tasks_flush_pooled_ids_on_the_emulator(
    spanner_emulator: Any, faults: Any, kind: str
) -> None:
    """50 tasks flush rows whose ids come from a pooled sequence with blocks of 3
    (refills race all the time): no duplicate, every row stored. The server holds some
    statements and commits until the event loop has turned: one that blocked the loop
    would be held until the watch gave up, or its caller gone."""
    database_id = spanner_emulator.create_database([SpannerSequence.create_ddl("item_ids")])
    through = faults.emulator(spanner_emulator)

    async def main() -> None:
        engine = spanner_engine(through, database_id, pool_size=10, max_overflow=0)
        seq = make_sequence(kind, engine, block_size=3, deadline=60, max_retries=40)
        metadata, item = item_model(seq)
        try:
            await create_tables(engine, metadata, seq)
            # no warm-up: the first reservation reaches the client without a pool
            # connection, which 50 flushes holding all 10 would not leave it
            watch = LoopWatch()
            for method in ("ExecuteSql", "Commit"):
                wait = functools.partial(watch.wait_for_turns, method, timeout=5.0)
                faults.hold(method, wait, times=5)
            ids = await insert_items(engine, item, TASKS, retry=True)
            blocked = await watch.stop()
            rows = await stored(engine, item)
        finally:
            seq.close()
            await engine.dispose()
        assert len(set(ids)) == TASKS
        assert rows == list(enumerate(ids))
        assert watch.held == 10 and blocked == []
        assert faults.count("ExecuteSql", "gone while held") == 0
        assert faults.count("Commit", "gone while held") == 0

    run_bounded(main, limit=300)


@pytest.fixture
def faults(spanner_faults: Any) -> Any:
    try:
        yield spanner_faults
    finally:
        spanner_faults.clear()


@pytest.mark.emulator
@pytest.mark.parametrize("kind", KINDS)
def test_a_slow_reservation_leaves_the_loop_on_schedule(
    spanner_emulator: Any, faults: Any, kind: str
) -> None:
    """The server holds the reservation's query until the event loop has turned, then
    fails it (it is retried): before, the flush ran it on the loop's thread, so the loop
    could not turn while it was held; now it runs on a thread."""
    database_id = spanner_emulator.create_database([SpannerSequence.create_ddl("item_ids")])
    through = faults.emulator(spanner_emulator)

    async def main() -> None:
        engine = spanner_engine(through, database_id, pool_size=2, max_overflow=0)
        seq = make_sequence(kind, engine, block_size=1, deadline=30)
        metadata, item = item_model(seq)
        try:
            await create_tables(engine, metadata, seq)
            first = await insert_items(engine, item, 1, retry=False)  # the session is made
            faults.clear()
            # the flush's first ExecuteSql is the reservation's (the default comes first)
            watch = LoopWatch()
            wait = functools.partial(watch.wait_for_turns, "the reservation")
            faults.hang("ExecuteSql", 0.0, times=1, wait=wait)
            second = await insert_items(engine, item, 1, retry=False)
            blocked = await watch.stop()
            rows = await stored(engine, item)
        finally:
            seq.close()
            await engine.dispose()
        assert faults.count("ExecuteSql", "hung") == 1 and seq.retries == 1
        assert len(set(first + second)) == 2 and rows == sorted([(0, first[0]), (0, second[0])])
        assert watch.held == 1 and blocked == []
        assert faults.count("ExecuteSql", "gone while held") == 0

    run_bounded(main)


@pytest.mark.emulator
def test_two_tasks_refilling_at_once_share_one_reservation(
    spanner_emulator: Any, faults: Any
) -> None:
    """Two tasks find the pool empty while the first one's reservation is slow: the
    second waits for it without blocking the loop (a lock held across the first one's
    await would freeze the loop: the thread join's timeout fails that case), and both
    values come from that one block."""
    database_id = spanner_emulator.create_database([SpannerSequence.create_ddl("item_ids")])
    through = faults.emulator(spanner_emulator)

    async def main() -> None:
        engine = spanner_engine(through, database_id, pool_size=2, max_overflow=0)
        seq = SpannerSequence(engine.sync_engine, "item_ids", block_size=2, deadline=10)
        try:
            async with engine.connect() as conn:  # the session is made, the pool drained
                await conn.run_sync(lambda _: [seq.next_id(), seq.next_id()])
            before = seq.reservations
            faults.clear()
            watch = LoopWatch()
            asked = threading.Event()

            def until_the_second_asked() -> None:
                watch.wait_for_turns("the first reservation")
                asked.wait(20)

            # the first one's reservation is held until the second has asked
            faults.hang("ExecuteSql", 0.0, times=1, wait=until_the_second_asked)
            first = asyncio.create_task(greenlet_spawn(seq.next_id))
            await asyncio.sleep(0.2)  # the first one's reservation is under way
            second = asyncio.create_task(greenlet_spawn(seq.next_id))
            await asyncio.sleep(0.2)  # the second waits for it
            asked.set()
            values = await asyncio.wait_for(asyncio.gather(first, second), 20)
            blocked = await watch.stop()
        finally:
            seq.close()
            await engine.dispose()
        assert len(set(values)) == 2
        assert seq.reservations == before + 1  # one block served both
        assert faults.count("ExecuteSql", "hung") == 1
        assert watch.held == 1 and blocked == []

    run_bounded(main, limit=60)
