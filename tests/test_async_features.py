"""Issue 46: what the sync dialect does, through ``create_async_engine("spanner+spanner_async:")``.

Each test drives an ``AsyncSession`` or ``AsyncConnection`` and checks what Spanner (the
emulator, or the mock server where the request itself is the point) saw or stored:
stale and read-only reads, request and transaction tags, the dual write of a key
reshard, the replay of an ABORTED transaction, and telemetry spans parented under the
calling task's span.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from reshard_models import events
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import (
    ShardedIndex,
    bulk_load,
    compute_shard,
    merged,
    shard_column,
    sharded_select,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


class Base(DeclarativeBase):
    pass


class Note(Base):
    __tablename__ = "async_notes"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    author: Mapped[str] = mapped_column(sa.String(20))
    ts: Mapped[int] = mapped_column(sa.BigInteger)
    s: Mapped[int] = shard_column("author", count=4)
    __table_args__ = (ShardedIndex("async_notes_by_ts", sa.desc("ts"), shard="s"),)


def _async(url: str) -> str:
    return url.replace("spanner+spanner:", "spanner+spanner_async:", 1)


def make_engine(emulator: Any, database_id: str, client: Any = None, **kw: Any) -> AsyncEngine:
    connect_args = {"client": client if client is not None else emulator.client}
    return create_async_engine(_async(emulator.url(database_id)), connect_args=connect_args, **kw)


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(main())  # type: ignore[arg-type]


async def _notes(engine: AsyncEngine, ids: range) -> None:
    async with async_sessionmaker(engine).begin() as s:
        s.add_all([Note(id=i, author=f"a{i % 3}", ts=i) for i in ids])


async def _ids(conn: Any) -> list[int]:
    return list((await conn.execute(sa.select(Note.id).order_by(Note.id))).scalars())


# ------------------------------------------------------------------ stale, read-only reads


@pytest.mark.emulator
def test_stale_and_read_only_reads(spanner_emulator: Any) -> None:
    async def main() -> None:
        # one pooled connection: every read below reuses the one the previous gave back
        db = spanner_emulator.create_database()
        engine = make_engine(spanner_emulator, db, pool_size=1, max_overflow=0)
        try:
            async with engine.begin() as conn:
                await conn.run_sync(Base.metadata.create_all)
            await _notes(engine, range(3))
            auto = engine.execution_options(isolation_level="AUTOCOMMIT")
            async with auto.connect() as conn:
                between = (await conn.execute(sa.select(sa.text("CURRENT_TIMESTAMP")))).scalar()
            await _notes(engine, range(3, 5))

            # a read-only transaction at the timestamp between the two writes
            past = engine.execution_options(read_only=True, staleness={"read_timestamp": between})
            async with AsyncSession(past) as s:
                assert list((await s.execute(sa.select(Note.id).order_by(Note.id))).scalars()) == [
                    0,
                    1,
                    2,
                ]
            async with past.connect() as conn:
                assert await _ids(conn) == [0, 1, 2]
            # the pooled connection is strong and read-write again afterwards
            async with engine.connect() as conn:
                assert await _ids(conn) == [0, 1, 2, 3, 4]
            async with AsyncSession(engine.execution_options(read_only=True)) as s:
                assert len((await s.execute(sa.select(Note.id))).all()) == 5
            # under AUTOCOMMIT: each statement a single-use snapshot of the past
            stale = auto.execution_options(staleness={"read_timestamp": between})
            async with stale.connect() as conn:
                assert await _ids(conn) == [0, 1, 2]
            async with engine.connect() as conn:
                assert await _ids(conn) == [0, 1, 2, 3, 4]

            # a read-only transaction refuses a write, which stores nothing
            with pytest.raises(sa.exc.SQLAlchemyError, match="read-write"):
                async with engine.connect() as conn:
                    conn = await conn.execution_options(read_only=True)
                    await conn.execute(sa.insert(Note), [{"id": 9, "author": "x", "ts": 9}])
                    await conn.commit()
            async with engine.connect() as conn:
                assert await _ids(conn) == [0, 1, 2, 3, 4]
        finally:
            await engine.dispose()

    run(main)


# ------------------------------------------------------------------ request, transaction tags


def test_request_and_transaction_tags_reach_spanner(mock_spanner: Any) -> None:
    select = "SELECT 1"
    insert = "INSERT INTO notes (id) VALUES (@a0)"
    mock_spanner.add_result(select, [("x", "INT64")], [[1]])
    mock_spanner.add_update_count(insert, 1)

    from google.cloud.spanner_v1 import RequestOptions

    low = RequestOptions.Priority.PRIORITY_LOW

    async def main() -> None:
        engine = create_async_engine(
            _async(mock_spanner.url), connect_args={"client": mock_spanner.client}
        )
        try:
            async with engine.connect() as conn:
                result = await conn.execute(
                    sa.text(select),
                    execution_options={"request_tag": "async-read", "request_priority": low},
                )
                assert result.scalar() == 1
            tagged = engine.execution_options(
                transaction_tag="async-job", request_tag="async-write"
            )
            async with AsyncSession(tagged) as s:
                await s.execute(sa.text("INSERT INTO notes (id) VALUES (:id)"), {"id": 1})
                await s.commit()
        finally:
            await engine.dispose()

    run(main)
    sent = [
        r
        for r in mock_spanner.requests
        if type(r).__name__ in ("ExecuteSqlRequest", "ExecuteBatchDmlRequest")
    ]
    tags = {r.sql: r.request_options.request_tag for r in sent if hasattr(r, "sql")}
    assert tags[select] == "async-read" and tags[insert] == "async-write"
    (read,) = [r for r in sent if getattr(r, "sql", "") == select]
    assert read.request_options.priority == low
    (commit,) = mock_spanner.commits()
    assert commit.request_options.transaction_tag == "async-job"
    (write,) = [r for r in sent if getattr(r, "sql", "") == insert]
    assert write.request_options.transaction_tag == "async-job"


# ------------------------------------------------------------------ key reshard dual writes


@pytest.mark.emulator
def test_dual_writes_of_a_key_reshard(spanner_emulator: Any) -> None:
    metadata = events("expand")  # Events, its successor Events16 declared
    Event, Event16 = metadata.info["models"]["Event"], metadata.info["models"]["Event16"]

    async def rows(engine: AsyncEngine, model: Any) -> dict[str, tuple[int, str]]:
        async with engine.connect() as conn:
            got = await conn.execute(sa.select(model.event_id, model.shard_id, model.kind))
            return {r[0]: (r[1], r[2]) for r in got}

    async def main() -> None:
        engine = make_engine(spanner_emulator, spanner_emulator.create_database())
        try:
            async with engine.begin() as conn:
                await conn.run_sync(metadata.create_all)
            stamps = {f"e{i}": T0 + dt.timedelta(seconds=i) for i in range(4)}
            async with async_sessionmaker(engine).begin() as s:  # ORM flush
                s.add_all([Event(event_id=e, timestamp=ts, kind="a") for e, ts in stamps.items()])
            new = await rows(engine, Event16)
            assert new == {e: (compute_shard((ts,), 16), "a") for e, ts in stamps.items()}
            async with engine.begin() as conn:  # Core INSERT, UPDATE
                await conn.execute(
                    sa.insert(Event.__table__),
                    [{"EventId": e, "Timestamp": T0, "Kind": "c"} for e in ("e5", "e6")],
                )
                await conn.execute(
                    sa.update(Event.__table__).where(Event.event_id == "e1").values(Kind="core")
                )
            async with async_sessionmaker(engine).begin() as s:  # ORM change of a loaded row
                e2 = (await s.execute(sa.select(Event).where(Event.event_id == "e2"))).scalar_one()
                e2.kind = "orm"
            async with async_sessionmaker(engine).begin() as s:  # ORM bulk INSERT, DELETE
                await s.execute(
                    sa.insert(Event), [{"event_id": "e4", "timestamp": T0, "kind": "b"}]
                )
                await s.execute(sa.delete(Event).where(Event.event_id == "e3"))
            async with engine.begin() as conn:  # Core DELETE
                await conn.execute(sa.delete(Event.__table__).where(Event.event_id == "e6"))
            loaded = [{"event_id": f"l{i}", "timestamp": T0, "kind": "l"} for i in range(3)]
            async with engine.connect() as conn:  # mutations, both tables in each commit
                await conn.run_sync(lambda c: bulk_load(c.engine, Event, loaded, progress=False))
            stamps.update({"e4": T0, "e5": T0, "l0": T0, "l1": T0, "l2": T0})
            del stamps["e3"]
            kinds = {"e0": "a", "e1": "core", "e2": "orm", "e4": "b", "e5": "c"}
            kinds.update({"l0": "l", "l1": "l", "l2": "l"})
            assert await rows(engine, Event16) == {
                e: (compute_shard((ts,), 16), kinds[e]) for e, ts in stamps.items()
            }
            assert await rows(engine, Event) == {
                e: (compute_shard((ts,), 8), kinds[e]) for e, ts in stamps.items()
            }
        finally:
            await engine.dispose()

    run(main)


# ------------------------------------------------------------------ ABORTED replays


@pytest.fixture
def aborting(spanner_emulator: Any, spanner_faults: Any) -> Iterator[tuple[Any, str]]:
    database_id = spanner_emulator.create_database(
        ["CREATE TABLE ReplayRows (Id STRING(36)) PRIMARY KEY (Id)"]
    )
    try:
        yield spanner_faults, database_id
    finally:
        spanner_faults.clear()


INSERT = "INSERT INTO ReplayRows (Id) VALUES (:id)"


@pytest.mark.emulator
@pytest.mark.parametrize("at", ["ExecuteStreamingSql", "ExecuteBatchDml", "Commit"])
def test_an_aborted_transaction_is_replayed_once(
    spanner_emulator: Any, aborting: tuple[Any, str], at: str
) -> None:
    """Spanner aborts the transaction at a statement, a batch of them (executemany) or
    its commit: the DB-API replays it once, on the connection's worker, and each row is
    stored once."""
    proxy, database_id = aborting

    async def main() -> None:
        engine = make_engine(proxy.emulator(spanner_emulator), database_id)
        try:
            async with engine.connect() as conn:  # a warm session before any fault
                assert (await conn.execute(sa.text("SELECT 1"))).scalar() == 1
            async with AsyncSession(engine) as s:
                await s.execute(sa.text(INSERT), {"id": "a"})
                proxy.fail(at, "ABORTED")  # the next call of it
                await s.execute(sa.text(INSERT), [{"id": "b"}, {"id": "c"}])
                await s.commit()
            async with engine.connect() as conn:
                got = await conn.execute(sa.text("SELECT Id FROM ReplayRows ORDER BY Id"))
                assert list(got.scalars()) == ["a", "b", "c"]
        finally:
            await engine.dispose()

    run(main)
    assert proxy.count(at, "failed ABORTED") == 1


# ------------------------------------------------------------------ telemetry parenting


@pytest.mark.emulator
def test_spans_nest_under_the_calling_task_s_span(spanner_emulator: Any, otel: Any) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import spanner

    from sharded_orm.testing.emulator import host_env

    with host_env(spanner_emulator.host):  # the client's own spans, to the test's provider
        client = spanner.Client(
            project=spanner_emulator.project,
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options={"api_endpoint": spanner_emulator.host},
            disable_builtin_metrics=True,
            observability_options={"tracer_provider": otel.tracer_provider},
        )
    tracer = otel.tracer_provider.get_tracer("app")
    stmt = sharded_select(Note, index="async_notes_by_ts").order_by(Note.ts.desc())

    writing = asyncio.Lock()  # the emulator runs one read-write transaction at a time

    async def task(name: str, engine: AsyncEngine, first: int) -> Any:
        with tracer.start_as_current_span(name) as span:
            await asyncio.sleep(0)  # the other task runs between this one's steps
            async with writing:
                await _notes(engine, range(first, first + 3))  # an ORM flush, its commit
            async with AsyncSession(engine) as s:
                top = await merged(s, stmt, 2)
            assert len(top) == 2
            return span.get_span_context().span_id

    async def main() -> dict[str, int]:
        engine = make_engine(spanner_emulator, spanner_emulator.create_database(), client)
        try:
            async with engine.begin() as conn:
                await conn.run_sync(Base.metadata.create_all)
            otel.spans_exporter.clear()
            one, two = await asyncio.gather(task("one", engine, 0), task("two", engine, 10))
            return {"one": one, "two": two}
        finally:
            await engine.dispose()

    roots = asyncio.run(main())
    spans = otel.spans()
    by_id = {s.context.span_id: s for s in spans}

    def root_of(span: Any) -> Any:
        while span.parent is not None and span.parent.span_id in by_id:
            span = by_id[span.parent.span_id]
        return span

    for span_id in roots.values():
        mine = [s for s in spans if root_of(s).context.span_id == span_id]
        names = [s.name for s in mine]
        # the library's read and the client's statements and commit, all under the task
        (read,) = [s for s in mine if s.name == "merged async_notes"]
        assert read.parent.span_id == span_id
        assert any(n.endswith(".commit") for n in names), names
        under_read = [
            s for s in mine if s.parent is not None and s.parent.span_id == read.context.span_id
        ]
        assert under_read, names
    # nothing the library or the client recorded is left without its task
    orphans = [s.name for s in spans if root_of(s).context.span_id not in roots.values()]
    assert orphans == [], orphans
