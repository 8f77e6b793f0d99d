"""What the simulator can simulate: the sizes it models and the rule for its ticks.

Everything beyond is refused before a run starts, with the parameter named (a nanosecond
tick used to be accepted, and made every split look hot).
"""

from __future__ import annotations

from typing import Any

from sharded_orm.errors import ShardConfigError

#: the most ticks a run takes (each a heatmap column and a pass over every split)
MAX_TICKS = 20_000
#: the most nodes, splits at the start, and heatmap rows per key space modelled
MAX_NODES = 1_000
MAX_SPLITS = 100_000
MAX_BUCKETS = 1_000


def check_ticks(workload: Any, instance: Any) -> None:
    """Refuse a run whose ticks cannot be simulated: a tick must hold at least one row (a
    shorter one is counted as one row's time, so every split looks hot), and the run at
    most ``MAX_TICKS`` ticks (each is a column of the heatmap, and a pass over the splits)."""
    rate, tick = float(workload.rows_per_second), float(instance.tick)
    if rate * tick < 1:
        raise ShardConfigError(
            f"tick={tick:g} s holds {rate * tick:.3g} rows at {rate:g} rows/s: a tick must "
            f"hold at least one row; give tick >= {1 / rate:.3g} s"
        )
    ticks = max(workload.duration, workload.history_seconds) / tick
    if ticks > MAX_TICKS:
        longest = max(workload.duration, workload.history_seconds)
        raise ShardConfigError(
            f"{longest:g} s in ticks of {tick:g} s is {ticks:,.0f} ticks; the simulator "
            f"takes at most {MAX_TICKS:,}: give tick >= {longest / MAX_TICKS:.3g} s"
        )
