"""Telemetry core: spans and durations by the stable database conventions, the write-skew
gauge, and nothing recorded (or paid) with no SDK or no OpenTelemetry at all."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from otel_fixtures import Recorded

from sharded_orm import ShardConfigError, ShardTypeError, telemetry
from sharded_orm.telemetry import skew

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_an_operation_is_a_client_span_under_the_callers_span(otel: Recorded) -> None:
    engine = sa.create_engine("sqlite://")
    tracer = otel.tracer_provider.get_tracer("app")
    with (
        tracer.start_as_current_span("handler") as parent,
        engine.connect() as conn,
        telemetry.operation("merged", conn, "Events", shards=16) as op,
    ):
        op.set(statements=1, rows_transferred=10, skipped=None)
    span = otel.span("merged Events")
    assert span.kind is trace.SpanKind.CLIENT
    assert span.parent is not None and span.parent.span_id == parent.get_span_context().span_id
    assert dict(span.attributes) == {
        "db.operation.name": "merged",
        "db.system.name": "sqlite",
        "db.collection.name": "Events",
        "sharded_orm.shards": 16,
        "sharded_orm.statements": 1,
        "sharded_orm.rows_transferred": 10,
    }
    (point,) = otel.points("db.client.operation.duration")
    assert dict(point.attributes) == {
        "db.system.name": "sqlite",
        "db.collection.name": "Events",
        "db.operation.name": "merged",
    }
    assert point.count == 1 and point.sum > 0
    assert list(point.explicit_bounds) == [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0]


def test_a_failed_operation_says_its_error_type(otel: Recorded) -> None:
    with pytest.raises(ShardConfigError), telemetry.operation("page", None, "Events"):
        raise ShardConfigError("no")
    span = otel.span("page Events")
    assert span.attributes["error.type"] == "sharded_orm.errors.ShardConfigError"
    assert span.status.status_code is trace.StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]
    (point,) = otel.points("db.client.operation.duration")
    assert point.attributes["error.type"] == "sharded_orm.errors.ShardConfigError"


def test_a_sampled_out_operation_records_its_duration_and_no_figures() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.configure(tracer_provider=provider, meter_provider=MeterProvider([reader]))
    try:
        with telemetry.operation("merged", None, "Events", shards=16) as op:
            assert not op.recording  # the figures are not even computed into attributes
            op.set(statements=1)
            assert not trace.get_current_span().get_span_context().trace_flags.sampled
        with pytest.raises(ShardConfigError), telemetry.operation("merged", None, "Events"):
            raise ShardConfigError("no")
        assert exporter.get_finished_spans() == ()
        data = reader.get_metrics_data()
        (metric,) = [
            m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
        ]
        errors = [p.attributes.get("error.type") for p in metric.data.data_points]
        assert sorted(errors, key=str) == [None, "sharded_orm.errors.ShardConfigError"]
    finally:
        telemetry.configure()


def test_the_described_attributes_are_copies_the_caller_cannot_spoil(otel: Recorded) -> None:
    engine = sa.create_engine("sqlite://")
    for rows in (1, 2):
        with engine.connect() as conn, telemetry.operation("merged", conn, "Events") as op:
            op.set(rows=rows)
    first, second = otel.spans("merged Events")
    assert first.attributes["sharded_orm.rows"] == 1 and second.attributes["sharded_orm.rows"] == 2
    assert "sharded_orm.rows" not in telemetry.database_attributes(engine, "merged", "Events")


def test_spanner_namespace_and_server() -> None:
    from sqlalchemy.engine import make_url

    class Bind:
        dialect = type("D", (), {"name": "spanner+spanner"})()
        url = make_url("spanner+spanner://localhost:9010/projects/p/instances/i/databases/d")

    attrs = telemetry.database_attributes(Bind(), "merged", "Events")
    assert attrs == {
        "db.operation.name": "merged",
        "db.system.name": "gcp.spanner",
        "db.namespace": "i|d",
        "server.address": "localhost",
        "server.port": 9010,
        "db.collection.name": "Events",
    }


@pytest.mark.parametrize(
    ("emulator", "address", "port"),
    [(None, "spanner.googleapis.com", 443), ("127.0.0.1:9010", "127.0.0.1", 9010),
     ("[::1]:9010", "::1", 9010), ("emulator-host", "emulator-host", None)],
)  # fmt: skip
def test_spanner_server_where_the_url_has_no_host(
    monkeypatch: pytest.MonkeyPatch, emulator: str | None, address: str, port: int | None
) -> None:
    """A Spanner URL names no host: the server is the endpoint the client connects to."""
    from sqlalchemy.engine import make_url

    if emulator is None:
        monkeypatch.delenv("SPANNER_EMULATOR_HOST", raising=False)
    else:
        monkeypatch.setenv("SPANNER_EMULATOR_HOST", emulator)

    class Bind:
        dialect = type("D", (), {"name": "spanner+spanner"})()
        url = make_url("spanner+spanner:///projects/p/instances/i/databases/d")

    attrs = telemetry.database_attributes(Bind(), "merged", "Events")
    assert attrs["server.address"] == address
    assert attrs.get("server.port") == port


def test_progress_sets_figures_and_few_events(otel: Recorded) -> None:
    with telemetry.operation("backfill", None, "Events") as op:
        for done in range(0, 1000, 100):
            op.progress(rows_done=done, resume_position=[done, "x"])
    span = otel.span("backfill Events")
    assert span.attributes["sharded_orm.rows_done"] == 900
    # a position that is not a count is an opaque digest, never the key (issue 44)
    digest = span.attributes["sharded_orm.resume_position"]
    assert digest == telemetry.position_digest([900, "x"]) and "900" not in digest
    assert len([e for e in span.events if e.name == "progress"]) == 1  # at most one per 5 s


def test_rows_written_counts_on_after_the_window_moves_past_them(otel: Recorded) -> None:
    import time

    skew.configure_window(0.3, buckets=1)
    try:
        telemetry.rows_written("Events", "ShardId", 4, [0, 1, 1])
        time.sleep(0.35)
        telemetry.rows_written("Events", "ShardId", 4, [2])
        rows = _gauge(otel, "sharded_orm.shard.window_rows")
        assert rows == {("Events", "ShardId"): 1}  # the window holds the last write only
        (point,) = otel.points("sharded_orm.shard.rows_written")
        assert point.value == 4 and point.attributes["db.collection.name"] == "Events"
    finally:
        skew.configure_window(skew.DEFAULT_WINDOW, skew.DEFAULT_BUCKETS)


def test_configure_refuses_what_is_no_provider() -> None:
    with pytest.raises(ShardTypeError):
        telemetry.configure(tracer_provider=object())


# --- the write-skew gauge ---------------------------------------------------------------


def _gauge(otel: Recorded, name: str) -> dict[tuple[str, str], float]:
    return {
        (p.attributes["db.collection.name"], p.attributes["sharded_orm.shard.column"]): p.value
        for p in otel.points(name)
    }


def test_skew_rises_on_a_skewed_stream_and_stays_flat_on_a_uniform_one(otel: Recorded) -> None:
    from sharded_orm import compute_shard

    uniform = [compute_shard(i, 16) for i in range(32_000)]
    for batch in range(0, len(uniform), 500):
        telemetry.rows_written("Even", "ShardId", 16, uniform[batch : batch + 500])
    hot = [compute_shard(i, 16) for i in range(16_000)] + [3] * 16_000
    for batch in range(0, len(hot), 500):
        telemetry.rows_written("Hot", "ShardId", 16, hot[batch : batch + 500])
    skews = _gauge(otel, "sharded_orm.shard.skew")
    assert skews[("Even", "ShardId")] < 1.1
    assert skews[("Hot", "ShardId")] > 8
    rates = _gauge(otel, "sharded_orm.shard.busiest_rate")
    assert rates[("Hot", "ShardId")] == pytest.approx(max(hot.count(s) for s in range(16)) / 60)
    rows = _gauge(otel, "sharded_orm.shard.window_rows")
    assert rows == {("Even", "ShardId"): 32_000, ("Hot", "ShardId"): 32_000}
    counted = {
        p.attributes["db.collection.name"]: p.value
        for p in otel.points("sharded_orm.shard.rows_written")
    }
    assert counted == {"Even": 32_000, "Hot": 32_000}
    (hottest, *_) = telemetry.write_skew()
    assert (hottest.table, hottest.busiest_shard) == ("Hot", 3)


def test_the_window_forgets_old_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(skew.time, "monotonic", lambda: clock[0])
    skew.track()
    try:
        skew.rows_written("T", "S", 4, [0] * 100)
        clock[0] += skew.SKEW_WINDOW / 2
        skew.rows_written("T", "S", 4, [0, 1, 2, 3] * 25)
        (fig,) = skew.write_skew()
        assert (fig.rows, fig.busiest, fig.skew) == (200, 125, 2.5)
        clock[0] += skew.SKEW_WINDOW / 2 + 0.1  # the first 100 rows left the window
        (fig,) = skew.write_skew()
        assert (fig.rows, fig.skew) == (100, 1.0)
        clock[0] += skew.SKEW_WINDOW
        (fig,) = skew.write_skew()
        assert (fig.rows, fig.skew, fig.busiest_shard) == (0, 0.0, None)
    finally:
        skew.track(False)
        skew.reset()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 7), min_size=1, max_size=200))
def test_skew_is_the_busiest_shard_over_the_mean(shards: list[int]) -> None:
    skew.track()
    try:
        skew.rows_written("T", "S", 8, shards)
        (fig,) = skew.write_skew()
        busiest = max(shards.count(s) for s in set(shards))
        assert fig.rows == len(shards) and fig.busiest == busiest
        assert fig.skew == pytest.approx(busiest / (len(shards) / 8))
        assert 1.0 <= fig.skew <= 8.0
    finally:
        skew.track(False)
        skew.reset()


def test_window_settings_are_checked() -> None:
    with pytest.raises(ShardConfigError):
        skew.configure_window(float("inf"))
    with pytest.raises(ShardConfigError):
        skew.configure_window(60, buckets=0)


# --- nothing recorded, nothing imported, where nothing would read it --------------------


def test_no_sdk_records_nothing_and_import_stays_light() -> None:
    out = _run(
        """
        import sys
        import sharded_orm
        assert not any(m.startswith("opentelemetry") for m in sys.modules), "imported at import"
        from sharded_orm import telemetry
        with telemetry.operation("merged", None, "Events") as op:
            assert not op.recording
        telemetry.rows_written("Events", "ShardId", 4, [1, 2, 3])
        assert telemetry.write_skew() == []
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_a_global_sdk_configured_later_is_used() -> None:
    out = _run(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from sharded_orm import telemetry
        from sharded_orm.telemetry import api
        with telemetry.operation("merged", None, "Events"):
            pass
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        api.RECHECK_SECONDS  # a global set after an idle check is seen within this
        import time; time.sleep(api.RECHECK_SECONDS + 0.05)
        with telemetry.operation("merged", None, "Events"):
            pass
        print([s.name for s in exporter.get_finished_spans()])
        """
    )
    assert out.strip() == "['merged Events']"


def test_without_opentelemetry_installed_everything_works() -> None:
    out = _run(
        """
        import sys
        class Absent:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ModuleNotFoundError(name)
                return None
        sys.meta_path.insert(0, Absent())
        import sqlalchemy as sa
        from sharded_orm import telemetry
        with telemetry.operation("merged", None, "Events") as op:
            op.set(rows=1)
        telemetry.rows_written("Events", "ShardId", 4, [1])
        telemetry.track()
        telemetry.rows_written("Events", "ShardId", 4, [1])
        print(telemetry.write_skew()[0].rows)
        """
    )
    assert out.strip() == "1"
