"""Deadlines of bulk_load and of the pooled sequences against a server that goes silent.

A silent server (every call hangs, as behind a dead TCP peer) is the case where cleanup
(deleting sessions, rolling back) could outlast the caller's deadline: each call here is
bounded by what is left of it.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from seed_models import LogEntry, Sharded

from sharded_orm import SpannerSequence, TableSequence
from sharded_orm.load.bulk import BulkLoadError, bulk_load
from sharded_orm.retry import RetryError
from sharded_orm.testing.faults import FaultProxy

pytestmark = [pytest.mark.emulator]

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
#: every Spanner method a load or a reservation sends
METHODS = (
    "Commit", "CreateSession", "BatchCreateSessions", "DeleteSession", "ExecuteSql",
    "ExecuteStreamingSql", "BeginTransaction", "Rollback", "GetSession",
)  # fmt: skip


def silence(proxy: FaultProxy) -> None:
    """From now on every call waits (up to its caller's timeout) and never answers."""
    for method in METHODS:
        proxy.hang(method, 120.0, times=100_000)


def when_calls(proxy: FaultProxy, method: str, n: int, action: Callable[[], None]) -> None:
    def watch() -> None:
        end = time.monotonic() + 30
        while proxy.count(method, "passed") < n and time.monotonic() < end:
            time.sleep(0.002)
        action()

    threading.Thread(target=watch, daemon=True).start()


@pytest.fixture
def engines(
    spanner_emulator: Any, spanner_faults: FaultProxy
) -> Iterator[tuple[sa.Engine, sa.Engine]]:
    db = spanner_emulator.create_database([SpannerSequence.create_ddl("ids")])
    direct = spanner_emulator.engine(db)
    Sharded.metadata.create_all(direct, tables=[LogEntry.__table__])
    engine = spanner_faults.emulator(spanner_emulator).engine(db)
    try:
        yield engine, direct
    finally:
        spanner_faults.clear()
        engine.dispose()
        direct.dispose()


def test_bulk_load_ends_within_its_deadline_when_the_server_goes_silent(
    engines: tuple[sa.Engine, sa.Engine], spanner_faults: FaultProxy
) -> None:
    engine, direct = engines
    rows = [
        {"company_id": f"c{i % 7}", "user_id": f"u{i:05d}", "ts": T0, "entry": f"e{i}"}
        for i in range(2_000)
    ]
    when_calls(spanner_faults, "Commit", 8, lambda: silence(spanner_faults))
    start = time.monotonic()
    with pytest.raises(BulkLoadError) as info:
        bulk_load(engine, LogEntry, rows, deadline=5, workers=8, batch_bytes=4_000,
                  max_retries=100)  # fmt: skip
    took = time.monotonic() - start
    assert took < 5 + 1, f"bulk_load(deadline=5) took {took:.1f} s"
    report = info.value.report
    assert "mode='insert_or_update'" in str(info.value)
    assert 8 <= len(report.committed_batches) < report.batches
    with direct.connect() as conn:
        stored = conn.execute(sa.select(sa.func.count()).select_from(LogEntry.__table__)).scalar()
    assert report.rows_written <= stored <= report.rows_written + report.rows_unknown


@pytest.mark.parametrize("kind", ["SpannerSequence", "TableSequence"])
def test_a_hung_reservation_is_retried_within_the_deadline(
    engines: tuple[sa.Engine, sa.Engine], spanner_faults: FaultProxy, kind: str
) -> None:
    """One attempt gets a third of ``deadline``: a call that never answers is cut off in
    time for a second attempt, and no id is handed out twice."""
    engine, direct = engines
    make: Any = SpannerSequence if kind == "SpannerSequence" else TableSequence
    name = "ids" if kind == "SpannerSequence" else "orders"
    ours, other = make(engine, name, block_size=10, deadline=6), make(direct, name, block_size=10)
    if kind == "TableSequence":
        ours.create_table()
    spanner_faults.hang("ExecuteSql", 60.0)  # the first query of the reservation
    start = time.monotonic()
    first = [ours.next_id() for _ in range(10)]
    took = time.monotonic() - start
    assert 2.0 <= took < 6, f"next_id took {took:.1f} s"
    assert ours.retries == 1 and ours.reservations == 1
    values = first + [other.next_id() for _ in range(10)] + [ours.next_id() for _ in range(10)]
    assert len(values) == len(set(values)) == 30
    ours.close()
    other.close()


def test_silent_server_next_id_ends_within_its_deadline(
    engines: tuple[sa.Engine, sa.Engine], spanner_faults: FaultProxy
) -> None:
    seq = SpannerSequence(engines[0], "ids", block_size=10, deadline=3)
    silence(spanner_faults)
    start = time.monotonic()
    with pytest.raises(RetryError, match=r"deadline of 3.0 s passed|none succeeded") as info:
        seq.next_id()
    took = time.monotonic() - start
    assert took < 3 + 1 and info.value.attempts >= 2, (took, str(info.value))
    start = time.monotonic()
    seq.close()  # its session's delete is bounded too
    assert time.monotonic() - start < 2.5


def test_a_hung_commit_is_retried_within_the_load_deadline(
    engines: tuple[sa.Engine, sa.Engine], spanner_faults: FaultProxy
) -> None:
    """One commit attempt gets at most a third of ``deadline``: a commit that never
    answers is retried in time, not the end of the load after one attempt."""
    engine, direct = engines
    rows = [{"company_id": "c", "user_id": f"u{i}", "ts": T0, "entry": "e"} for i in range(20)]
    spanner_faults.hang("Commit", 60.0)
    start = time.monotonic()
    report = bulk_load(engine, LogEntry, rows, deadline=6, workers=1)
    took = time.monotonic() - start
    assert report.complete and report.retries == 1
    assert 2.0 <= took < 6, f"bulk_load took {took:.1f} s"
    with direct.connect() as conn:
        stored = conn.execute(sa.select(sa.func.count()).select_from(LogEntry.__table__)).scalar()
    assert stored == 20
