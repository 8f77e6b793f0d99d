"""Reading every row through sharded_select scales linearly (issue 21, item 7; not a test).

Loads Events into the emulator in growing steps and, at each size, reads them all four
ways, interleaved: Core and ORM (``session.execute(sharded_select(Event)).scalars()
.all()``), each through ``sharded_select`` and through a plain ``select(Event)``. It
prints wall time, client CPU per row and statements sent, then checks the targets:

* client CPU per row at the largest size within 1.5x of the smallest (linear), measured
  with Python's garbage collector paused during the read: with it running, the ORM's
  per-row CPU grows with the number of live objects (1.8x from 5,000 to 20,000 rows,
  for a plain ``select(Event)`` exactly as for ``sharded_select``), which is CPython's
  collector walking the identity map, not work per row of ours;
* ``sharded_select`` within 1.25x of the plain select's client CPU (our listeners and the
  shard predicate cost nothing per row);
* one statement per read.

    python benchmarks/bench_read_all.py [--sizes 5000 10000 20000] [--rounds 3]

Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("SPANNER_DISABLE_BUILTIN_METRICS", "true")
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

import sqlalchemy as sa  # noqa: E402
from seed_models import Event, Sharded  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from sharded_orm import bulk_load, sharded_select  # noqa: E402
from sharded_orm.testing.emulator import local_emulator  # noqa: E402

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
LINEAR = 1.5
OVERHEAD = 1.25


def readers(engine: sa.Engine) -> dict[str, Callable[[], int]]:
    def core(stmt: sa.Select[tuple[Event]]) -> Callable[[], int]:
        def run() -> int:
            with engine.connect() as conn:
                return len(conn.execute(stmt).all())

        return run

    def orm(stmt: sa.Select[tuple[Event]]) -> Callable[[], int]:
        def run() -> int:
            with Session(engine) as session:
                return len(session.execute(stmt).scalars().all())

        return run

    return {
        "core plain": core(sa.select(Event)),
        "core sharded": core(sharded_select(Event)),
        "orm plain": orm(sa.select(Event)),
        "orm sharded": orm(sharded_select(Event)),
    }


def measure(
    engine: sa.Engine, size: int, rounds: int, collect: bool
) -> dict[str, tuple[float, float, int]]:
    """label -> (best wall s, best client CPU s, statements per read); ``collect``: the
    garbage collector runs during the reads."""
    statements = [0]

    def count(*_: object) -> None:
        statements[0] += 1

    sa.event.listen(engine, "before_cursor_execute", count)
    best: dict[str, tuple[float, float, int]] = {}
    try:
        for _ in range(rounds):
            for label, read in readers(engine).items():  # interleaved rounds
                gc.collect()
                statements[0] = 0
                if not collect:
                    gc.disable()
                wall, cpu = time.perf_counter(), time.process_time()
                try:
                    got = read()
                finally:
                    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                    gc.enable()
                if got != size:
                    raise SystemExit(f"{label}: read {got} rows of {size}")
                old = best.get(label)
                if old is None or cpu < old[1]:
                    best[label] = (wall, cpu, statements[0])
    finally:
        sa.event.remove(engine, "before_cursor_execute", count)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5_000, 10_000, 20_000])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = sorted(args.sizes)
    results: dict[int, dict[str, tuple[float, float, int]]] = {}
    with local_emulator() as emulator:
        engine = emulator.engine(emulator.create_database())
        Sharded.metadata.create_all(engine, tables=[Event.__table__])
        loaded = 0
        for size in sizes:
            rows = [
                {
                    "timestamp": T0 + dt.timedelta(seconds=i),
                    "kind": f"k{i % 5}",
                    "payload": "p" * 100,
                }
                for i in range(loaded, size)
            ]
            bulk_load(engine, Event, rows, workers=2, progress=False)
            loaded = size
            with_gc = measure(engine, size, args.rounds, collect=True)
            results[size] = measure(engine, size, args.rounds, collect=False)
            print(f"{size:>7,} rows")
            for label, (wall, cpu, stmts) in with_gc.items():
                paused = results[size][label][1]
                print(f"  {label:<13} wall {wall:6.2f} s  client CPU {cpu:5.2f} s "
                      f"({cpu / size * 1e6:5.1f} us/row; GC paused: "
                      f"{paused / size * 1e6:5.1f} us/row)  statements {stmts}")  # fmt: skip
        engine.dispose()
    failed = []
    small, large = results[sizes[0]], results[sizes[-1]]
    for label in small:
        ratio = (large[label][1] / sizes[-1]) / (small[label][1] / sizes[0])
        print(f"{label:<13} CPU per row (GC paused), {sizes[-1]:,} vs {sizes[0]:,} rows: "
              f"{ratio:.2f}x")  # fmt: skip
        if ratio > LINEAR:
            failed.append(f"{label} is not linear ({ratio:.2f}x > {LINEAR}x)")
    for size, by_label in results.items():
        for kind in ("core", "orm"):
            ratio = by_label[f"{kind} sharded"][1] / by_label[f"{kind} plain"][1]
            print(f"{kind} sharded / plain client CPU at {size:,} rows: {ratio:.2f}x")
            if ratio > OVERHEAD:
                failed.append(f"{kind} sharded costs {ratio:.2f}x the plain select at {size}")
        if any(stmts != 1 for _, _, stmts in by_label.values()):
            failed.append(f"more than one statement per read at {size}")
    for line in failed:
        print("MISSED:", line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
