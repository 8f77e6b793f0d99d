"""Heatmaps that compare (issue 24 item 4): one colour scale and a colour bar per figure,
labelled axes and units, dark labels outside the picture, a readable size, the time axis
ending with the workload, and "simulated" on doctor's picture of simulated rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import UTCDateTime, shard_column
from sharded_orm.tools.doctor import doctor
from sharded_orm.tools.doctor.report import heatmap_panel
from sharded_orm.tools.simulate import Instance, Workload, simulate
from sharded_orm.tools.simulate.heatmap import Panel, figure

pytest.importorskip("matplotlib")


class Base(DeclarativeBase):
    pass


class Hot(Base):
    __tablename__ = "Hot"
    ts: Mapped[object] = mapped_column("Ts", UTCDateTime, primary_key=True)


class Spread(Base):
    __tablename__ = "Spread"
    ts: Mapped[object] = mapped_column("Ts", UTCDateTime, primary_key=True)
    shard: Mapped[int] = shard_column("ts", count=20, name="ShardId", primary_key=True)
    __table_args__ = (sa.PrimaryKeyConstraint("ShardId", "Ts"),)


def test_panels_share_one_scale_and_a_colour_bar() -> None:
    hot = Panel("hot", [[0.0, 90.0], [0.0, 100.0]], 10.0, [("T", 0, 2)])
    cool = Panel("cool", [[5.0, 5.0], [4.0, 6.0]], 10.0, [("T", 0, 2)])
    fig = figure([hot, cool])
    try:
        panels = [ax for ax in fig.axes if ax.get_title()]
        meshes = [ax.collections[0] for ax in panels]
        assert {(m.norm.vmin, m.norm.vmax) for m in meshes} == {(0.0, 100.0)}
        bar = [ax for ax in fig.axes if ax not in panels]
        assert len(bar) == 1 and bar[0].get_ylabel() == "writes/s per key range"
        for ax in panels:
            assert ax.get_xlabel() == "time since start (s)"
            for label in ax.get_yticklabels():  # outside the picture, never white on bright
                assert label.get_color() not in ("white", "w", "#ffffff")
        width, height = fig.get_size_inches() * fig.dpi
        assert width >= 900 and height >= 450
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_the_time_axis_ends_with_the_workload(tmp_path: Path) -> None:
    workload = Workload(rows_per_second=100, duration=95)  # ticks of 10 s: the last is 5 s
    result = simulate({"hot": Hot, "spread": Spread}, workload, Instance(), progress_mode="off")
    out = result.heatmap(tmp_path / "h.png")
    assert out.stat().st_size > 1000
    panel = Panel("x", result.results[0].heatmap, 10.0, [], end=95.0)
    assert panel.time_edges()[-1] == 95.0


# simulates a scenario end to end; quick loop: test_panels_share_one_scale_and_a_colour_bar
@pytest.mark.slow
def test_doctor_says_simulated_for_the_simulators_rows() -> None:
    workload = Workload(rows_per_second=5000, duration=300, users_per_tenant=1000)
    run = simulate({"hot": Hot}, workload, Instance(nodes=4), progress_mode="off").results[0]
    rows = run.hot_split_rows()
    assert rows and all(r["SOURCE"] == "simulated" for r in rows)
    panel = heatmap_panel(doctor(rows, [Hot]))
    assert panel.title.startswith("simulated:") and "production" not in panel.title
    assert panel.unit.startswith("CPU usage score")
