"""Each long operation of the library is one span with its figures (the SDK's in-memory
exporters): pooled sequence refills, verify, backfill (with progress and retries), the key
reshard's copy; on SQLite and the emulator."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa
from otel_fixtures import Recorded
from reshard_models import events
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from alembic_ext import backfill_shard
from sharded_orm import (
    ShardedIndex,
    ShardingWarning,
    TableSequence,
    UTCDateTime,
    compute_shard,
    shard_column,
    telemetry,
    verify,
)
from sharded_orm.retry import RetryPolicy, TransientError, retry_call
from sharded_orm.telemetry import operation
from sharded_orm.testing.async_engines import run_through

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


class Base(DeclarativeBase):
    pass


class Reading(Base):
    __tablename__ = "Readings"
    sensor: Mapped[str] = mapped_column("Sensor", sa.String(20), primary_key=True)
    ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime, primary_key=True)
    shard: Mapped[int] = shard_column("sensor", "ts", count=8, name="Shard")


def _attrs(span: Any) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in span.attributes.items()}


def test_a_sequence_refill_is_a_span(otel: Recorded) -> None:
    engine = sa.create_engine("sqlite://")
    seq = TableSequence(engine, "tickets", block_size=3)
    seq.create_table()
    assert [seq.next_id() for _ in range(7)] == [1, 2, 3, 4, 5, 6, 7]
    spans = otel.spans("sequence.refill Sequences")  # the table it reserves in
    assert len(spans) == 3  # 3 + 3 + 1 of the third block
    assert [_attrs(s)["sharded_orm.block_size"] for s in spans] == [3, 3, 3]
    assert _attrs(spans[0])["sharded_orm.sequence"] == "tickets"
    assert _attrs(spans[0])["db.system.name"] == "sqlite"
    assert _attrs(spans[0])["db.collection.name"] == "Sequences"


def test_verify_is_a_span_with_its_counts(otel: Recorded) -> None:
    engine = sa.create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        s.add_all(Reading(sensor=f"s{i}", ts=T0 + dt.timedelta(seconds=i)) for i in range(20))
        s.commit()
    with engine.begin() as c, pytest.warns(ShardingWarning):  # a shard that disagrees
        c.execute(
            sa.text('UPDATE "Readings" SET "Shard" = ("Shard" + 1) % 8 WHERE "Sensor" = \'s3\'')
        )
    report = verify(engine, Reading, progress_mode="off")
    assert report.rows_checked == 20
    span = otel.span("verify Readings")
    assert _attrs(span)["sharded_orm.rows_checked"] == 20
    assert _attrs(span)["sharded_orm.rows_mismatched"] == 1
    (point,) = otel.points("db.client.operation.duration")
    assert point.attributes["db.operation.name"] == "verify"


def _unfilled(engine: sa.Engine, n: int) -> None:
    with engine.begin() as c:
        c.execute(
            sa.text(
                "CREATE TABLE Events (Id INTEGER PRIMARY KEY, CompanyId VARCHAR(10) NOT NULL, "
                "N INTEGER NOT NULL, Shard16 INTEGER)"
            )
        )
        c.execute(
            sa.text("INSERT INTO Events (Id, CompanyId, N) VALUES (:i, :c, :n)"),
            [{"i": i, "c": f"c{i % 5}", "n": i * 7} for i in range(n)],
        )


def test_a_backfill_is_a_span_with_its_progress(otel: Recorded) -> None:
    engine = sa.create_engine("sqlite://")
    _unfilled(engine, 250)
    result = backfill_shard(
        engine, "Events", "Shard16", sources=["CompanyId", "N"], count=16, batch_size=100,
        progress=False,
    )  # fmt: skip
    assert result.rows == 250
    span = otel.span("backfill Events")
    attrs = _attrs(span)
    assert attrs["sharded_orm.rows_done"] == 250
    assert attrs["sharded_orm.engine"] == "client_batches"
    assert attrs["sharded_orm.shard_column"] == "Shard16"
    assert attrs["sharded_orm.batches"] == result.batches >= 2
    # where the walk last stood, as a count in key order: never the row's key (issue 44)
    assert attrs["sharded_orm.resume_position"] == 250
    (event,) = [e for e in span.events if e.name == "progress"]  # one per 5 s at most
    assert event.attributes["sharded_orm.rows_done"] == 100
    with engine.connect() as c:
        stored = c.execute(sa.text("SELECT CompanyId, N, Shard16 FROM Events")).all()
    assert all(shard == compute_shard((cid, n), 16) for cid, n, shard in stored)


def test_retries_inside_an_operation_are_counted(otel: Recorded) -> None:
    calls = []

    def flaky(timeout: float) -> str:
        calls.append(timeout)
        if len(calls) < 3:
            raise TransientError("try again")
        return "done"

    policy = RetryPolicy(attempts=5, base_delay=0.001, max_delay=0.002, deadline=10)
    with operation("bulk_load", None, "Events"):
        assert retry_call(flaky, policy, what="a batch") == "done"
    span = otel.span("bulk_load Events")
    assert span.attributes["sharded_orm.retries"] == 2
    retries = [e for e in span.events if e.name == "retry"]
    assert [e.attributes["sharded_orm.attempt"] for e in retries] == [1, 2]
    assert retries[0].attributes["error.type"] == "sharded_orm.retry.TransientError"


@pytest.mark.emulator
def test_the_reshard_copy_is_a_span(spanner_engine: sa.Engine, otel: Recorded) -> None:
    from sharded_orm.load.copy import copy_table

    metadata = events("both")
    old, new = metadata.info["models"]["Event"], metadata.info["models"]["Event16"]
    metadata.create_all(spanner_engine)
    with Session(spanner_engine) as s:
        s.add_all(old(timestamp=T0 + dt.timedelta(seconds=i), event_id=f"e{i}", kind="k")
                  for i in range(30))  # fmt: skip
        s.commit()
    result = copy_table(spanner_engine, old, new, batch_size=20, progress_mode="off")
    assert result.rows == 30
    span = otel.span(f"copy {new.__table__.name}")
    attrs = _attrs(span)
    assert attrs["db.system.name"] == "gcp.spanner"
    assert attrs["db.namespace"].startswith(attrs["db.namespace"].split("|")[0] + "|")
    assert (attrs["sharded_orm.rows_done"], attrs["sharded_orm.batches"]) == (30, 2)
    assert attrs["sharded_orm.source"] == old.__table__.name
    assert attrs["sharded_orm.resumed"] is False
    report = verify(spanner_engine, new, progress_mode="off")
    assert report.ok
    assert otel.span(f"verify {new.__table__.name}").attributes["sharded_orm.rows_checked"] == 30


class Visit(Base):
    __tablename__ = "Visits"
    visit_id: Mapped[int] = mapped_column("VisitId", primary_key=True, autoincrement=False)
    tenant: Mapped[str] = mapped_column("Tenant", sa.String(20))
    ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime)
    shard: Mapped[int] = shard_column("tenant", "ts", count=8, name="Shard")


def test_every_write_path_feeds_the_skew_gauge(engine: sa.Engine, otel: Recorded) -> None:
    """ORM add + flush, ORM bulk insert, Core insert (executemany and one row) and an
    UPDATE that moves a row: each row counted once, in the shard it was written to."""
    Base.metadata.create_all(engine)
    rows = [
        {"visit_id": i, "tenant": f"t{i % 7}", "ts": T0 + dt.timedelta(seconds=i)}
        for i in range(60)
    ]
    core = [{"VisitId": r["visit_id"], "Tenant": r["tenant"], "Ts": r["ts"]} for r in rows]
    with Session(engine) as s:
        s.add_all(Visit(**r) for r in rows[:20])
        s.flush()
        s.execute(sa.insert(Visit), rows[20:40])
        s.commit()
    with engine.begin() as c:
        c.execute(sa.insert(Visit.__table__), core[40:59])
        c.execute(sa.insert(Visit.__table__).values(**core[59]))
    expected: dict[int, int] = {}
    for r in rows:
        shard = compute_shard((r["tenant"], r["ts"]), 8)
        expected[shard] = expected.get(shard, 0) + 1
    (fig,) = [f for f in telemetry.write_skew() if f.table == "Visits"]
    assert (fig.column, fig.shards, fig.rows) == ("Shard", 8, 60)
    assert fig.busiest == max(expected.values())
    assert fig.skew == pytest.approx(max(expected.values()) / (60 / 8))
    with Session(engine) as s:  # a source changed: the row is written to its new shard
        moved = s.get(Visit, 0)
        assert moved is not None
        moved.tenant = "zz"
        s.commit()
    (fig,) = [f for f in telemetry.write_skew() if f.table == "Visits"]
    assert fig.rows == 61
    (point,) = otel.points("sharded_orm.shard.rows_written")
    assert point.value == 61


def test_nothing_is_counted_without_a_meter(engine: sa.Engine) -> None:
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        s.add(Visit(visit_id=1, tenant="a", ts=T0))
        s.commit()
    assert telemetry.write_skew() == []


def test_a_bulk_load_is_a_span_with_its_figures(engine: sa.Engine, otel: Recorded) -> None:
    from sharded_orm import bulk_load

    Base.metadata.create_all(engine)
    rows = ({"visit_id": i, "tenant": f"t{i % 3}", "ts": T0 + dt.timedelta(seconds=i)}
            for i in range(500))  # fmt: skip
    report = bulk_load(engine, Visit, rows, workers=2, batch_bytes=4096, progress=False)
    assert report.rows_written == 500
    span = otel.span("bulk_load Visits")
    attrs = _attrs(span)
    assert attrs["sharded_orm.rows"] == attrs["sharded_orm.rows_written"] == 500
    assert attrs["sharded_orm.batches"] == report.batches > 1
    assert attrs["sharded_orm.commits"] == report.commits
    assert attrs["sharded_orm.bytes"] > 500 * 8
    assert attrs["sharded_orm.retries"] == report.retries  # the emulator aborts some
    assert (attrs["sharded_orm.mode"], attrs["sharded_orm.workers"]) == ("insert", 2)


class Ping(Base):
    __tablename__ = "Pings"
    ping_id: Mapped[int] = mapped_column("PingId", primary_key=True, autoincrement=False)
    ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime)
    shard: Mapped[int] = shard_column("ts", count=16, name="Shard")
    __table_args__ = (ShardedIndex("PingsByTs", sa.desc("Ts"), shard="Shard"),)


def _pings(engine: sa.Engine, n: int) -> None:
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        s.add_all(Ping(ping_id=i, ts=T0 + dt.timedelta(seconds=i)) for i in range(n))
        s.commit()


def test_a_merged_read_is_a_span_with_what_it_cost(engine: sa.Engine, otel: Recorded) -> None:
    from sharded_orm import MergeStats, merged, sharded_select

    _pings(engine, 120)
    tracer = otel.tracer_provider.get_tracer("app")
    stats = MergeStats()
    newest = sharded_select(Ping, index="PingsByTs").order_by(Ping.ts.desc()).limit(20)
    with tracer.start_as_current_span("GET /pings"), Session(engine) as s:
        rows = merged(s, newest, stats=stats)
    assert [p.ping_id for p in rows] == list(range(119, 99, -1))
    span = otel.span("merged Pings")
    attrs = _attrs(span)
    assert (
        span.parent is not None and otel.span("GET /pings").context.span_id == span.parent.span_id
    )
    assert attrs["db.operation.name"] == "merged"
    assert attrs["db.system.name"] == (
        "gcp.spanner" if engine.dialect.name != "sqlite" else "sqlite"
    )
    assert (attrs["sharded_orm.shards"], attrs["sharded_orm.limit"]) == (16, 20)
    assert attrs["sharded_orm.plan"] == stats.plan != ""
    assert attrs["sharded_orm.statements"] == stats.statements >= 1
    assert attrs["sharded_orm.rows_transferred"] == stats.rows_transferred
    assert attrs["sharded_orm.server_rows_read"] == stats.server_rows_read
    assert attrs["sharded_orm.consistency_retries"] == 0
    assert attrs["sharded_orm.bound_found"] in ("none", "in the statement", "by a bound round")
    (point,) = otel.points("db.client.operation.duration")
    assert point.attributes["db.operation.name"] == "merged" and point.count == 1


def test_a_page_walk_is_one_span_a_page(engine: sa.Engine, otel: Recorded) -> None:
    from sharded_orm import page, sharded_select

    _pings(engine, 50)
    stmt = sharded_select(Ping, index="PingsByTs").order_by(Ping.ts.desc())
    seen, cursor = [], None
    with Session(engine) as s:
        while True:
            p = page(s, stmt, 20, cursor)
            seen += [r.ping_id for r in p.rows]
            cursor = p.next_cursor
            if cursor is None:
                break
    assert seen == list(range(49, -1, -1))
    spans = otel.spans("page Pings")
    assert len(spans) == 3
    assert [s.attributes["sharded_orm.has_next"] for s in spans] == [True, True, False]
    assert [s.attributes["sharded_orm.cursor_given"] for s in spans] == [False, True, True]
    assert all(s.attributes["sharded_orm.page_size"] == 20 for s in spans)
    assert all(s.attributes["sharded_orm.statements"] >= 1 for s in spans)


def test_a_failed_read_records_its_error_and_retries(
    otel: Recorded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows that change between statements on every attempt (forced here): the span
    counts the repeats and ends with the ShardReadError."""
    import sharded_orm.read.merge as merge_module
    from sharded_orm import ShardReadError, merged, sharded_select
    from sharded_orm.read.consistency import RowsChanged

    engine = sa.create_engine("sqlite://")
    _pings(engine, 300)
    stmt = sharded_select(Ping, index="PingsByTs").order_by(Ping.ts.desc()).limit(200)

    def changed(*args: Any, **kwargs: Any) -> None:
        raise RowsChanged()

    monkeypatch.setattr(merge_module, "_run", changed)
    with Session(engine) as s, pytest.raises(ShardReadError):
        merged(s, stmt)
    span = otel.span("merged Pings")
    assert span.attributes["error.type"] == "sharded_orm.errors.ShardReadError"
    assert span.attributes["sharded_orm.consistency_retries"] == 2  # 3 attempts in all


# ---- through the async engine (spanner+spanner_async): the same bodies, in its greenlet


@pytest.mark.emulator
def test_a_merged_read_through_the_async_engine_is_a_span(
    spanner_async_engine: Any, otel: Recorded
) -> None:
    run_through(spanner_async_engine, test_a_merged_read_is_a_span_with_what_it_cost, otel)


# async variant; quick loop: test_a_merged_read_through_the_async_engine_is_a_span
@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.parametrize(
    "body",
    [
        test_the_reshard_copy_is_a_span,
        test_every_write_path_feeds_the_skew_gauge,
        test_a_page_walk_is_one_span_a_page,
    ],
    ids=lambda body: body.__name__,
)
def test_spans_through_the_async_engine(
    spanner_async_engine: Any, otel: Recorded, body: Any
) -> None:
    run_through(spanner_async_engine, body, otel)
