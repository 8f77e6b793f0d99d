"""Telemetry that leaks nothing and loses nothing (issue 44): no row key or bound value in
any span, event, status or metric; context and retry events on the library's worker
threads; refusals as spans; per-operation figures; the documented names; the write-skew
warning. The SDK's in-memory exporters, on SQLite and the emulator."""

from __future__ import annotations

import datetime as dt
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from otel_fixtures import Recorded, recording
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from alembic_ext import backfill_shard
from sharded_orm import (
    CursorError,
    MergeStats,
    ShardedIndex,
    UTCDateTime,
    merged,
    page,
    shard_column,
    sharded_select,
    telemetry,
)
from sharded_orm.retry import RetryPolicy, TransientError, retry_call
from sharded_orm.telemetry import skew, spans

DOCS = Path(__file__).resolve().parents[1] / "docs" / "observability.md"
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


class Base(DeclarativeBase):
    pass


class Member(Base):
    __tablename__ = "Members"
    email: Mapped[str] = mapped_column("Email", sa.String(200), primary_key=True)
    tenant: Mapped[str] = mapped_column("Tenant", sa.String(200))
    ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime)
    shard: Mapped[int] = shard_column("tenant", count=8, name="Shard")
    __table_args__ = (ShardedIndex("MembersByTs", sa.desc("Ts"), shard="Shard"),)


def everything(otel: Recorded) -> Iterator[str]:
    """Every text a span or a metric point holds: names, attributes, events, links,
    statuses, exceptions (what an exporter would send of them)."""

    def values(attrs: Any) -> Iterator[str]:
        for k, v in (attrs or {}).items():
            yield str(k)
            yield from (str(x) for x in v) if isinstance(v, (list, tuple)) else (str(v),)

    for span in otel.spans():
        yield span.name
        yield str(span.status.description or "")
        yield from values(span.attributes)
        for event in span.events:
            yield event.name
            yield from values(event.attributes)
        for link in span.links:
            yield from values(link.attributes)
    data = otel.reader.get_metrics_data()
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                yield m.name
                for point in m.data.data_points:
                    yield from values(point.attributes)
                    for ex in getattr(point, "exemplars", None) or ():
                        yield from values(ex.filtered_attributes)


def leaked(otel: Recorded, secrets: list[str]) -> list[tuple[str, str]]:
    return [(s, text) for text in everything(otel) for s in secrets if s in text]


# ---- (A) row keys ----------------------------------------------------------------------


def _unfilled_members(engine: sa.Engine, emails: list[str]) -> None:
    meta = sa.MetaData()
    sa.Table(
        "Users", meta,
        sa.Column("Email", sa.String(200), primary_key=True),
        sa.Column("Tenant", sa.String(200), nullable=False),
        sa.Column("Shard16", sa.Integer, nullable=True),
    )  # fmt: skip
    meta.create_all(engine)
    with engine.begin() as c:
        c.execute(
            sa.text("INSERT INTO Users (Email, Tenant) VALUES (:e, :t)"),
            [{"e": e, "t": f"tenant {i % 5}"} for i, e in enumerate(emails)],
        )


def _backfill_leaks_no_key(engine: sa.Engine, otel: Recorded, emails: list[str]) -> None:
    _unfilled_members(engine, emails)
    result = backfill_shard(
        engine, "Users", "Shard16", sources=["Tenant"], count=16, batch_size=7, progress=False
    )
    assert result.rows == len(emails)
    span = otel.span("backfill Users")
    progress = [e for e in span.events if e.name == "progress"]
    assert len(progress) == result.batches >= 2  # every batch an event (no 5 s spacing here)
    # the position is a count in key order: the rows the walk has passed
    assert span.attributes["sharded_orm.resume_position"] == len(emails)
    positions = [e.attributes["sharded_orm.resume_position"] for e in progress]
    assert positions == sorted(positions) and all(isinstance(p, int) for p in positions)
    assert leaked(otel, emails) == []


