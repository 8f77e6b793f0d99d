"""What the telemetry costs where nothing, or nothing much, reads it (issue 35).

Two workloads on SQLite, each timed in a child process (CPU time, the best of 5 runs):
``merged()``, the newest 20 rows of 16 shards through a Session, and an ORM flush of 50
new objects of a sharded model. Three modes, run in interleaved rounds:

- ``none``: the library without its telemetry: the spans' and the skew counter's hooks
  replaced by bare no-ops (the baseline);
- ``api``: the OpenTelemetry API installed, no SDK configured (its default providers).
  (OpenTelemetry absent is not measured: google-cloud-spanner, which every install of
  sharded-orm has, depends on the API and the SDK; tests/test_telemetry.py shows the
  library working without them);
- ``sdk``: an SDK tracer and meter provider configured, with no exporter or reader: spans
  are made and dropped, rows are counted per shard.

The ratio of each round (mode / none) is reported as min / median / max. Target: ``api``
and ``sdk`` <= 1.03; ``sdk`` is what an app that traces pays before its exporter's own
cost.

    python benchmarks/bench_telemetry.py [--rounds 7] [--ops 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import datetime as dt, gc, json, sys, time
mode, ops = sys.argv[1], int(sys.argv[2])
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
import sharded_orm
from sharded_orm import ShardedIndex, UTCDateTime, merged, shard_column, sharded_select
if mode == "none":
    import contextlib
    from sharded_orm.read import merge, pagination
    from sharded_orm.telemetry import skew
    for module in (merge, pagination):
        module.operation = lambda *a, **k: contextlib.nullcontext(sharded_orm.telemetry.spans._IDLE)
    skew.counting = lambda: False
if mode == "sdk":
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    trace.set_tracer_provider(TracerProvider())
    metrics.set_meter_provider(MeterProvider())


class Base(DeclarativeBase):
    pass


T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


class Event(Base):
    __tablename__ = "Events"
    event_id: Mapped[int] = mapped_column("EventId", primary_key=True, autoincrement=False)
    tenant: Mapped[str] = mapped_column("Tenant", sa.String(20))
    ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime)
    shard: Mapped[int] = shard_column("tenant", "ts", count=16, name="Shard")
    __table_args__ = (ShardedIndex("EventsByTs", sa.desc("Ts"), shard="Shard"),)


engine = sa.create_engine("sqlite://")
Base.metadata.create_all(engine)
with Session(engine) as s:
    s.add_all(
        Event(event_id=i, tenant=f"t{i % 7}", ts=T0 + dt.timedelta(seconds=i)) for i in range(2000)
    )
    s.commit()
newest = sharded_select(Event, index="EventsByTs").order_by(Event.ts.desc()).limit(20)
next_id = [10_000]


def reads(n):
    with Session(engine) as s:
        for _ in range(n):
            merged(s, newest)


def flushes(n):
    with Session(engine) as s:
        for _ in range(n):
            first = next_id[0]
            next_id[0] += 50
            s.add_all(Event(event_id=i, tenant="x", ts=T0 + dt.timedelta(seconds=i))
                      for i in range(first, first + 50))
            s.flush()
        s.rollback()


def timed(fn, n):
    fn(5)  # warm: statement caches, first-run costs, the telemetry's first look
    best = None
    for _ in range(5):
        gc.collect()
        start = time.process_time()
        fn(n)
        took = time.process_time() - start
        best = took if best is None else min(best, took)
    return best


print(json.dumps({"merged()": timed(reads, ops), "ORM flush": timed(flushes, ops // 4)}))
"""

MODES = ("none", "api", "sdk")


def run(mode: str, ops: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(ops)], capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ops", type=int, default=200)
    args = parser.parse_args()
    ratios: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):  # interleaved: every mode once a round
        results = {mode: run(mode, args.ops) for mode in MODES}
        for mode in MODES:
            for work, took in results[mode].items():
                cpu.setdefault((mode, work), []).append(took)
                if mode != "none":
                    ratios.setdefault((mode, work), []).append(took / results["none"][work])
    print(f"{args.rounds} interleaved rounds, CPU time, best of 5 runs each; ratio to 'none'")
    print(f"{'workload':<11}{'mode':<8}{'best ms/op':>11}   {'ratio min / median / max':>26}")
    for (mode, work), values in sorted(
        cpu.items(), key=lambda kv: (kv[0][1], MODES.index(kv[0][0]))
    ):
        per_op = min(values) * 1000 / (args.ops if work == "merged()" else args.ops // 4)
        if mode == "none":
            print(f"{work:<11}{mode:<8}{per_op:>11.3f}")
            continue
        r = ratios[(mode, work)]
        print(
            f"{work:<11}{mode:<8}{per_op:>11.3f}   "
            f"{min(r):>8.3f} / {statistics.median(r):.3f} / {max(r):.3f}"
        )


if __name__ == "__main__":
    main()
