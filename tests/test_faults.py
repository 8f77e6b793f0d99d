"""Fault tests on the emulator, through sharded_orm.testing.faults.FaultProxy.

For bulk_load, both sequence pools and an ORM flush: ABORTED, UNAVAILABLE and
DEADLINE_EXCEEDED before a call reaches Spanner, a lost commit reply (applied, then the
reply dropped), permanent errors (duplicate key, value too long, missing object) and the
server going away. Each test asserts: the call ends within its deadline; it succeeds or
raises a clear error; the rows in the table are exactly the rows reported, no duplicate
and none missing after a resume; no id is handed out twice.

Each test records its outcome; the last test checks docs/fault_matrix.md against them
(regenerate with ``SHARDED_ORM_FAULT_MATRIX=write pytest tests/test_faults.py``).
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from seed_models import LogEntry, Sharded
from sqlalchemy.orm import Session

from sharded_orm import ShardingError, SpannerSequence, TableSequence
from sharded_orm.load.bulk import BulkLoadError, bulk_load
from sharded_orm.retry import RetryError
from sharded_orm.testing.faults import FaultProxy

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)
MATRIX = Path(__file__).parent.parent / "docs" / "fault_matrix.md"
OPERATIONS = ("bulk_load", "SpannerSequence", "TableSequence", "ORM flush")
FAULTS = (
    "ABORTED",
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
    "lost commit reply",
    "duplicate key",
    "value too long",
    "missing table or sequence",
    "server goes away",
)
#: (operation, fault) -> outcome, filled by the tests below
RESULTS: dict[tuple[str, str], str] = {}


def record(operation: str, fault: str, outcome: str) -> None:
    assert operation in OPERATIONS and fault in FAULTS
    RESULTS[(operation, fault)] = outcome


@dataclass
class Setup:
    proxy: FaultProxy
    engine: sa.Engine  # through the proxy
    direct: sa.Engine  # straight to the emulator, to check what is stored
    emulator: Any
    database_id: str


@pytest.fixture
def setup(spanner_emulator: Any, spanner_faults: FaultProxy) -> Iterator[Setup]:
    db = spanner_emulator.create_database(
        [
            "CREATE TABLE Short (K INT64 NOT NULL, V STRING(5)) PRIMARY KEY (K)",
            SpannerSequence.create_ddl("ids"),
        ]
    )
    direct = spanner_emulator.engine(db)
    Sharded.metadata.create_all(direct, tables=[LogEntry.__table__])
    engine = spanner_faults.emulator(spanner_emulator).engine(db)
    try:
        yield Setup(spanner_faults, engine, direct, spanner_emulator, db)
    finally:
        engine.dispose()
        direct.dispose()


def entries(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"company_id": f"c{i % 5}", "user_id": f"u{i:04d}", "ts": T0, "entry": f"e{i}"}
        for i in range(start, start + n)
    ]


def stored_keys(engine: sa.Engine) -> list[str]:
    t = LogEntry.__table__
    with engine.connect() as conn:
        return list(conn.execute(sa.select(t.c.UserId).order_by(t.c.UserId)).scalars())


def keys_of(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(r["user_id"] for r in rows)


def timed(fn: Callable[[], Any]) -> tuple[Any, BaseException | None, float]:
    start = time.monotonic()
    try:
        return fn(), None, time.monotonic() - start
    except Exception as exc:
        return None, exc, time.monotonic() - start


def when_calls(proxy: FaultProxy, method: str, n: int, action: Callable[[], None]) -> None:
    """Run ``action`` in the background once ``n`` calls of ``method`` have passed."""

    def watch() -> None:
        deadline = time.monotonic() + 30
        while proxy.count(method, "passed") < n and time.monotonic() < deadline:
            time.sleep(0.005)
        action()

    threading.Thread(target=watch, daemon=True).start()


# ----------------------------------------------------------------------------- bulk_load

ROWS = entries(300)
LOAD = {"workers": 2, "batch_bytes": 3_000, "commit_timeout": 5.0}


def check_load_exact(s: Setup, rows: list[dict[str, Any]], report: Any) -> None:
    keys = stored_keys(s.direct)
    assert len(keys) == len(set(keys))  # no duplicate
    assert keys == keys_of(rows) and report.rows_written == len(rows)


@pytest.mark.parametrize(
    ("fault", "inject"),
    [
        ("ABORTED", lambda p: p.fail("Commit", "ABORTED", times=3)),
        ("UNAVAILABLE", lambda p: p.fail("Commit", "UNAVAILABLE", times=3)),
        ("DEADLINE_EXCEEDED", lambda p: p.fail("Commit", "DEADLINE_EXCEEDED", times=3)),
        ("lost commit reply", lambda p: p.lose_reply("Commit", times=3)),
    ],
)
def test_bulk_load_transient(
    setup: Setup, fault: str, inject: Callable[[FaultProxy], None]
) -> None:
    inject(setup.proxy)
    report, error, took = timed(lambda: bulk_load(setup.engine, LogEntry, ROWS, **LOAD))
    assert error is None and took < 30 and setup.proxy.pending == 0
    assert report.complete and report.commits == report.batches
    assert report.retries >= 3  # (plus the emulator's own aborts between the two workers)
    check_load_exact(setup, ROWS, report)
    record(
        "bulk_load", fault, "completes: retried (unknown outcomes as insert_or_update); rows exact"
    )


def test_bulk_load_hung_commit_times_out_and_is_retried(setup: Setup) -> None:
    """A commit that never answers: our commit_timeout ends it (not the client's hour)."""
    setup.proxy.hang("Commit", 30)
    report, error, took = timed(
        lambda: bulk_load(setup.engine, LogEntry, ROWS, **{**LOAD, "commit_timeout": 1.0})
    )
    assert error is None and 1.0 <= took < 10 and report.retries == 1
    check_load_exact(setup, ROWS, report)


def test_bulk_load_duplicate_key(setup: Setup) -> None:
    bulk_load(setup.direct, LogEntry, ROWS[100:110])  # makes a plain insert fail
    _, error, took = timed(lambda: bulk_load(setup.engine, LogEntry, ROWS, **LOAD))
    assert isinstance(error, BulkLoadError) and took < 10
    assert "not retryable (permanent)" in str(error) and "already exists" in str(error)
    report = error.report
    assert not report.complete  # a permanent error is never retried (aborts before it may be)
    assert len(stored_keys(setup.direct)) == 10 + report.rows_written
    again = bulk_load(setup.engine, LogEntry, ROWS, mode="insert_or_update", **LOAD)
    check_load_exact(setup, ROWS, again)
    record("bulk_load", "duplicate key", "BulkLoadError at once (not retried), report exact; "
           "insert_or_update resume completes")  # fmt: skip


def test_bulk_load_missing_table(setup: Setup) -> None:
    missing = sa.Table("Missing", sa.MetaData(), sa.Column("K", sa.BigInteger, primary_key=True))
    _, error, took = timed(lambda: bulk_load(setup.engine, missing, [{"K": 1}]))
    assert isinstance(error, BulkLoadError) and took < 10
    assert "not retryable (permanent)" in str(error) and "Missing" in str(error)
    record("bulk_load", "missing table or sequence", "BulkLoadError at once (not retried)")


def test_bulk_load_value_too_long(setup: Setup) -> None:
    """The model says String (no length); the table says STRING(5): Spanner refuses."""
    short = sa.Table("Short", sa.MetaData(), sa.Column("K", sa.BigInteger, primary_key=True),
                     sa.Column("V", sa.String))  # fmt: skip
    rows = [{"K": k, "V": "x" * (3 if k != 7 else 50)} for k in range(20)]
    _, error, took = timed(lambda: bulk_load(setup.engine, short, rows, workers=1))
    assert isinstance(error, BulkLoadError) and took < 10
    assert "exceeds the maximum size" in str(error) and "not retryable (permanent)" in str(error)
    with setup.direct.connect() as conn:
        stored = conn.execute(sa.text("SELECT COUNT(*) FROM Short")).scalar()
    assert stored == error.report.rows_written
    record("bulk_load", "value too long", "BulkLoadError at once (not retried), report exact")


def test_bulk_load_server_goes_away(setup: Setup) -> None:
    proxy = setup.proxy
    when_calls(proxy, "Commit", 3, proxy.go_away)
    _, error, took = timed(
        lambda: bulk_load(setup.engine, LogEntry, ROWS, deadline=3.0, max_retries=100, **LOAD)
    )
    assert isinstance(error, BulkLoadError) and took < 3.0 + 1.0  # within its deadline
    assert "deadline of 3.0 s passed" in str(error), str(error)
    assert "mode='insert_or_update'" in str(error)
    report = error.report
    assert 3 <= len(report.committed_batches) < report.batches
    # commits cut off in flight may have landed: the report says which, and how many rows
    stored = len(stored_keys(setup.direct))
    assert report.rows_written <= stored <= report.rows_written + report.rows_unknown
    proxy.come_back()
    again = bulk_load(setup.engine, LogEntry, ROWS, mode="insert_or_update", **LOAD)
    check_load_exact(setup, ROWS, again)
    record("bulk_load", "server goes away", "BulkLoadError within the deadline; report: rows "
           "committed, plus rows of commits cut off in flight (unknown outcome); "
           "insert_or_update resume completes, rows exact")  # fmt: skip


def test_bulk_load_emulator_killed_mid_load() -> None:
    """The real thing: the emulator process dies mid-load, and comes back empty."""
    from sharded_orm.testing.emulator import start

    emulator = start()
    try:
        emulator.ensure_instance()
        db = emulator.create_database()
        engine = emulator.engine(db)
        Sharded.metadata.create_all(engine, tables=[LogEntry.__table__])
        with FaultProxy(emulator.host) as proxy:  # only to count commits
            via = proxy.emulator(emulator).engine(db)
            when_calls(proxy, "Commit", 2, lambda: emulator.stop(timeout=0.1))
            _, error, took = timed(
                lambda: bulk_load(via, LogEntry, ROWS, deadline=5.0, max_retries=50, **LOAD)
            )
            assert isinstance(error, BulkLoadError) and took < 6.0
            assert len(error.report.committed_batches) >= 2
            via.dispose()
    finally:
        emulator.stop()
    restarted = start()
    try:  # same port is not guaranteed; the database is gone either way: a clear error
        restarted.ensure_instance()
        _, error, took = timed(
            lambda: bulk_load(restarted.engine(db), LogEntry, ROWS, max_retries=3, **LOAD)
        )
        assert isinstance(error, BulkLoadError) and took < 10
        assert "Database not found" in str(error) or "not found" in str(error).lower()
    finally:
        restarted.stop()


# ----------------------------------------------------------------------------- sequences


def make_sequence(kind: str, engine: sa.Engine, name: str = "", **kwargs: Any) -> Any:
    if kind == "SpannerSequence":
        return SpannerSequence(engine, name or "ids", block_size=10, **kwargs)
    return TableSequence(engine, name or "orders", block_size=10, **kwargs)


def draw_both(ours: Any, other: Any, n: int) -> list[int]:
    """``n`` ids from each generator, concurrently (two engines, one through the proxy)."""
    got: list[list[int]] = [[], []]
    errors: list[BaseException] = []

    def work(i: int, gen: Any) -> None:
        try:
            got[i].extend(gen.next_id() for _ in range(n))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i, g)) for i, g in enumerate((ours, other))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return got[0] + got[1]


