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
        """A terminal table, what its columns mean, and a text heatmap per schema, every
        heatmap on ONE scale (the same character is the same load in each)."""
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
        lines.extend(COLUMNS_EXPLAINED)
        if heat:
            peak = max((heat_peak(r) for r in self.results), default=0.0)
            lines.append("")
            lines.append(
                f"heatmaps: writes/s per key range, rows = key ranges (tables, then indexes), "
                f"columns = time; one scale for every schema: {SHADES[1]!r} is up to "
                f"{peak / 9:,.0f}, {SHADES[-1]!r} {peak:,.0f}"
            )
            for r in self.results:
                lines.append("")
                lines.append(f"{r.name}: writes by key range (rows) over time (columns)")
                lines.extend(text_heatmap(r, peak=peak))
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


SHADES = " .:-=+*#%@"

#: what the summary's columns mean (printed under the table)
COLUMNS_EXPLAINED = (
    "  writes: every write the rows cost, one per row into the table plus one per row into "
    "each index (an index is a table of its own on Spanner): table_writes + index_writes",
    "  hottest split: the busiest split's share of those writes, averaged over ticks; "
    "imbalance: busiest node / mean node (1.00 is even)",
    "  peak node w/s: the busiest node's writes per second at its worst tick; overloaded: "
    "seconds it was above the node capacity; splits: splits at the end",
)


def _cells(result: SimulationResult, width: int, height: int) -> list[list[float]]:
    """The heatmap averaged into ``height`` x ``width`` cells, in writes/s per key range
    (each cell the mean over its key ranges and ticks, so panels with more key ranges, a
    table and its indexes, are not brighter for it)."""
    nb = len(result.heatmap[0])
    nt = len(result.heatmap)
    cols = min(width, nt)
    rows = min(height, nb)
    total = [[0.0] * cols for _ in range(rows)]
    count = [[0] * cols for _ in range(rows)]
    for t, row in enumerate(result.heatmap):
        c = t * cols // nt
        for b, v in enumerate(row):
            total[b * rows // nb][c] += v
            count[b * rows // nb][c] += 1
    tick = result.tick or 1.0
    return [
        [v / n / tick if n else 0.0 for v, n in zip(tr, cr, strict=True)]
        for tr, cr in zip(total, count, strict=True)
    ]


def heat_peak(result: SimulationResult, width: int = 60, height: int = 16) -> float:
    """The brightest cell of ``text_heatmap(result)`` in writes/s per key range."""
    if not result.heatmap or not result.heatmap[0]:
        return 0.0
    return max(max(r) for r in _cells(result, width, height))


def text_heatmap(
    result: SimulationResult, width: int = 60, height: int = 16, *, peak: float | None = None
) -> list[str]:
    """A coarse text rendering of the heatmap: darker = more writes/s per key range.

    ``peak``: the load drawn as the darkest character; give the same one to every schema
    compared (``Comparison.summary`` does) so that panels share one scale. Default: this
    panel's own brightest cell.
    """
    if not result.heatmap or not result.heatmap[0]:
        return []
    grid = _cells(result, width, height)
    top = peak if peak is not None else max(max(r) for r in grid)
    top = top or 1.0
    out = []
    for r in reversed(grid):
        line = "".join(SHADES[min(9, math.ceil(9 * v / top))] for v in r)
        out.append(f"  |{line}|")
    return out
