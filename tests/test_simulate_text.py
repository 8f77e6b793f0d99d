"""simulate's text summary: every heatmap on one scale, and the columns explained (issue 31,
item 6)."""

from __future__ import annotations

from examples.hotspots import LogEntry, NaiveLogEntry
from sharded_orm.tools.simulate import Instance, Workload, simulate, text_heatmap
from sharded_orm.tools.simulate.results import SHADES


def _panels(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if line.endswith("writes by key range (rows) over time (columns)"):
            name = line.split(":", 1)[0]
            out[name] = []
        elif name and line.startswith("  |"):
            out[name].append(line)
    return out


def _darkest(lines: list[str]) -> int:
    return max(SHADES.index(ch) for line in lines for ch in line.strip()[1:-1])


def test_text_heatmaps_share_one_scale() -> None:
    result = simulate(
        {"naive": NaiveLogEntry, "fixed": LogEntry},
        # 30,000 rows: the smallest workload whose panels still differ as below (the scale
        # is what is checked, not the volume; 180,000 rows took 5x as long for the same shades)
        Workload(rows_per_second=1000, duration=30, tenants=3, tenant_weights=(1, 3, 1)),
        Instance(nodes=6),
        progress_mode="off",
    )
    panels = _panels(result.summary())
    assert set(panels) == {"naive", "fixed"}
    # the naive index's hot tail is the darkest cell of the figure; the fixed schema's
    # even glow is dimmer on the same scale (on a scale per panel both reached '@')
    assert _darkest(panels["naive"]) == 9
    assert _darkest(panels["fixed"]) < 9
    # alone, a panel is still scaled to its own peak
    assert _darkest(text_heatmap(result["fixed"])) == 9


def test_summary_explains_its_columns() -> None:
    result = simulate(
        LogEntry,
        Workload(rows_per_second=500, duration=20),
        Instance(nodes=2),
        progress_mode="off",
    )
    text = result.summary()
    r = result.results[0]
    assert r.writes == r.table_writes + r.index_writes > 10_000
    assert "one per row into the table plus one per row into each index" in text
    assert "one scale for every schema" in text
