"""What ``advise`` learns from: a sample of the rows and the rate they are written at.

From a ``simulate`` Workload (the rows the simulator would write, its rate), rows read
from the database (the newest ``size`` rows of the table, the rate from their time span),
a CSV file (a header of column names), or an iterable of dicts. Only the columns the
layout needs are kept; values are the table's own types (CSV text is parsed by the
column's Python type).

The rate a count is sized for is the busiest ``window`` of the rows' time span (the
instance model's tick), not their mean: writes that come in bursts need the count of
their bursts. A window's count is taken less its Poisson noise (``BURST_NOISE`` standard
deviations, which the busiest of many windows of a steady rate shows anyway, and which
the split model adds again), and never below the mean.
"""

from __future__ import annotations

import csv
import datetime as dt
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import types as sqltypes

from sharded_orm.errors import ShardConfigError, ShardValueError
from sharded_orm.schema.coerce import base_type
from sharded_orm.tools.advise.layout import Layout
from sharded_orm.tools.doctor.keys import parse_timestamp

#: the most rows a sample keeps (memory and the merge runs stay small)
MAX_ROWS = 200_000
#: the largest CSV read
MAX_FILE_BYTES = 256 << 20
#: standard deviations of a window's Poisson noise taken off the busiest window's count
BURST_NOISE = 2.0


@dataclass
class Sample:
    """Rows (by column name, the layout's columns), oldest first, and the write rate."""

    rows: list[dict[str, Any]]
    rows_per_second: float  # the rate sized for: the busiest window's, at least the mean
    source: str
    #: the mean rate over the rows' time span (None: the rate was given, not measured)
    mean_rows_per_second: float | None = None
    window: float | None = None  # seconds of the busiest window measured


def _needed(layout: Layout) -> list[sa.Column[Any]]:
    names = {p for p, _ in layout.parts} | {c.name for c in layout.shard.sources}
    names |= {c.name for c in layout.table.primary_key.columns}
    names.discard(layout.shard.name)
    return [c for c in layout.table.columns if c.name in names]


def _seconds(rows: list[dict[str, Any]], growing: str | None) -> list[float]:
    """The rows' times as seconds from the first, sorted ([] where the growing part is no
    time); naive and aware datetimes are not mixed by a database column."""
    if not growing or len(rows) < 2:
        return []
    values = [r[growing] for r in rows if r.get(growing) is not None]
    if not values or not all(isinstance(v, (dt.datetime, dt.date)) for v in values):
        return []
    values.sort()
    first = values[0]
    try:
        return [(v - first).total_seconds() for v in values]
    except TypeError:  # naive and aware together (a CSV or rows given by hand)
        return []


def _rates(seconds: list[float], window: float | None) -> tuple[float, float]:
    """(mean rate, the rate of the busiest ``window``, less its noise, at least the mean)
    of rows at ``seconds`` (sorted); (0, 0) when they span no time."""
    if len(seconds) < 2 or seconds[-1] <= 0:
        return 0.0, 0.0
    span = seconds[-1]
    mean = len(seconds) / span
    if window is None or span <= window:
        return mean, mean
    busiest, j = 0, 0
    for i, t in enumerate(seconds):  # the most rows in any [t - window, t]
        while t - seconds[j] > window:
            j += 1
        busiest = max(busiest, i - j + 1)
    burst = (busiest - BURST_NOISE * math.sqrt(busiest)) / window
    return mean, max(mean, burst)


def _parse(column: sa.Column[Any], text: str, where: str) -> Any:
    """CSV text as the column's value (by its SQL type: a TypeDecorator by what it wraps)."""
    t = base_type(column.type)
    kinds: list[tuple[type[Any], Any]] = [
        (sqltypes.DateTime, parse_timestamp),
        (sqltypes.Date, dt.date.fromisoformat),
        (sqltypes.Boolean, lambda v: v.strip().lower() in ("1", "true", "t", "yes")),
        (sqltypes.Integer, int),
        (sqltypes.Float, float),
        (sqltypes.Numeric, Decimal),
    ]
    for kind, parse in kinds:
        if isinstance(t, kind):
            try:
                return parse(text)
            except (ValueError, OverflowError, ArithmeticError):
                raise ShardValueError(
                    f"{where}: {text[:40]!r} is not a {kind.__name__} for column {column.name}"
                ) from None
    return text


