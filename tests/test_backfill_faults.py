"""The client backfill against a server that goes silent, and on a key with DESC parts.

Silent server: each RPC carries the batch timeout, the run its deadline; it ends within
that deadline with an error saying how to resume, and the re-run completes with 0 rows
lost. DESC key: the walk follows the stored order with its key cursor (one read per
batch, no rescan) and fills every row.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic_project import Project
from hypothesis import given
from hypothesis import strategies as st

from alembic_ext import backfill_shard, reflection
from alembic_ext.backfill import DEADLINE_ATTRIBUTE
from alembic_ext.backfill_io import Plan, SpannerWriter, batch_uppers
from alembic_ext.backfill_walk import Walk
from alembic_ext.commit import COMMIT_TIMEOUT_ATTRIBUTE
from alembic_ext.errors import MigrationError
from alembic_ext.ops import PROGRESS_ATTRIBUTE
from sharded_orm import compute_shard
from sharded_orm.hashing import shard_function
from sharded_orm.load.backfill_server import backfill_server_side
from sharded_orm.retry import Deadline, RetryError

pytestmark = pytest.mark.emulator

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
KW: dict[str, Any] = dict(sources=["CompanyId", "Ts"], count=16, batch_size=100)


def _table(database: Any, n: int) -> None:
    """Events keyed (Bucket, Ts DESC, Id), a new shard column still NULL."""
    database.update_ddl(
        [
            "CREATE TABLE Events (Bucket INT64 NOT NULL, Ts TIMESTAMP NOT NULL, "
            "Id STRING(36) NOT NULL, CompanyId STRING(36) NOT NULL, Shard16 INT64) "
            "PRIMARY KEY (Bucket, Ts DESC, Id)"
        ]
    ).result(60)
    values = [
        [i % 3, T0 + dt.timedelta(seconds=i // 7), f"e{i:05d}", f"c{i % 11}"] for i in range(n)
    ]
    with database.batch() as batch:
        batch.insert("Events", columns=["Bucket", "Ts", "Id", "CompanyId"], values=values)


def _check_all(engine: sa.Engine, n: int) -> None:
    with engine.connect() as c:
        rows = c.exec_driver_sql("SELECT CompanyId, Ts, Shard16 FROM Events").all()
    assert len(rows) == n
    assert all(s is not None and compute_shard((a, b), 16) == s for a, b, s in rows)


def test_walk_of_a_desc_key_reads_each_row_once(spanner_emulator: Any) -> None:
    db = spanner_emulator.create_database()
    _table(spanner_emulator.database(db), 1050)
    engine = spanner_emulator.engine(db)
    seen: list[int] = []
    res = backfill_shard(engine, "Events", "Shard16", progress=lambda p: seen.append(p.total), **KW)
    assert (res.rows, res.verified, res.batches) == (1050, 1050, 11)
    assert seen == [min(100 * (i + 1), 1050) for i in range(11)]  # cursor: no row twice
    _check_all(engine, 1050)
    engine.dispose()


class _RangeRecorder(SpannerWriter):
    """The Spanner writer, recording each batch's key range and the rows it returned."""

    ranges: list[tuple[Any, Any, int]]

    def batch(self, after: Any, bound: Any, limit: int, fix: Any, timeout: float) -> Any:
        rows = super().batch(after, bound, limit, fix, timeout)
        self.ranges.append((after, bound, len(rows)))
        return rows