SEQUENCE_FAULTS = [
    ("ABORTED", "Commit", lambda p: p.fail("Commit", "ABORTED", times=2)),
    ("UNAVAILABLE", "ExecuteSql", lambda p: p.fail("ExecuteSql", "UNAVAILABLE", times=2)),
    ("DEADLINE_EXCEEDED", "Commit", lambda p: p.fail("Commit", "DEADLINE_EXCEEDED", times=2)),
    ("lost commit reply", "Commit", lambda p: p.lose_reply("Commit", times=2)),
]


@pytest.mark.parametrize("kind", ["SpannerSequence", "TableSequence"])
@pytest.mark.parametrize(("fault", "method", "inject"), SEQUENCE_FAULTS)
def test_sequence_transient(
    setup: Setup, kind: str, fault: str, method: str, inject: Callable[[FaultProxy], None]
) -> None:
    ours = make_sequence(kind, setup.engine, deadline=10)
    other = make_sequence(kind, setup.direct, deadline=10)
    if kind == "TableSequence":
        ours.create_table()
    inject(setup.proxy)
    values, error, took = timed(lambda: draw_both(ours, other, 25))
    assert error is None and took < 10 and setup.proxy.pending == 0
    assert len(values) == len(set(values)) == 50  # never twice
    assert ours.retries >= 2  # (plus contention between the two pools, at times)
    if fault == "lost commit reply":
        # the lost blocks were reserved: a gap, never handed out
        assert ours.reservations == 3
    ours.close()
    other.close()
    outcome = "values handed out: retried" + (
        "; the lost blocks are a gap, never reused" if fault == "lost commit reply" else ""
    )
    record(kind, fault, outcome + "; no id twice")


