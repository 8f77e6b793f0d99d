"""Simulator speed at 1,000,000 simulated writes, and the seed scenarios' figures.

Target: 1,000,000 writes (table + index) in under 10 s on 2 cores, i.e. > 100,000
simulated writes/s, pure Python. Each schema below writes 500,000 rows with one index:
1,000,000 writes. Keys are computed with the library's own shard function (crc32 of the
canonical string) and ``bit_reverse``, as on the real write path.

    python benchmarks/bench_simulate.py [--scale 0.25]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

from sharded_orm.tools.simulate import Instance, Workload, simulate

ROOT = Path(__file__).resolve().parent.parent


def load_example() -> object:
    spec = importlib.util.spec_from_file_location("hotspots", ROOT / "examples" / "hotspots.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def speed(hotspots: object) -> None:
    workload = Workload(rows_per_second=5000, duration=100, tenants=3, tenant_weights=(1, 3, 1))
    for name, model in (
        ("LogEntries, naive index", hotspots.NaiveLogEntry),  # type: ignore[attr-defined]
        ("LogEntries, EntryShardId", hotspots.LogEntry),  # type: ignore[attr-defined]
        ("Events, sharded index", hotspots.Event),  # type: ignore[attr-defined]
    ):
        started = time.perf_counter()
        result = simulate({name: model}, workload, Instance(nodes=6)).results[0]
        elapsed = time.perf_counter() - started
        print(
            f"{name:28} {result.writes:>9,} writes in {elapsed:5.2f} s: "
            f"{result.writes / elapsed:>9,.0f} simulated writes/s"
        )


def scenarios(hotspots: object, scale: float) -> None:
    for name in hotspots.scenarios(scale):  # type: ignore[attr-defined]
        comparison = hotspots.run(name, scale)  # type: ignore[attr-defined]
        print(f"\n{name}:")
        for r in comparison.results:
            print(
                f"  {r.name:22} hottest split {r.hottest_split_share:6.1%}  "
                f"imbalance {r.imbalance:5.2f}  overloaded {r.overloaded_seconds:4.0f} s"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=0.25, help="of the docs' durations")
    args = parser.parse_args()
    hotspots = load_example()
    speed(hotspots)
    scenarios(hotspots, args.scale)


if __name__ == "__main__":
    main()
