"""What ``advise`` learns from: a sample of the rows and the rate they are written at.

From a ``simulate`` Workload (the rows the simulator would write, its rate), rows read
from the database (the newest ``size`` rows of the table, the rate from their time span),
a CSV file (a header of column names), or an iterable of dicts. Only the columns the
layout needs are kept; values are the table's own types (CSV text is parsed by the
column's Python type).
"""

from __future__ import annotations

import csv
import datetime as dt
import itertools
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


@dataclass
class Sample:
    """Rows (by column name, the layout's columns), oldest first, and the write rate."""

    rows: list[dict[str, Any]]
    rows_per_second: float
    source: str


def _needed(layout: Layout) -> list[sa.Column[Any]]:
    names = {p for p, _ in layout.parts} | {c.name for c in layout.shard.sources}
    names |= {c.name for c in layout.table.primary_key.columns}
    names.discard(layout.shard.name)
    return [c for c in layout.table.columns if c.name in names]


def _span(rows: list[dict[str, Any]], growing: str | None) -> float:
    if not growing or len(rows) < 2:
        return 0.0
    values = [r[growing] for r in rows if r.get(growing) is not None]
    if not values or not isinstance(values[0], (dt.datetime, dt.date)):
        return 0.0
    span = max(values) - min(values)
    return span.total_seconds() if isinstance(span, dt.timedelta) else 0.0


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
              rows_per_second: float | None = None) -> Sample:  # fmt: skip
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
        raise ShardValueError(f"{source}: no rows to learn from")
    grow = layout.growing
    if grow and all(isinstance(r[grow], (dt.datetime, dt.date)) for r in out):
        out.sort(key=lambda r: r[grow])
    rate = rows_per_second
    if rate is None:
        span = _span(out, layout.growing)
        if span <= 0:
            raise ShardConfigError(
                f"{source}: the rows span no time ({layout.growing or 'no time column'}), so "
                "their write rate is unknown: give rows_per_second= (--rows-per-second)"
            )
        rate = len(out) / span
    return Sample(out, float(rate), source)


def from_csv(layout: Layout, path: str | Path, rows_per_second: float | None = None) -> Sample:
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
    return from_rows(layout, rows, repr(str(p)), rows_per_second)


def from_engine(layout: Layout, engine: Any, size: int = 20_000,
                rows_per_second: float | None = None) -> Sample:  # fmt: skip
    """The newest ``size`` rows of the table (by its growing column), read from ``engine``."""
    t = layout.table
    cols = [t.c[c.key] for c in _needed(layout)]
    stmt = sa.select(*cols)
    if layout.growing:
        stmt = stmt.order_by(t.c[layout.table.columns[layout.growing].key].desc())
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(stmt.limit(min(size, MAX_ROWS)))]
    named = [{c.name: r[c.key] for c in cols} for r in rows]
    return from_rows(layout, named, f"{t.name} in the database", rows_per_second)


def from_workload(layout: Layout, workload: Any, size: int = 20_000) -> Sample:
    from sharded_orm.tools.simulate import sample_rows

    n = min(size, workload.rows, MAX_ROWS)
    rows = sample_rows(layout.table, workload, n)
    return from_rows(layout, rows, "the simulate workload", workload.rows_per_second)