@pytest.mark.parametrize("kind", ["SpannerSequence", "TableSequence"])
def test_sequence_missing_object(setup: Setup, kind: str) -> None:
    """A permanent error: not retried, and the lock is released for the next caller."""
    if kind == "SpannerSequence":
        seq: Any = SpannerSequence(setup.engine, "nope", block_size=10, deadline=10)
    else:
        seq = TableSequence(setup.engine, "orders", table_name="NoSuchTable", deadline=10)
    for _ in range(2):  # the second call is not blocked by the first
        _, error, took = timed(seq.next_id)
        assert isinstance(error, RetryError) and took < 5
        assert "not retryable (permanent)" in str(error) and seq.retries == 0
    seq.close()
    record(kind, "missing table or sequence", "RetryError at once (not retried); lock released")


@pytest.mark.parametrize("kind", ["SpannerSequence", "TableSequence"])
def test_sequence_value_too_long(setup: Setup, kind: str) -> None:
    with pytest.raises(ShardingError, match="at most 128 characters|plain identifier"):
        make_sequence(kind, setup.engine, name="x" * 10_000)
    record(kind, "value too long", "a too-long name is refused up front, before any call")


@pytest.mark.parametrize("kind", ["SpannerSequence", "TableSequence"])
def test_sequence_duplicate_key(setup: Setup, kind: str) -> None:
    """Two pools create the same new sequence row at once: the loser's ALREADY_EXISTS (or
    ABORTED) is a conflict, retried; no id twice."""
    if kind == "SpannerSequence":
        record(kind, "duplicate key", "n/a: a reservation writes no row")
        return
    ours = make_sequence(kind, setup.engine, name="fresh")
    other = make_sequence(kind, setup.direct, name="fresh")
    ours.create_table()
    values, error, took = timed(lambda: draw_both(ours, other, 25))
    assert error is None and took < 10 and len(values) == len(set(values)) == 50
    ours.close()
    other.close()
    record(kind, "duplicate key", "the row created by another pool first: a conflict, "
           "retried; no id twice")  # fmt: skip


