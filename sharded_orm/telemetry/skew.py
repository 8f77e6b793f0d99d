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
from the windows when the app's metric reader collects. Windows are kept per database
(``db.namespace``), table and shard column: two databases with a table of the same name
are two series.

When the documented rule fires (:func:`skewed`: the busiest shard has more than
``WARN_SKEW`` times its share, over enough rows that chance cannot explain it) the
library logs a WARNING on the ``sharded_orm.telemetry.skew`` logger, and adds a
``sharded_orm.write_skew`` event to the current span, once per window per database and
table: which table, which shard, and what to run (``sharded-orm doctor``, ``advise``).
The rule is checked every ``10 x shard count`` rows a window counts, not per row.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sharded_orm.checks import check_seconds
from sharded_orm.memo import Memo
from sharded_orm.telemetry import api

#: seconds of writes the skew looks back over, and the steps the window moves by
DEFAULT_WINDOW = 60.0
DEFAULT_BUCKETS = 6
SKEW_WINDOW = DEFAULT_WINDOW
SKEW_BUCKETS = DEFAULT_BUCKETS
#: the warning's rule (docs/observability.md, "Thresholds"): skew above WARN_SKEW with at
#: least WARN_ROWS_PER_SHARD rows per shard in the window, or WARN_BUSIEST_ROWS rows in
#: the busiest shard (an even stream's busiest shard stays near twice its share only
#: while a shard holds fewer than ~2 ln(shards) rows: never a thousand)
WARN_SKEW = 2.0
WARN_ROWS_PER_SHARD = 100
WARN_BUSIEST_ROWS = 1000
#: the rule is checked each time a window has counted this many rows per shard more
CHECK_ROWS_PER_SHARD = 10

logger = logging.getLogger("sharded_orm.telemetry.skew")


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
    database: str | None = None  # db.namespace of the database written to

    @property
    def busiest_rate(self) -> float:
        """The busiest shard's rows per second over the window."""
        return self.busiest / self.window


