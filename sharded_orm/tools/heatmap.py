"""Key-visualizer-style heatmaps of a simulation: time across, key space up.

Like Spanner's Key Visualizer, each row of pixels is a range of keys (tables and indexes
stacked, each in key order) and each column a tick; brightness is writes. A hotspot is a
bright horizontal line; a healthy schema is an even glow. matplotlib is an optional extra
(``pip install sharded-orm[heatmap]``) and is imported only here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sharded_orm.errors import ShardConfigError

if TYPE_CHECKING:
    from sharded_orm.tools.simulate import Comparison


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


def save_heatmap(comparison: Comparison, path: str | Path) -> Path:
    """One panel per schema, side by side, written as a PNG to ``path``."""
    require_matplotlib()
    import matplotlib.pyplot as plt

    out = check_output_path(path)
    results = comparison.results
    fig, axes = plt.subplots(
        1, len(results), figsize=(4.2 * len(results), 3.6), squeeze=False, dpi=80
    )
    for ax, r in zip(axes[0], results, strict=True):
        # [bucket][tick], normalised by the busiest cell of this schema
        grid = [[row[b] for row in r.heatmap] for b in range(len(r.heatmap[0]))]
        ticks = len(r.heatmap)
        extent = (0.0, ticks * r.tick, 0.0, float(len(grid)))
        ax.imshow(grid, aspect="auto", origin="lower", cmap="inferno", extent=extent)
        for name, lo, hi in r.space_buckets:
            if lo:
                ax.axhline(lo, color="white", linewidth=0.6)
            label = name.split(".", 1)[-1] if "." in name else name
            ax.text(
                ticks * r.tick * 0.01,
                (lo + hi) / 2,
                label,
                color="white",
                fontsize=7,
                va="center",
            )
        ax.set_title(
            f"{r.name}\nhottest split {r.hottest_split_share:.0%}, imbalance {r.imbalance:.2f}",
            fontsize=9,
        )
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