@pytest.mark.parametrize("kind", ["SpannerSequence", "TableSequence"])
def test_sequence_server_goes_away(setup: Setup, kind: str) -> None:
    ours = make_sequence(kind, setup.engine, deadline=2)
    other = make_sequence(kind, setup.direct, deadline=10)
    if kind == "TableSequence":
        ours.create_table()
    first = [ours.next_id() for _ in range(10)]  # the pool is empty again
    setup.proxy.go_away()
    _, error, took = timed(ours.next_id)
    assert isinstance(error, RetryError) and took < 2 + 1  # within its deadline
    assert "No value of a failed block is handed out" in str(error)
    meanwhile = [other.next_id() for _ in range(15)]  # the database is not blocked
    setup.proxy.come_back()
    later, error, _ = timed(lambda: [ours.next_id() for _ in range(15)])
    if error is not None:  # the client's channel may still be backing off: once more
        ours.deadline = 10
        later = [ours.next_id() for _ in range(15)]
    values = first + meanwhile + later
    assert len(values) == len(set(values)) == 40
    ours.close()
    other.close()
    record(kind, "server goes away", "RetryError within the deadline, lock released; "
           "works again when the server is back; no id twice")  # fmt: skip


# ----------------------------------------------------------------------------- ORM flush


def flush(engine: sa.Engine, rows: list[dict[str, Any]]) -> None:
    with Session(engine) as session:
        session.add_all(LogEntry(**r) for r in rows)
        session.commit()


@pytest.mark.parametrize(
    ("fault", "inject", "outcome"),
    [
        ("ABORTED", lambda p: p.fail("Commit", "ABORTED"),
         "commits: the client replays the transaction"),
        ("UNAVAILABLE", lambda p: p.fail("Commit", "UNAVAILABLE"),
         "commits: the client retries the commit"),
    ],
)  # fmt: skip
def test_orm_flush_retried_by_the_client(
    setup: Setup, fault: str, inject: Callable[[FaultProxy], None], outcome: str
) -> None:
    rows = entries(20)
    inject(setup.proxy)
    _, error, took = timed(lambda: flush(setup.engine, rows))
    assert error is None and took < 10 and setup.proxy.pending == 0
    assert stored_keys(setup.direct) == keys_of(rows)
    record("ORM flush", fault, outcome + "; rows exact")


def test_orm_flush_deadline_exceeded(setup: Setup) -> None:
    rows = entries(20)
    setup.proxy.fail("Commit", "DEADLINE_EXCEEDED")
    _, error, took = timed(lambda: flush(setup.engine, rows))
    assert isinstance(error, sa.exc.DBAPIError) and took < 10
    assert "injected by FaultProxy" in str(error)
    assert stored_keys(setup.direct) == []  # it never reached Spanner
    flush(setup.engine, rows)  # the caller's retry of the unit of work
    assert stored_keys(setup.direct) == keys_of(rows)
    record("ORM flush", "DEADLINE_EXCEEDED", "error raised to the caller (DBAPIError), "
           "nothing written; retrying the unit of work completes")  # fmt: skip


