"""Doctor's output: a terminal table, and the hot splits on the simulator's heatmap axes."""

from __future__ import annotations

import datetime as dt
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sharded_orm.tools.doctor.keys import Key

if TYPE_CHECKING:
    from sharded_orm.tools.doctor.findings import Diagnosis

BUCKETS = 48


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min"


def text_report(d: Diagnosis) -> str:
    info = d.as_dict()
    lines = [
        f"{info['view']}: {info['rows']} hot split rows, intervals ending "
        f"{info['first_interval_end']} .. {info['last_interval_end']}",
        f"{'table or index':28} {'pattern':16} {'shard':>5} {'tenant':16} {'peak':>4} "
        f"{'hot':>8} rule",
    ]
    for f in d.findings:
        tenant = "" if f.tenant is None else str(f.tenant)
        shard = "" if f.shard is None else str(f.shard)
        lines.append(
            f"{f.table[:28]:28} {f.pattern:16} {shard:>5} {tenant[:16]:16} "
            f"{f.peak_score:>4} {_minutes(f.hot_seconds):>8} {f.rule or '-'}"
        )
    for f in d.findings:
        lines.append("")
        where = f.table + (f" shard {f.shard}" if f.shard is not None else "")
        where += f" tenant {f.tenant!r}" if f.tenant is not None else ""
        lines.append(f"{where}: {f.pattern}")
        if f.keys:
            lines.append(f"  hot splits from: {', '.join(f.keys[:3])}")
        lines.extend(
            textwrap.wrap(f.fix, 88, initial_indent="  fix: ", subsequent_indent="       ")
        )
    return "\n".join(lines)


def _order(key: Key) -> tuple[Any, ...]:
    """A sort key for decoded split starts, in the key space's order (DESC parts reversed)."""
    out: list[Any] = []
    for p in key.parts:
        v = p.value
        if isinstance(v, dt.datetime):
            v = v.timestamp()
        elif isinstance(v, dt.date):
            v = v.toordinal()
        if isinstance(v, (int, float)):
            out.append((0, -v if p.descending else v, ""))
        else:
            s = str(v)
            if p.descending:
                s = "".join(chr(0x10FFFF - ord(c)) for c in s)
            out.append((1, 0, s))
    return tuple(out)


def heatmap_panel(d: Diagnosis) -> Any:
    """The window as a heatmap panel: time across, each table's and index's keys up."""
    from sharded_orm.tools.simulate.heatmap import Panel

    first, last = d.heat.first_end, d.heat.last_end
    step = float(d.interval_seconds)
    n_t = int(round((last - first).total_seconds() / step)) + 1
    by_space = d.heat.rows  # each key space's rows, a bounded sample of them
    spaces = sorted(by_space, key=lambda n: (by_space[n][0].space.kind == "index", n))
    grid = [[0.0] * 0 for _ in range(n_t)]
    bands: list[tuple[str, int, int]] = []
    offset = 0
    for name in spaces:
        rows = by_space[name]
        starts = sorted({r.start.text: r.start for r in rows}.values(), key=_order)
        rank = {k.text: i for i, k in enumerate(starts)}
        n_b = min(BUCKETS, len(starts))
        for t in range(n_t):
            grid[t].extend([0.0] * n_b)
        for r in rows:
            t = int(round((r.row.interval_end - first).total_seconds() / step))
            b = offset + rank[r.start.text] * n_b // len(starts)
            grid[t][b] = max(grid[t][b], float(r.row.cpu_usage_score))
        bands.append((name, offset, offset + n_b))
        offset += n_b
    hot = sum(1 for f in d.findings if f.hot_seconds)
    title = f"{d.source}: {d.row_count} hot split rows\n{hot} finding(s) hot at CPU score 100"
    unit = "CPU usage score of the hot split (0-100)"
    return Panel(title=title, grid=grid, step=step, spaces=bands, unit=unit)


def save_doctor_heatmap(d: Diagnosis, path: str | Path) -> Path:
    from sharded_orm.tools.simulate.heatmap import draw_panels

    return draw_panels([heatmap_panel(d)], path)
