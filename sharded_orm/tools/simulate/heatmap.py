"""Key-Visualizer-style heatmaps: time across, key space up (tables, then indexes).

Like Spanner's Key Visualizer, each row of pixels is a range of keys (tables and indexes
stacked, each in key order) and each column a time step; brightness is load. A hotspot is
a bright line; a healthy schema is an even glow. The simulator draws its runs with it and
``sharded-orm doctor --heatmap`` draws production's hot splits on the same axes.
matplotlib is an optional extra (``pip install sharded-orm[heatmap]``), imported only here
and only when drawing.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sharded_orm.errors import ShardConfigError

if TYPE_CHECKING:
    from sharded_orm.tools.simulate.results import Comparison


@dataclass(frozen=True)
class Panel:
    """One picture: ``grid[t][bucket]`` load per column of time, ``step`` seconds per column
    (the last may be shorter: ``end``, the seconds the workload lasted), and the key spaces
    as ``(name, first bucket, end bucket)`` from the bottom up. ``unit`` names the values;
    every panel of one figure must share it (they share one colour scale)."""

    title: str
    grid: Sequence[Sequence[float]]
    step: float
    spaces: Sequence[tuple[str, int, int]]
    unit: str = "writes/s per key range"
    end: float | None = None

    def time_edges(self) -> list[float]:
        """Column edges in seconds: ``0, step, 2*step, ...``, the last at ``end``."""
        ticks = max(len(self.grid), 1)
        edges = [i * self.step for i in range(ticks + 1)]
        if self.end is not None and edges[-2] < self.end < edges[-1]:
            edges[-1] = float(self.end)
        return edges


def check_output_path(path: str | Path) -> Path:
    """Fail now, not after the simulation, if ``path`` cannot be written."""
    p = Path(path)
    if p.is_dir():
        raise ShardConfigError(f"output path {str(p)!r} is a directory: give a file name")
    existed = p.exists()
    try:
        with open(p, "ab"):
            pass
    except OSError as exc:
        raise ShardConfigError(
            f"cannot write {str(p)!r} ({exc.strerror or exc}): choose a writable path"
        ) from None
    if not existed:
        p.unlink()
    return p


def require_matplotlib() -> Any:
    """Import matplotlib with a headless backend, or say how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise ShardConfigError(
            "drawing a heatmap needs matplotlib: pip install 'sharded-orm[heatmap]' "
            "(or leave out the heatmap path)"
        ) from None
    matplotlib.use("Agg", force=False)
    return matplotlib


def _short(name: str) -> str:
    return name.split(".", 1)[-1] if "." in name else name


def draw_panels(panels: Sequence[Panel], path: str | Path) -> Path:
    """The panels side by side (:func:`figure`), written as a PNG to ``path``."""
    require_matplotlib()
    import matplotlib.pyplot as plt

    out = check_output_path(path)
    fig = figure(panels)
    try:
        fig.savefig(out, format="png")
    except OSError as exc:
        raise ShardConfigError(f"cannot write {str(out)!r}: {exc}") from None
    finally:
        plt.close(fig)
    return out


def figure(panels: Sequence[Panel]) -> Any:
    """A matplotlib Figure: the panels side by side on ONE colour scale with a colour bar.

    A shared scale is what makes panels comparable: the same brightness is the same load in
    every panel, so the fixed schema's even glow is dim next to the naive one's hot line.
    """
    require_matplotlib()
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize

    units = {p.unit for p in panels}
    if len(units) != 1:
        raise ShardConfigError(f"panels of one figure share one unit, got {sorted(units)}")
    vmax = max((v for p in panels for row in p.grid for v in row), default=0.0) or 1.0
    norm = Normalize(vmin=0.0, vmax=vmax)
    fig, axes = plt.subplots(
        1,
        len(panels),
        figsize=(1.5 + 4.6 * len(panels), 4.6),
        squeeze=False,
        dpi=110,
        layout="constrained",
    )
    mesh: Any = None
    for ax, p in zip(axes[0], panels, strict=True):
        edges = p.time_edges()
        buckets = len(p.grid[0]) if p.grid else 1
        # [bucket][tick]: key space up, time across
        grid = [[row[b] for row in p.grid] for b in range(buckets)] if p.grid else [[0.0]]
        mesh = ax.pcolormesh(
            edges, range(buckets + 1), grid, cmap="inferno", norm=norm, shading="flat"
        )
        for _name, lo, _hi in p.spaces:
            if lo:
                ax.axhline(lo, color="#4fc3f7", linewidth=1.0)
        ax.set_yticks(
            [(lo + hi) / 2 for _, lo, hi in p.spaces], [_short(n) for n, _, _ in p.spaces]
        )
        ax.tick_params(axis="y", length=0, labelsize=8)
        ax.tick_params(axis="x", labelsize=8)
        ax.set_xlim(edges[0], edges[-1])
        ax.set_title(p.title, fontsize=9)
        ax.set_xlabel("time since start (s)", fontsize=9)
    axes[0][0].set_ylabel("key ranges, in key order (tables, then indexes)", fontsize=9)
    bar = fig.colorbar(mesh, ax=axes[0].tolist(), fraction=0.05, pad=0.02)
    bar.set_label(next(iter(units)), fontsize=9)
    bar.ax.tick_params(labelsize=8)
    return fig


def save_heatmap(comparison: Comparison, path: str | Path) -> Path:
    """One panel per schema of a simulation, side by side, in writes/s per key range."""
    duration = float(comparison.workload.duration)
    panels = []
    for r in comparison.results:
        probe = Panel("", r.heatmap, r.tick, r.space_buckets, end=duration)
        widths = [hi - lo for lo, hi in itertools.pairwise(probe.time_edges())]
        grid = [[v / w for v in row] for row, w in zip(r.heatmap, widths, strict=False)]
        panels.append(
            Panel(
                title=f"{r.name}\nhottest split {r.hottest_split_share:.0%}, "
                f"imbalance {r.imbalance:.2f}",
                grid=grid,
                step=r.tick,
                spaces=r.space_buckets,
                end=duration,
            )
        )
    return draw_panels(panels, path)
