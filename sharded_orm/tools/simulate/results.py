"""What a simulation reports: per schema, per comparison, and as Spanner would report it."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sharded_orm.tools.simulate.instance import HotSplit, Instance
from sharded_orm.tools.simulate.workload import Workload


@dataclass
class SimulationResult:
    """What one schema did under the workload. Shares are fractions of all writes."""

    name: str
    table: str
    spaces: list[str]
    tick: float
    nodes: int
    node_capacity: float
    writes: int
    table_writes: int
    index_writes: int
    node_writes: list[list[int]]  # [tick][node]
    split_writes: list[dict[int, int]]  # [tick] split id -> writes
    split_space: dict[int, str]
    heatmap: list[list[int]]  # [tick][bucket], buckets grouped by space in ``spaces`` order
    space_buckets: list[tuple[str, int, int]]  # (space, first bucket, end bucket)
    splits: int
    elapsed: float
    start: dt.datetime = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    #: splits at CPU score >= 50 per tick, as the split statistics would list them
    hot_splits: list[HotSplit] = field(default_factory=list)

    @property
    def ticks(self) -> int:
        return len(self.node_writes)

    def node_share_over_time(self) -> list[list[float]]:
        """Per tick, each node's share of that tick's writes."""
        return [[w / max(sum(row), 1) for w in row] for row in self.node_writes]

    def split_share_over_time(self) -> list[dict[int, float]]:
        """Per tick, each written split's share of that tick's writes."""
        out = []
        for d in self.split_writes:
            total = max(sum(d.values()), 1)
            out.append({k: v / total for k, v in d.items()})
        return out

    def _hottest_split_shares(self) -> list[float]:
        return [max(d.values()) / sum(d.values()) for d in self.split_writes if d]

    @property
    def hottest_split_share(self) -> float:
        """Mean over ticks of the hottest split's share of the tick's writes."""
        shares = self._hottest_split_shares()
        return sum(shares) / len(shares) if shares else 0.0

    @property
    def peak_split_share(self) -> float:
        return max(self._hottest_split_shares(), default=0.0)

    def _imbalances(self) -> list[float]:
        return [max(r) * len(r) / sum(r) for r in self.node_writes if sum(r)]

    @property
    def imbalance(self) -> float:
        """Mean over ticks of max / mean node writes (1.0: perfectly even)."""
        values = self._imbalances()
        return sum(values) / len(values) if values else 0.0

    @property
    def peak_imbalance(self) -> float:
        return max(self._imbalances(), default=0.0)

    @property
    def overloaded_seconds(self) -> float:
        """How long the hottest node was above ``node_capacity`` writes/s."""
        limit = self.node_capacity * self.tick
        return sum(self.tick for r in self.node_writes if max(r) > limit)

    @property
    def peak_node_rate(self) -> float:
        return max((max(r) for r in self.node_writes), default=0) / self.tick

    def hot_split_rows(self) -> list[dict[str, Any]]:
        """The rows Spanner's ``SPANNER_SYS.SPLIT_STATS_TOP_MINUTE`` would hold for this run.

        One row per split and minute in which the split's CPU score (its write rate against
        a node's capacity) reached 50; ``CPU_USAGE_SCORE`` is the minute's highest, like the
        10-minute and hour views aggregate theirs. The model has no unsplittable reasons:
        ``UNSPLITTABLE_REASONS`` is empty; ``SOURCE`` is ``"simulated"`` (doctor's report says
        so). ``sharded_orm.doctor`` reads these rows.
        """
        rows: dict[tuple[dt.datetime, str, str], dict[str, Any]] = {}
        for h in self.hot_splits:
            seconds = (h.tick + 1) * self.tick
            end = self.start + dt.timedelta(minutes=math.ceil(seconds / 60 - 1e-9))
            key = (end, h.start, h.limit)
            row = rows.get(key)
            if row is None:
                rows[key] = {
                    "INTERVAL_END": end,
                    "SPLIT_START": h.start,
                    "SPLIT_LIMIT": h.limit,
                    "CPU_USAGE_SCORE": h.score,
                    "AFFECTED_TABLES": [h.space.split(".", 1)[-1]],
                    "UNSPLITTABLE_REASONS": [],
                    "SOURCE": "simulated",  # not a Spanner column: says where the row came from
                }
            else:
                row["CPU_USAGE_SCORE"] = max(row["CPU_USAGE_SCORE"], h.score)
        return sorted(rows.values(), key=lambda r: (r["INTERVAL_END"], -r["CPU_USAGE_SCORE"]))

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "table": self.table,
            "key_spaces": self.spaces,
            "writes": self.writes,
            "table_writes": self.table_writes,
            "index_writes": self.index_writes,
            "hottest_split_share": round(self.hottest_split_share, 4),
            "peak_split_share": round(self.peak_split_share, 4),
            "imbalance": round(self.imbalance, 3),
            "peak_imbalance": round(self.peak_imbalance, 3),
            "overloaded_seconds": self.overloaded_seconds,
            "peak_node_writes_per_second": round(self.peak_node_rate, 1),
            "splits": self.splits,
            "node_share_over_time": [
                [round(s, 4) for s in row] for row in self.node_share_over_time()
            ],
        }


@dataclass
class Comparison:
    """Several schemas under the same workload and instance."""

    workload: Workload
    instance: Instance
    results: list[SimulationResult]

    def __getitem__(self, name: str) -> SimulationResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def summary(self, *, heat: bool = True) -> str:
        """A terminal table (and a small text heatmap per schema)."""
        w, inst = self.workload, self.instance
        lines = [
            f"workload: {w.rows_per_second:g} rows/s for {w.duration:g} s ({w.rows} rows), "
            f"{w.tenants} tenant(s), order={w.insert_order}; instance: {inst.nodes} node(s) "
            f"x {inst.node_capacity:g} writes/s, tick {inst.tick:g} s",
            f"{'schema':24} {'writes':>9} {'hottest split':>13} {'imbalance':>9} "
            f"{'peak node w/s':>13} {'overloaded':>10} {'splits':>6}",
        ]
        for r in self.results:
            lines.append(
                f"{r.name[:24]:24} {r.writes:>9} {r.hottest_split_share:>12.1%} "
                f"{r.imbalance:>9.2f} {r.peak_node_rate:>13.0f} "
                f"{r.overloaded_seconds:>9.0f}s {r.splits:>6}"
            )
        if heat:
            for r in self.results:
                lines.append("")
                lines.append(f"{r.name}: writes by key range (rows) over time (columns)")
                lines.extend(text_heatmap(r))
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"results": [r.as_dict() for r in self.results]}

    def hot_split_rows(self) -> list[dict[str, Any]] | dict[str, list[dict[str, Any]]]:
        """The expected split statistics rows: a list for one schema, else name -> list."""
        if len(self.results) == 1:
            return self.results[0].hot_split_rows()
        return {r.name: r.hot_split_rows() for r in self.results}

    def heatmap(self, path: str | Path) -> Path:
        """Draw the key-visualizer heatmaps side by side into a PNG (needs matplotlib)."""
        from sharded_orm.tools.simulate.heatmap import save_heatmap

        return save_heatmap(self, path)


_SHADES = " .:-=+*#%@"


def text_heatmap(result: SimulationResult, width: int = 60, height: int = 16) -> list[str]:
    """A coarse text rendering of the heatmap: darker = more writes."""
    if not result.heatmap:
        return []
    nb = len(result.heatmap[0])
    nt = len(result.heatmap)
    cols = min(width, nt)
    rows = min(height, nb)
    grid = [[0] * cols for _ in range(rows)]
    for t, row in enumerate(result.heatmap):
        c = t * cols // nt
        for b, v in enumerate(row):
            grid[b * rows // nb][c] += v
    peak = max(max(r) for r in grid) or 1
    out = []
    for r in reversed(grid):
        line = "".join(_SHADES[min(9, math.ceil(9 * v / peak))] for v in r)
        out.append(f"  |{line}|")
    return out
