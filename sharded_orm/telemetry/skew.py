"""Write skew per shard column, measured as rows are written, before Spanner sees it.

For each shard column the library counts the rows it writes per shard over a sliding
window (``SKEW_WINDOW`` seconds, in ``SKEW_BUCKETS`` steps). The skew is the busiest shard's
rows over the mean (rows in the window / the column's shard count): 1.0 is an even spread,
``count`` means every row went to one shard. Exported, when a meter provider is configured,
as the gauge ``sharded_orm.shard.skew`` beside ``sharded_orm.shard.busiest_rate`` (the
busiest shard's rows/s, the figure to hold against a split's capacity),
``sharded_orm.shard.window_rows`` and the counter ``sharded_orm.shard.rows_written`` (rows
counted since the window was made; it starts again from 0 after :func:`configure_window`);
read in Python with :func:`write_skew`. Rows written by ``bulk_load``, copies and backfills are
not counted: they spread their writes by key range themselves.

Counting costs one ``Counter.update`` per statement (per flush batch), and only while a
meter provider is configured (or :func:`track` was called): with none, nothing is kept.
No instrument is called per statement: every figure, the counter's too, is observed
from the windows when the app's metric reader collects.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sharded_orm.checks import check_seconds
from sharded_orm.telemetry import api

#: seconds of writes the skew looks back over, and the steps the window moves by
DEFAULT_WINDOW = 60.0
DEFAULT_BUCKETS = 6
SKEW_WINDOW = DEFAULT_WINDOW
SKEW_BUCKETS = DEFAULT_BUCKETS


@dataclass(frozen=True)
class SkewFigure:
    """One shard column's writes over the window."""

    table: str
    column: str
    shards: int  # the column's shard count
    rows: int  # rows written in the window
    busiest: int  # rows of the busiest shard
    busiest_shard: int | None
    skew: float  # busiest / (rows / shards); 0.0 with no rows
    window: float  # seconds the figures cover

    @property
    def busiest_rate(self) -> float:
        """The busiest shard's rows per second over the window."""
        return self.busiest / self.window


