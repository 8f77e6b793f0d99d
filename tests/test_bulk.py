"""bulk_load: complete, partitioned, retried, resumable; bad input refused up front."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import pytest
import sqlalchemy as sa
from seed_models import LogEntry, Sharded

from sharded_orm import ShardConfigError, ShardTypeError, compute_shard
from sharded_orm.load.bulk import BulkLoadError, BulkValidationError, bulk_load

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)
T = LogEntry.__table__


def entries(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "company_id": f"c{i % 7}",
            "user_id": f"u{i}",
            "ts": T0 + dt.timedelta(seconds=i),
            "entry": f"entry {i}",
        }
        for i in range(start, start + n)
    ]


def stored(engine: sa.Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(T).order_by(T.c.UserId))]


def expected(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    out = [
        (
            r["company_id"],
            r["user_id"],
            r["ts"],
            r["entry"],
            compute_shard((r["company_id"], r["ts"]), 10),
        )
        for r in rows
    ]
    return sorted(out, key=lambda t: t[1])


def test_load_is_complete_row_for_row(engine: sa.Engine) -> None:
    Sharded.metadata.create_all(engine)
    rows = entries(3000)
    report = bulk_load(engine, LogEntry, rows, workers=3, batch_bytes=20_000)
    assert report.complete and report.rows_written == 3000
    assert report.commits == report.batches > 10
    assert stored(engine) == expected(rows)
    # each worker owns its ranges: no range is written by two workers
    owners: dict[int, int] = {}
    for w, ranges in report.write_order.items():
        for r in ranges:
            assert owners.setdefault(r, w) == w
    assert sorted(owners) == list(range(len(owners))) and len(owners) == 30


# 100,000 rows; quick loop: test_load_is_complete_row_for_row[spanner]
@pytest.mark.slow
@pytest.mark.emulator
def test_100k_rows_on_the_emulator(spanner_engine: sa.Engine) -> None:
    Sharded.metadata.create_all(spanner_engine)
    rows = entries(100_000)
    report = bulk_load(spanner_engine, LogEntry, rows, workers=4, batch_bytes=2_000_000)
    assert report.complete and report.rows_written == 100_000
    assert stored(spanner_engine) == expected(rows)


def test_sqlite_resume_with_insert_or_update() -> None:
    eng = sa.create_engine("sqlite://")
    Sharded.metadata.create_all(eng)
    rows = entries(500)
    bulk_load(eng, LogEntry, rows[:200])
    with pytest.raises(BulkLoadError):  # duplicates with plain insert
        bulk_load(eng, LogEntry, rows)
    report = bulk_load(eng, LogEntry, rows, mode="insert_or_update")
    assert report.complete and stored(eng) == expected(rows)


def test_deferred_indexes_are_back_after_the_load() -> None:
    eng = sa.create_engine("sqlite://")
    Sharded.metadata.create_all(eng)
    bulk_load(eng, LogEntry, entries(100), defer_indexes=True)
    assert [ix["name"] for ix in sa.inspect(eng).get_indexes("LogEntries")] == [
        "LogEntriesByCompany"
    ]


def test_progress_goes_to_the_log_off_a_terminal(
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    eng = sa.create_engine("sqlite://")
    Sharded.metadata.create_all(eng)
    # another test's logging.config.fileConfig (Alembic's env.py) may have disabled it
    monkeypatch.setattr(logging.getLogger("sharded_orm.progress"), "disabled", False)
    with caplog.at_level(logging.INFO, logger="sharded_orm.progress"):
        bulk_load(eng, LogEntry, entries(50))
        bulk_load(eng, LogEntry, entries(50, start=50), progress=False)
    assert capsys.readouterr().err == ""  # never a redrawn line off a terminal
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "bulk_load LogEntries: done, 50 rows" in lines[1]


@pytest.mark.parametrize(
    ("rows", "kwargs", "error", "message"),
    [
        ([{"company_id": "a", "ts": T0}], {}, BulkValidationError, "row 0: key column 'UserId'"),
        (
            entries(3) + [{"company_id": "a", "user_id": 5, "ts": T0}],
            {},
            BulkValidationError,
            "row 3: column 'UserId' takes str",
        ),
        (
            [{"company_id": "a", "user_id": "u", "ts": dt.datetime(2024, 1, 1)}],
            {},
            BulkValidationError,
            "naive datetime",
        ),
        (entries(1), {"workers": 0}, ShardConfigError, "workers must be at least 1"),
        (entries(1), {"workers": -2}, ShardConfigError, "workers"),
        (entries(1), {"batch_bytes": 0}, ShardConfigError, "batch_bytes"),
        (entries(1), {"workers": 1.5}, ShardTypeError, "workers"),
        (entries(1), {"mode": "upsert"}, ShardConfigError, "mode must be"),
        (
            entries(2) + [{"company_id": "a", "user_id": "u", "ts": T0, "entry": "x" * 1000}],
            {"batch_bytes": 500},
            BulkValidationError,
            "row 2: about [0-9,]+ bytes with its index entries: larger than one commit",
        ),
        (
            [{"company_id": "a", "user_id": "u", "ts": T0, "entry": "x" * 1025}],
            {},
            BulkValidationError,
            "row 0: column 'LogEntry' holds at most 1024 characters",
        ),
        (entries(1), {"batch_bytes": "4MB"}, ShardTypeError, "batch_bytes"),
        (entries(1), {"max_retries": -1}, ShardConfigError, "max_retries"),
        (entries(1), {"max_retries": 1.0}, ShardTypeError, "max_retries"),
        (entries(1), {"workers": 10**6}, ShardConfigError, "workers must be at most 256"),
        (entries(1), {"batch_bytes": True}, ShardTypeError, "batch_bytes"),
        (entries(1), {"seed": "x"}, ShardTypeError, "seed"),
        (entries(1), {"defer_indexes": "yes"}, ShardTypeError, "defer_indexes"),
        (None, {}, ShardTypeError, "rows must be an iterable of mappings"),
        (entries(1)[0], {}, ShardTypeError, "rows must be an iterable of mappings"),
        (entries(1), {"progress": "yes"}, ShardTypeError, "progress"),
        (entries(1), {"deadline": -1}, ShardConfigError, "deadline"),
        (entries(1), {"deadline": float("inf")}, ShardConfigError, "deadline must be a positive"),
        (entries(1), {"deadline": 1e300}, ShardConfigError, "deadline must be a positive"),
        (entries(1), {"deadline": "60"}, ShardTypeError, "deadline"),
        (entries(1), {"batch_bytes": 10**12}, ShardConfigError, "batch_bytes must be at most"),
        (entries(1), {"commit_timeout": 0}, ShardConfigError, "commit_timeout"),
        (entries(1), {"commit_timeout": 7200}, ShardConfigError, "commit_timeout"),
        (
            entries(3) + entries(1, start=1),
            {},
            BulkValidationError,
            "row 3: its primary key .* is also the key of row 1",
        ),
        (
            entries(3) + entries(1, start=1),
            {"mode": "insert_or_update"},
            BulkValidationError,
            "row 3: its primary key",
        ),
        ([("a", "u", T0)], {}, BulkValidationError, "row 0: rows are mappings"),
        (
            [{"company_id": "a", "user_id": "u", "ts": T0, "nope": 1}],
            {},
            BulkValidationError,
            "'nope' is not a column",
        ),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(
    rows: list[dict[str, Any]], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    eng = sa.create_engine("sqlite://")
    Sharded.metadata.create_all(eng)
    with pytest.raises(error, match=message):
        bulk_load(eng, LogEntry, rows, **kwargs)
    assert stored(eng) == []


def test_a_url_is_not_a_bind() -> None:
    with pytest.raises(ShardTypeError, match=r"bind must be .*got str 'sqlite://'.*create_engine"):
        bulk_load("sqlite://", LogEntry, entries(1))


def test_an_int_beyond_int64_is_refused() -> None:
    t = sa.Table("Ints", sa.MetaData(), sa.Column("k", sa.BigInteger, primary_key=True))
    with pytest.raises(BulkValidationError, match=r"row 1: column 'k': 9223372036854775808 does"):
        bulk_load(sa.create_engine("sqlite://"), t, [{"k": 1}, {"k": 2**63}])


def test_table_without_primary_key() -> None:
    t = sa.Table("nokey", sa.MetaData(), sa.Column("a", sa.Integer))
    with pytest.raises(ShardConfigError, match="no primary key"):
        bulk_load(sa.create_engine("sqlite://"), t, [{"a": 1}])


@pytest.mark.emulator
def test_deferred_indexes_on_the_emulator(spanner_engine: sa.Engine) -> None:
    Sharded.metadata.create_all(spanner_engine)
    rows = entries(500)
    report = bulk_load(spanner_engine, LogEntry, rows, defer_indexes=True)
    assert report.complete and stored(spanner_engine) == expected(rows)
    with spanner_engine.connect() as conn:
        names = (
            conn.execute(
                sa.text(
                    "SELECT INDEX_NAME FROM INFORMATION_SCHEMA.INDEXES "
                    "WHERE TABLE_NAME = 'LogEntries' AND INDEX_TYPE = 'INDEX'"
                )
            )
            .scalars()
            .all()
        )
    assert names == ["LogEntriesByCompany"]


def test_failed_load_with_deferred_indexes_puts_them_back() -> None:
    eng = sa.create_engine("sqlite://")
    Sharded.metadata.create_all(eng)
    rows = entries(500)
    bulk_load(eng, LogEntry, rows[250:260])  # these make a plain insert fail midway
    with pytest.raises(BulkLoadError, match="IntegrityError") as info:
        bulk_load(eng, LogEntry, rows, defer_indexes=True)
    report = info.value.report
    assert report.dropped_indexes == [] and not report.complete
    assert "are dropped" not in str(info.value)
    names = [ix["name"] for ix in sa.inspect(eng).get_indexes("LogEntries")]
    assert names == ["LogEntriesByCompany"]
    again = bulk_load(eng, LogEntry, rows, mode="insert_or_update", defer_indexes=True)
    assert again.complete and again.dropped_indexes == []
    assert [ix["name"] for ix in sa.inspect(eng).get_indexes("LogEntries")] == names
    assert stored(eng) == expected(rows)


def test_a_rerun_recreates_indexes_a_dead_load_left_dropped() -> None:
    """A load killed with its indexes dropped: the same call re-creates them."""
    eng = sa.create_engine("sqlite://")
    Sharded.metadata.create_all(eng)
    for ix in T.indexes:
        ix.drop(eng)
    rows = entries(100)
    report = bulk_load(eng, LogEntry, rows, defer_indexes=True)
    assert report.complete and report.dropped_indexes == []
    assert [ix["name"] for ix in sa.inspect(eng).get_indexes("LogEntries")] == [
        "LogEntriesByCompany"
    ]


def test_deferred_indexes_need_an_engine() -> None:
    class Database:  # what a google-cloud-spanner Database looks like to bulk_load
        spanner_api = None

        def batch(self) -> Any:
            raise AssertionError("nothing may be written")

    with pytest.raises(ShardConfigError, match="pass an Engine"):
        bulk_load(Database(), LogEntry, entries(5), defer_indexes=True)


def test_no_write_stream_runs_in_key_order() -> None:
    eng = sa.create_engine("sqlite://")
    Sharded.metadata.create_all(eng)
    report = bulk_load(eng, LogEntry, entries(4000), workers=4, batch_bytes=5_000)
    for ranges in report.write_order.values():
        assert len(ranges) >= 10 and ranges != sorted(ranges)


def index_names(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.text(
                    "SELECT INDEX_NAME FROM INFORMATION_SCHEMA.INDEXES "
                    "WHERE TABLE_NAME = 'LogEntries' AND INDEX_TYPE = 'INDEX'"
                )
            ).scalars()
        )


@pytest.mark.emulator
def test_failed_deferred_load_on_the_emulator_puts_the_index_back(
    spanner_engine: sa.Engine,
) -> None:
    """Item 4 of issue 12: the index was lost for good, and the re-run raised NotFound."""
    Sharded.metadata.create_all(spanner_engine)
    rows = entries(300)
    bulk_load(spanner_engine, LogEntry, rows[150:160])  # a plain insert of all fails
    with pytest.raises(BulkLoadError, match="not retryable") as info:
        bulk_load(spanner_engine, LogEntry, rows, defer_indexes=True, workers=1)
    assert info.value.report.dropped_indexes == []
    assert index_names(spanner_engine) == ["LogEntriesByCompany"]
    again = bulk_load(spanner_engine, LogEntry, rows, mode="insert_or_update", defer_indexes=True)
    assert again.complete and stored(spanner_engine) == expected(rows)
    assert index_names(spanner_engine) == ["LogEntriesByCompany"]


def test_defaults_only_the_database_evaluates_are_named_as_such() -> None:
    """A SQL default (not a shard source) and a sequence-filled key: the error says what the
    load cannot do, not that the column is a shard source; nothing is written."""
    md = sa.MetaData()
    made = sa.Table(
        "Made",
        md,
        sa.Column("k", sa.String(8), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), default=sa.func.now()),
    )
    seq_keyed = sa.Table(
        "SeqKeyed",
        md,
        sa.Column("k", sa.BigInteger, sa.Sequence("s"), primary_key=True),
        sa.Column("v", sa.String(8)),
    )
    eng = sa.create_engine("sqlite://")
    md.create_all(eng)
    with pytest.raises(
        BulkValidationError, match="row 0: column 'at' has no value and its default is SQL"
    ):
        bulk_load(eng, made, [{"k": "a"}])
    with pytest.raises(ShardConfigError, match=r"needs every key value up front, but SeqKeyed\.k"):
        bulk_load(eng, seq_keyed, [{"v": "a"}])
    with eng.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(made)).scalar() == 0


def test_a_column_given_twice_with_different_values_is_refused() -> None:
    """By attribute and by column name: two values, one column (issue 24, item 10)."""
    eng = sa.create_engine("sqlite://")
    Sharded.metadata.create_all(eng)
    rows = entries(3)
    rows[1] = {**rows[1], "CompanyId": "other"}
    with pytest.raises(
        BulkValidationError,
        match=r"row 1: 'company_id' and 'CompanyId' both name column 'CompanyId', with "
        r"different values \('c1' and 'other'\)",
    ) as info:
        bulk_load(eng, LogEntry, rows)
    assert info.value.position == 1 and stored(eng) == []


def test_a_column_given_twice_with_one_value_is_loaded() -> None:
    eng = sa.create_engine("sqlite://")
    Sharded.metadata.create_all(eng)
    rows = [{**r, "CompanyId": r["company_id"], "UserId": r["user_id"]} for r in entries(3)]
    assert bulk_load(eng, LogEntry, rows).rows_written == 3
    assert len(stored(eng)) == 3


@pytest.mark.parametrize("column", ["entry", "user_id"])
def test_a_lone_surrogate_is_refused_with_its_row(column: str) -> None:
    """Not a bare UnicodeEncodeError: the row, the column and the character."""
    eng = sa.create_engine("sqlite://")
    Sharded.metadata.create_all(eng)
    rows = entries(4)
    rows[2] = {**rows[2], column: "ok \udc80 then"}
    with pytest.raises(
        BulkValidationError, match=r"row 2: column '\w+': '\\udc80' at index 3 is a lone surrogate"
    ) as info:
        bulk_load(eng, LogEntry, rows)
    assert info.value.position == 2 and stored(eng) == []
