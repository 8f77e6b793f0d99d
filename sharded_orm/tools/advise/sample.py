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

Before the layout is chosen, :func:`probe` reads a few rows of the key columns whose role
their values decide (``layout.held_roles``): a UUID or text key filled by an app's helper.
It reads the newest rows by the table's time column: an app that changed its id scheme
(random UUIDv4 to UUIDv7, a sequence to random ids) is judged by the ids it writes now.
"""

from __future__ import annotations

import csv
import datetime as dt
import heapq
import io
import itertools
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import types as sqltypes

from sharded_orm.checks import check_positive_int, quote_identifier
from sharded_orm.errors import ShardConfigError, ShardTypeError, ShardValueError
from sharded_orm.read.plan import EMULATOR_NULL_FILTER_HINT
from sharded_orm.schema.coerce import base_type
from sharded_orm.tools.advise.layout import Held, Layout, SeveralGrow, layout_of, value_columns
from sharded_orm.tools.doctor.keys import parse_timestamp, role_of
from sharded_orm.tools.lint import index_parts

#: the most rows a sample keeps (memory and the merge runs stay small)
MAX_ROWS = 200_000
#: the largest CSV read
MAX_FILE_BYTES = 256 << 20
#: standard deviations of a window's Poisson noise taken off the busiest window's count
BURST_NOISE = 2.0
#: rows :func:`probe` reads to tell what the key columns' values are
PROBE_ROWS = 1000

#: a CSV record kept: the line it ends on, its time parsed (None: empty), its text
_Record = tuple[int, Any, dict[str, str]]


@dataclass
class Sample:
    """Rows (by column name, the layout's columns), oldest first, and the write rate."""

    rows: list[dict[str, Any]]
    rows_per_second: float  # the rate sized for: the busiest window's, at least the mean
    source: str
    #: the mean rate over the rows' time span (None: the rate was given, not measured)
    mean_rows_per_second: float | None = None
    window: float | None = None  # seconds of the busiest window measured
    #: where the busiest window starts, and the rows in it (None: no window measured)
    window_start: dt.datetime | dt.date | None = None
    window_rows: int | None = None
    #: the columns whose datetimes came without a timezone (read as UTC instants)
    naive: tuple[str, ...] = ()

    @property
    def window_end(self) -> dt.datetime | dt.date | None:
        if self.window_start is None or self.window is None:
            return None
        return self.window_start + dt.timedelta(seconds=self.window)


def _needed(layout: Layout) -> list[sa.Column[Any]]:
    names = {p for p, _ in layout.parts} | {c.name for c in layout.shard.sources}
    names |= {c.name for c in layout.table.primary_key.columns} | set(layout.checked)
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


@dataclass(frozen=True)
class _Rates:
    mean: float  # over the rows' span
    rate: float  # the busiest window's, less its noise, at least the mean
    start: float | None = None  # seconds from the first row to the busiest window's start
    rows: int = 0  # rows in the busiest window


def _rates(seconds: list[float], window: float | None) -> _Rates:
    """The mean rate of rows at ``seconds`` (sorted) and the rate of their busiest
    ``window`` (less its noise, at least the mean); 0 when they span no time."""
    if len(seconds) < 2 or seconds[-1] <= 0:
        return _Rates(0.0, 0.0)
    span = seconds[-1]
    mean = len(seconds) / span
    if window is None or span <= window:
        return _Rates(mean, mean)
    busiest, start, j = 0, 0.0, 0
    for i, t in enumerate(seconds):  # the most rows in any [t - window, t]
        while t - seconds[j] > window:
            j += 1
        if i - j + 1 > busiest:
            busiest, start = i - j + 1, seconds[j]
    burst = (busiest - BURST_NOISE * math.sqrt(busiest)) / window
    return _Rates(mean, max(mean, burst), start, busiest)


def _naive(rows: list[dict[str, Any]], cols: list[sa.Column[Any]]) -> tuple[str, ...]:
    """The columns of ``rows`` holding datetimes without a timezone."""
    return tuple(
        c.name
        for c in cols
        if any(isinstance(r[c.name], dt.datetime) and r[c.name].tzinfo is None for r in rows)
    )


#: an RFC 3339 / ISO 8601 time that says its zone (Z or an offset) at its end
_ZONED = re.compile(r"[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?\s*(Z|[+-]\d{2}(:?\d{2})?)\s*$", re.I)


def _parse(column: sa.Column[Any], text: str, where: str) -> Any:
    """CSV text as the column's value (by its SQL type: a TypeDecorator by what it wraps)."""
    t = base_type(column.type)
    kinds: list[tuple[type[Any], Any]] = [
        # the instant, in UTC: the hash of an offset's wall time is refused where a
        # database drops the offset (SQLite's DateTime), and the instant is what is sized
        (sqltypes.DateTime, lambda v: parse_timestamp(v).astimezone(dt.timezone.utc)),
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
              empty: str = "", naive: Iterable[str] = ()) -> Sample:  # fmt: skip
    """The sample of ``rows``; its rate: ``rows_per_second``, else the busiest ``window``
    seconds of their time span (see the module). ``empty``: what to do when there are none;
    ``naive``: columns whose datetimes came without a timezone and were made UTC (a CSV's)."""
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
    # the rows' time: the growing part's, else (a key that grows by its values, a UUIDv7)
    # a time part of the key space
    times = [n for n in (layout.growing, *(p for p, _ in layout.parts)) if n]
    grow = next((n for n in times if any(isinstance(r[n], dt.date) for r in out)), None)
    grow = grow or layout.growing
    if grow and all(isinstance(r[grow], (dt.datetime, dt.date)) for r in out):
        try:
            out.sort(key=lambda r: r[grow])
        except TypeError:
            raise ShardValueError(
                f"{source}: {grow} holds naive and timezone-aware datetimes together: give "
                "them all with a timezone (or all without)"
            ) from None
    seen = set(naive) | set(_naive(out, cols))
    naive_cols = tuple(c.name for c in cols if c.name in seen)
    if rows_per_second is not None:
        return Sample(out, float(rows_per_second), source, naive=naive_cols)
    rates = _rates(_seconds(out, grow), window)
    if rates.rate <= 0:
        raise ShardConfigError(
            f"{source}: the rows span no time ({grow or 'no time column'}), so "
            "their write rate is unknown: give rows_per_second= (--sample-rate)"
        )
    if window is None or rates.start is None or grow is None:
        return Sample(out, rates.rate, source, rates.mean, naive=naive_cols)
    first = min(row[grow] for row in out if row[grow] is not None)
    start = first + dt.timedelta(seconds=rates.start)
    return Sample(out, rates.rate, source, rates.mean, window, start, rates.rows, naive_cols)


def from_csv(layout: Layout, path: str | Path, rows_per_second: float | None = None,
             window: float | None = None, limit: int = MAX_ROWS) -> Sample:  # fmt: skip
    """The sample of the CSV file ``path`` (a header of column names): its ``limit``
    records with the greatest times by the layout's time column (:func:`csv_time`), the
    file streamed once with at most ``limit`` kept, in whatever order it is (an export is
    usually oldest first: its first records would be its oldest); without such a column,
    its first ``limit`` records. A file of more says so in the sample's ``source``. A named
    pipe (``--csv <(zcat events.csv.gz)``) is read as a file is."""
    p, limit = Path(path), check_positive_int(limit, "limit")
    kept = _csv_kept(p, csv_time(layout), limit)
    return _csv_sample(layout, p, kept, limit, rows_per_second, window)


def _csv_sample(layout: Layout, p: Path, kept: _Kept, limit: int,
                rows_per_second: float | None, window: float | None) -> Sample:  # fmt: skip
    """The sample of ``layout`` from the records one pass over the CSV file ``p`` kept (by
    the layout's time column, newest first, or the file's first): its newest ``limit``."""
    cols = {c.name: c for c in _needed(layout)}
    # a time without a zone is read as UTC (parse_timestamp): the advice says so
    times = [k for k, c in cols.items() if isinstance(base_type(c.type), sqltypes.DateTime)]
    naive: set[str] = set()
    time = csv_time(layout)
    records = kept.records[:limit]
    if time is not None:
        records.reverse()  # oldest first, as a sample's rows are
    rows = []
    for line, when, raw in records:
        where = f"{str(p)!r} line {line}"
        row = {
            k: _parse(c, raw[k], where)
            for k, c in cols.items()
            if k in raw and (time is None or k != time.name)
        }
        if time is not None and time.name in raw:
            row[time.name] = when if when is not None else _parse(time, raw[time.name], where)
        rows.append(row)
        naive.update(k for k in times if raw.get(k) and not _ZONED.search(raw[k]))
    name = repr(str(p))
    if kept.total > len(records):
        name += (
            f" (cut to its newest {len(records):,} of {kept.total:,} records, by {kept.by})"
            if kept.by is not None
            else f" (cut to its first {len(records):,} of {kept.total:,} records: no time "
            "column to find the newest by)"
        )
    return from_rows(layout, rows, name, rows_per_second, window, naive=naive)


def csv_time(layout: Layout) -> sa.Column[Any] | None:
    """The column a CSV sample of ``layout`` is ordered by: the growing part where it is a
    time (a ``DateTime`` or ``Date``), else the first time part of the key space; None
    where the key space has none."""
    cols = {c.name: c for c in _needed(layout)}
    for name in (layout.growing, *(p for p, _ in layout.parts)):
        col = cols.get(name) if name else None
        if col is not None and isinstance(base_type(col.type), (sqltypes.DateTime, sqltypes.Date)):
            return col
    return None


def _csv_records(p: Path, limit: int) -> list[dict[str, str]]:
    """The first ``limit`` records of the CSV file ``p`` as text by its header's names."""
    return [raw for _, raw in itertools.islice(_csv_numbered(p), limit)]


def _csv_numbered(p: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """The records of the CSV file ``p`` as text by its header's names, one at a time,
    each with the line it ends on (a file, or a named pipe, of at most ``MAX_FILE_BYTES``);
    a malformed record or file refused, saying where."""
    if not (p.is_file() or p.is_fifo()):
        raise ShardConfigError(f"no such file: {str(p)!r} (give a CSV of the table's rows)")
    if p.stat().st_size > MAX_FILE_BYTES:  # a pipe's size is unknown: counted as it is read
        _too_big(p, p.stat().st_size)
    try:
        with (
            p.open("rb", buffering=0) as raw,
            io.TextIOWrapper(
                io.BufferedReader(_Capped(raw, p)), encoding="utf-8-sig", newline=""
            ) as f,
        ):
            reader = csv.DictReader(f)
            for row in reader:
                line = reader.line_num  # the physical line: blank ones are skipped
                if None in row or None in row.values():
                    raise ShardValueError(
                        f"{str(p)!r} line {line}: a different number of fields than the header "
                        "(a truncated or edited file?)"
                    )
                yield line, row
    except UnicodeDecodeError as exc:
        raise ShardValueError(
            f"{str(p)!r} is not UTF-8 text (offset {exc.start}): export the rows as UTF-8 CSV"
        ) from None
    except csv.Error as exc:
        raise ShardValueError(f"{str(p)!r} is not a readable CSV file: {exc}") from None


def _too_big(p: Path, size: int, at_least: bool = False) -> None:
    raise ShardValueError(
        f"{str(p)!r} is {'more than ' if at_least else ''}{size:,} bytes, more than advise "
        f"reads ({MAX_FILE_BYTES:,}): a sample of {MAX_ROWS:,} rows is enough"
    )


class _Capped(io.RawIOBase):
    """The bytes of ``raw`` (the file ``p``), refused past ``MAX_FILE_BYTES``: a pipe's
    size is known only once read (counted per chunk read, not per record)."""

    def __init__(self, raw: io.RawIOBase, p: Path) -> None:
        super().__init__()
        self._raw, self._p, self._read = raw, p, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        n = self._raw.readinto(buffer)
        self._read += n or 0
        if self._read > MAX_FILE_BYTES:
            _too_big(self._p, MAX_FILE_BYTES, at_least=True)
        return n


def from_engine(
    layout: Layout,
    engine: Any,
    size: int = 20_000,
    rows_per_second: float | None = None,
    window: float | None = None,
) -> Sample:
    """The newest ``size`` rows of the table (by its growing column), read from ``engine``:
    one statement, ``ORDER BY <growing> DESC LIMIT size``, never the whole table. On
    Spanner, where the growing column is an index's, the read goes through that index
    (``@{FORCE_INDEX=...}``): Spanner would otherwise scan and sort the base table."""
    named = _engine_rows(layout, engine, min(size, MAX_ROWS), rows_per_second)
    return _engine_sample(layout, named, rows_per_second, window)


def _engine_rows(layout: Layout, engine: Any, limit: int, rows_per_second: float | None,
                 also: Iterable[str] = ()) -> list[dict[str, Any]]:  # fmt: skip
    """:func:`from_engine`'s read of the newest ``limit`` rows, by column name: the columns
    the layout needs and those named ``also``."""
    t = layout.table
    names = {c.name for c in _needed(layout)} | set(also)
    cols = [t.c[c.key] for c in t.columns if c.name in names]
    stmt = sa.select(*cols)
    if layout.growing:
        newest = next(c for c in t.columns if c.name == layout.growing)  # by name: keys differ
        stmt = stmt.order_by(newest.desc())
        if layout.index is not None:
            stmt = _through_index(stmt, t, layout.index, engine.dialect)
    elif rows_per_second is None:
        raise ShardConfigError(
            f"{t.name}: the key space sized has no time-ordered part, so neither its newest "
            "rows nor their rate can be read: give the rate (rows_per_second=, --sample-rate)"
        )
    with engine.connect() as conn:  # by position: a result names a column by its name
        result = conn.execute(stmt.limit(limit))
        return [{c.name: v for c, v in zip(cols, r, strict=True)} for r in result]


def _engine_sample(layout: Layout, named: list[dict[str, Any]], rows_per_second: float | None,
                   window: float | None) -> Sample:  # fmt: skip
    """The sample of ``layout`` from the rows :func:`_engine_rows` read."""
    t = layout.table
    empty = (
        f"table {t.name} is empty. advise learns the count from the table's recent writes: "
        "run it once the table has rows (an hour of traffic is plenty), or give the writes "
        "you expect: a CSV of rows (--csv) or a workload (--rows-per-second, --duration)"
    )
    return from_rows(layout, named, f"{t.name} in the database", rows_per_second, window, empty)


#: the dialect name a table hint is given for (the stock Spanner dialect and ours render it)
_SPANNER_HINTS = "spanner+spanner"


def _through_index(
    stmt: sa.Select[Any], table: sa.Table, index: str, dialect: Any
) -> sa.Select[Any]:
    """``stmt`` read through ``table``'s index ``index`` on Spanner: its name quoted into
    the ``FORCE_INDEX`` hint; a NULL_FILTERED index's nullable parts filtered to NOT NULL
    (the rows it holds), with the hint the emulator needs to use it (Spanner ignores that
    one). Elsewhere ``stmt`` as it is."""
    if not str(getattr(dialect, "name", "")).startswith("spanner"):
        return stmt
    hint = f"FORCE_INDEX={quote_identifier(dialect, index, 'index name')}"
    ix = next((i for i in table.indexes if i.name == index), None)
    if ix is not None and ix.dialect_kwargs.get("spanner_null_filtered"):
        nullable = [table.c[c.key] for c in ix.columns if isinstance(c, sa.Column) and c.nullable]
        stmt = stmt.where(*[c.is_not(None) for c in nullable])
        hint += f", {EMULATOR_NULL_FILTER_HINT}"
    return stmt.with_hint(table, f"@{{{hint}}}", _SPANNER_HINTS)


#: the share of a column's steps (row to next row, oldest first) that go one way for its
#: values to grow (or shrink) with time: a counter's all do, a random or bit-reversed id's half
GROWS_WITH_TIME = 0.9


def grows_with_time(sample: Sample, layout: Layout, name: str) -> tuple[bool, str]:
    """Whether column ``name``'s values grow (or shrink) with the layout's growing time in
    ``sample`` (its rows oldest first), and the figures that say so. Too few steps to
    tell: taken as growing."""
    values = [r[name] for r in sample.rows if r.get(name) is not None]
    ups = sum(1 for a, b in itertools.pairwise(values) if b > a)
    downs = sum(1 for a, b in itertools.pairwise(values) if b < a)
    steps = ups + downs
    if steps < 10:
        return True, f"too few rows with {name} to tell ({steps} steps)"
    share = max(ups, downs) / steps
    why = (
        f"{share:.0%} of its values {'above' if ups >= downs else 'below'} the one written "
        f"before them, over {steps:,} rows of the sample by {layout.growing}"
    )
    return share >= GROWS_WITH_TIME, why


def from_workload(layout: Layout, workload: Any, size: int = 20_000) -> Sample:
    from sharded_orm.tools.simulate import sample_rows

    n = min(size, workload.rows, MAX_ROWS)
    rows = sample_rows(layout.table, workload, n)
    return from_rows(layout, rows, "the simulate workload", workload.rows_per_second)


def without_flat_counters(
    several: SeveralGrow, model: Any, shard_on: Any, index: str | None,
    read: Callable[[Layout], Sample], held: tuple[Held, ...] = (),
) -> tuple[Layout, Sample] | None:  # fmt: skip
    """Where several key spaces grow only because an integer column is taken for a counter
    by its name (an ``id`` beside a time index): the layout without those, its sample
    read, when the sample shows none of them grows with time (a random or bit-reversed
    id); else refused as before, saying which grows. None: no such column to check."""
    if not several.guessed:
        return None
    guess = tuple((name, "") for name in several.guessed)
    try:
        layout = layout_of(model, shard_on=shard_on, index=index, flat=guess, held=held)
    except ShardConfigError:  # still several (two times), or none: the first answer holds
        return None
    if layout.growing is None or layout.growing in several.guessed:
        return None
    data = read(replace(layout, checked=several.guessed))
    seen = [(name, *grows_with_time(data, layout, name)) for name in several.guessed]
    grows = [(name, why) for name, up, why in seen if up]
    if grows:
        raise ShardConfigError(
            f"{several} ({'; '.join(f'{n} grows with time: {why}' for n, why in grows)})"
        )
    return replace(layout, checked=several.guessed, flat=tuple((n, w) for n, _, w in seen)), data


def source(sample: Any) -> tuple[str, Any]:
    """What ``sample`` is (``workload``, ``csv``, ``engine`` or ``rows``) and the sample to
    read, a one-shot iterable of rows made a list (it is read twice: :func:`probe`, then
    the sample)."""
    from sharded_orm.tools.simulate import Workload

    if isinstance(sample, Workload):
        return "workload", sample
    if isinstance(sample, (str, Path)):
        if "://" in str(sample):
            raise ShardConfigError(
                f"{str(sample)!r} is a URL: advise takes an Engine (create_engine(url)) or, on "
                "the command line, --url"
            )
        return "csv", sample
    if hasattr(sample, "connect") and hasattr(sample, "dialect"):
        return "engine", sample
    if isinstance(sample, (list, tuple)):
        return "rows", sample
    if hasattr(sample, "__iter__"):
        return "rows", list(itertools.islice(sample, MAX_ROWS))
    raise ShardTypeError(
        "sample must be a simulate Workload, an Engine, a CSV path or an iterable of dicts "
        f"keyed by column name; got {sample!r}"
    )


def read(layout: Layout, kind: str, sample: Any, rows_per_second: float | None, size: int,
         window: float) -> Sample:  # fmt: skip
    """The sample of ``layout`` from ``sample`` (of :func:`source`'s ``kind``)."""
    if kind == "workload":
        return from_workload(layout, sample, size)
    if kind == "csv":
        return from_csv(layout, sample, rows_per_second, window)
    if kind == "engine":
        return from_engine(layout, sample, size, rows_per_second=rows_per_second, window=window)
    return from_rows(layout, sample, "the rows given", rows_per_second, window)


def probe_order(table: sa.Table, layout: Layout | None = None) -> tuple[str, str | None] | None:
    """The time column :func:`probe` reads the newest rows by, and the index it reads them
    through (None: the table), by name: the growing part of ``layout`` (the layout as the
    model declares it, before the values decide) where that is a time column, the read
    :func:`from_engine` makes; else the first time part of ``table``'s key, then of its
    indexes (by name). None: no key or index has a time part, so the newest rows cannot be
    read without a scan and sort of the whole table."""
    if layout is not None and layout.growing is not None:
        col = next((c for c in table.columns if c.name == layout.growing), None)
        if col is not None and role_of(col) == "time":
            return col.name, layout.index
    spaces: list[tuple[str | None, list[sa.Column[Any]]]] = [
        (None, list(table.primary_key.columns))
    ]
    for ix in sorted(table.indexes, key=lambda i: str(i.name)):
        try:
            spaces.append((str(ix.name), [c for c, _ in index_parts(ix)]))
        except ShardConfigError:  # a part that is an expression
            continue
    for index, parts in spaces:
        for c in parts:
            if role_of(c) == "time":
                return c.name, index
    return None


def _instant(value: Any) -> dt.datetime | None:
    """``value`` as an instant to order rows by (a naive datetime taken as UTC, a date as
    its midnight UTC), or None (no time: such rows count as the oldest)."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.timezone.utc)
    return None


_OLDEST = dt.datetime.min.replace(tzinfo=dt.timezone.utc)
_Row = TypeVar("_Row")


def _newest(items: Iterable[tuple[Any, _Row]], n: int) -> list[_Row]:
    """The ``n`` rows of ``items`` ((time, row) pairs) with the greatest times, newest
    first, read one at a time with at most ``n`` kept; between equal times the later row
    is taken as the newer (a file appended to in time order)."""
    kept: list[tuple[dt.datetime, int, _Row]] = []
    for i, (when, row) in enumerate(items):
        key = (_instant(when) or _OLDEST, i)
        if len(kept) < n:
            heapq.heappush(kept, (*key, row))
        elif key > kept[0][:2]:
            heapq.heapreplace(kept, (*key, row))
    return [row for *_, row in sorted(kept, key=lambda k: k[:2], reverse=True)]


@dataclass(frozen=True)
class _Kept:
    """What one pass over a CSV file kept: ``records``, its ``n`` newest by the time column
    ``by``, newest first, or (``by`` None: no time column asked for, or none in its header)
    its first ``n``, in its order; ``total``, how many records it has."""

    records: list[_Record]
    total: int
    by: str | None
    header: frozenset[str] = frozenset()


def _csv_kept(p: Path, time: sa.Column[Any] | None, n: int) -> _Kept:
    """One pass over the CSV file ``p``: its ``n`` records with the greatest ``time``
    (parsed as the sample parses it; an empty one counts as the oldest), the file streamed
    with at most ``n`` kept; its first ``n`` where ``time`` is None or not in its header."""
    records = _csv_numbered(p)
    first = next(records, None)
    if first is None:
        return _Kept([], 0, None)
    header = frozenset(first[1])
    if time is None or time.name not in header:
        head = [first, *itertools.islice(records, n - 1)]
        total = len(head) + sum(1 for _ in records)
        return _Kept([(line, None, raw) for line, raw in head], total, None, header)
    seen = 0

    def timed() -> Iterator[tuple[Any, _Record]]:
        nonlocal seen
        for line, raw in itertools.chain([first], records):
            seen += 1
            text = raw[time.name]
            when = _parse(time, text, f"{str(p)!r} line {line}") if text.strip() else None
            yield when, (line, when, raw)

    return _Kept(_newest(timed(), n), seen, time.name, header)


def probe(
    table: sa.Table, kind: str, sample: Any, layout: Layout | None = None
) -> list[dict[str, Any]]:
    """Up to ``PROBE_ROWS`` rows of ``table``'s key columns whose role their values decide
    (``layout.value_columns``), from ``sample`` (of :func:`source`'s ``kind``): the newest,
    by the time column :func:`probe_order` gives (``layout``: the model's layout before the
    values decide, where it has one), so that ids an app writes now decide, not the ones
    it wrote before changing its id scheme.

    The database's: one statement, ``ORDER BY <time> DESC LIMIT``, through the time
    index on Spanner as :func:`from_engine` reads (``@{FORCE_INDEX=...}``). A CSV's: the
    records with the greatest times, the whole file streamed with ``PROBE_ROWS`` kept
    (its order is not trusted); the rows given: those with the greatest times. A record
    without a time counts as the oldest. Where no key or index has a time part, there is
    no cheap way to the newest rows (the database would scan and sort the whole table):
    the database's any ``PROBE_ROWS`` rows, a CSV's first records, the first rows given.
    A workload's rows are made from the declared roles: they show nothing else (none)."""
    cols = value_columns(table)
    if not cols or kind == "workload":
        return []
    order = probe_order(table, layout)
    if kind == "csv":
        if order is None:
            return [dict(r) for r in _csv_records(Path(sample), PROBE_ROWS)]
        time = next(c for c in table.columns if c.name == order[0])
        return [dict(raw) for _, _, raw in _csv_kept(Path(sample), time, PROBE_ROWS).records]
    if kind == "engine":
        stmt = sa.select(*[table.c[c.key] for c in cols])
        if order is not None:
            name, index = order
            stmt = stmt.order_by(next(c for c in table.columns if c.name == name).desc())
            if index is not None:
                stmt = _through_index(stmt, table, index, sample.dialect)
        with sample.connect() as conn:
            result = conn.execute(stmt.limit(PROBE_ROWS))
            return [dict(zip([c.name for c in cols], r, strict=True)) for r in result]
    given = (dict(r) for r in sample if isinstance(r, Mapping))
    if order is None:
        return list(itertools.islice(given, PROBE_ROWS))
    return _newest(((r.get(order[0]), r) for r in given), PROBE_ROWS)


class SampleReader:
    """``advise``'s sample, read once where it can be: :meth:`probe`, the newest rows of the
    key columns whose role their values decide (:func:`probe`), then :meth:`read`, the
    sample of the layout those values decide (:func:`read`).

    A CSV is streamed once: the pass keeps the newest ``limit`` records by the probe's
    time column (:func:`probe_order`; its first records where there is none); the probe is
    the newest ``PROBE_ROWS`` of them, and the sample the records kept where the layout
    the values decide is ordered by the same column (:func:`csv_time`), as it is unless
    the values move the layout to a key space with another time column. A database is
    read once where the model's declared layout reads its newest rows by the probe's time
    column (its growing part is that time, through the same index) and the values leave
    that read as it is: the probe is then the newest rows of the sample itself. Elsewhere
    the two reads are made as :func:`probe` and :func:`read` make them."""

    def __init__(self, table: sa.Table, kind: str, sample: Any, declared: Layout | None,
                 rows_per_second: float | None, size: int, window: float,
                 limit: int = MAX_ROWS) -> None:  # fmt: skip
        self.table, self.kind, self.sample, self.declared = table, kind, sample, declared
        self.rows_per_second, self.size, self.window = rows_per_second, size, window
        self.limit = check_positive_int(limit, "limit")  # the most records a CSV's sample keeps
        self._kept: _Kept | None = None  # a CSV's one pass
        #: the database's one read: the layout it was read for, its rows, their columns
        self._rows: tuple[Layout, list[dict[str, Any]], frozenset[str]] | None = None

    def probe(self) -> list[dict[str, Any]]:
        """:func:`probe`'s rows, from the read the sample is then taken from where it can be."""
        cols = value_columns(self.table)
        if not cols or self.kind not in ("csv", "engine"):
            return probe(self.table, self.kind, self.sample, self.declared)
        names = [c.name for c in cols]
        order = probe_order(self.table, self.declared)
        if self.kind == "csv":
            time = next((c for c in self.table.columns if order and c.name == order[0]), None)
            self._kept = _csv_kept(Path(self.sample), time, max(self.limit, PROBE_ROWS))
            return [dict(raw) for _, _, raw in self._kept.records[:PROBE_ROWS]]
        lay = self.declared
        if lay is None or lay.growing is None or order != (lay.growing, lay.index):
            return probe(self.table, self.kind, self.sample, self.declared)
        limit = max(min(self.size, MAX_ROWS), PROBE_ROWS)
        rows = _engine_rows(lay, self.sample, limit, self.rows_per_second, also=names)
        columns = frozenset(c.name for c in _needed(lay)) | frozenset(names)
        self._rows = (lay, rows, columns)
        return [{n: r[n] for n in names} for r in rows[:PROBE_ROWS]]

    def read(self, layout: Layout) -> Sample:
        """The sample of ``layout``: from what :meth:`probe` read where it serves, else read."""
        if self._kept is not None:
            time = csv_time(layout)
            want = time.name if time is not None and time.name in self._kept.header else None
            p = Path(self.sample)
            if want == self._kept.by:
                return _csv_sample(layout, p, self._kept, self.limit, self.rows_per_second,
                                   self.window)  # fmt: skip
            # the sample is ordered otherwise than the probe (its key space's time column is
            # another, or it has none: a counter's key probed by a time index's newest):
            # the records it keeps are another set, so the file is read a second time
            if p.is_fifo():
                raise ShardConfigError(
                    f"{str(p)!r} is a pipe, which can be read once: advise read it by "
                    f"{self._kept.by or 'its first records'} for the key columns' values, "
                    f"and they make the sample's order {want or 'its first records'}: save "
                    "it to a file and give that"
                )
        if self._rows is not None:
            lay, rows, columns = self._rows
            same = (layout.growing, layout.index) == (lay.growing, lay.index)
            if same and {c.name for c in _needed(layout)} <= columns:
                size = min(self.size, MAX_ROWS)
                return _engine_sample(layout, rows[:size], self.rows_per_second, self.window)
        if self.kind == "csv":
            return from_csv(layout, self.sample, self.rows_per_second, self.window, self.limit)
        return read(layout, self.kind, self.sample, self.rows_per_second, self.size, self.window)
