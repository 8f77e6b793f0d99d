"""verify: rows whose stored shard disagrees with its sources, on SQLite and the emulator,
and the ``sharded-orm verify`` command."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa
from at_scale_models import (
    CrcBase,
    CrcLogEntry,
    FarmBase,
    FarmLogEntry,
    load_old_rows,
    rows,
)
from seed_models import NaiveLogEntry, User
from sqlalchemy.orm import Session

from sharded_orm import ShardConfigError, get_shard_column
from sharded_orm.load.verify import scan_partitions, verify
from sharded_orm.spanner.mutations import database_of
from sharded_orm.tools.cli import main

KEY = ("CompanyId", "UserId", "Timestamp")


def _sqlite_with_rows(n: int) -> sa.Engine:
    engine = sa.create_engine("sqlite://")
    CrcBase.metadata.create_all(engine)
    with Session(engine) as session:  # the write path fills both shard columns
        session.execute(sa.insert(CrcLogEntry), list(rows(n)))
        session.commit()
    return engine


def test_sqlite_clean_table_reports_zero() -> None:
    report = verify(_sqlite_with_rows(300), CrcLogEntry)
    assert report.rows_checked == 300
    assert report.mismatched == {"EntryShardId": 0, "EntryShardV2": 0}
    assert report.ok
    assert report.methods == {"EntryShardId": "client scan", "EntryShardV2": "client scan"}


def test_sqlite_counts_wrong_and_null_shards_per_column() -> None:
    engine = _sqlite_with_rows(100)
    table = CrcLogEntry.__table__
    with engine.begin() as raw:  # behind the write path's back: the driver's own cursor
        cur = raw.connection.driver_connection.cursor()
        cur.execute('UPDATE "LogEntries" SET "EntryShardV2" = NULL WHERE rowid <= 3')
        cur.execute('UPDATE "LogEntries" SET "EntryShardId" = ("EntryShardId" + 1) % 10 '
                    "WHERE rowid > 95")  # fmt: skip
    report = verify(engine, table)
    assert report.rows_checked == 100
    assert report.mismatched == {"EntryShardId": 5, "EntryShardV2": 3}
    assert not report.ok


def test_table_without_shard_columns_is_refused() -> None:
    with pytest.raises(ShardConfigError, match="no shard columns"):
        verify(sa.create_engine("sqlite://"), NaiveLogEntry)
    with pytest.raises(ShardConfigError, match="'Users' has no shard columns"):
        verify(sa.create_engine("sqlite://"), User)


@pytest.mark.emulator
def test_emulator_server_count_for_farm_and_partitioned_scan_for_crc32(
    spanner_engine: Any,
) -> None:
    FarmBase.metadata.create_all(spanner_engine)
    load_old_rows(spanner_engine, FarmLogEntry, 400)  # EntryShardV2 still NULL
    report = verify(spanner_engine, FarmLogEntry)
    assert report.rows_checked == 400
    assert report.mismatched == {"EntryShardId": 0, "EntryShardV2": 400}
    assert report.methods == {
        "EntryShardId": "partitioned scan",
        "EntryShardV2": "server-side count",
    }
    sc = get_shard_column(FarmLogEntry, "EntryShardV2")
    good = [[r["company_id"], r["user_id"], r["ts"], sc.compute([r["company_id"], r["ts"]])]
            for r in rows(400)]  # fmt: skip
    good[0][3] = (good[0][3] + 1) % 16
    with database_of(spanner_engine).batch() as b:
        b.update("LogEntries", columns=(*KEY, "EntryShardV2"), values=good)
        r = next(rows(1, start=5))
        b.update("LogEntries", columns=(*KEY, "EntryShardId"),
                 values=[[r["company_id"], r["user_id"], r["ts"], 11]])  # fmt: skip
    report = verify(spanner_engine, FarmLogEntry)
    assert report.mismatched == {"EntryShardId": 1, "EntryShardV2": 1}


def _models_module(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "verify_target.py").write_text("from at_scale_models import CrcLogEntry\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_cli_verify_text_json_and_exit_codes(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "v.db"
    engine = sa.create_engine(f"sqlite:///{db}")
    CrcBase.metadata.create_all(engine)
    with Session(engine) as session:
        session.execute(sa.insert(CrcLogEntry), list(rows(50)))
        session.commit()
    _models_module(tmp_path, monkeypatch)
    url = f"sqlite:///{db}"
    assert main(["verify", url, "verify_target:CrcLogEntry"]) == 0
    out = capsys.readouterr().out
    assert "EntryShardV2" in out and "50 rows checked" in out
    with engine.begin() as raw:
        raw.connection.driver_connection.cursor().execute(
            'UPDATE "LogEntries" SET "EntryShardV2" = NULL WHERE rowid = 1'
        )
    assert main(["verify", url, "verify_target:CrcLogEntry", "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["command"] == "verify" and data["summary"]["rows_checked"] == 50
    assert data["summary"]["tables"][0]["mismatched"] == {"EntryShardId": 0, "EntryShardV2": 1}
    assert data["summary"]["ok"] is False
    assert data["findings"] == [
        {
            "table": "LogEntries",
            "shard_column": "EntryShardV2",
            "mismatched": 1,
            "method": "client scan",
        }
    ]


def test_cli_verify_bad_target_exits_2(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "naive_target.py").write_text("from seed_models import NaiveLogEntry\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["verify", "sqlite://", "naive_target:NaiveLogEntry"]) == 2
    assert "no shard columns" in capsys.readouterr().err


def test_a_connection_works_as_bind_and_a_url_string_does_not() -> None:
    engine = _sqlite_with_rows(20)
    with engine.connect() as conn:
        assert verify(conn, CrcLogEntry).rows_checked == 20
    with pytest.raises(TypeError, match="Engine or Connection.*create_engine"):
        verify("sqlite://", CrcLogEntry)


class _Partitions:
    """A batch snapshot of ``parts`` partitions whose streams take a while, noting how
    many are read at once and the timeouts they are given."""

    def __init__(self, parts: int) -> None:
        self.parts = parts
        self.lock = threading.Lock()
        self.open = self.most = 0
        self.timeouts: list[float] = []

    def generate_query_batches(self, sql: str, *, timeout: float) -> Any:
        self.timeouts.append(timeout)
        return iter([{"partition": i} for i in range(self.parts)])

    def process_query_batch(self, batch: Any, *, timeout: float) -> Any:
        self.timeouts.append(timeout)
        with self.lock:
            self.open += 1
            self.most = max(self.most, self.open)
        time.sleep(0.05)
        with self.lock:
            self.open -= 1
        return iter([[batch["partition"], 1]] * 10)


def test_partitions_are_scanned_concurrently_by_bounded_workers() -> None:
    snap = _Partitions(9)

    def work(rows: Any) -> tuple[int, list[int]]:
        seen = list(rows)
        return len(seen), [sum(1 for p, _ in seen if p % 2)]

    n, bad = scan_partitions(snap, "SELECT 1", work, workers=3, timeout=7.0)
    assert (n, bad) == (90, [40])  # every partition once: odd ones 1, 3, 5, 7
    assert snap.most == 3  # at most `workers` at once, and as many as that
    # PartitionQuery and every stream carry a timeout: what is left of their Deadline
    assert len(snap.timeouts) == 10 and all(6.5 < t <= 7.0 for t in snap.timeouts)


def test_workers_must_be_positive() -> None:
    engine = sa.create_engine("sqlite://")
    with pytest.raises(ShardConfigError, match="workers"):
        verify(engine, User, workers=0)
