"""Key-Visualizer-style heatmaps: time across, key space up (tables, then indexes).

Like Spanner's Key Visualizer, each row of pixels is a range of keys (tables and indexes
stacked, each in key order) and each column a time step; brightness is load. A hotspot is
a bright line; a healthy schema is an even glow. The simulator draws its runs with it and
``sharded-orm doctor --heatmap`` draws production's hot splits on the same axes.
matplotlib is an optional extra (``pip install sharded-orm[heatmap]``), imported only here
and only when drawing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sharded_orm.errors import ShardConfigError

if TYPE_CHECKING:
    from sharded_orm.tools.simulate.results import Comparison


@dataclass(frozen=True)
class Panel:
    """One picture: ``grid[t][bucket]`` load, ``step`` seconds per column, and the key
    spaces as ``(name, first bucket, end bucket)`` from the bottom up."""

    title: str
    grid: Sequence[Sequence[float]]
    step: float
    spaces: Sequence[tuple[str, int, int]]


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


def draw_panels(panels: Sequence[Panel], path: str | Path) -> Path:
    """The panels side by side, written as a PNG to ``path``."""
    require_matplotlib()
    import matplotlib.pyplot as plt

    out = check_output_path(path)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False, dpi=80
    )
    for ax, p in zip(axes[0], panels, strict=True):
        ticks = len(p.grid)
        buckets = len(p.grid[0]) if ticks else 1
        # [bucket][tick]: key space up, time across
        grid = [[row[b] for row in p.grid] for b in range(buckets)] if ticks else [[0.0]]
        extent = (0.0, max(ticks, 1) * p.step, 0.0, float(buckets))
        ax.imshow(grid, aspect="auto", origin="lower", cmap="inferno", extent=extent)
        for name, lo, hi in p.spaces:
            if lo:
                ax.axhline(lo, color="white", linewidth=0.6)
            label = name.split(".", 1)[-1] if "." in name else name
            ax.text(
                max(ticks, 1) * p.step * 0.01,
                (lo + hi) / 2,
                label,
                color="white",
                fontsize=7,
                va="center",
            )
        ax.set_title(p.title, fontsize=9)
        ax.set_xlabel("time (s)", fontsize=8)
        ax.set_yticks([])
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("key space (table, then indexes)", fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(out, format="png")
    except OSError as exc:
        raise ShardConfigError(f"cannot write {str(out)!r}: {exc}") from None
    finally:
        plt.close(fig)
    return out


def save_heatmap(comparison: Comparison, path: str | Path) -> Path:
    """One panel per schema of a simulation, side by side."""
    panels = [
        Panel(
            title=f"{r.name}\nhottest split {r.hottest_split_share:.0%}, "
            f"imbalance {r.imbalance:.2f}",
            grid=r.heatmap,
            step=r.tick,
            spaces=r.space_buckets,
        )
        for r in comparison.results
    ]
    return draw_panels(panels, path)
