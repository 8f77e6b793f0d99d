"""What the simulator cannot simulate is refused at once, with the parameter named (issue 33
item 5): ``simulate --tick 1e-9`` was accepted (each row its own tick of a nanosecond: every
split at a billion writes/s), and so were siblings that crashed deep in the run or hung:
``zipf=1e300`` (OverflowError), ``nodes=10**9`` (a list per tick), ``node_capacity=1e-308``
(OverflowError), a history before year 1 (OverflowError), ``rows_per_second=1e300``
(ValueError). Durations go through the library's one rule (``checks.check_seconds``).
"""

from __future__ import annotations

import datetime as dt
import math
import os
import subprocess
import sys
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from sharded_orm import Instance, ShardingError, Workload, simulate
from sharded_orm.errors import ShardConfigError, ShardTypeError

MD = sa.MetaData()
HOT = sa.Table("Hot", MD, sa.Column("Ts", sa.DateTime(timezone=True), primary_key=True))

NAN, INF = float("nan"), float("inf")
ABSURD = [NAN, INF, -INF, -1.0, 0.0, 1e-300, 1e300, 10**30, True, "10"]

#: (Workload or Instance, parameter) -> the absurd values it must refuse
REFUSED: dict[tuple[str, str], list[Any]] = {
    ("Workload", "rows_per_second"): [NAN, INF, -1.0, 0.0, 1e300, 10**30, True, "10"],
    ("Workload", "duration"): [NAN, INF, -1.0, 0.0, 1e-300, 1e-7, 1e300, 10**30, True, "10"],
    ("Workload", "history"): [NAN, INF, -1.0, 1e-300, 1e-7, 1e300, 10**30, True, "10"],
    ("Workload", "zipf"): [NAN, INF, -1.0, 11.0, 1e300, 10**30, True, "10"],
    ("Workload", "tenants"): [-1, 0, 10**30, 1.5, True, "10"],
    ("Workload", "users_per_tenant"): [-1, 0, 1.5, True, "10"],
    ("Instance", "tick"): [NAN, INF, -1.0, 0.0, 1e300, 10**30, True, "10"],
    ("Instance", "nodes"): [-1, 0, 10**9, 1.5, True, "10"],
    ("Instance", "node_capacity"): [NAN, INF, -1.0, 0.0, 1e-300, 0.5, True, "10"],
    ("Instance", "load_split_after"): [NAN, INF, -1.0, 1e300, 10**30, True, "10"],
    ("Instance", "load_split_threshold"): [NAN, INF, -1.0, 0.0, True, "10"],
    ("Instance", "initial_splits_per_node"): [-1, 0, 10**7, 1.5, True, "10"],
    ("Instance", "heatmap_buckets"): [-1, 0, 10**7, 1.5, True, "10"],
    ("Instance", "row_bytes"): [-1, 0, 10**30, 1.5, True, "10"],
    ("Instance", "split_size_bytes"): [-1, 0, 100, 1.5, True, "10"],
}


def make(kind: str, **kw: Any) -> Any:
    if kind == "Workload":
        return Workload(**{"rows_per_second": 10.0, "duration": 60.0, **kw})
    return Instance(**kw)


@pytest.mark.parametrize(
    ("kind", "name", "value"),
    [(k, n, v) for (k, n), values in REFUSED.items() for v in values],
    ids=lambda x: repr(x)[:20],
)
def test_absurd_values_are_refused_naming_the_parameter(kind: str, name: str, value: Any) -> None:
    extra = {"tenant_weights": None} if name == "zipf" else {}
    with pytest.raises((ShardConfigError, ShardTypeError)) as info:
        make(kind, **{name: value}, **extra)
    words = name.split("_")
    assert any(w in str(info.value) for w in (name, *words)), str(info.value)


def test_a_history_or_traffic_outside_the_datetime_range_is_refused() -> None:
    start = dt.datetime(1, 1, 2, tzinfo=dt.timezone.utc)
    with pytest.raises(ShardConfigError, match="datetime range"):
        Workload(rows_per_second=10, duration=60, history=86400 * 3, start=start)
    late = dt.datetime(9999, 12, 31, 23, 59, 30, tzinfo=dt.timezone.utc)
    with pytest.raises(ShardConfigError, match="datetime range"):
        Workload(rows_per_second=10, duration=60, start=late)


@pytest.mark.parametrize(
    ("rate", "duration", "tick", "words"),
    [
        (10.0, 60.0, 1e-9, ("tick=1e-09", "at least one row", "tick >= 0.1")),
        (10.0, 60.0, 0.05, ("at least one row",)),
        (100.0, 86400.0, 1.0, ("86,400 ticks", "at most 20,000", "tick >= 4.32")),
        (10.0, 60.0, 1e8, ()),  # one tick longer than the run: fine
    ],
)
def test_ticks_that_cannot_be_simulated_are_refused(
    rate: float, duration: float, tick: float, words: tuple[str, ...]
) -> None:
    workload = Workload(rows_per_second=rate, duration=duration, history=0)
    instance = Instance(tick=tick)
    if not words:
        assert simulate(HOT, workload, instance, progress_mode="off").results
        return
    with pytest.raises(ShardConfigError) as info:
        simulate(HOT, workload, instance, progress_mode="off")
    for word in words:
        assert word in str(info.value), str(info.value)


def test_cli_refuses_a_nanosecond_tick() -> None:
    code = "import sys; from sharded_orm.tools.cli import main; sys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", code, "simulate", "seed_models:LogEntry",
         "--rows-per-second", "10", "--duration", "60", "--tick", "1e-9"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.path.dirname(__file__), "SHARDED_ORM_PROGRESS": "off"},
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.startswith("sharded-orm: error: tick=1e-09 s holds 1e-08 rows")


SMALL = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.sampled_from(ABSURD),
)


@settings(max_examples=150, deadline=None)
@given(rate=SMALL, duration=SMALL, tick=SMALL, zipf=SMALL, nodes=SMALL, capacity=SMALL)
def test_a_run_is_refused_or_simulated_never_crashed(
    rate: Any, duration: Any, tick: Any, zipf: Any, nodes: Any, capacity: Any
) -> None:
    """Whatever numbers are given, the simulator refuses them with a ShardingError or runs
    them; accepted runs are small here: at most a million rows (a ShardingError above)."""
    try:
        workload = Workload(rows_per_second=rate, duration=duration, tenants=3, zipf=zipf)
        instance = Instance(nodes=nodes, node_capacity=capacity, tick=tick)
        if workload.rows > 1_000_000:
            return  # accepted, and too long a run for a test
        result = simulate(HOT, workload, instance, progress_mode="off")
    except ShardingError:
        return
    [run] = result.results
    assert run.table_writes == workload.rows
    assert math.isfinite(run.imbalance) and math.isfinite(run.peak_node_rate)
    assert run.as_dict() and run.hot_split_rows() is not None