def test_orm_flush_lost_commit_reply(setup: Setup) -> None:
    rows = entries(20)
    setup.proxy.lose_reply("Commit", "UNAVAILABLE")
    _, error, took = timed(lambda: flush(setup.engine, rows))
    assert took < 10
    assert stored_keys(setup.direct) == keys_of(rows)  # applied once, never doubled
    if error is None:
        outcome = "commits (the client re-sends the commit of the same transaction); rows exact"
    else:
        outcome = (
            f"error raised ({type(error).__name__}) although applied: rows are in, once; "
            "check before retrying (the outcome is unknown)"
        )
    record("ORM flush", "lost commit reply", outcome)


def test_orm_flush_duplicate_key(setup: Setup) -> None:
    flush(setup.direct, entries(1))
    _, error, took = timed(lambda: flush(setup.engine, entries(5)))
    assert isinstance(error, sa.exc.DBAPIError) and took < 10
    assert "previously existing row" in str(error)
    assert stored_keys(setup.direct) == ["u0000"]  # the transaction wrote nothing
    record("ORM flush", "duplicate key", f"{type(error).__name__} at once ('... previously "
           "existing row'); the transaction wrote nothing")  # fmt: skip


def test_orm_flush_value_too_long(setup: Setup) -> None:
    short = sa.Table("Short", sa.MetaData(), sa.Column("K", sa.BigInteger, primary_key=True),
                     sa.Column("V", sa.String))  # fmt: skip
    _, error, took = timed(lambda: _insert(setup.engine, short, {"K": 1, "V": "x" * 50}))
    assert isinstance(error, sa.exc.DBAPIError) and took < 10
    assert "exceeds the maximum size" in str(error) or "exceeds" in str(error.orig.__cause__)
    record("ORM flush", "value too long", "DBAPIError at once naming the column; nothing written")


def _insert(engine: sa.Engine, table: sa.Table, row: dict[str, Any]) -> None:
    with engine.begin() as conn:
        conn.execute(table.insert(), [row])


def test_orm_flush_missing_table(setup: Setup) -> None:
    missing = sa.Table("Missing", sa.MetaData(), sa.Column("K", sa.BigInteger, primary_key=True))
    _, error, took = timed(lambda: _insert(setup.engine, missing, {"K": 1}))
    assert isinstance(error, sa.exc.DBAPIError) and took < 10
    record("ORM flush", "missing table or sequence", "DBAPIError at once")


def test_orm_flush_server_goes_away_and_comes_back(setup: Setup) -> None:
    """The client retries UNAVAILABLE itself (up to its own deadline, not ours): a flush
    during a 2 s outage completes when the server is back."""
    rows = entries(20)
    proxy = setup.proxy
    proxy.go_away()
    threading.Timer(2.0, proxy.come_back).start()
    _, error, took = timed(lambda: flush(setup.engine, rows))
    assert error is None and 2.0 <= took < 20
    assert stored_keys(setup.direct) == keys_of(rows)
    record("ORM flush", "server goes away", "waits (the client retries UNAVAILABLE up to its "
           "own deadline); commits when the server is back; rows exact")  # fmt: skip


# ----------------------------------------------------------------------------- the matrix


def matrix_text() -> str:
    lines = [
        "# Fault matrix",
        "",
        "Generated from `tests/test_faults.py` (on the emulator, through",
        "`sharded_orm.testing.faults.FaultProxy`); regenerate with",
        "`SHARDED_ORM_FAULT_MATRIX=write pytest tests/test_faults.py`. Do not edit by hand.",
        "",
        "Every cell is asserted by a test: the call ends within its deadline, succeeds or",
        "raises a clear error, the rows stored are exactly the rows reported (none doubled,",
        "none missing after a resume), and no id is handed out twice.",
        "",
    ]
    for op in OPERATIONS:
        lines += [f"## {op}", "", "| fault | outcome |", "|---|---|"]
        lines += [f"| {fault} | {RESULTS[(op, fault)]} |" for fault in FAULTS]
        lines.append("")
    return "\n".join(lines)


def test_fault_matrix_doc_matches_the_results() -> None:
    """Runs last in this module: the doc is the table these tests just produced."""
    missing = [(op, f) for op in OPERATIONS for f in FAULTS if (op, f) not in RESULTS]
    if missing:
        pytest.skip(f"only part of the fault tests ran ({len(missing)} cells missing)")
    text = matrix_text()
    if os.environ.get("SHARDED_ORM_FAULT_MATRIX") == "write":
        MATRIX.write_text(text)
    assert MATRIX.read_text() == text, (
        "docs/fault_matrix.md is out of date: "
        "SHARDED_ORM_FAULT_MATRIX=write pytest tests/test_faults.py"
    )
