"""A key reshard's copy on Beam (``sharded_orm.beam.CopyTable``) on the DirectRunner
against the emulator: every row of Events (8 shards) into Events16, the new shard
computed; a re-run rewrites the same rows; ``op.copy_table_rows(engine="external")``
then finds none missing."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import apache_beam as beam  # the beam extra (tests/conftest.py BEAM_ONLY)
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import TimestampShardedMixin, compute_shard, verify
from sharded_orm.beam import counters, run
from sharded_orm.beam.copy import CopyTable
from sharded_orm.load.copy import compare_tables
from sharded_orm.spanner.mutations import database_of

pytestmark = [pytest.mark.beam, pytest.mark.emulator]

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
N = 1_500


class Base(DeclarativeBase):
    pass


class Event(TimestampShardedMixin, Base):
    __tablename__ = "Events"
    __shard_count__ = 8
    kind: Mapped[str] = mapped_column("Kind", sa.String(20))


class Event16(TimestampShardedMixin, Base):
    __tablename__ = "Events16"
    __shard_count__ = 16
    kind: Mapped[str] = mapped_column("Kind", sa.String(20))


@pytest.fixture(params=["in_process", pytest.param("multi_processing", marks=pytest.mark.slow)])
def pipeline(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    if request.param == "in_process":
        return beam.Pipeline
    from apache_beam.options.pipeline_options import PipelineOptions

    here = str(Path(__file__).parent)  # workers import this module's models
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    options = PipelineOptions(direct_running_mode="multi_processing", direct_num_workers=2)
    return lambda: beam.Pipeline(options=options)


def test_copy_table_on_beam(spanner_emulator: Any, pipeline: Any) -> None:
    database_id = spanner_emulator.create_database()
    engine = spanner_emulator.engine(database_id)
    Base.metadata.create_all(engine)
    with database_of(engine).batch() as batch:
        batch.insert(
            "Events", columns=["ShardId", "Timestamp", "EventId", "Kind"],
            values=[
                [compute_shard((T0 + dt.timedelta(seconds=i),), 8),
                 T0 + dt.timedelta(seconds=i), f"e{i:05d}", "k"]
                for i in range(N)
            ],
        )  # fmt: skip
    ids = {
        "project_id": spanner_emulator.project,
        "instance_id": spanner_emulator.instance_id,
        "database_id": database_id,
    }
    for _ in range(2):  # a re-run (after a failed job, say) rewrites the same rows
        p = pipeline()
        _ = p | CopyTable(Event, Event16, **ids)
        assert counters(run(p, total=N, progress_mode="off"))["rows_prepared"] == N
        assert compare_tables(engine, Event, Event16) == {
            "missing_in_target": 0, "missing_in_source": 0, "different": 0,
        }  # fmt: skip
    report = verify(engine, Event16, progress_mode="off")
    assert report.ok and report.rows_checked == N
    engine.dispose()
