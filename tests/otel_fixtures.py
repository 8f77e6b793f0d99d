"""In-memory OpenTelemetry providers for the telemetry tests (the SDK's own exporters)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sharded_orm import telemetry
from sharded_orm.telemetry import skew


@dataclass
class Recorded:
    """What the library recorded through in-memory providers (``sharded_orm.telemetry``)."""

    tracer_provider: TracerProvider
    spans_exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def spans(self, name: str | None = None) -> list[Any]:
        found = self.spans_exporter.get_finished_spans()
        return [s for s in found if name is None or s.name == name]

    def span(self, name: str) -> Any:
        found = self.spans(name)
        assert len(found) == 1, [s.name for s in self.spans()]
        return found[0]

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        out: list[Any] = []
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == metric:
                        out.extend(m.data.data_points)
        return out


@contextmanager
def recording() -> Iterator[Recorded]:
    """Record the library's spans and metrics in memory, as an app's SDK would."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry.configure(tracer_provider=tracer_provider, meter_provider=meter_provider)
    skew.reset()
    try:
        yield Recorded(tracer_provider, exporter, reader)
    finally:
        telemetry.configure()
        skew.reset()
        meter_provider.shutdown()
        tracer_provider.shutdown()