emails = st.lists(
    st.from_regex(r"[a-z][a-z0-9._]{3,12}@[a-z]{3,8}\.(com|org|io)", fullmatch=True),
    min_size=20, max_size=40, unique=True,
)  # fmt: skip


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(emails=emails)
def test_a_backfill_reports_positions_as_counts_never_keys(emails: list[str]) -> None:
    monkey = pytest.MonkeyPatch()
    monkey.setattr(spans, "PROGRESS_EVENT_SECONDS", 0.0)
    try:
        with recording() as otel:
            _backfill_leaks_no_key(sa.create_engine("sqlite://"), otel, emails)
    finally:
        monkey.undo()


@pytest.mark.emulator
def test_a_backfill_on_spanner_reports_no_key(
    spanner_engine: sa.Engine, otel: Recorded, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spans, "PROGRESS_EVENT_SECONDS", 0.0)
    found = [f"member.{i:03d}@example.org" for i in range(30)]
    _backfill_leaks_no_key(spanner_engine, otel, found)


def test_a_position_that_is_no_count_is_an_opaque_digest(otel: Recorded) -> None:
    """A copy's saved position (the codec's text of a key) becomes a digest."""
    key = '{"codec":1,"key":[["s","ann@example.org"]]}'
    with telemetry.operation("copy", None, "Users") as op:
        op.progress(rows_done=1, resume_position=key)
    (span,) = otel.spans()
    digest = span.attributes["sharded_orm.resume_position"]
    assert digest == telemetry.position_digest(key) != telemetry.position_digest(key + " ")
    assert leaked(otel, ["ann@example.org", "ann", "example"]) == []


# ---- (B) bound values ------------------------------------------------------------------


def _failing_read(engine: sa.Engine, tenant: str) -> BaseException:
    Base.metadata.create_all(engine)
    stmt = (
        sharded_select(Member, index="MembersByTs")
        .where(Member.tenant == tenant)
        .order_by(Member.ts.desc())
        .limit(10)
    )
    Member.__table__.drop(engine)  # the database refuses the read: no such table
    try:
        with Session(engine) as s:
            merged(s, stmt)
    except sa.exc.DBAPIError as e:
        return e
    raise AssertionError("the read did not fail")


def _check_error_span(otel: Recorded, error: BaseException, secrets: list[str]) -> None:
    span = otel.span("merged Members")
    assert span.attributes["error.type"] == f"sqlalchemy.exc.{type(error).__name__}"
    assert span.status.status_code.name == "ERROR"
    (event,) = [e for e in span.events if e.name == "exception"]
    assert event.attributes["exception.type"] == span.attributes["error.type"]
    assert "not recorded" in event.attributes["exception.message"]
    (point,) = otel.points("db.client.operation.duration")
    assert point.attributes["error.type"] == span.attributes["error.type"]
    assert leaked(otel, secrets) == []


tenants = st.from_regex(r"tenant-[A-Za-z0-9]{6,20}", fullmatch=True)


@pytest.mark.parametrize("hide_parameters", [False, True])
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tenant=tenants)
def test_a_failed_read_records_no_bound_value(hide_parameters: bool, tenant: str) -> None:
    engine = sa.create_engine("sqlite://", hide_parameters=hide_parameters)
    with recording() as otel:
        error = _failing_read(engine, tenant)
        if not hide_parameters:  # the error itself carries the value: the span must not
            assert tenant in str(error)
        _check_error_span(otel, error, [tenant])


@pytest.mark.emulator
def test_a_failed_read_on_spanner_records_no_bound_value(
    spanner_engine: sa.Engine, otel: Recorded
) -> None:
    tenant = "tenant-Zq81kX0wqa"
    error = _failing_read(spanner_engine, tenant)
    _check_error_span(otel, error, [tenant])


@pytest.mark.emulator
def test_a_failed_read_through_the_async_engine_records_no_bound_value(
    spanner_async_engine: Any, otel: Recorded
) -> None:
    from sharded_orm.testing.async_engines import run_through

    run_through(spanner_async_engine, test_a_failed_read_on_spanner_records_no_bound_value, otel)