def test_each_batch_reads_a_range_that_holds_only_its_rows(spanner_emulator: Any) -> None:
    """Root cause of the emulator's slowdown with size: a batch asking for the range from
    its cursor to the table's end (with a row limit) costs the whole range, so the walk
    was quadratic. Each batch's range now holds just the rows it returns."""
    db = spanner_emulator.create_database()
    database = spanner_emulator.database(db)
    _table(database, 1050)
    engine = spanner_emulator.engine(db)
    with engine.connect() as conn:
        plan = Plan(conn, "Events", "Shard16", ["CompanyId", "Ts"])
        key_order = reflection.read_primary_key(conn, "Events")
    writer = _RangeRecorder(engine, plan, key_order)
    writer.ranges = []
    walk = Walk(plan, shard_function(16, "crc32"), 100, writer, False, time.monotonic(), True)
    walk.walk(Deadline(60), 10.0)
    writer.close()
    assert [n for _, _, n in writer.ranges] == [100] * 10 + [50]
    from google.cloud.spanner_v1.keyset import KeyRange, KeySet

    with database.snapshot(multi_use=True) as snap:
        for after, upper, n in writer.ranges:
            start = {"start_open": after} if after is not None else {"start_closed": []}
            keys = KeySet(ranges=[KeyRange(**start, end_closed=upper)])
            assert len(list(snap.read("Events", ["Id"], keys))) == n
    _check_all(engine, 1050)
    engine.dispose()


@given(
    n=st.integers(0, 60), batch=st.integers(1, 7), batches=st.integers(1, 4),
)  # fmt: skip
def test_batch_uppers_cut_the_next_keys_into_batches(n: int, batch: int, batches: int) -> None:
    keys = [[i] for i in range(n)]
    read = keys[: batch * batches]  # what the key-only read with its limit returns
    uppers, end = batch_uppers(iter(read), [999], batch, batches)
    assert end == (n < batch * batches)
    sizes, lower = [], -1
    for (upper,) in uppers:  # the range (lower, upper] of each batch
        sizes.append(sum(lower < k <= upper for (k,) in keys))
        lower = upper
    assert sum(sizes) == len(read)  # every key read is in exactly one batch
    assert all(0 < s <= batch for s in sizes)
    assert all(s == batch for s in sizes[:-1])
    assert (uppers[-1] == [999]) if end and read else True  # the walk's last range


# waits out a deadline; quick loop:
# test_silent_server_at_the_commit_before_a_schema_change_ends_in_time
@pytest.mark.slow
def test_silent_server_mid_backfill_ends_within_its_deadline(
    spanner_emulator: Any, spanner_faults: Any
) -> None:
    db = spanner_emulator.create_database()
    _table(spanner_emulator.database(db), 1000)
    proxy = spanner_faults
    engine = proxy.emulator(spanner_emulator).engine(db)

    def go_silent(p: Any) -> None:
        if p.batches == 2:
            for method in ("BeginTransaction", "StreamingRead", "Commit", "CreateSession"):
                proxy.hang(method, 120, times=1000)

    start = time.monotonic()
    with pytest.raises(RetryError) as caught:
        backfill_shard(
            engine, "Events", "Shard16", progress=go_silent, deadline=6, batch_timeout=1.5, **KW
        )
    took = time.monotonic() - start
    assert took < 6 + 2, took
    message = str(caught.value)
    assert "batch 3, after 200 rows" in message and "run the step again" in message
    proxy.clear()
    direct = spanner_emulator.engine(db)
    with direct.connect() as c:
        filled = c.exec_driver_sql("SELECT COUNT(*) FROM Events WHERE Shard16 IS NOT NULL")
        assert filled.scalar_one() == 200
    res = backfill_shard(engine, "Events", "Shard16", progress=False, deadline=60, **KW)
    assert (res.rows, res.verified) == (800, 1000)
    _check_all(direct, 1000)
    engine.dispose()
    direct.dispose()


