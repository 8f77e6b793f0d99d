"""docs/observability.md's pictures: one traced ``merged()`` and one backfill, on the emulator.

The spans come from the OpenTelemetry SDK's in-memory exporter, set as the global tracer
provider, so the Spanner client's own spans (its statements, commits and sessions) nest
under the library's as they would in Cloud Trace. Each picture is a waterfall: one bar
per span, by start time, indented by depth, labelled with its name and its figures.

    python examples/trace_pictures.py docs/img     # needs the heatmap extra (matplotlib)
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import (
    ShardedIndex,
    UTCDateTime,
    bulk_load,
    merged,
    shard_column,
    sharded_select,
)
from sharded_orm.testing.emulator import local_emulator

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)

#: the attributes shown beside a span's name (the rest are in the exporter's output)
SHOWN = (
    "sharded_orm.plan",
    "sharded_orm.shards",
    "sharded_orm.statements",
    "sharded_orm.rows_transferred",
    "sharded_orm.server_rows_read",
    "sharded_orm.rows_done",
    "sharded_orm.batches",
    "sharded_orm.engine",
)


class Base(DeclarativeBase):
    pass


class Event(Base):
    __tablename__ = "Events"
    event_id: Mapped[int] = mapped_column("EventId", primary_key=True, autoincrement=False)
    tenant: Mapped[str] = mapped_column("Tenant", sa.String(20))
    ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime)
    shard: Mapped[int] = shard_column("tenant", "ts", count=64, name="Shard")
    __table_args__ = (ShardedIndex("EventsByTs", sa.desc("Ts"), shard="Shard"),)


def waterfall(spans: list[Any], title: str, path: Path) -> None:
    """Draw ``spans`` (finished SDK spans) as a waterfall PNG: each span under its parent,
    children by start time; its events (progress, retry) as ticks on its bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ids = {s.context.span_id for s in spans}
    children: dict[Any, list[Any]] = {}
    for s in spans:
        parent = s.parent.span_id if s.parent is not None and s.parent.span_id in ids else None
        children.setdefault(parent, []).append(s)
    ordered: list[tuple[Any, int]] = []

    def walk(parent: Any, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda s: s.start_time):
            ordered.append((s, depth))
            walk(s.context.span_id, depth + 1)

    walk(None, 0)
    start = min(s.start_time for s in spans)
    width = (max(s.end_time for s in spans) - start) / 1e6
    fig, ax = plt.subplots(figsize=(12, 0.5 * len(ordered) + 1.3))
    for row, (s, depth) in enumerate(ordered):
        left = (s.start_time - start) / 1e6
        length = max((s.end_time - s.start_time) / 1e6, width / 400)
        ours = s.instrumentation_scope.name == "sharded_orm"
        ax.barh(row, length, left=left, color="#1a73e8" if ours else "#9aa0a6", height=0.6)
        for event in s.events:
            at = (event.timestamp - start) / 1e6
            ax.plot([at, at], [row - 0.3, row + 0.3], color="#e37400", linewidth=2)
        figures = ", ".join(
            f"{k.removeprefix('sharded_orm.')}={s.attributes[k]}"
            for k in SHOWN
            if k in s.attributes
        )
        x = left + length + width / 150
        ax.text(x, row - (0.15 if figures else 0), "   " * depth + s.name, va="center", fontsize=8)
        if figures:
            ax.text(x, row + 0.25, "   " * depth + figures, va="center", fontsize=6.5,
                    color="#1a73e8")  # fmt: skip
    ax.set_yticks([])
    ax.invert_yaxis()
    ax.set_xlim(0, width * 2.2)
    ax.set_xlabel("milliseconds since the first span")
    ax.set_title(
        f"{title}\nblue: sharded-orm's spans (their figures below the name); grey: the "
        "application's and the Spanner client's; orange ticks: span events",
        fontsize=9,
    )
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(out: Path) -> None:
    from alembic_ext import backfill_shard

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("app")
    with local_emulator() as emulator:
        engine = emulator.engine(emulator.create_database())
        Base.metadata.create_all(engine)
        rows = (
            {"event_id": i, "tenant": f"t{i % 9}", "ts": T0 + dt.timedelta(seconds=i)}
            for i in range(3000)
        )
        bulk_load(engine, Event, rows, progress=False)
        exporter.clear()
        newest = sharded_select(Event, index="EventsByTs").order_by(Event.ts.desc()).limit(100)
        with tracer.start_as_current_span("GET /events"), Session(engine) as s:
            merged(s, newest)
        waterfall(exporter.get_finished_spans(), "merged(): newest 100 of 64 shards",
                  out / "trace_merged.png")  # fmt: skip
        with engine.begin() as c:
            c.execute(sa.text("ALTER TABLE Events ADD COLUMN Shard16 INT64"))
        exporter.clear()
        with tracer.start_as_current_span("alembic upgrade"):
            backfill_shard(engine, "Events", "Shard16", sources=["Tenant", "Ts"], count=16,
                           batch_size=1000, progress=False)  # fmt: skip
        waterfall(exporter.get_finished_spans(), "backfill_shard(): 3,000 rows in batches of 1,000",
                  out / "trace_backfill.png")  # fmt: skip
        engine.dispose()
    print(f"wrote {out / 'trace_merged.png'} and {out / 'trace_backfill.png'}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img"))
