"""What the telemetry costs where nothing, or nothing much, reads it (issue 35).

Two workloads on SQLite, timed as CPU time: ``merged()``, the newest 20 rows of 16 shards
through a Session, and an ORM flush of 50 new objects of a sharded model; and the
telemetry alone: one operation (``merged``'s span with its figures and its duration),
whose CPU time beyond the no-op hooks is what one recorded operation costs (issue 44).
Each round is a child process that switches between four modes in 30 inner rounds of
short runs (each mode once a round, the order alternating), so that the modes share the
process's memory layout and warm caches and a slow moment of the machine falls on all
of them:

- ``none``: the library without its telemetry: the spans' and the skew counter's hooks
  replaced by bare no-ops (the baseline);
- ``api``: the OpenTelemetry API installed, no SDK configured (its default providers).
  (OpenTelemetry absent is not measured: google-cloud-spanner, which every install of
  sharded-orm has, depends on the API and the SDK; tests/test_telemetry.py shows the
  library working without them);
- ``sampled``: an SDK tracer provider whose sampler drops the span (as an app that samples
  a fraction of its traces does for the rest) and an SDK meter provider, no reader;
- ``sdk``: an SDK tracer and meter provider configured (``sharded_orm.telemetry.configure``,
  as a global provider would be), with no exporter or reader: every span is recorded with
  its figures and dropped, rows are counted per shard.

Each process gives, per mode, the median of its rounds' ratios (mode / none, run beside
each other); the figures are the min / median / max of those over the processes. Target
(issue 35): ``api`` <= 1.03. ``sampled`` is what a sampling app pays for the traces it
does not keep; ``sdk`` is what a recorded trace costs before its exporter's own cost (the
SDK's span and its attributes).

    python benchmarks/bench_telemetry.py [--rounds 5] [--ops 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Any

CHILD = r"""
import datetime as dt, gc, json, sys, time
ops = int(sys.argv[1])
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
import contextlib
import sharded_orm
from sharded_orm import ShardedIndex, UTCDateTime, merged, shard_column, sharded_select
from sharded_orm.read import merge, pagination
from sharded_orm.telemetry import api, skew, spans
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

PROVIDERS = {"tracer_provider": TracerProvider(), "meter_provider": MeterProvider()}
SAMPLED_OUT = {
    "tracer_provider": TracerProvider(sampler=ALWAYS_OFF),
    "meter_provider": PROVIDERS["meter_provider"],
}
REAL = {"operation": merge.operation, "counting": skew.counting}


def idle_operation(*a, **k):
    return contextlib.nullcontext(spans._IDLE)


def set_mode(mode):
    # switch the telemetry in this process: none (no-op hooks), api (no SDK), sdk
    hooked = mode != "none"
    for module in (merge, pagination):
        module.operation = REAL["operation"] if hooked else idle_operation
    skew.counting = REAL["counting"] if hooked else (lambda: False)
    if mode == "sdk":
        api.configure(**PROVIDERS)
    elif mode == "sampled":
        api.configure(**SAMPLED_OUT)
    else:
        api.configure()


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
    # short runs, every mode once an inner round (order alternating), ratios paired by round
    runs = {mode: [] for mode in MODES}
    for mode in MODES:
        set_mode(mode)
        fn(5)  # warm: statement caches, first-run costs, the telemetry's first look
    for i in range(INNER):
        for mode in MODES if i % 2 else MODES[::-1]:
            set_mode(mode)
            gc.collect()
            start = time.process_time()
            fn(n)
            runs[mode].append(time.process_time() - start)
    out = {"best": {mode: min(t) / n for mode, t in runs.items()}}
    for mode in MODES[1:]:
        paired = sorted(a / b for a, b in zip(runs[mode], runs["none"]))
        out[mode] = paired[len(paired) // 2]
    return out


INNER = 30
MODES = ("none", "api", "sampled", "sdk")
FIGURES = merge.MergeStats().figures()


def operations(n):
    # the telemetry alone: one operation with merged()'s figures, nothing read
    for _ in range(n):
        with merge.operation("merged", engine, "Events", shards=16, limit=20) as op:
            op.set_all(FIGURES)


print(json.dumps({
    "merged()": timed(reads, ops),
    "ORM flush": timed(flushes, max(1, ops // 4)),
    "operation": timed(operations, ops * 25),
}))
"""

MODES = ("none", "api", "sampled", "sdk")


def run(ops: int) -> dict[str, dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(ops)], capture_output=True, text=True, check=True
    )
    result: dict[str, dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=40)
    args = parser.parse_args()
    ratios: dict[tuple[str, str], list[float]] = {}
    best: dict[tuple[str, str], float] = {}
    per_op: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):  # a process a round, the modes interleaved inside it
        for work, found in run(args.ops).items():
            if work == "operation":
                for mode in MODES:
                    per_op[mode].append(found["best"][mode])
                continue
            for mode in MODES:
                key = (mode, work)
                best[key] = min(best.get(key, found["best"][mode]), found["best"][mode])
                if mode != "none":
                    ratios.setdefault(key, []).append(found[mode])
    # what one recorded operation costs by itself: its CPU time beyond the no-op hooks'
    costs = {
        mode: [1e6 * (b - a) for a, b in zip(per_op["none"], per_op[mode], strict=True)]
        for mode in MODES[1:]
    }
    print(
        "one operation (span, figures, duration), CPU us beyond no telemetry, "
        "min / median / max over processes: "
        + "; ".join(
            f"{mode} {min(c):.1f} / {statistics.median(c):.1f} / {max(c):.1f}"
            for mode, c in costs.items()
        )
    )
    print(
        f"{args.rounds} processes x 30 interleaved inner rounds, CPU time; ratio to 'none' "
        "(each process's median of its rounds' ratios: min / median / max over processes)"
    )
    print(f"{'workload':<11}{'mode':<8}{'best ms/op':>11}   {'ratio min / median / max':>26}")
    for (mode, work), took in sorted(
        best.items(), key=lambda kv: (kv[0][1], MODES.index(kv[0][0]))
    ):
        if mode == "none":
            print(f"{work:<11}{mode:<8}{took * 1000:>11.3f}")
            continue
        r = ratios[(mode, work)]
        print(
            f"{work:<11}{mode:<8}{took * 1000:>11.3f}   "
            f"{min(r):>8.3f} / {statistics.median(r):.3f} / {max(r):.3f}"
        )


if __name__ == "__main__":
    main()
