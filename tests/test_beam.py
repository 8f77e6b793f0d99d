"""sharded_orm.beam on the DirectRunner against the emulator: WriteSharded (with dead
letters) and the crc32 Backfill; the row preparation on its own; refusals."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from decimal import Decimal
from typing import Any

import apache_beam as beam  # the beam extra (tests/conftest.py BEAM_ONLY)
import pytest
import sqlalchemy as sa
from apache_beam.testing.util import assert_that
from at_scale_models import BASE_TS, CrcLogEntry, load_old_rows, rows
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import (
    ShardConfigError,
    UTCDateTime,
    compute_shard,
    get_shard_column,
    shard_column,
    verify,
)
from sharded_orm.beam import (
    Backfill,
    RowPlan,
    RowRejected,
    WriteSharded,
    counters,
    run,
)

pytestmark = pytest.mark.beam

N_WRITE = 2_000
N_BACKFILL = 2_000


class _IdBase(DeclarativeBase):
    pass


class ServerKeyed(_IdBase):
    """A key only the database can fill: a pipeline writing mutations cannot."""

    __tablename__ = "ServerKeyed"
    id: Mapped[int] = mapped_column(sa.BigInteger, sa.Identity(), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(10))


def _bad_rows() -> list[tuple[dict[str, Any], str]]:
    ok = next(rows(1, start=10**6))
    return [
        ({**ok, "user_id": None}, "key column 'UserId' is missing"),
        ({**ok, "ts": dt.datetime(2026, 1, 1)}, "naive datetime"),
        ({**ok, "company_id": 7}, "must be a str"),
        ({**ok, "company_id": "x" * 65}, "at most 64 characters"),
        ({**ok, "entry": "y" * 1025}, "at most 1024 characters"),
        ({**ok, "colour": "red"}, "'colour' is not a column"),
        ({**ok, "entry_shard_id": 99}, "EntryShardId=99 disagrees"),
        ({k: v for k, v in ok.items() if k != "ts"}, "cannot hash None"),
        ({**ok, "ts": "2026-01-01T00:00:00Z"}, "must be a timezone-aware datetime"),
        ("not a row", "a row is a mapping"),
    ]


def test_row_plan_fills_both_shards_with_the_library_function() -> None:
    plan = RowPlan(CrcLogEntry)
    assert plan.column_names == [
        "CompanyId", "UserId", "Timestamp", "LogEntry", "EntryShardId", "EntryShardV2",
    ]  # fmt: skip
    r = next(rows(1))
    values = plan.prepare(r)
    for name in ("EntryShardId", "EntryShardV2"):
        sc = get_shard_column(CrcLogEntry, name)
        assert values[plan.column_names.index(name)] == sc.compute([r["company_id"], r["ts"]])
    # a model instance works the same
    assert plan.prepare(CrcLogEntry(**r)) == values


@pytest.mark.parametrize(("row", "reason"), _bad_rows())
def test_row_plan_rejects_with_the_reason(row: Any, reason: str) -> None:
    with pytest.raises(RowRejected, match=reason.replace("(", r"\(")):
        RowPlan(CrcLogEntry).prepare(row)


@settings(max_examples=60, deadline=None)
@given(
    company=st.text(min_size=1, max_size=64),
    seconds=st.integers(min_value=0, max_value=10**9),
)
def test_row_plan_agrees_with_shard_column(company: str, seconds: int) -> None:
    ts = BASE_TS + dt.timedelta(seconds=seconds)
    values = RowPlan(CrcLogEntry).prepare({"company_id": company, "user_id": "u", "ts": ts})
    assert values[4] == get_shard_column(CrcLogEntry, "EntryShardId").compute([company, ts])


class _Code(sa.types.TypeDecorator[str]):
    """A user type over String(8): its length is the impl's."""

    impl = sa.String(8)
    cache_ok = True


class _Checked(_IdBase):
    __tablename__ = "Checked"
    id: Mapped[str] = mapped_column(sa.String(16), primary_key=True)
    code: Mapped[str] = mapped_column(_Code)
    price: Mapped[Decimal] = mapped_column(sa.Numeric(12, 2))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    ts_shard: Mapped[int] = shard_column("id", "ts", count=8)


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"code": "ok"}, None),
        ({"code": "x" * 9}, "'code' holds at most 8 characters"),
        ({"price": 1.5}, "'price' takes Decimal/int"),
        ({"ts": dt.datetime(2026, 1, 1)}, "naive datetime"),
        ({"ts_shard": 99}, "ts_shard=99 disagrees"),
        ({"colour": "red"}, "'colour' is not a column"),
        ({"id": None}, "shard column 'ts_shard': cannot hash None"),
    ],
)
def test_pipelines_and_bulk_load_accept_and_refuse_the_same_rows(
    row: dict[str, Any], reason: str | None
) -> None:
    """One row checker serves both: a row a pipeline dead-letters, bulk_load refuses with
    the same reason, and a row both accept gets the same values."""
    from sharded_orm.load.bulk import BulkValidationError
    from sharded_orm.load.prepare import prepare_rows

    full = {"id": "a1", "code": "ok", "price": Decimal("1.50"), "ts": BASE_TS, **row}
    plan = RowPlan(_Checked)
    if reason is None:
        prep = prepare_rows(_Checked.__table__, [full], plan.columns, None, None)
        assert prep.rows[0][-1] == compute_shard(["a1", BASE_TS], 8)
        assert len(plan.prepare(full)) == len(prep.rows[0])
        return
    with pytest.raises(RowRejected, match=reason):
        plan.prepare(full)
    with pytest.raises(BulkValidationError, match=f"row 0: .*{reason}"):
        prepare_rows(_Checked.__table__, [full], plan.columns, None, None)