def test_the_librarys_own_refusals_keep_their_words(otel: Recorded) -> None:
    engine = sa.create_engine("sqlite://")
    Base.metadata.create_all(engine)
    stmt = sharded_select(Member, index="MembersByTs").order_by(Member.ts.desc())
    with Session(engine) as s, pytest.raises(Exception, match="give limit"):
        merged(s, stmt)
    span = otel.span("merged Members")
    assert "give limit" in span.status.description


# ---- (C) worker threads ----------------------------------------------------------------


def test_work_carried_onto_threads_reports_to_the_operation(otel: Recorded) -> None:
    """What a worker thread of the library does is the operation's: spans started there
    are its children, retries there are its retry events (one per retry)."""
    tracer = otel.tracer_provider.get_tracer("client")
    policy = RetryPolicy(attempts=5, base_delay=0.001, max_delay=0.002, deadline=10)

    def partition(i: int) -> int:
        tries = []

        def flaky(timeout: float) -> int:
            tries.append(1)
            if len(tries) <= i % 3:
                raise TransientError("the server is busy")
            return i

        with tracer.start_as_current_span(f"client read {i}"):
            return retry_call(flaky, policy, what="a partition", idempotent=True)

    with telemetry.operation("verify", None, "Users"), ThreadPoolExecutor(4) as pool:
        assert sorted(pool.map(telemetry.carried(partition), range(9))) == list(range(9))
    span = otel.span("verify Users")
    reads = [s for s in otel.spans() if s.name.startswith("client read")]
    assert len(reads) == 9
    assert all(r.context.trace_id == span.context.trace_id for r in reads)
    assert all(r.parent is not None and r.parent.span_id == span.context.span_id for r in reads)
    retries = sum(i % 3 for i in range(9))
    assert len([e for e in span.events if e.name == "retry"]) == retries
    assert span.attributes["sharded_orm.retries"] == retries


def test_nothing_is_wrapped_when_nothing_records() -> None:
    def fn() -> int:
        return 1

    assert telemetry.carried(fn) is fn


@pytest.mark.emulator
def test_a_bulk_loads_retries_on_its_workers_are_events(
    spanner_emulator: Any, spanner_faults: Any, otel: Recorded
) -> None:
    from sharded_orm import bulk_load

    db = spanner_emulator.create_database()
    Base.metadata.create_all(spanner_emulator.engine(db))
    engine = spanner_faults.emulator(spanner_emulator).engine(db)
    spanner_faults.fail("Commit", "UNAVAILABLE", times=6)
    rows = ({"email": f"m{i}@example.org", "tenant": f"t{i % 3}", "ts": T0} for i in range(300))
    report = bulk_load(engine, Member, rows, workers=3, batch_bytes=2048, progress=False)
    assert report.rows_written == 300 and report.retries >= 6
    span = otel.span("bulk_load Members")
    assert len([e for e in span.events if e.name == "retry"]) == report.retries
    assert span.attributes["sharded_orm.retries"] == report.retries
    assert leaked(otel, [f"m{i}@example.org" for i in range(300)]) == []


# ---- (D) refusals ----------------------------------------------------------------------


def _refused(otel: Recorded, name: str, error: type) -> None:
    span = otel.span(name)
    kind = f"{error.__module__}.{error.__qualname__}"
    assert span.attributes["error.type"] == kind
    assert span.status.status_code.name == "ERROR"
    points = otel.points("db.client.operation.duration")
    assert [p.attributes.get("error.type") for p in points] == [kind]


def test_a_refused_merged_is_a_span_and_an_error_in_the_duration(otel: Recorded) -> None:
    engine = sa.create_engine("sqlite://")
    Base.metadata.create_all(engine)
    stmt = sharded_select(Member, index="MembersByTs").order_by(Member.ts.desc())
    with Session(engine) as s, pytest.raises(Exception) as caught:
        merged(s, stmt)  # no limit
    _refused(otel, "merged Members", type(caught.value))
    assert otel.span("merged Members").attributes["db.system.name"] == "sqlite"