# waits out a deadline; quick loop:
# test_silent_server_at_the_commit_before_a_schema_change_ends_in_time
@pytest.mark.slow
def test_silent_server_mid_partitioned_dml_ends_within_its_deadline(
    spanner_emulator: Any, spanner_faults: Any
) -> None:
    """The Partitioned-DML path: the client's ``execute_partitioned_dml`` sends no
    timeout (its streamed statement waits up to an hour); each of our statements carries
    the time left, so a server gone silent after two statements ends the run in time."""
    db = spanner_emulator.create_database()
    _table(spanner_emulator.database(db), 500)
    proxy = spanner_faults
    engine = proxy.emulator(spanner_emulator).engine(db)
    kw: dict[str, Any] = dict(
        sources=["CompanyId", "Ts"], count=16, algorithm="farm_fingerprint",
        rows_per_statement=100, progress_mode="off",
    )  # fmt: skip
    stop = threading.Event()

    def silence_after_two_statements() -> None:
        while not stop.wait(0.01):
            if proxy.count("BeginTransaction") >= 2:
                for method in ("BeginTransaction", "ExecuteStreamingSql", "CreateSession"):
                    proxy.hang(method, 120, times=1000)
                return

    watcher = threading.Thread(target=silence_after_two_statements)
    watcher.start()
    start = time.monotonic()
    try:
        with pytest.raises(RetryError) as caught:
            backfill_server_side(
                engine, "Events", "Shard16", deadline=6, statement_timeout=1.5, **kw
            )
    finally:
        stop.set()
        watcher.join()
    took = time.monotonic() - start
    assert took < 6 + 2, took
    assert "run the backfill again" in str(caught.value)
    proxy.clear()
    direct = spanner_emulator.engine(db)
    with direct.connect() as c:
        filled = c.exec_driver_sql("SELECT COUNT(*) FROM Events WHERE Shard16 IS NOT NULL")
        assert 100 <= filled.scalar_one() < 500
    res = backfill_server_side(engine, "Events", "Shard16", deadline=60, **kw)
    assert res.mismatched == 0 and res.rows_updated == res.rows_missing_before > 0
    with direct.connect() as c:
        rows = c.exec_driver_sql("SELECT CompanyId, Ts, Shard16 FROM Events").all()
    assert len(rows) == 500
    assert all(compute_shard((a, b), 16, "farm_fingerprint") == s for a, b, s in rows)
    engine.dispose()
    direct.dispose()


def test_silent_server_at_the_commit_before_a_schema_change_ends_in_time(
    tmp_path: Path, spanner_emulator: Any, spanner_faults: Any, monkeypatch: Any
) -> None:
    """The migration's DB-API commit before its next DDL (the client's has no timeout and
    retries UNAVAILABLE for an hour): bounded by the commit timeout, with how to go on;
    the re-run completes with every row filled."""
    db = spanner_emulator.create_database()
    _table(spanner_emulator.database(db), 1000)
    proxy = spanner_faults
    proj = Project(tmp_path, spanner_emulator.url(db))
    monkeypatch.setenv("SPANNER_EMULATOR_HOST", proxy.host)  # env.py's engine: the proxy
    proj.cfg.attributes["target_metadata"] = None
    head = proj.hand_written("backfill then index", """
        op.backfill_shard("Events", "Shard16", sources=["CompanyId", "Ts"], count=16,
                          batch_size=100, engine="client")
        op.execute("UPDATE Events SET CompanyId = 'c0' WHERE Id = 'e00000'")
        op.create_index("EventsByShard", "Events", ["Shard16", "Ts"])
    """)  # fmt: skip

    def silence_commits_after_the_fill(p: Any) -> None:
        if p.total == 1000:
            proxy.hang("Commit", 120, times=1000)

    start = time.monotonic()
    with pytest.raises(MigrationError, match="did not finish within 3 s") as caught:
        proj.upgrade(**{PROGRESS_ATTRIBUTE: silence_commits_after_the_fill,
                        COMMIT_TIMEOUT_ATTRIBUTE: 3})  # fmt: skip
    took = time.monotonic() - start
    assert took < 3 + 5, took
    assert "run `alembic upgrade` again" in str(caught.value)
    proxy.clear()
    direct = spanner_emulator.engine(db)
    with direct.connect() as c:
        assert c.exec_driver_sql("SELECT COUNT(*) FROM alembic_version").scalar_one() == 0
    proj.upgrade(**{PROGRESS_ATTRIBUTE: None})
    with direct.connect() as c:
        assert c.exec_driver_sql("SELECT version_num FROM alembic_version").scalar_one() == head
    _check_all(direct, 1000)
    direct.dispose()


