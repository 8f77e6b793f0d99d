"""bulk_load on the mock Spanner server: exactly what is sent, commit by commit."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa
from seed_models import LogEntry

from sharded_orm import compute_shard
from sharded_orm.load.bulk import MAX_MUTATIONS, BulkLoadError, bulk_load

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)


def entries(n: int) -> list[dict[str, Any]]:
    return [
        {"company_id": f"c{i % 7}", "user_id": f"u{i:05d}", "ts": T0, "entry": f"e{i}"}
        for i in range(n)
    ]


def written(commit: Any) -> tuple[str, list[str], list[list[Any]]]:
    """(operation, columns, rows) of a commit holding one write mutation."""
    (mutation,) = commit.mutations
    op = "insert" if "insert" in mutation else "insert_or_update"
    write = getattr(mutation, op)
    return op, list(write.columns), [list(row) for row in write.values]


def test_only_commits_are_sent_one_range_each(mock_spanner: Any) -> None:
    engine = mock_spanner.engine()
    rows = entries(2000)
    report = bulk_load(engine, LogEntry, rows, workers=2, batch_bytes=4_000)
    assert report.complete and report.rows_written == 2000
    kinds = {type(r).__name__ for r in mock_spanner.requests}
    assert "ExecuteSqlRequest" not in kinds and "ExecuteBatchDmlRequest" not in kinds
    commits = mock_spanner.commits()
    assert len(commits) == report.commits == report.batches > 20
    sent = []
    for c in commits:
        op, columns, values = written(c)
        assert op == "insert" and "single_use_transaction" in c  # no BeginTransaction
        assert columns == ["CompanyId", "UserId", "Timestamp", "LogEntry", "EntryShardId"]
        sent.extend(values)
        # one batch = rows of one key range: contiguous in key order
        keys = sorted((v[0], v[1]) for v in values)
        assert keys == [(v[0], v[1]) for v in values]
    assert sorted(v[1] for v in sent) == sorted(r["user_id"] for r in rows)  # each row once
    first = next(v for v in sent if v[1] == "u00003")
    assert first == [
        "c3",
        "u00003",
        "2024-01-01T00:00:00.000000Z",
        "e3",
        str(compute_shard(("c3", T0), 10)),
    ]
    # commit order is not key order
    first_keys = [written(c)[2][0][:2] for c in commits]
    assert first_keys != sorted(first_keys)


# quick loop: test_only_commits_are_sent_one_range_each
@pytest.mark.slow
def test_commits_stay_within_the_mutation_limit(mock_spanner: Any) -> None:
    md = sa.MetaData()
    cols = [sa.Column(f"c{i}", sa.Integer) for i in range(400)]
    wide = sa.Table("Wide", md, sa.Column("k", sa.Integer, primary_key=True), *cols)
    sa.Index("WideByC0", wide.c.c0, wide.c.c1)
    rows = [{"k": k, **{f"c{i}": k for i in range(400)}} for k in range(2000)]
    report = bulk_load(mock_spanner.engine(), wide, rows, workers=1, batch_bytes=50_000_000)
    # columns written + the index's cells (c0, c1, the key k) + its old entry's delete
    assert report.mutations_per_row == 401 + 4
    sizes = [len(written(c)[2]) for c in mock_spanner.commits()]
    assert sum(sizes) == 2000
    assert max(sizes) == MAX_MUTATIONS // 405  # 197 rows: the range of 200 is split
    assert all(n * 405 <= MAX_MUTATIONS for n in sizes)


@pytest.mark.parametrize("code", ["ABORTED", "UNAVAILABLE", "RESOURCE_EXHAUSTED"])
def test_transient_commit_errors_are_retried(mock_spanner: Any, code: str) -> None:
    """Retried by us alone (the client's own retries are off: one commit per attempt)."""
    mock_spanner.add_error("Commit", code, times=1)
    report = bulk_load(mock_spanner.engine(), LogEntry, entries(300), workers=1)
    assert report.complete and report.commits == report.batches
    assert len(mock_spanner.commits()) == report.batches + 1 and report.retries == 1


def test_emulator_lost_transactions_are_retried_by_us(mock_spanner: Any) -> None:
    mock_spanner.add_error("Commit", "INTERNAL", "Transaction not found", times=3)
    report = bulk_load(mock_spanner.engine(), LogEntry, entries(300), workers=1)
    assert report.complete and report.retries == 3
    assert len(mock_spanner.commits()) == report.batches + 3


def test_retries_are_bounded(mock_spanner: Any) -> None:
    mock_spanner.add_error("Commit", "UNAVAILABLE", "injected", times=3)
    with pytest.raises(BulkLoadError, match="3 attempts made.*ServiceUnavailable") as info:
        bulk_load(mock_spanner.engine(), LogEntry, entries(30), workers=1, max_retries=2)
    assert info.value.report.retries == 2 and info.value.report.committed_batches == []
    assert info.value.report.unknown_batches == [info.value.report.failed_batch]
    assert "may have been applied" in str(info.value)


def test_contention_has_its_own_budget(mock_spanner: Any) -> None:
    """ABORTED means nothing was applied: retried past max_retries (up to 100 times)."""
    mock_spanner.add_error("Commit", "ABORTED", "injected", times=5)
    report = bulk_load(mock_spanner.engine(), LogEntry, entries(30), workers=1, max_retries=1)
    assert report.complete and report.retries == 5


def test_an_ambiguous_commit_is_retried_as_insert_or_update(mock_spanner: Any) -> None:
    """After DEADLINE_EXCEEDED the rows may be in: rewriting them cannot fail on them."""
    mock_spanner.add_error("Commit", "DEADLINE_EXCEEDED", times=1)
    report = bulk_load(mock_spanner.engine(), LogEntry, entries(10), workers=1)
    assert report.complete and report.retries == 1
    ops = [written(c)[0] for c in mock_spanner.commits()]
    assert ops[:2] == ["insert", "insert_or_update"] and set(ops[2:]) <= {"insert"}


def test_a_permanent_error_stops_the_load_with_a_report(mock_spanner: Any) -> None:
    mock_spanner.add_error("Commit", "PERMISSION_DENIED", times=1)
    with pytest.raises(BulkLoadError, match="mode='insert_or_update'") as info:
        bulk_load(mock_spanner.engine(), LogEntry, entries(300), workers=1)
    report = info.value.report
    assert report.failed_batch is not None and report.retries == 0
    assert report.committed_batches == [] and not report.complete


def test_insert_or_update_mode_is_sent(mock_spanner: Any) -> None:
    bulk_load(mock_spanner.engine(), LogEntry, entries(5), mode="insert_or_update")
    assert {written(c)[0] for c in mock_spanner.commits()} == {"insert_or_update"}