def test_a_merged_of_no_sharded_select_is_a_span(otel: Recorded) -> None:
    engine = sa.create_engine("sqlite://")
    with Session(engine) as s, pytest.raises(Exception) as caught:
        merged(s, sa.select(sa.literal(1)))
    _refused(otel, "merged", type(caught.value))


@pytest.mark.parametrize("engine", ["sqlite", "emulator"], indirect=True)
def test_a_tampered_cursor_is_a_refused_page_span(engine: sa.Engine, otel: Recorded) -> None:
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        s.add_all(
            Member(email=f"m{i}@x.org", tenant=f"t{i}", ts=T0 + dt.timedelta(seconds=i))
            for i in range(6)
        )
        s.commit()
    stmt = sharded_select(Member, index="MembersByTs").order_by(Member.ts.desc())
    with Session(engine) as s:
        first = page(s, stmt, 2)
        assert first.next_cursor is not None
        tampered = first.next_cursor[:-4] + ("AAAA" if first.next_cursor[-4:] != "AAAA" else "BBBB")
        with pytest.raises(CursorError):
            page(s, stmt, 2, tampered)
    spans = otel.spans("page Members")
    assert [s.attributes.get("error.type") for s in spans] == [
        None, "sharded_orm.read.cursors.CursorError",
    ]  # fmt: skip
    points = otel.points("db.client.operation.duration")
    assert sorted(p.attributes.get("error.type") or "" for p in points) == [
        "", "sharded_orm.read.cursors.CursorError",
    ]  # fmt: skip
    assert leaked(otel, [f"m{i}@x.org" for i in range(6)]) == []


# ---- (E) figures, attributes, names ----------------------------------------------------


def _members(engine: sa.Engine, n: int, tenant: str = "t") -> None:
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        s.add_all(
            Member(email=f"m{i}@x.org", tenant=f"{tenant}{i % 9}", ts=T0 + dt.timedelta(seconds=i))
            for i in range(n)
        )
        s.commit()


def test_a_stats_passed_to_several_reads_gives_each_span_its_own_figures(
    otel: Recorded,
) -> None:
    engine = sa.create_engine("sqlite://")
    _members(engine, 60)
    stmt = sharded_select(Member, index="MembersByTs").order_by(Member.ts.desc()).limit(10)
    stats = MergeStats()
    alone = []
    with Session(engine) as s:
        for _ in range(3):
            one = MergeStats()
            merged(s, stmt, stats=one)
            alone.append(one)
            merged(s, stmt, stats=stats)
    figures = [
        (sp.attributes["sharded_orm.statements"], sp.attributes["sharded_orm.rows_transferred"])
        for sp in otel.spans("merged Members")
    ]
    assert figures == [(a.statements, a.rows_transferred) for a in alone for _ in (0, 1)]
    assert stats.statements == sum(a.statements for a in alone)  # the caller's: the sum
    assert stats.rows_transferred == sum(a.rows_transferred for a in alone)


def test_a_sequence_refill_names_its_table(otel: Recorded) -> None:
    from sharded_orm import TableSequence

    seq = TableSequence(sa.create_engine("sqlite://"), "tickets", block_size=5)
    seq.create_table()
    seq.next_id()
    span = otel.span("sequence.refill Sequences")
    assert span.attributes["db.collection.name"] == "Sequences"


def test_two_databases_with_one_table_name_are_two_skew_series(
    otel: Recorded, tmp_path: Path
) -> None:
    for name, tenant in (("one", "a"), ("two", "b")):
        _members(sa.create_engine(f"sqlite:///{tmp_path / name}.db"), 40, tenant)
    figures = {f.database: f for f in telemetry.write_skew() if f.table == "Members"}
    assert set(figures) == {str(tmp_path / "one.db"), str(tmp_path / "two.db")}
    assert all(f.rows == 40 for f in figures.values())
    points = otel.points("sharded_orm.shard.skew")
    assert sorted(p.attributes["db.namespace"] for p in points) == sorted(figures)


