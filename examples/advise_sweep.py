"""``advise`` against a sweep of ``simulate`` over the shard count, and the pictures of
docs/hotspots.md's "From finding to fix".

For each scenario (the seed scenarios of docs/hotspots.md and two skewed tenant mixes: a
Zipf over 1,000 tenants, and one tenant at 100x among 1,000), ``advise`` predicts each
candidate count's busiest split from a sample and prices its reads; the sweep runs the
whole workload through ``simulate`` at every candidate count and measures the busiest split
of the sized key space (the worst tick). Both pick the count that meets the write target
with the least read cost, by the same cost function (the merge's, run on the sample).

Rates and node capacities are a tenth of the docs' (the same shapes, ten times fewer rows
to simulate). ``python examples/advise_sweep.py`` prints the tables; ``--images DIR`` also
draws ``advise_curve.png`` and ``fix_before_after.png`` there.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples import hotspots as h  # noqa: E402
from sharded_orm.tools.advise import CANDIDATES, Advice, advise  # noqa: E402
from sharded_orm.tools.simulate import Instance, Workload, simulate  # noqa: E402


@dataclass(frozen=True)
class Scenario:
    model: Any
    workload: Workload
    instance: Instance


def scenarios() -> dict[str, Scenario]:
    cap = 350.0  # a tenth of a node's 3,500 writes/s, with a tenth of the docs' rates
    skew = (100.0,) + (1.0,) * 10
    return {
        "1 company 3x": Scenario(
            h.LogEntry,
            Workload(rows_per_second=600, duration=60, tenants=3, tenant_weights=(1, 3, 1)),
            Instance(nodes=6, node_capacity=cap, tick=5),
        ),
        "2 company 100x": Scenario(
            h.sharded_log_entry(10),
            Workload(rows_per_second=3000, duration=60, tenants=11, tenant_weights=skew),
            Instance(nodes=30, node_capacity=cap, tick=5),
        ),
        "3 timestamp key": Scenario(
            h.ShardedUser,
            Workload(rows_per_second=500, duration=60, users_per_tenant=1_000_000),
            Instance(nodes=4, node_capacity=cap, tick=5),
        ),
        "4 timestamp index": Scenario(
            h.Event,
            Workload(rows_per_second=500, duration=60),
            Instance(nodes=4, node_capacity=cap, tick=5),
        ),
        "zipf over 1,000 tenants": Scenario(
            h.LogEntry,
            Workload(rows_per_second=3000, duration=60, tenants=1000, zipf=1.0),
            Instance(nodes=30, node_capacity=cap, tick=5),
        ),
        "one tenant at 100x of 1,000": Scenario(
            h.LogEntry,
            Workload(
                rows_per_second=3000,
                duration=60,
                tenants=1000,
                tenant_weights=(100.0,) + (1.0,) * 999,
            ),  # fmt: skip
            Instance(nodes=30, node_capacity=cap, tick=5),
        ),
    }


def simulated_peak(advice: Advice, sc: Scenario, count: int) -> float:
    """The busiest split of the sized key space at ``count`` shards, worst tick, writes/s."""
    layout = advice.layout
    space = layout.table.name + (f".{layout.index}" if layout.index else "")
    r = simulate(layout.variant(count), sc.workload, sc.instance, progress_mode="off").results[0]
    ids = {i for i, s in r.split_space.items() if s == space}
    return max(
        (max((v for i, v in d.items() if i in ids), default=0) / r.tick for d in r.split_writes),
        default=0.0,
    )


@dataclass
class Compared:
    name: str
    advice: Advice
    simulated: dict[int, float]

    @property
    def sweep_best(self) -> Any:
        sim, target = self.simulated, self.advice.target
        ok = [p for p in self.advice.points if p.count in sim and sim[p.count] <= target]
        return min(ok, key=lambda p: (p.read_cost, p.count), default=None)

    def ratio(self) -> float | None:
        best, mine = self.sweep_best, self.advice.best
        if best is None or mine is None:
            return None
        return mine.read_cost / best.read_cost

    def table(self) -> str:
        a = self.advice
        lines = [
            f"### {self.name}: target {a.target:,.0f} writes/s per split",
            "",
            "| N | advise: busiest split w/s | simulate: busiest split w/s | statements | "
            "rows read | read cost |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for p in a.points:
            mark = lambda ok: "" if ok else " (over)"  # noqa: E731
            sim = self.simulated.get(p.count)
            simulated = "not simulated" if sim is None else f"{sim:,.0f}{mark(sim <= a.target)}"
            lines.append(
                f"| {p.count} | {p.peak_split_writes:,.0f}{mark(p.peak_split_writes <= a.target)}"
                f" | {simulated} | {p.statements} | {p.server_rows_read}"
                f" | {p.read_cost:,.0f} |"
            )
        best, mine, ratio = self.sweep_best, a.best, self.ratio()
        lines.append("")
        lines.append(
            f"advise: N = {mine.count if mine else None} (cost "
            f"{mine.read_cost if mine else float('nan'):,.0f}); sweep: N = "
            f"{best.count if best else None} (cost {best.read_cost if best else float('nan'):,.0f})"
            + (f"; advised / best = {ratio:.3f}" if ratio is not None else "")
        )
        return "\n".join(lines)


def compare(
    name: str, sc: Scenario, candidates: Sequence[int] = CANDIDATES, cache: Path | None = None,
    *, cheapest_first: bool = False,
) -> Compared:  # fmt: skip
    """``advise`` and the sweep; ``cache``: a JSON file keeping simulated peaks between runs.

    ``cheapest_first``: simulate the counts by read cost, cheapest first, and stop at the
    first within the target: the sweep's best is the same (the cheapest count within the
    target), the dearer counts are left unsimulated (the tests; the docs' tables show all)."""
    import json

    advice = advise(
        sc.model, sc.workload, instance=sc.instance, candidates=candidates, full_curve=True
    )
    known = json.loads(cache.read_text()) if cache and cache.exists() else {}
    simulated = {}
    order = sorted(advice.points, key=lambda p: (p.read_cost, p.count))
    for n in [p.count for p in order] if cheapest_first else candidates:
        if cheapest_first and any(v <= advice.target for v in simulated.values()):
            break
        key = f"{name}|{n}"
        if key not in known:
            known[key] = simulated_peak(advice, sc, n)
            if cache:
                cache.write_text(json.dumps(known))
        simulated[n] = known[key]
    return Compared(name, advice, simulated)


def draw(out: Path) -> None:
    """The docs' pictures: the advise curve of scenario 2, and scenario 1 before and after
    the revision doctor --fix writes (the after-table of its model change)."""
    import tempfile

    from sharded_orm.tools.doctor import doctor
    from sharded_orm.tools.doctor.fix import fix

    out.mkdir(parents=True, exist_ok=True)
    sc = scenarios()["2 company 100x"]
    advise(sc.model, sc.workload, instance=sc.instance, full_curve=True).plot(
        out / "advise_curve.png"
    )
    w = Workload(rows_per_second=6000, duration=300, tenants=3, tenant_weights=(1, 3, 1))
    inst = Instance(nodes=6)
    rows = simulate(h.NaiveLogEntry, w, inst, progress_mode="off").hot_split_rows()
    report = fix(doctor(rows, [h.NaiveLogEntry]), [h.NaiveLogEntry])
    [change] = report.changes
    with tempfile.TemporaryDirectory():
        simulate(
            {"before: index (CompanyId, Timestamp)": h.NaiveLogEntry,
             f"after doctor --fix: {change.new_index.name}": change.after},  # fmt: skip
            w, inst, progress_mode="off", heatmap=out / "fix_before_after.png",
        )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=Path, default=None, help="draw the docs' PNGs here")
    parser.add_argument("--only", default=None, help="run the scenarios whose name has this")
    parser.add_argument("--cache", type=Path, default=None, help="keep simulated peaks here")
    args = parser.parse_args(argv)
    worst = 0.0
    for name, sc in scenarios().items():
        if args.only and args.only not in name:
            continue
        c = compare(name, sc, cache=args.cache)
        print(c.table(), "\n", flush=True)
        worst = max(worst, c.ratio() or 0.0)
    print(f"worst advised / best cost: {worst:.3f}")
    if args.images:
        draw(args.images)
    return 0


if __name__ == "__main__":
    sys.exit(main())
