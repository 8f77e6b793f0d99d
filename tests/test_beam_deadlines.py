"""The Beam transforms' Spanner calls end within their timeouts (the client's defaults: an
hour per commit, retried on UNAVAILABLE for another; an hour per streamed read): a
server gone silent at a commit or mid-read fails the pipeline in time, with the reason.
In-process DirectRunner against the emulator, through the fault proxy."""

from __future__ import annotations

import time
from typing import Any

import apache_beam as beam  # the beam extra (tests/conftest.py BEAM_ONLY)
import pytest
import sqlalchemy as sa
from at_scale_models import CrcLogEntry, load_old_rows, rows

from sharded_orm import ShardConfigError
from sharded_orm.beam import Backfill, WriteSharded

pytestmark = [pytest.mark.beam, pytest.mark.emulator]


@pytest.fixture
def proxied_db(
    beam_db: tuple[Any, dict[str, str]], spanner_faults: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, dict[str, str]]:
    """``beam_db``, the pipeline's clients reaching it through the fault proxy."""
    monkeypatch.setenv("SPANNER_EMULATOR_HOST", spanner_faults.host)
    return beam_db


def _count(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(CrcLogEntry)).scalar_one())


# a pipeline waited for until its commit deadline (seconds); quick loop:
# test_silent_server_mid_read_fails_the_pipeline_in_time (the pipeline's deadline, on a read),
# test_commit_deadlines.py::test_a_commit_that_does_not_finish_ends_in_time_with_its_outcome_unknown
@pytest.mark.slow
def test_silent_server_at_a_commit_fails_the_pipeline_in_time(
    proxied_db: Any, spanner_faults: Any
) -> None:
    engine, ids = proxied_db
    spanner_faults.hang("Commit", 120, times=10_000)
    start = time.monotonic()
    write = WriteSharded(CrcLogEntry, commit_timeout=1, **ids)
    failure = pytest.raises(Exception, match="committing a batch of 50 mutations")
    with failure as caught, beam.Pipeline() as p:
        _ = p | beam.Create(list(rows(50))) | write
    took = time.monotonic() - start
    assert took < 3 * 1 * 4 + 10, took  # 3 x commit_timeout per batch; the runner's retries
    assert "deadline" in str(caught.value).lower()
    assert spanner_faults.count("Commit", "hung") >= 2  # each attempt ended by its timeout
    spanner_faults.clear()
    assert _count(engine) == 0
    with beam.Pipeline() as p:  # the re-run writes every row
        _ = p | beam.Create(list(rows(50))) | WriteSharded(CrcLogEntry, **ids)
    assert _count(engine) == 50


def test_silent_server_mid_read_fails_the_pipeline_in_time(
    proxied_db: Any, spanner_faults: Any
) -> None:
    engine, ids = proxied_db
    load_old_rows(engine, CrcLogEntry, 50)
    spanner_faults.stall_stream("ExecuteStreamingSql", 120, after=0, times=10_000)
    start = time.monotonic()
    # DEADLINE_EXCEEDED either way: the client's own (its message says deadline) or, when the
    # proxy sees the call's deadline first, the status it answers ("504 stalled by ...";
    # google-api-core names DEADLINE_EXCEEDED 504)
    deadline_exceeded = r"(?i)deadline|\b504 stalled by FaultProxy"
    with pytest.raises(Exception, match=deadline_exceeded), beam.Pipeline() as p:
        _ = p | Backfill(CrcLogEntry, "EntryShardV2", read_timeout=1, **ids)
    took = time.monotonic() - start
    assert took < 1 * 4 + 10, took
    assert spanner_faults.count("ExecuteStreamingSql", "stalled after 0") >= 1


def test_timeouts_must_be_positive_seconds() -> None:
    ids = {"project_id": "p", "instance_id": "i", "database_id": "d"}
    with pytest.raises(ShardConfigError, match="commit_timeout"):
        WriteSharded(CrcLogEntry, commit_timeout=0, **ids)
    with pytest.raises(ShardConfigError, match="read_timeout"):
        Backfill(CrcLogEntry, "EntryShardV2", read_timeout=-1, **ids)