class _Window:
    __slots__ = ("shards", "buckets", "starts", "lock", "total", "unchecked", "warned")

    def __init__(self, shards: int) -> None:
        self.shards = shards
        self.total = 0  # rows counted since the window was made (the cumulative counter)
        self.unchecked = 0  # rows counted since the warning's rule was last checked
        self.warned = -float("inf")  # monotonic time of the last warning
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

    def add(self, shards: list[int] | tuple[int, ...], now: float) -> bool:
        """Count the rows; True when the warning's rule is due to be checked."""
        with self.lock:
            self._bucket(now).update(shards)
            self.total += len(shards)
            self.unchecked += len(shards)
            if self.unchecked < CHECK_ROWS_PER_SHARD * self.shards:
                return False
            self.unchecked = 0
            return True

    def totals(self, now: float) -> Counter[int]:
        step = SKEW_WINDOW / SKEW_BUCKETS
        oldest = int(now // step) - SKEW_BUCKETS + 1
        out: Counter[int] = Counter()
        with self.lock:
            for start, bucket in zip(self.starts, self.buckets, strict=True):
                if start >= oldest:
                    out.update(bucket)
        return out


#: (database, table, shard column) -> its window
_windows: dict[tuple[str | None, str, str], _Window] = {}
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


def count(
    table: str,
    column: str,
    shard_count: int,
    shards: list[int] | tuple[int, ...],
    database: str | None = None,
) -> None:
    """Count rows written with these shard values, once :func:`counting` said yes
    (``database``: the ``db.namespace`` written to, :func:`database_of`)."""
    key = (database, table, column)
    window = _windows.get(key)
    if window is None or window.shards != shard_count:
        with _windows_lock:
            window = _windows.get(key)
            if window is None or window.shards != shard_count:
                window = _windows[key] = _Window(shard_count)
    now = time.monotonic()
    if window.add(shards, now):
        _check(key, window, now)


#: URL -> its db.namespace (computed once per database)
_databases: Memo[Any, str | None] = Memo("telemetry.databases", 512)
_UNKNOWN = object()


def database_of(bind: Any) -> str | None:
    """The ``db.namespace`` of the database behind a Connection or Engine (cached)."""
    engine = getattr(bind, "engine", bind)
    url = getattr(engine, "url", None)
    try:
        known = _databases.get(url, _UNKNOWN)
    except TypeError:  # an unhashable URL of some other library: not kept
        known, url = _UNKNOWN, _UNKNOWN
    if known is not _UNKNOWN:
        return known  # type: ignore[return-value]
    from sharded_orm.telemetry.conventions import database_attributes

    found = database_attributes(bind, "", None).get("db.namespace")
    if url is not _UNKNOWN:
        _databases.put(url, found)
    return found


def _figure(key: tuple[str | None, str, str], window: _Window, now: float) -> SkewFigure:
    database, table, column = key
    totals = window.totals(now)
    rows = sum(totals.values())
    if totals:
        shard, busiest = max(totals.items(), key=lambda kv: (kv[1], -kv[0]))
    else:
        shard, busiest = None, 0
    skew = busiest * window.shards / rows if rows else 0.0
    return SkewFigure(
        table, column, window.shards, rows, busiest, shard, skew, SKEW_WINDOW, database
    )


def skewed(figure: SkewFigure) -> bool:
    """The documented rule: the busiest shard holds more than ``WARN_SKEW`` times its
    share, over at least ``WARN_ROWS_PER_SHARD`` rows per shard or ``WARN_BUSIEST_ROWS``
    rows in the busiest shard."""
    return (
        figure.shards > 1
        and figure.skew > WARN_SKEW
        and (
            figure.rows >= WARN_ROWS_PER_SHARD * figure.shards
            or figure.busiest >= WARN_BUSIEST_ROWS
        )
    )


def _check(key: tuple[str | None, str, str], window: _Window, now: float) -> None:
    """Warn, once per window per database and table, when the rule fires."""
    if now - window.warned < SKEW_WINDOW:
        return
    figure = _figure(key, window, now)
    if not skewed(figure):
        return
    with window.lock:
        if now - window.warned < SKEW_WINDOW:
            return
        window.warned = now
    with _windows_lock:  # the table's other shard columns wait a window too
        for (database, table, _), other in _windows.items():
            if (database, table) == key[:2]:
                other.warned = max(other.warned, now)
    _warn(figure)


def _warn(f: SkewFigure) -> None:
    where = f"table {f.table!r}" + (f" of database {f.database!r}" if f.database else "")
    logger.warning(
        "write skew on %s: shard %s of shard column %r took %s of the %s rows written in "
        "the last %g s, %.1fx its share of %d shards (the rule: over %gx). Writes that pile "
        "on one shard become a Spanner hotspot. Run `sharded-orm doctor` to see whether "
        "Spanner reports a hot split, and `sharded-orm advise` on a sample of the table's "
        "rows for a shard count or shard key that spreads them.",
        where, f.busiest_shard, f.column, f"{f.busiest:,}", f"{f.rows:,}", f.window,
        f.skew, f.shards, WARN_SKEW,
        extra={"sharded_orm_skew": f},
    )  # fmt: skip
    trace = api.trace_module()
    if trace is None:
        return
    span = trace.get_current_span()
    if span.is_recording():
        attrs: dict[str, Any] = {
            "db.collection.name": f.table,
            "sharded_orm.shard.column": f.column,
            "sharded_orm.shard": -1 if f.busiest_shard is None else f.busiest_shard,
            "sharded_orm.shard.skew": round(f.skew, 3),
            "sharded_orm.shard.window_rows": f.rows,
            "sharded_orm.shard.busiest_rows": f.busiest,
        }
        if f.database:
            attrs["db.namespace"] = f.database
        span.add_event("sharded_orm.write_skew", attrs)


def rows_written(
    table: str,
    column: str,
    shard_count: int,
    shards: Iterable[int],
    database: str | None = None,
) -> None:
    """Count rows written to ``table`` with these values of shard column ``column``."""
    if counting():
        count(
            table,
            column,
            shard_count,
            shards if isinstance(shards, (list, tuple)) else list(shards),
            database,
        )


def write_skew() -> list[SkewFigure]:
    """Each tracked shard column's writes over the window, busiest skew first."""
    now = time.monotonic()
    with _windows_lock:
        windows = list(_windows.items())
    out = [_figure(key, window, now) for key, window in windows]
    return sorted(out, key=lambda f: -f.skew)


def _attributes(database: str | None, table: str, column: str) -> dict[str, str]:
    attrs = {"db.collection.name": table, "sharded_orm.shard.column": column}
    if database:
        attrs["db.namespace"] = database
    return attrs


def _observed(values: Iterable[tuple[str | None, str, str, float]]) -> list[Any]:
    """``(database, table, column, value)`` as observations, attributed as every figure
    here is."""
    from opentelemetry.metrics import Observation

    return [
        Observation(value, _attributes(database, table, column))
        for database, table, column, value in values
    ]


def _observe_written(options: Any) -> list[Any]:
    with _windows_lock:
        windows = list(_windows.items())
    return _observed((*key, window.total) for key, window in windows)


def _observe_skew(options: Any) -> list[Any]:
    return _observed((f.database, f.table, f.column, f.skew) for f in write_skew())


def _observe_rate(options: Any) -> list[Any]:
    return _observed((f.database, f.table, f.column, f.busiest_rate) for f in write_skew())


def _observe_rows(options: Any) -> list[Any]:
    return _observed((f.database, f.table, f.column, f.rows) for f in write_skew())


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