def _doc_tables() -> tuple[list[list[str]], str]:
    text = DOCS.read_text()
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| `")
    ]
    return rows, text


def prometheus_name(name: str, unit: str, kind: str) -> str:
    """The Prometheus name OpenTelemetry's exporter gives: dots as underscores, the unit
    (annotations in braces dropped, ``1`` none, ``s`` seconds, ``x/s`` per_second) as a
    suffix, ``_total`` on a counter (the compatibility spec, as the exporter does it)."""
    unit = re.sub(r"\{[^}]*\}", "", unit)
    units = {"1": "", "s": "seconds", "": ""}
    if unit in units:
        suffix = units[unit]
    elif "/" in unit:
        top, bottom = unit.split("/", 1)
        suffix = (f"{units.get(top, top)}_" if top else "") + "per_" + {"s": "second"}[bottom]
    else:
        suffix = unit
    out = name.replace(".", "_")
    if suffix and not out.endswith(suffix):
        out += "_" + suffix
    return out + ("_total" if kind == "counter" else "")


def test_the_documented_names_are_the_recorded_ones(otel: Recorded, tmp_path: Path) -> None:
    """Every metric in the docs' table is recorded with that name, unit, kind and
    attributes, under the Prometheus name the docs give; every span attribute the docs'
    table names for merged() is on a merged() span."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'named.db'}")  # a db.namespace
    _members(engine, 40)
    stmt = sharded_select(Member, index="MembersByTs").order_by(Member.ts.desc()).limit(5)
    with Session(engine) as s:
        merged(s, stmt)
    data = otel.reader.get_metrics_data()
    assert data is not None
    recorded = {
        m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    rows, text = _doc_tables()
    documented = {r[0].strip("`"): r for r in rows if r[0].strip("`") in recorded or "." in r[0]}
    metrics = {k: v for k, v in documented.items() if k.startswith(("db.client", "sharded_orm."))}
    assert set(metrics) == set(recorded)
    for name, row in metrics.items():
        m = recorded[name]
        kind = {"Histogram": "histogram", "Sum": "counter", "Gauge": "gauge"}[type(m.data).__name__]
        assert row[1].startswith(kind), (name, row[1])
        prom = prometheus_name(name, m.unit, kind)
        assert f"`{prom}`" in row[2], (name, prom, row[2])
        for attr in re.findall(r"`([a-z_.]+)`", row[3]):
            if attr == "error.type":
                continue
            assert any(attr in p.attributes for p in m.data.data_points), (name, attr)
    # the operations table: merged()'s figures, all on the span
    (merged_row,) = [r for r in rows if r[0] == "`merged()`"]
    span = otel.span("merged Members")
    for figure in re.findall(r"`([a-z_]+)`", merged_row[2]):
        assert "sharded_orm." + figure in span.attributes, figure
    assert "sharded_orm_shard_skew_ratio" not in text  # the exporter's name has no suffix


def test_a_sharded_read_on_sqlite_loads_no_spanner_client() -> None:
    code = """
import sys
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sharded_orm import ShardedIndex, merged, shard_column, sharded_select, page
class Base(DeclarativeBase): pass
class E(Base):
    __tablename__ = "E"
    id: Mapped[int] = mapped_column(primary_key=True)
    t: Mapped[str] = mapped_column(sa.String(10))
    shard: Mapped[int] = shard_column("t", count=4, name="Shard")
    __table_args__ = (ShardedIndex("EById", "id", shard="Shard"),)
engine = sa.create_engine("sqlite://")
Base.metadata.create_all(engine)
with Session(engine) as s:
    s.add_all(E(id=i, t=str(i)) for i in range(10)); s.commit()
    stmt = sharded_select(E, index="EById").order_by(E.id)
    assert len(merged(s, stmt.limit(3))) == 3
    assert len(page(s, stmt, 3).rows) == 3
print(sorted(m for m in sys.modules if m.startswith(("google.cloud.spanner", "grpc"))))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- (F) the write-skew warning --------------------------------------------------------


def _write(engine: sa.Engine, n: int, start: int, tenant: Any) -> None:
    with engine.begin() as c:
        c.execute(
            sa.insert(Member.__table__),
            [
                {"Email": f"w{i}@x.org", "Tenant": tenant(i), "Ts": T0}
                for i in range(start, start + n)
            ],
        )


def test_twenty_thousand_rows_to_one_shard_warn_once(
    otel: Recorded, caplog: pytest.LogCaptureFixture
) -> None:
    engine = sa.create_engine("sqlite:///:memory:")
    Base.metadata.create_all(engine)
    tracer = otel.tracer_provider.get_tracer("app")
    with (
        caplog.at_level(logging.WARNING, logger="sharded_orm"),
        tracer.start_as_current_span("import job"),
    ):
        for b in range(20):
            _write(engine, 1000, b * 1000, lambda i: "acme")
    records = [r for r in caplog.records if r.name.startswith("sharded_orm.telemetry")]
    assert len(records) == 1  # once per window per table and database
    (record,) = records
    assert record.levelno == logging.WARNING
    text = record.getMessage()
    shard = skew.write_skew()[0].busiest_shard
    assert "'Members'" in text and f"shard {shard} " in text and "'Shard'" in text
    assert "sharded-orm doctor" in text and "sharded-orm advise" in text
    (event,) = [e for e in otel.span("import job").events if e.name == "sharded_orm.write_skew"]
    assert event.attributes["db.collection.name"] == "Members"
    assert event.attributes["sharded_orm.shard"] == shard
    assert leaked(otel, ["acme"]) == []


def test_an_even_stream_does_not_warn(otel: Recorded, caplog: pytest.LogCaptureFixture) -> None:
    engine = sa.create_engine("sqlite:///:memory:")
    Base.metadata.create_all(engine)
    with caplog.at_level(logging.WARNING, logger="sharded_orm"):
        for b in range(20):
            _write(engine, 1000, b * 1000, lambda i: f"tenant{i}")
    assert [r for r in caplog.records if r.name.startswith("sharded_orm.telemetry")] == []
    (figure,) = skew.write_skew()
    assert figure.rows == 20_000 and figure.skew < 1.2


@settings(max_examples=40, deadline=None)
@given(
    shards=st.integers(2, 512),
    hot=st.integers(0, 5000),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_rule_fires_on_a_hot_shard_and_never_on_chance(
    shards: int, hot: int, seed: int
) -> None:
    import random

    rng = random.Random(seed)
    even = [rng.randrange(shards) for _ in range(3000)]
    assert not skew.skewed(_figure_of(even, shards))  # an even stream, by chance alone
    with_hot = even + [0] * hot
    figure = _figure_of(with_hot, shards)
    assert skew.skewed(figure) == (
        figure.skew > skew.WARN_SKEW
        and (
            figure.rows >= skew.WARN_ROWS_PER_SHARD * shards
            or figure.busiest >= skew.WARN_BUSIEST_ROWS
        )
    )
    if hot >= skew.WARN_BUSIEST_ROWS + 3000 // shards * 2 and shards >= 4:
        assert skew.skewed(figure)


def _figure_of(values: list[int], shards: int) -> skew.SkewFigure:
    from collections import Counter

    counts = Counter(values)
    shard, busiest = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))
    rows = len(values)
    return skew.SkewFigure("T", "S", shards, rows, busiest, shard, busiest * shards / rows, 60.0)


# async variant; quick loop: test_a_failed_read_through_the_async_engine_records_no_bound_value
@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.parametrize(
    "body",
    [test_a_backfill_on_spanner_reports_no_key, test_a_tampered_cursor_is_a_refused_page_span],
    ids=lambda body: body.__name__,
)
def test_no_leak_through_the_async_engine(
    spanner_async_engine: Any, otel: Recorded, monkeypatch: pytest.MonkeyPatch, body: Any
) -> None:
    from sharded_orm.testing.async_engines import run_through

    extra = [monkeypatch] if body is test_a_backfill_on_spanner_reports_no_key else []
    run_through(spanner_async_engine, body, otel, *extra)
