"""The ``advise`` curve as a PNG: busiest split writes/s and read cost over the count."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sharded_orm.errors import ShardConfigError
from sharded_orm.tools.simulate.heatmap import check_output_path, require_matplotlib

if TYPE_CHECKING:
    from sharded_orm.tools.advise.report import Advice


def draw_curve(advice: Advice, path: str | Path) -> Path:
    require_matplotlib()
    import matplotlib.pyplot as plt

    out = check_output_path(path)
    counts = [p.count for p in advice.points]
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110, layout="constrained")
    try:
        ax.plot(counts, [p.peak_split_writes for p in advice.points], "o-", color="#d84315",
                label="busiest split, writes/s")  # fmt: skip
        ax.axhline(advice.target, color="#d84315", linestyle="--", linewidth=1,
                   label=f"write target ({advice.target:,.0f}/s)")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(c) if c != 32 or 30 not in counts else "" for c in counts],
                      fontsize=7)  # fmt: skip
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("shard count N", fontsize=9)
        ax.set_ylabel("busiest split, writes/s", fontsize=9, color="#d84315")
        right = ax.twinx()
        right.plot(counts, [p.read_cost for p in advice.points], "s-", color="#1565c0",
                   label="read cost")  # fmt: skip
        right.set_ylabel(
            f"read cost (newest {advice.k} + {advice.pages} pages): entries + 1024/statement",
            fontsize=8, color="#1565c0",
        )  # fmt: skip
        best = advice.best
        if best is not None:
            ax.axvline(best.count, color="#2e7d32", linewidth=1.5)
            ax.annotate(
                f"advised N = {best.count}", (best.count, 0.04), xycoords=("data", "axes fraction"),
                fontsize=9, color="#2e7d32", xytext=(6, 0), textcoords="offset points",
            )  # fmt: skip
        ax.set_title(
            f"advise: {advice.layout.table.name}.{advice.layout.shard.name}, "
            f"{advice.sample.rows_per_second:,.0f} rows/s", fontsize=10,
        )  # fmt: skip
        lines = ax.get_legend_handles_labels()
        more = right.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper center")
        fig.savefig(out, format="png")
    except OSError as exc:
        raise ShardConfigError(f"cannot write {str(out)!r}: {exc}") from None
    finally:
        plt.close(fig)
    return out
