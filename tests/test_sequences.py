"""Pooled sequences: thread- and process-safe, retried on ABORTED, never a duplicate."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from sharded_orm import (
    SequenceExhausted,
    ShardConfigError,
    ShardTypeError,
    SpannerSequence,
    TableSequence,
    UnsupportedOnDialectError,
    bit_reverse,
)
from sharded_orm.hashing import INT64_MAX
from sharded_orm.ids.sequences import MAX_BLOCK_SIZE
from sharded_orm.retry import RetryError

SEQ_SQL = (
    "SELECT GET_NEXT_SEQUENCE_VALUE(SEQUENCE `s`) FROM UNNEST(GENERATE_ARRAY(1, LEAST(@n, "
    "9223372036854775807 - COALESCE(GET_INTERNAL_SEQUENCE_STATE(SEQUENCE `s`), 0))))"
)


def draw_concurrently(gens: list[Any], threads: int, per_thread: int) -> list[int]:
    """``threads`` threads, thread i drawing ``per_thread`` ids from ``gens[i % len]``."""
    out: list[list[int]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def work(i: int) -> None:
        gen = gens[i % len(gens)]
        start.wait()
        try:
            out[i].extend(gen.next_id() for _ in range(per_thread))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    return [v for chunk in out for v in chunk]


@pytest.fixture
def sqlite_file(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'seq.db'}"


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("size", "error"),
    [(0, ShardConfigError), (-5, ShardConfigError), (2.5, ShardTypeError), (True, ShardTypeError)]
    + [("10", ShardTypeError), (None, ShardTypeError), (2**63, ShardConfigError)]
    + [(MAX_BLOCK_SIZE + 1, ShardConfigError)],
)
def test_bad_block_sizes(size: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="block_size"):
        TableSequence(sa.create_engine("sqlite://"), "s", block_size=size)
    with pytest.raises(error, match="block_size"):
        SpannerSequence(sa.create_engine("sqlite://"), "s", block_size=size)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"skip_range": (100, 10)}, ShardConfigError, "minimum 100 is above its maximum 10"),
        ({"skip_range": (0, 10)}, ShardConfigError, "between 1 and 2"),
        ({"skip_range": (1, 2**63)}, ShardConfigError, "between 1 and 2"),
        ({"skip_range": (1.0, 10)}, ShardTypeError, "must be an int"),
        ({"skip_range": [1, 10]}, ShardTypeError, r"\(min, max\) tuple"),
        ({"start_counter": 0}, ShardConfigError, "start_counter"),
        ({"start_counter": "1"}, ShardTypeError, "start_counter"),
    ],
)
def test_bad_sequence_options(kwargs: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        SpannerSequence.create_ddl("s", **kwargs)


def test_create_ddl() -> None:
    assert SpannerSequence.create_ddl("ids", skip_range=(1, 1000), start_counter=7) == (
        "CREATE SEQUENCE ids OPTIONS (sequence_kind = 'bit_reversed_positive', "
        "skip_range_min = 1, skip_range_max = 1000, start_with_counter = 7)"
    )
    with pytest.raises(ShardConfigError, match="plain identifier"):
        SpannerSequence.create_ddl("ids; DROP TABLE x")


def test_spanner_sequence_needs_spanner() -> None:
    with pytest.raises(UnsupportedOnDialectError, match="use TableSequence"):
        SpannerSequence(sa.create_engine("sqlite://"), "s")


def test_bad_table_sequence_arguments() -> None:
    eng = sa.create_engine("sqlite://")
    with pytest.raises(ShardTypeError, match="sequence name"):
        TableSequence(eng, "")
    with pytest.raises(ShardTypeError, match="bit_reversed"):
        TableSequence(eng, "s", bit_reversed=1)  # type: ignore[arg-type]
    with pytest.raises(ShardConfigError, match="plain identifier"):
        TableSequence(eng, "s", table_name="Seq uences")
    with pytest.raises(ShardConfigError, match=r"at most 128 characters .*got 10000"):
        TableSequence(eng, "n" * 10_000)
    with pytest.raises(ShardTypeError, match="engine must be a SQLAlchemy Engine"):
        TableSequence("sqlite://", "s")  # type: ignore[arg-type]
    with pytest.raises(ShardConfigError, match="max_retries"):
        TableSequence(eng, "s", max_retries=-1)
    with pytest.raises(ShardConfigError, match="deadline"):
        TableSequence(eng, "s", deadline=0)
    with pytest.raises(ShardConfigError, match="deadline"):
        TableSequence(eng, "s", deadline=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("deadline", [float("inf"), float("nan"), -1.0, 10**9])
def test_an_unbounded_deadline_is_refused_at_construction(deadline: float) -> None:
    """Not accepted, then an OverflowError from every next_id() (issue 24, item 10)."""
    with pytest.raises(ShardConfigError, match=r"deadline must be more than 0 and at most"):
        TableSequence(sa.create_engine("sqlite://"), "s", deadline=deadline)


def test_one_attempt_gets_a_share_of_the_deadline() -> None:
    """A hung attempt leaves time for a retry (issue 24, item 9)."""
    seq = TableSequence(sa.create_engine("sqlite://"), "s", deadline=30)
    assert seq.policy.call_timeout == 10.0 and seq.policy.deadline == 30
    assert TableSequence(sa.create_engine("sqlite://"), "s", deadline=600).policy.call_timeout == 60


def test_a_huge_block_is_refused_before_anything_is_reserved() -> None:
    eng = sa.create_engine("sqlite://")
    TableSequence(eng, "s").create_table()
    with pytest.raises(ShardConfigError, match="block_size must be between 1 and 100,000"):
        TableSequence(eng, "s", block_size=2**63)
    with eng.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM Sequences")).scalar() == 0


# ----------------------------------------------------------------------------- TableSequence


def test_table_sequence_hands_out_blocks() -> None:
    eng = sa.create_engine("sqlite://")
    seq = TableSequence(eng, "orders", block_size=4)
    seq.create_table()
    assert [seq.next_id() for _ in range(10)] == list(range(1, 11))
    assert seq.reservations == 3
    with eng.connect() as conn:
        stored = conn.execute(sa.select(seq.table)).all()
    assert stored == [("orders", 13)]  # 11 and 12 are in this pool; 13 is the next block's
    rev = TableSequence(eng, "other", block_size=3, bit_reversed=True)
    assert [rev() for _ in range(4)] == [bit_reverse(v) for v in (1, 2, 3, 4)]


def test_a_lost_pool_is_a_gap_not_a_duplicate() -> None:
    eng = sa.create_engine("sqlite://")
    first = TableSequence(eng, "s", block_size=10)
    first.create_table()
    assert first.next_id() == 1  # 2..10 die with this pool
    second = TableSequence(eng, "s", block_size=10)
    assert [second.next_id() for _ in range(3)] == [11, 12, 13]
    assert first.next_id() == 2  # the first pool still owns its block


def test_table_sequence_threads_and_engines_on_sqlite(sqlite_file: str) -> None:
    e1, e2 = sa.create_engine(sqlite_file), sa.create_engine(sqlite_file)
    s1 = TableSequence(e1, "orders", block_size=50)
    s1.create_table()
    s2 = TableSequence(e2, "orders", block_size=50)
    values = draw_concurrently([s1, s2], 8, 500)
    assert len(values) == len(set(values)) == 4000
    assert s1.reservations + s2.reservations == 80  # 4,000 / 50: no block lost or shared


def test_a_lost_race_is_retried(sqlite_file: str) -> None:
    """Another client reserves between our read and our write: our conditional UPDATE
    changes nothing, the attempt is retried, and the blocks stay disjoint."""
    e1, e2 = sa.create_engine(sqlite_file), sa.create_engine(sqlite_file)
    ours = TableSequence(e1, "s", block_size=5)
    ours.create_table()
    theirs = TableSequence(e2, "s", block_size=5)
    assert theirs.next_id() == 1  # the row exists: Next_Value = 6
    interfered: list[int] = []

    @sa.event.listens_for(e1, "before_cursor_execute")
    def race(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if statement.startswith("UPDATE") and not interfered:
            theirs._pool.clear()
            interfered.append(theirs.next_id())  # reserves 6..10 on the other engine

    assert [ours.next_id() for _ in range(5)] == [11, 12, 13, 14, 15]
    assert interfered == [6]
    assert ours.retries == 1 and ours.reservations == 1


def _draw_in_process(url: str, n: int, out: Any) -> None:
    seq = TableSequence(sa.create_engine(url), "shared", block_size=7)
    out.put([seq.next_id() for _ in range(n)])


# 3 spawned interpreters (seconds each); quick loop:
# test_table_sequence_never_duplicates_on_the_emulator (two engines drawing at once, as two
# processes would)
@pytest.mark.slow
def test_process_safe_on_sqlite(sqlite_file: str) -> None:
    TableSequence(sa.create_engine(sqlite_file), "shared").create_table()
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_draw_in_process, args=(sqlite_file, 300, queue)) for _ in range(3)]
    for p in procs:
        p.start()
    here = TableSequence(sa.create_engine(sqlite_file), "shared", block_size=7)
    values = [here.next_id() for _ in range(300)]
    for _ in procs:
        values += queue.get(timeout=60)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(values) == len(set(values)) == 1200


def test_table_sequence_exhaustion_at_int64_max() -> None:
    eng = sa.create_engine("sqlite://")
    seq = TableSequence(eng, "x", block_size=10)
    seq.create_table()
    with eng.begin() as conn:
        conn.execute(seq.table.insert(), {"Sequence_ID": "x", "Next_Value": INT64_MAX - 3})
    # the last, short block: Next_Value must stay an INT64, so 2**63 - 1 is never handed out
    assert [seq.next_id() for _ in range(3)] == [INT64_MAX - 3, INT64_MAX - 2, INT64_MAX - 1]
    for _ in range(2):
        with pytest.raises(SequenceExhausted, match="exhausted.*Start a new sequence"):
            seq.next_id()
    assert seq.retries == 0  # not contention: not retried
    with eng.connect() as conn:
        assert conn.execute(sa.select(seq.table.c.Next_Value)).scalar() == INT64_MAX


# ----------------------------------------------------------------------------- bounded


def test_a_permanent_error_ends_at_once_and_releases_the_lock() -> None:
    """No table: a permanent error, not retried; every thread gets it, none blocks."""
    seq = TableSequence(sa.create_engine("sqlite://"), "s", deadline=5)
    errors: list[BaseException] = []

    def draw() -> None:
        try:
            seq.next_id()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert len(errors) == 4 and all(isinstance(e, RetryError) for e in errors)
    assert "not retryable (permanent)" in str(errors[0]) and "no such table" in str(errors[0])
    assert seq.retries == 0


def test_a_locked_database_is_retried_until_the_deadline(sqlite_file: str) -> None:
    engine = sa.create_engine(sqlite_file, connect_args={"timeout": 0.05})
    seq = TableSequence(engine, "s", deadline=0.5)
    seq.create_table()
    blocker = sa.create_engine(sqlite_file).connect()
    blocker.exec_driver_sql("BEGIN EXCLUSIVE")  # the writer lock, held by someone else
    try:
        with pytest.raises(RetryError, match="deadline of 0.5 s passed.*database is locked"):
            seq.next_id()
    finally:
        blocker.rollback()
        blocker.close()
    assert seq.retries > 0 and seq.next_id() == 1


def test_waiting_for_another_threads_reservation_is_bounded(sqlite_file: str) -> None:
    engine = sa.create_engine(sqlite_file)
    seq = TableSequence(engine, "s", deadline=0.5)
    seq.create_table()
    slow = threading.Event()

    @sa.event.listens_for(engine, "before_cursor_execute")
    def stall(*args: Any) -> None:
        if not slow.is_set():
            slow.set()
            time.sleep(1.5)  # a reservation stuck on a slow server

    first: list[int] = []
    holder = threading.Thread(target=lambda: first.append(seq.next_id()))
    holder.start()
    slow.wait(5)
    started = time.monotonic()
    with pytest.raises(RetryError, match="held the pool's lock"):
        seq.next_id()
    assert time.monotonic() - started < 1.4
    holder.join(10)
    assert first == [1] and seq.next_id() == 2


# ----------------------------------------------------------------------------- Spanner


def blocks_on_mock(mock: Any, monkeypatch: pytest.MonkeyPatch, blocks: list[list[int]]) -> None:
    """The sequence query answers each call with the next block (as Spanner would)."""
    results = []
    for block in blocks:
        mock.add_result(SEQ_SQL, [("v", "INT64")], [[v] for v in block])
        results.append(mock.spanner_svc.mock_spanner.results[SEQ_SQL.lower()])
    served = iter(results)
    monkeypatch.setattr(mock.spanner_svc.mock_spanner, "get_result", lambda sql: next(served))


def requests_named(mock: Any, name: str) -> list[Any]:
    return [r for r in mock.requests if type(r).__name__ == name]


def test_one_transaction_per_block_on_the_mock(mock_spanner: Any) -> None:
    """One query (beginning the transaction), one commit: the block's own transaction,
    sent by us with the client's retries off (no DB-API)."""
    engine = mock_spanner.engine()
    mock_spanner.add_result(SEQ_SQL, [("v", "INT64")], [[v] for v in (5, 6, 7)])
    seq = SpannerSequence(engine, "s", block_size=3)
    assert [seq.next_id() for _ in range(9)] == [5, 6, 7] * 3  # the mock repeats itself
    queries = requests_named(mock_spanner, "ExecuteSqlRequest")
    assert len(queries) == 3 and {q.sql for q in queries} == {SEQ_SQL}
    assert all(int(q.params["n"]) == 3 and "read_write" in q.transaction.begin for q in queries)
    assert mock_spanner.count("BeginTransactionRequest") == 0  # begun inline by the query
    assert mock_spanner.count("CommitRequest") == 3
    assert mock_spanner.count("ExecuteStreamingSqlRequest") == 0
    seq.close()
    assert mock_spanner.count("DeleteSessionRequest") == 1
    engine.dispose()