class _Window:
    __slots__ = ("shards", "buckets", "starts", "lock", "total")

    def __init__(self, shards: int) -> None:
        self.shards = shards
        self.total = 0  # rows counted since the window was made (the cumulative counter)
        self.buckets: list[Counter[int]] = [Counter() for _ in range(SKEW_BUCKETS)]
        self.starts = [0.0] * SKEW_BUCKETS
        self.lock = threading.Lock()

    def _bucket(self, now: float) -> Counter[int]:
        step = SKEW_WINDOW / SKEW_BUCKETS
        slot = int(now // step)
        i = slot % SKEW_BUCKETS
        if self.starts[i] != slot:
            self.starts[i] = slot
            self.buckets[i] = Counter()
        return self.buckets[i]

    def add(self, shards: list[int] | tuple[int, ...], now: float) -> None:
        with self.lock:
            self._bucket(now).update(shards)
            self.total += len(shards)

    def totals(self, now: float) -> Counter[int]:
        step = SKEW_WINDOW / SKEW_BUCKETS
        oldest = int(now // step) - SKEW_BUCKETS + 1
        out: Counter[int] = Counter()
        with self.lock:
            for start, bucket in zip(self.starts, self.buckets, strict=True):
                if start >= oldest:
                    out.update(bucket)
        return out


_windows: dict[tuple[str, str], _Window] = {}
_windows_lock = threading.Lock()
_tracking: dict[str, Any] = {"forced": False, "instruments": None}


def track(on: bool = True) -> None:
    """Count writes per shard even with no meter provider (for :func:`write_skew`)."""
    _tracking["forced"] = bool(on)


def configure_window(seconds: float, buckets: int = DEFAULT_BUCKETS) -> None:
    """Change the sliding window (clears what was counted)."""
    global SKEW_WINDOW, SKEW_BUCKETS
    seconds = check_seconds(seconds, "skew window")
    if not isinstance(buckets, int) or isinstance(buckets, bool) or not 1 <= buckets <= 600:
        from sharded_orm.errors import ShardConfigError

        raise ShardConfigError(f"skew window buckets must be an int in 1..600, got {buckets!r}")
    with _windows_lock:
        SKEW_WINDOW, SKEW_BUCKETS = seconds, buckets
        _windows.clear()


def _instruments(meter: Any) -> None:
    """Declare the observed instruments on ``meter``, once per meter."""
    if _tracking["instruments"] is meter:
        return
    with _windows_lock:
        if _tracking["instruments"] is meter:
            return
        meter.create_observable_counter(
            "sharded_orm.shard.rows_written",
            callbacks=[_observe_written],
            unit="{row}",
            description="Rows written to a sharded table, per shard column.",
        )
        for name, callback, unit, description in _GAUGES:
            meter.create_observable_gauge(
                "sharded_orm.shard." + name,
                callbacks=[callback],
                unit=unit,
                description=description,
            )
        _tracking["instruments"] = meter


def counting() -> bool:
    """Whether writes are counted now (a meter provider is configured, or :func:`track`)."""
    meter = api.meter()
    if meter is not None:
        _instruments(meter)
        return True
    return bool(_tracking["forced"])


def count(table: str, column: str, shard_count: int, shards: list[int] | tuple[int, ...]) -> None:
    """Count rows written with these shard values, once :func:`counting` said yes."""
    key = (table, column)
    window = _windows.get(key)
    if window is None or window.shards != shard_count:
        with _windows_lock:
            window = _windows.get(key)
            if window is None or window.shards != shard_count:
                window = _windows[key] = _Window(shard_count)
    window.add(shards, time.monotonic())


def rows_written(table: str, column: str, shard_count: int, shards: Iterable[int]) -> None:
    """Count rows written to ``table`` with these values of shard column ``column``."""
    if counting():
        count(
            table,
            column,
            shard_count,
            shards if isinstance(shards, (list, tuple)) else list(shards),
        )


def write_skew() -> list[SkewFigure]:
    """Each tracked shard column's writes over the window, busiest skew first."""
    now = time.monotonic()
    with _windows_lock:
        windows = list(_windows.items())
    out = []
    for (table, column), window in windows:
        totals = window.totals(now)
        rows = sum(totals.values())
        if totals:
            shard, busiest = max(totals.items(), key=lambda kv: (kv[1], -kv[0]))
        else:
            shard, busiest = None, 0
        skew = busiest * window.shards / rows if rows else 0.0
        out.append(
            SkewFigure(table, column, window.shards, rows, busiest, shard, skew, SKEW_WINDOW)
        )
    return sorted(out, key=lambda f: -f.skew)


def _observed(values: Iterable[tuple[str, str, float]]) -> list[Any]:
    """``(table, column, value)`` as observations, attributed as every figure here is."""
    from opentelemetry.metrics import Observation

    return [
        Observation(value, {"db.collection.name": table, "sharded_orm.shard.column": column})
        for table, column, value in values
    ]


def _observe_written(options: Any) -> list[Any]:
    with _windows_lock:
        windows = list(_windows.items())
    return _observed((table, column, window.total) for (table, column), window in windows)


def _observe_skew(options: Any) -> list[Any]:
    return _observed((f.table, f.column, f.skew) for f in write_skew())


def _observe_rate(options: Any) -> list[Any]:
    return _observed((f.table, f.column, f.busiest_rate) for f in write_skew())


def _observe_rows(options: Any) -> list[Any]:
    return _observed((f.table, f.column, f.rows) for f in write_skew())


#: the gauges read from the windows: name, callback, unit, description
_GAUGES = (
    ("skew", _observe_skew, "1", "Busiest shard's rows over the mean, in the window."),
    ("busiest_rate", _observe_rate, "{row}/s", "The busiest shard's rows/s in the window."),
    ("window_rows", _observe_rows, "{row}", "Rows written in the sliding window."),
)


def reset() -> None:
    """Forget every window (tests)."""
    with _windows_lock:
        _windows.clear()