def from_rows(layout: Layout, rows: Iterable[Mapping[str, Any]], source: str,
              rows_per_second: float | None = None, window: float | None = None,
              empty: str = "") -> Sample:  # fmt: skip
    """The sample of ``rows``; its rate: ``rows_per_second``, else the busiest ``window``
    seconds of their time span (see the module). ``empty``: what to do when there are none."""
    cols = _needed(layout)
    out: list[dict[str, Any]] = []
    for i, r in enumerate(itertools.islice(rows, MAX_ROWS)):
        if not isinstance(r, Mapping):
            raise ShardValueError(f"{source} row {i + 1}: expected a mapping of column names")
        missing = [c.name for c in cols if c.name not in r]
        if missing:
            raise ShardValueError(
                f"{source} row {i + 1}: missing column(s) {', '.join(missing)} (the sample needs "
                f"{', '.join(c.name for c in cols)})"
            )
        out.append({c.name: r[c.name] for c in cols})
    if not out:
        raise ShardValueError(
            f"{source}: no rows to learn from"
            + (f": {empty}" if empty else ": give rows of the table, oldest or newest first")
        )
    grow = layout.growing
    if grow and all(isinstance(r[grow], (dt.datetime, dt.date)) for r in out):
        try:
            out.sort(key=lambda r: r[grow])
        except TypeError:
            raise ShardValueError(
                f"{source}: {grow} holds naive and timezone-aware datetimes together: give "
                "them all with a timezone (or all without)"
            ) from None
    if rows_per_second is not None:
        return Sample(out, float(rows_per_second), source)
    mean, rate = _rates(_seconds(out, grow), window)
    if rate <= 0:
        raise ShardConfigError(
            f"{source}: the rows span no time ({grow or 'no time column'}), so "
            "their write rate is unknown: give rows_per_second= (--sample-rate)"
        )
    measured = window if window is not None and rate > mean else None
    return Sample(out, rate, source, mean, measured)


def from_csv(layout: Layout, path: str | Path, rows_per_second: float | None = None,
             window: float | None = None) -> Sample:  # fmt: skip
    p = Path(path)
    if not p.is_file():
        raise ShardConfigError(f"no such file: {str(p)!r} (give a CSV of the table's rows)")
    if p.stat().st_size > MAX_FILE_BYTES:
        raise ShardValueError(
            f"{str(p)!r} is {p.stat().st_size:,} bytes, more than advise reads "
            f"({MAX_FILE_BYTES:,}): a sample of {MAX_ROWS:,} rows is enough"
        )
    cols = {c.name: c for c in _needed(layout)}
    try:
        with p.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            rows = []
            for i, raw in enumerate(itertools.islice(reader, MAX_ROWS)):
                if None in raw or None in raw.values():
                    raise ShardValueError(
                        f"{str(p)!r} line {i + 2}: a different number of fields than the header "
                        "(a truncated or edited file?)"
                    )
                where = f"{str(p)!r} line {i + 2}"
                rows.append({k: _parse(c, raw[k], where) for k, c in cols.items() if k in raw})
    except UnicodeDecodeError as exc:
        raise ShardValueError(
            f"{str(p)!r} is not UTF-8 text (offset {exc.start}): export the rows as UTF-8 CSV"
        ) from None
    except csv.Error as exc:
        raise ShardValueError(f"{str(p)!r} is not a readable CSV file: {exc}") from None
    return from_rows(layout, rows, repr(str(p)), rows_per_second, window)


def from_engine(
    layout: Layout,
    engine: Any,
    size: int = 20_000,
    rows_per_second: float | None = None,
    window: float | None = None,
) -> Sample:
    """The newest ``size`` rows of the table (by its growing column), read from ``engine``:
    one statement, ``ORDER BY <growing> DESC LIMIT size``, never the whole table."""
    t = layout.table
    cols = [t.c[c.key] for c in _needed(layout)]
    stmt = sa.select(*cols)
    if layout.growing:
        newest = next(c for c in t.columns if c.name == layout.growing)  # by name: keys differ
        stmt = stmt.order_by(newest.desc())
    elif rows_per_second is None:
        raise ShardConfigError(
            f"{t.name}: the key space sized has no time-ordered part, so neither its newest "
            "rows nor their rate can be read: give the rate (rows_per_second=, --sample-rate)"
        )
    with engine.connect() as conn:  # by position: a result names a column by its name
        result = conn.execute(stmt.limit(min(size, MAX_ROWS)))
        named = [{c.name: v for c, v in zip(cols, r, strict=True)} for r in result]
    empty = (
        f"table {t.name} is empty. advise learns the count from the table's recent writes: "
        "run it once the table has rows (an hour of traffic is plenty), or give the writes "
        "you expect: a CSV of rows (--csv) or a workload (--rows-per-second, --duration)"
    )
    return from_rows(layout, named, f"{t.name} in the database", rows_per_second, window, empty)


def from_workload(layout: Layout, workload: Any, size: int = 20_000) -> Sample:
    from sharded_orm.tools.simulate import sample_rows

    n = min(size, workload.rows, MAX_ROWS)
    rows = sample_rows(layout.table, workload, n)
    return from_rows(layout, rows, "the simulate workload", workload.rows_per_second)
