"""Every statement on our dialect has a deadline (issue 21 item 6).

The Spanner client streams results under a one-hour default timeout and restarts a cut
stream without end; a read on a silent or stopped server never returned. Each statement
now carries the ``timeout`` execution option (default ``DEFAULT_READ_TIMEOUT``) to the
client per call, and ends within it with an ``OperationalError`` that says it can be
retried. Faults come from the project's gRPC fault proxy in front of the emulator.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import ShardedIndex, UTCDateTime, merged, page, shard_column, sharded_select
from sharded_orm.spanner.deadlines import DEFAULT_READ_TIMEOUT, TIMEOUT_OPTION

pytestmark = pytest.mark.emulator

#: Rows of ~100 kB each: the emulator sends them in several result messages.
BIG = sa.text(
    "SELECT n, REPEAT('x', 100000) AS pad FROM UNNEST(GENERATE_ARRAY(1, 40)) AS n ORDER BY n"
)
DEADLINE = 1.0
#: Slack for the client to notice and unwind (the deadline itself is the bound).
SLACK = 3.0


@pytest.fixture
def faulty(spanner_emulator: Any, spanner_faults: Any) -> Iterator[tuple[sa.Engine, Any]]:
    database_id = spanner_emulator.create_database()
    engine = spanner_faults.emulator(spanner_emulator).engine(database_id)
    with engine.connect() as conn:  # warm the pool and the session before faults
        assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    try:
        yield engine, spanner_faults
    finally:
        spanner_faults.clear()
        spanner_faults.come_back()
        engine.dispose()


def _read(engine: sa.Engine, stmt: Any = BIG, **options: Any) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execution_options(**options).execute(stmt).all())


def _fails_within(seconds: float, read: Any) -> sa.exc.OperationalError:
    started = time.monotonic()
    with pytest.raises(sa.exc.OperationalError) as caught:
        read()
    took = time.monotonic() - started
    assert took < seconds + SLACK, f"the read took {took:.1f} s, deadline {seconds} s"
    assert "can be retried" in str(caught.value)
    return caught.value


class Base(DeclarativeBase):
    pass


class Tick(Base):
    __tablename__ = "ticks"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    s: Mapped[int] = shard_column("id", count=8)
    __table_args__ = (ShardedIndex("ticks_by_ts", sa.desc("ts"), shard="s"),)


@pytest.mark.parametrize("read", ["merged", "page"])
def test_merged_and_page_end_within_the_connection_s_deadline(
    faulty: tuple[sa.Engine, Any], read: str
) -> None:
    engine, proxy = faulty
    Base.metadata.create_all(engine)
    t0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    with engine.begin() as conn:
        conn.execute(
            Tick.__table__.insert(),
            [{"id": i, "ts": t0 + dt.timedelta(seconds=i)} for i in range(50)],
        )
    stmt = sharded_select(Tick, index="ticks_by_ts").order_by(Tick.ts.desc())
    proxy.stall_stream("ExecuteStreamingSql", 3600, after=0, times=100)

    def run() -> None:
        with engine.connect() as conn:
            conn = conn.execution_options(timeout=DEADLINE)
            if read == "merged":
                merged(conn, stmt, 10)
            else:
                page(conn, stmt, 10)

    _fails_within(DEADLINE, run)


def test_the_default_deadline_is_documented() -> None:
    assert TIMEOUT_OPTION == "timeout"
    assert 0 < DEFAULT_READ_TIMEOUT <= 300


def test_big_reads_stream_in_several_messages(faulty: tuple[sa.Engine, Any]) -> None:
    engine, proxy = faulty
    rows = _read(engine)
    assert [r.n for r in rows] == list(range(1, 41))
    assert proxy.count("ExecuteStreamingSql", "passed") >= 1


def test_silent_server_before_the_first_row(faulty: tuple[sa.Engine, Any]) -> None:
    engine, proxy = faulty
    proxy.hang("ExecuteStreamingSql", 3600, times=100)
    error = _fails_within(DEADLINE, lambda: _read(engine, timeout=DEADLINE))
    assert "deadline of 1 s" in str(error)


def test_without_a_deadline_the_client_waits_for_the_server(
    faulty: tuple[sa.Engine, Any],
) -> None:
    """``timeout=None``: the client's own default (one hour) applies, as before this fix."""
    engine, proxy = faulty
    proxy.stall_stream("ExecuteStreamingSql", 4, after=1)
    started = time.monotonic()
    with pytest.raises(sa.exc.OperationalError):
        _read(engine, timeout=None)
    assert time.monotonic() - started >= 4  # only the proxy's own 4 s pause ended it


def test_silent_server_mid_result(faulty: tuple[sa.Engine, Any]) -> None:
    engine, proxy = faulty
    proxy.stall_stream("ExecuteStreamingSql", 3600, after=1, times=100)
    _fails_within(DEADLINE, lambda: _read(engine, timeout=DEADLINE))


def test_silent_server_in_a_session_transaction(faulty: tuple[sa.Engine, Any]) -> None:
    engine, proxy = faulty
    proxy.stall_stream("ExecuteStreamingSql", 3600, after=1, times=100)

    def read() -> None:
        with Session(engine) as session:  # a read-write transaction, as the ORM runs
            session.execute(BIG, execution_options={TIMEOUT_OPTION: DEADLINE}).all()

    _fails_within(DEADLINE, read)


