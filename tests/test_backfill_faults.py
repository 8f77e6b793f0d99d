"""The client backfill against a server that goes silent, and on a key with DESC parts.

Silent server: each RPC carries the batch timeout, the run its deadline; it ends within
that deadline with an error saying how to resume, and the re-run completes with 0 rows
lost. DESC key: the walk follows the stored order with its key cursor (one read per
batch, no rescan) and fills every row.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
import sqlalchemy as sa

from alembic_ext import backfill_shard
from sharded_orm import compute_shard
from sharded_orm.retry import RetryError

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
