"""presplit: the exact AddSplitPoints requests (on an in-process gRPC server), the
emulator's 501 (a logged skip), and bad input."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from seed_models import Event, LogEntry, User
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import ShardedIndex, UnsupportedOnDialectError, shard_column
from sharded_orm.errors import ShardConfigError
from sharded_orm.load.presplit import SplitPoint, presplit, split_points


class _Base(DeclarativeBase):
    pass


class WideEvent(_Base):
    """A table keyed by a 250-way shard: 249 boundaries, over the 100-per-request limit."""

    __tablename__ = "WideEvents"
    shard: Mapped[int] = shard_column("event_id", count=250, name="ShardId", primary_key=True)
    event_id: Mapped[str] = mapped_column("EventId", sa.String(36), primary_key=True)
    kind: Mapped[str] = mapped_column("Kind", sa.String(32))
    __table_args__ = (ShardedIndex("WideEventsByKind", "Kind", shard="ShardId"),)


class _Recorder:
    def __init__(self) -> None:
        self.requests: list[Any] = []

    def add_split_points(self, request: Any, context: Any) -> Any:
        from google.cloud.spanner_admin_database_v1.types import AddSplitPointsResponse

        self.requests.append(request)
        return AddSplitPointsResponse()


@pytest.fixture
def split_server() -> Iterator[tuple[Any, _Recorder]]:
    """A gRPC server with Spanner's mock service and an AddSplitPoints that records."""
    from sharded_orm.testing.split_server import split_server

    recorder = _Recorder()
    with split_server(recorder.add_split_points, workers=4) as server:
        yield server.engine, recorder


def _sent(request: Any) -> list[tuple[str, str, list[str]]]:
    return [
        (sp.table, sp.index, [v for k in sp.keys for v in k.key_parts])
        for sp in request.split_points
    ]


def test_log_entries_points_are_the_index_shard_boundaries() -> None:
    points, notes = split_points(LogEntry)
    assert points == [SplitPoint("LogEntries", "LogEntriesByCompany", (k,)) for k in range(1, 10)]
    assert any("starts with CompanyId, not a shard column" in n for n in notes)


def test_table_keyed_by_its_shard_is_split_too() -> None:
    points, _ = split_points(Event)
    assert [(p.index, p.key) for p in points] == [(None, (k,)) for k in range(1, 8)] + [
        ("EventsByKind", (k,)) for k in range(1, 8)
    ]
    assert split_points(Event, indexes=False)[0] == points[:7]


def test_nodes_hold_points_to_ten_per_node() -> None:
    points, notes = split_points(WideEvent, nodes=3)
    assert len(points) == 30
    assert {p.index for p in points} == {None, "WideEventsByKind"}
    assert any("held to 30 points" in n for n in notes)


def test_presplit_sends_the_log_entries_points_in_one_request(split_server: Any) -> None:
    engine, recorder = split_server
    before = dt.datetime.now(dt.timezone.utc)
    report = presplit(engine, LogEntry, expire_after=dt.timedelta(days=2))
    assert report.skipped is None
    assert report.requests == 1 and len(recorder.requests) == 1
    request = recorder.requests[0]
    assert request.database == "projects/p/instances/i/databases/d"
    assert request.initiator == "sharded-orm-presplit"
    assert _sent(request) == [("LogEntries", "LogEntriesByCompany", [str(k) for k in range(1, 10)])]
    expire = request.split_points[0].expire_time
    assert (
        dt.timedelta(days=2) - dt.timedelta(minutes=1)
        < expire - before
        < dt.timedelta(days=2, minutes=1)
    )


def test_presplit_batches_over_the_per_request_limit(split_server: Any) -> None:
    engine, recorder = split_server
    report = presplit(engine, WideEvent)
    assert len(report.points) == 2 * 249
    assert report.requests == 5 and len(recorder.requests) == 5
    sizes = [sum(len(sp.keys) for sp in r.split_points) for r in recorder.requests]
    assert sizes == [100, 100, 100, 100, 98]
    sent = [(t, i, v) for r in recorder.requests for t, i, vs in _sent(r) for v in vs]
    assert sent == [("WideEvents", "", str(k)) for k in range(1, 250)] + [
        ("WideEvents", "WideEventsByKind", str(k)) for k in range(1, 250)
    ]


def test_nothing_to_split_sends_nothing(split_server: Any) -> None:
    engine, recorder = split_server
    report = presplit(engine, User)
    assert report.points == [] and report.requests == 0 and recorder.requests == []
    assert report.skipped == "no shard boundaries to split at"


def test_non_spanner_engine_is_refused() -> None:
    with pytest.raises(UnsupportedOnDialectError, match="AddSplitPoints"):
        presplit(sa.create_engine("sqlite://"), LogEntry)


@pytest.mark.parametrize("bad", [dt.timedelta(days=31), dt.timedelta(0), 10])
def test_expire_after_is_checked(bad: Any) -> None:
    engine = sa.create_engine("spanner+spanner:///projects/p/instances/i/databases/d")
    with pytest.raises(ShardConfigError, match="30 days"):
        presplit(engine, LogEntry, expire_after=bad)


@pytest.mark.emulator
def test_emulator_answers_501_and_presplit_skips_with_a_log_line(
    spanner_engine: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # another test's logging.config.fileConfig (Alembic's env.py) may have disabled it
    monkeypatch.setattr(logging.getLogger("sharded_orm.presplit"), "disabled", False)
    with caplog.at_level(logging.INFO, logger="sharded_orm.presplit"):
        report = presplit(spanner_engine, LogEntry)
    assert report.requests == 0
    assert report.skipped is not None and "501" in report.skipped
    assert any("skipped" in r.getMessage() for r in caplog.records)


@settings(max_examples=40, deadline=None)
@given(nodes=st.integers(min_value=1, max_value=60))
def test_nodes_budget_is_kept_and_points_are_boundaries(nodes: int) -> None:
    points, _ = split_points(WideEvent, nodes=nodes)
    assert len(points) <= max(2, 10 * nodes)
    for index in (None, "WideEventsByKind"):
        keys = [p.key[0] for p in points if p.index == index]
        assert keys == sorted(set(keys)) and all(1 <= k < 250 for k in keys)
        assert keys  # every object keeps at least one point