def test_an_aborted_commit_is_retried_by_us_alone(
    mock_spanner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ABORTED at commit: no replay inside the client; our retry reserves a new block in
    a new transaction, and only the committed block is handed out."""
    engine = mock_spanner.engine()
    blocks_on_mock(mock_spanner, monkeypatch, [[1, 2], [3, 4], [5, 6]])
    mock_spanner.add_error("Commit", "ABORTED", "aborted by the test")
    seq = SpannerSequence(engine, "s", block_size=2)
    assert [seq.next_id() for _ in range(2)] == [3, 4]
    assert (seq.reservations, seq.retries) == (1, 1)
    assert len(requests_named(mock_spanner, "ExecuteSqlRequest")) == 2
    assert mock_spanner.count("CommitRequest") == 2  # aborted, then ours
    assert mock_spanner.count("RollbackRequest") == 1
    engine.dispose()


@pytest.mark.parametrize("code", ["ABORTED", "DEADLINE_EXCEEDED", "UNAVAILABLE"])
def test_a_failed_query_is_retried(
    mock_spanner: Any, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    engine = mock_spanner.engine()
    blocks_on_mock(mock_spanner, monkeypatch, [[7, 8], [9, 10]])
    mock_spanner.add_error("ExecuteSql", code, "injected", times=3)
    seq = SpannerSequence(engine, "s", block_size=2)
    assert [seq.next_id() for _ in range(2)] == [7, 8]  # the mock serves a block once asked
    assert seq.retries == 3 and mock_spanner.count("CommitRequest") == 1
    engine.dispose()


@pytest.mark.parametrize(
    ("code", "message"),
    [("PERMISSION_DENIED", "denied"), ("INVALID_ARGUMENT", "bad"), ("NOT_FOUND", "Instance")],
)
def test_a_permanent_error_is_not_retried(mock_spanner: Any, code: str, message: str) -> None:
    engine = mock_spanner.engine()
    mock_spanner.add_error("ExecuteSql", code, message, times=1)
    seq = SpannerSequence(engine, "s", block_size=2)
    started = time.monotonic()
    with pytest.raises(RetryError, match=f"not retryable.*{message}"):
        seq.next_id()
    assert time.monotonic() - started < 5 and seq.retries == 0
    assert mock_spanner.count("ExecuteSqlRequest") == 1
    engine.dispose()


@pytest.mark.emulator
def test_native_sequence_never_duplicates_on_the_emulator(spanner_emulator: Any) -> None:
    db = spanner_emulator.create_database([SpannerSequence.create_ddl("ids")])
    e1, e2 = spanner_emulator.engine(db), spanner_emulator.engine(db)
    try:
        native = SpannerSequence(e1, "ids", block_size=100)
        # 8 threads x 1,000 draws: 80 reservations race as 400 did with 5,000 draws a thread
        # (5x the time, nothing more checked)
        values = draw_concurrently([native], 8, 1000)
        assert len(values) == len(set(values)) == 8000
        assert native.reservations == 80  # one query per block of 100
        # Spanner's counter is 1, 2, 3...: the values are exactly its bit reversals
        assert {bit_reverse(v) for v in values} == set(range(1, 8001))
        other = SpannerSequence(e2, "ids", block_size=100)
        both = draw_concurrently([native, other], 8, 1000)
        assert len(both) == len(set(both)) == 8000
        assert not set(both) & set(values)
    finally:
        e1.dispose()
        e2.dispose()


@pytest.mark.emulator
def test_table_sequence_never_duplicates_on_the_emulator(spanner_emulator: Any) -> None:
    db = spanner_emulator.create_database()
    e1, e2 = spanner_emulator.engine(db), spanner_emulator.engine(db)
    try:
        table1 = TableSequence(e1, "orders", block_size=100)
        table1.create_table()
        values = draw_concurrently([table1], 8, 1000)  # 80 reservations race
        assert len(values) == len(set(values)) == 8000
        table2 = TableSequence(e2, "orders", block_size=100, bit_reversed=True)
        both = draw_concurrently([table1, table2], 8, 1000)  # concurrent writers: retried
        plain = [v for i, v in enumerate(both) if (i // 1000) % 2 == 0]
        rev = [bit_reverse(v) for i, v in enumerate(both) if (i // 1000) % 2 == 1]
        everything = values + plain + rev
        assert len(everything) == len(set(everything)) == 16_000
    finally:
        e1.dispose()
        e2.dispose()


@pytest.mark.emulator
def test_skip_range_is_honoured_exactly(spanner_emulator: Any) -> None:
    """Both ends are skipped: counter 1 -> 2**62 and 2 -> 2**61 are the bounds themselves."""
    lo, hi = 2**61, 2**62
    db = spanner_emulator.create_database([SpannerSequence.create_ddl("s", skip_range=(lo, hi))])
    engine = spanner_emulator.engine(db)
    try:
        seq = SpannerSequence(engine, "s", block_size=50)
        got = [seq.next_id() for _ in range(200)]
    finally:
        engine.dispose()
    assert not [v for v in got if lo <= v <= hi]
    # exactly the skipped ones are missing: the first counters whose reversal is outside
    outside = [bit_reverse(c) for c in range(1, 1000) if not lo <= bit_reverse(c) <= hi]
    assert set(got) == set(outside[:200])


@pytest.mark.emulator
def test_native_sequence_exhaustion(spanner_emulator: Any) -> None:
    """A block near the end is cut to the counters left: none is burnt by a failed block,
    every counter is handed out, then a clear error whose advice works."""
    db = spanner_emulator.create_database(
        [SpannerSequence.create_ddl("s", start_counter=INT64_MAX - 6)]
    )
    engine = spanner_emulator.engine(db)
    try:
        first = SpannerSequence(engine, "s", block_size=2)
        got = [first.next_id() for _ in range(2)]
        seq = SpannerSequence(engine, "s", block_size=10)
        got += [seq.next_id() for _ in range(4)]  # a block of 10 with 4 counters left
        assert sorted(bit_reverse(v) for v in got) == list(range(INT64_MAX - 6, INT64_MAX))
        for _ in range(2):
            with pytest.raises(SequenceExhausted, match="'s' is exhausted.*create_ddl"):
                seq.next_id()
        assert seq.retries == 0
        advice = SpannerSequence.create_ddl("s_2")
        with engine.begin() as conn:
            conn.exec_driver_sql(advice)
        assert SpannerSequence(engine, "s_2").next_id() > 0
    finally:
        engine.dispose()