def test_server_filled_key_is_refused_when_built() -> None:
    with pytest.raises(ShardConfigError, match="filled by the database.*cannot ask"):
        WriteSharded(ServerKeyed, project_id="p", instance_id="i", database_id="d")


def test_model_must_be_importable_by_workers() -> None:
    class Local(_IdBase):
        __tablename__ = "Local"
        id: Mapped[str] = mapped_column(sa.String(8), primary_key=True)

    with pytest.raises(ShardConfigError, match="define it at module level"):
        WriteSharded(Local, project_id="p", instance_id="i", database_id="d")


def test_import_sharded_orm_does_not_import_beam() -> None:
    code = "import sys, sharded_orm; assert 'apache_beam' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


@pytest.fixture(params=["in_process", pytest.param("multi_processing", marks=pytest.mark.slow)])
def pipeline(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A DirectRunner pipeline maker: in-process, or in worker processes that share no
    memory with the test (as on Dataflow); workers import the models from tests/."""
    if request.param == "in_process":
        return beam.Pipeline
    from pathlib import Path

    from apache_beam.options.pipeline_options import PipelineOptions

    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    options = PipelineOptions(direct_running_mode="multi_processing", direct_num_workers=2)
    return lambda: beam.Pipeline(options=options)


# Beam pipeline end to end; quick loop: test_row_plan_rejects_with_the_reason
@pytest.mark.slow
@pytest.mark.emulator
def test_write_sharded_loads_good_rows_and_dead_letters_bad_ones(
    beam_db: Any, pipeline: Any
) -> None:
    engine, ids = beam_db
    bad = _bad_rows()
    inputs: list[Any] = list(rows(N_WRITE))
    for i, (row, _) in enumerate(bad):
        inputs.insert(i * 97, row)
    expected = [why for _, why in bad]

    def check_letters(letters: list[dict[str, Any]]) -> None:
        assert len(letters) == len(expected)
        reasons = [d["reason"] for d in letters]
        for why in expected:
            assert sum(why in r for r in reasons) == 1, (why, reasons)
        assert {repr(d["row"]) for d in letters} == {repr(row) for row, _ in bad}

    p = pipeline()  # the DirectRunner
    out = p | beam.Create(inputs) | WriteSharded(CrcLogEntry, **ids)
    assert_that(out["dead_letter"], check_letters)
    result = run(p, total=len(inputs), description="WriteSharded")
    assert counters(result) == {"rows_prepared": N_WRITE, "dead_letters": len(bad)}
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(CrcLogEntry)).scalar() == N_WRITE
    report = verify(engine, CrcLogEntry)
    assert report.rows_checked == N_WRITE
    assert report.mismatched == {"EntryShardId": 0, "EntryShardV2": 0}


# Beam pipeline end to end; quick loop: test_row_plan_agrees_with_shard_column
@pytest.mark.slow
@pytest.mark.emulator
def test_backfill_reshards_crc32_and_is_idempotent(beam_db: Any, pipeline: Any) -> None:
    engine, ids = beam_db
    load_old_rows(engine, CrcLogEntry, N_BACKFILL)
    assert verify(engine, CrcLogEntry).mismatched["EntryShardV2"] == N_BACKFILL

    p = pipeline()
    _ = p | Backfill(CrcLogEntry, "EntryShardV2", **ids)
    result = run(p, total=N_BACKFILL, description="backfill", counter="rows_backfilled")
    assert counters(result)["rows_backfilled"] == N_BACKFILL
    report = verify(engine, CrcLogEntry)
    assert report.rows_checked == N_BACKFILL
    assert report.mismatched == {"EntryShardId": 0, "EntryShardV2": 0}

    # a second run finds nothing left; a full recompute writes the same values
    p = pipeline()
    _ = p | Backfill(CrcLogEntry, "EntryShardV2", **ids)
    assert counters(run(p, counter="rows_backfilled")).get("rows_backfilled", 0) == 0
    p = pipeline()
    _ = p | Backfill(CrcLogEntry, "EntryShardV2", only_missing=False, **ids)
    assert counters(run(p, counter="rows_backfilled"))["rows_backfilled"] == N_BACKFILL
    assert verify(engine, CrcLogEntry).ok