# alembic upgrade journey; quick loop:
# test_silent_server_at_the_commit_before_a_schema_change_ends_in_time
@pytest.mark.slow
def test_silent_server_mid_backfill_in_alembic_upgrade_ends_within_its_deadline(
    tmp_path: Path, spanner_emulator: Any, spanner_faults: Any, monkeypatch: Any
) -> None:
    """``alembic upgrade`` with ``config.attributes['sharded_orm.backfill_deadline']``: a
    server gone silent mid-backfill ends the upgrade in time, saying how to resume; the
    re-run completes it."""
    db = spanner_emulator.create_database()
    _table(spanner_emulator.database(db), 1000)
    proxy = spanner_faults
    proj = Project(tmp_path, spanner_emulator.url(db))
    monkeypatch.setenv("SPANNER_EMULATOR_HOST", proxy.host)
    proj.cfg.attributes["target_metadata"] = None
    head = proj.hand_written("backfill", """
        op.backfill_shard("Events", "Shard16", sources=["CompanyId", "Ts"], count=16,
                          batch_size=100, engine="client")
    """)  # fmt: skip

    def go_silent(p: Any) -> None:
        if p.batches == 3:
            for method in ("BeginTransaction", "StreamingRead", "Commit", "CreateSession"):
                proxy.hang(method, 120, times=1000)

    start = time.monotonic()
    with pytest.raises(RetryError, match="run the step again") as caught:
        proj.upgrade(**{PROGRESS_ATTRIBUTE: go_silent, DEADLINE_ATTRIBUTE: 5})
    took = time.monotonic() - start
    assert took < 5 + 3, took
    assert "batch 4, after 300 rows" in str(caught.value)
    proxy.clear()
    proj.upgrade(**{PROGRESS_ATTRIBUTE: None, DEADLINE_ATTRIBUTE: 60})
    direct = spanner_emulator.engine(db)
    with direct.connect() as c:
        assert c.exec_driver_sql("SELECT version_num FROM alembic_version").scalar_one() == head
    _check_all(direct, 1000)
    direct.dispose()


@pytest.mark.parametrize("method", ["StreamingRead", "BeginTransaction"])
def test_a_failed_batch_starts_a_new_session_for_its_retry(
    spanner_emulator: Any, spanner_faults: Any, method: str
) -> None:
    """A batch (its key-range read, or its read-write transaction) that fails may have
    lost its session (a server restart, an expired session): the retry runs on a new
    one, as the queries' retries do, never on the session Spanner answers NOT_FOUND for."""
    db = spanner_emulator.create_database()
    _table(spanner_emulator.database(db), 30)
    proxy = spanner_faults
    engine = proxy.emulator(spanner_emulator).engine(db)
    with engine.connect() as conn:
        plan = Plan(conn, "Events", "Shard16", ["CompanyId", "Ts"])
        key_order = reflection.read_primary_key(conn, "Events")
    writer = SpannerWriter(engine, plan, key_order)
    try:
        bound = writer.last_key(10)
        assert bound is not None
        sessions = proxy.count("CreateSession")
        proxy.fail(method, "UNAVAILABLE", times=1)

        def step() -> Any:
            if method == "StreamingRead":
                return writer.plan_batches(None, bound, 10, 2, 10)
            return writer.batch(None, bound, 10, lambda rows: [], 10)

        with pytest.raises(Exception, match="UNAVAILABLE|unavailable|503"):
            step()
        step()  # the retry
        assert proxy.count("CreateSession") == sessions + 1
    finally:
        writer.close()
        engine.dispose()