def test_a_cut_stream_is_resumed(faulty: tuple[sa.Engine, Any]) -> None:
    engine, proxy = faulty
    proxy.cut_stream("ExecuteStreamingSql", after=1)
    rows = _read(engine, timeout=30)
    assert [r.n for r in rows] == list(range(1, 41))
    assert proxy.count("ExecuteStreamingSql") >= 2  # cut once, then restarted


def test_a_cut_stream_with_the_server_gone_fails_within_the_deadline(
    faulty: tuple[sa.Engine, Any],
) -> None:
    engine, proxy = faulty
    proxy.cut_stream("ExecuteStreamingSql", after=1, times=1000)
    _fails_within(DEADLINE, lambda: _read(engine, timeout=DEADLINE))


def test_a_stopped_server_fails_within_the_deadline(faulty: tuple[sa.Engine, Any]) -> None:
    engine, proxy = faulty
    proxy.go_away()
    _fails_within(DEADLINE, lambda: _read(engine, timeout=DEADLINE))
    proxy.come_back()
    assert len(_read(engine, timeout=30)) == 40  # and the engine works again


def test_the_engine_wide_default_applies(spanner_emulator: Any, spanner_faults: Any) -> None:
    database_id = spanner_emulator.create_database()
    engine = spanner_faults.emulator(spanner_emulator).engine(
        database_id, execution_options={TIMEOUT_OPTION: DEADLINE}
    )
    try:
        spanner_faults.hang("ExecuteStreamingSql", 3600, times=100)
        _fails_within(DEADLINE, lambda: _read(engine))
    finally:
        spanner_faults.clear()
        engine.dispose()


@pytest.mark.parametrize("bad", [0, -1, "5", True, float("inf"), float("nan"), 1e300])
def test_a_bad_timeout_is_refused(spanner_engine: sa.Engine, bad: object) -> None:
    with pytest.raises(sa.exc.ProgrammingError, match="execution option timeout"):
        _read(spanner_engine, sa.text("SELECT 1"), timeout=bad)


def test_upstream_dbapi_passes_no_deadline_and_reads_through_these_seams() -> None:
    """Trips when the Spanner DB-API changes what ``DeadlineConnection`` relies on: it
    sends no timeout itself, and its cursor starts every read through the connection's
    ``run_statement``, ``snapshot_checkout()`` or ``database.snapshot()``."""
    import inspect

    from google.cloud.spanner_dbapi import Connection, Cursor

    assert "timeout" not in inspect.signature(Connection.run_statement).parameters
    rw = inspect.getsource(Cursor._execute_in_rw_transaction)
    assert "self.connection.run_statement(" in rw
    assert 'getattr(self.connection, "_transaction", None)' in rw  # the inline-begin fallback
    dql = inspect.getsource(Cursor._handle_DQL)
    assert "self.connection.snapshot_checkout()" in dql
    assert "self.connection.database.snapshot(" in dql
    run = inspect.getsource(Connection.run_statement)
    assert "timeout" not in run and "self.transaction_checkout()" in run


# ---- through the async engine (spanner+spanner_async): the same bodies, in its greenlet


@pytest.fixture
def faulty_async(
    spanner_emulator: Any, spanner_faults: Any, faulty: tuple[sa.Engine, Any]
) -> Iterator[tuple[Any, Any]]:
    """``faulty``'s database through the fault proxy, on an async engine."""
    from sharded_orm.testing.async_engines import dispose, run_through

    engine, proxy = faulty
    database_id = str(engine.url.database).rsplit("/", 1)[-1]
    async_engine = spanner_faults.emulator(spanner_emulator).async_engine(database_id)
    run_through(async_engine, _read, sa.text("SELECT 1"))  # warm before faults
    try:
        yield async_engine, proxy
    finally:
        proxy.clear()
        proxy.come_back()
        dispose(async_engine)


def _through_async(faulty_async: tuple[Any, Any], body: Any, *args: Any) -> None:
    from sharded_orm.testing.async_engines import run_through

    async_engine, proxy = faulty_async
    run_through(async_engine, lambda engine: body((engine, proxy), *args))


def test_silent_server_mid_result_through_the_async_engine(
    faulty_async: tuple[Any, Any],
) -> None:
    _through_async(faulty_async, test_silent_server_mid_result)


# async variant; quick loop: test_silent_server_mid_result_through_the_async_engine
@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "args"),
    [
        (test_merged_and_page_end_within_the_connection_s_deadline, ("merged",)),
        (test_merged_and_page_end_within_the_connection_s_deadline, ("page",)),
        (test_big_reads_stream_in_several_messages, ()),
        (test_silent_server_before_the_first_row, ()),
        (test_silent_server_in_a_session_transaction, ()),
        (test_a_cut_stream_is_resumed, ()),
        (test_a_cut_stream_with_the_server_gone_fails_within_the_deadline, ()),
        (test_a_stopped_server_fails_within_the_deadline, ()),
    ],
    ids=lambda v: v.__name__ if callable(v) else "-".join(v),
)
def test_read_deadlines_through_the_async_engine(
    faulty_async: tuple[Any, Any], body: Any, args: tuple[str, ...]
) -> None:
    _through_async(faulty_async, body, *args)
