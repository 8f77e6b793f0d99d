"""Where split statistics come from: a Spanner database, exported rows, or a file.

Spanner keeps them in ``SPANNER_SYS.SPLIT_STATS_TOP_MINUTE``, ``_10MINUTE`` and ``_HOUR``
(columns ``INTERVAL_END``, ``SPLIT_START``, ``SPLIT_LIMIT``, ``CPU_USAGE_SCORE``,
``AFFECTED_TABLES`` and, in newer versions, ``UNSPLITTABLE_REASONS``). The emulator has
none of them.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sharded_orm.checks import render_url, shown
from sharded_orm.errors import ShardConfigError, ShardingError, ShardTypeError, ShardValueError
from sharded_orm.tools.doctor.exports import REQUIRED, checked_file, rows_from_file
from sharded_orm.tools.doctor.keys import parse_timestamp

VIEWS = {
    "minute": "SPANNER_SYS.SPLIT_STATS_TOP_MINUTE",
    "10minute": "SPANNER_SYS.SPLIT_STATS_TOP_10MINUTE",
    "hour": "SPANNER_SYS.SPLIT_STATS_TOP_HOUR",
}
#: seconds per interval of each view
INTERVAL_SECONDS = {"minute": 60, "10minute": 600, "hour": 3600}
EMULATOR_MESSAGE = (
    "the Spanner emulator has no hot-split statistics (SPANNER_SYS.SPLIT_STATS_TOP_*) and "
    "no load-based splitting: run `sharded-orm simulate` against your models to see where "
    "writes would land, or export the statistics from a real instance (console or `gcloud "
    'spanner databases execute-sql --sql="SELECT * FROM SPANNER_SYS.SPLIT_STATS_TOP_MINUTE" '
    "--format=json`) and pass the file (gcloud's JSON or table, or a CSV) to `sharded-orm "
    "doctor`"
)


class StatisticsUnavailableError(ShardingError):
    """The database has no split statistics to read (the emulator, or not Spanner)."""


@dataclass(frozen=True)
class SplitRow:
    """One row of a split statistics view."""

    interval_end: dt.datetime
    split_start: str
    split_limit: str
    cpu_usage_score: int
    affected_tables: tuple[str, ...] = ()
    unsplittable_reasons: tuple[str, ...] = ()
    #: ``"simulated"`` for rows ``sharded-orm simulate`` predicted (their ``SOURCE`` column)
    source: str = ""


def query_for(window: str, *, reasons: bool = True) -> str:
    """The SQL doctor sends for ``window`` (a fixed text: no identifier comes from input).

    ``reasons=False`` leaves out ``UNSPLITTABLE_REASONS``, which older instances lack.
    """
    extra = ", UNSPLITTABLE_REASONS" if reasons else ""
    return (
        "SELECT INTERVAL_END, SPLIT_START, SPLIT_LIMIT, CPU_USAGE_SCORE, AFFECTED_TABLES"
        f"{extra} FROM {VIEWS[window]} "
        "WHERE INTERVAL_END >= :since ORDER BY INTERVAL_END, CPU_USAGE_SCORE DESC"
    )


def _timestamp(value: Any, where: str) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    if isinstance(value, str):
        try:
            return parse_timestamp(value)
        except ValueError:
            raise ShardValueError(f"{where}: INTERVAL_END {value!r} is not a timestamp") from None
    raise ShardValueError(f"{where}: INTERVAL_END {value!r} is not a timestamp")


_QUOTED = re.compile(r"""\s*('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\s*(?:,|$)""")


def _names(value: Any) -> tuple[str, ...]:
    """An ARRAY<STRING> column as exported: a list (JSON), JSON text (``["a", "b"]``), the
    text gcloud's table prints (``['a', 'b']``), or names separated by commas."""
    if value is None or value == "" or value == "None":
        return ()
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("[") and text.endswith("]"):
            try:
                loaded = json.loads(text)
            except (ValueError, RecursionError):
                inner = text[1:-1]
                quoted = list(_QUOTED.finditer(inner))
                if quoted and quoted[-1].end() == len(inner):
                    return tuple(ast.literal_eval(m.group(1)) for m in quoted)
                text = inner
            else:
                if isinstance(loaded, list):
                    return tuple(str(v) for v in loaded)
        return tuple(p.strip().strip('"') for p in text.split(",") if p.strip())
    return tuple(str(v) for v in value)


#: the documented range of each numeric column (Spanner, "Split statistics": CPU_USAGE_SCORE
#: is an INT64 percentage of the split's load that the server's resources constrain; the
#: views have no other numeric column)
RANGES = {"CPU_USAGE_SCORE": (0, 100)}


def _integer(upper: Mapping[str, Any], column: str, where: str) -> int:
    """``column``'s value as an int within its documented range, or one line naming the row,
    the column, the value and the range."""
    low, high = RANGES[column]
    value = upper[column]
    expect = f"an integer from {low} to {high}"
    try:
        if isinstance(value, bool) or value is None:
            raise ValueError(value)
        number = float(value) if not isinstance(value, int) else value
        if isinstance(number, float):
            if not number.is_integer():
                raise ShardValueError(
                    f"{where}: {column} {value!r} is not an integer: Spanner's {column} is "
                    f"{expect} (a percentage); fix the row or export it again"
                )
            number = int(number)
    except (TypeError, ValueError, OverflowError):
        raise ShardValueError(
            f"{where}: {column} {value!r} is not a number: Spanner's {column} is {expect} "
            "(a percentage); fix the row or export it again"
        ) from None
    if not low <= number <= high:
        raise ShardValueError(
            f"{where}: {column} {value!r} is outside its range {low}-{high}: Spanner's "
            f"{column} is a percentage of the split's load, so this row is not Spanner's "
            "(edited or from another tool): fix the row or export it again"
        )
    return number


def split_row(row: Mapping[str, Any], where: str) -> SplitRow:
    """A dict keyed by the view's column names (any case) as a :class:`SplitRow`."""
    if not isinstance(row, Mapping):
        raise ShardTypeError(
            f"{where}: expected a row keyed by column names (a JSON object, a CSV line under "
            f"its header, or a row of `gcloud spanner databases execute-sql --format=json` "
            f"with its metadata), got {shown_value(row)}"
        )
    upper = {str(k).upper(): v for k, v in row.items()}
    missing = [c for c in REQUIRED if c not in upper]
    if missing:
        raise ShardValueError(
            f"{where}: missing column(s) {', '.join(missing)}; rows need the split statistics "
            f"columns {', '.join(REQUIRED)} (and AFFECTED_TABLES, UNSPLITTABLE_REASONS)"
        )
    score = _integer(upper, "CPU_USAGE_SCORE", where)
    return SplitRow(
        _timestamp(upper["INTERVAL_END"], where),
        str(upper["SPLIT_START"]),
        str(upper["SPLIT_LIMIT"]),
        score,
        _names(upper.get("AFFECTED_TABLES")),
        _names(upper.get("UNSPLITTABLE_REASONS")),
        str(upper.get("SOURCE") or ""),
    )


def shown_value(value: Any) -> str:
    """``value`` for an error line: its repr, cut to 120 characters."""
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _is_emulator(engine: Any) -> bool:
    if os.environ.get("SPANNER_EMULATOR_HOST"):
        return True
    return "emulator" in str(getattr(engine, "url", "")).lower()


def rows_from_engine(engine: Any, window: str, since: dt.datetime) -> Iterator[dict[str, Any]]:
    """Read the split statistics view of ``window`` from a Spanner engine, as a stream."""
    from sqlalchemy import text

    from sharded_orm.spanner import is_spanner

    if not is_spanner(engine):
        name = getattr(getattr(engine, "dialect", None), "name", type(engine).__name__)
        raise StatisticsUnavailableError(
            f"doctor reads Spanner's split statistics, but this engine is {name!r} "
            f"({render_url(getattr(engine, 'url', '?'))}): give an engine on Spanner "
            "(spanner+spanner:///projects/P/instances/I/databases/D) or exported rows"
        )
    emulator = _is_emulator(engine)
    count = 0
    try:
        with engine.connect() as conn:
            try:
                result = conn.execute(text(query_for(window)), {"since": since})
            except Exception as exc:
                if "UNSPLITTABLE_REASONS" not in str(getattr(exc, "orig", exc).__cause__ or exc):
                    raise
                conn.rollback()  # an instance from before the column: read without it
                result = conn.execute(text(query_for(window, reasons=False)), {"since": since})
            for r in result:  # streamed: one row at a time
                count += 1
                yield dict(r._mapping)
    except ShardingError:
        raise
    except Exception as exc:
        if emulator:
            raise StatisticsUnavailableError(EMULATOR_MESSAGE) from exc
        raise StatisticsUnavailableError(
            f"cannot read {VIEWS[window]}: {exc}. The split statistics need a real Spanner "
            "database and the spanner.databases.select permission"
        ) from exc
    if not count and emulator:
        raise StatisticsUnavailableError(EMULATOR_MESSAGE)


def load_rows(source: Any, window: str, since: dt.datetime | None) -> Iterator[SplitRow]:
    """Split rows from an engine, a file path, or an iterable of dicts, from ``since`` on:
    checked now, read as they are consumed (``diagnose`` reads them once)."""
    if window not in VIEWS:
        raise ShardConfigError(f"window must be one of {', '.join(VIEWS)}, got {window!r}")
    if hasattr(source, "dialect") and hasattr(source, "connect"):
        start = since or dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=6)
        raw: Iterable[Any] = rows_from_engine(source, window, start)
    elif isinstance(source, (str, Path)):
        text = str(source)
        if "://" in text:
            raise StatisticsUnavailableError(
                f"{shown(text)} is a URL: doctor takes an Engine (sqlalchemy.create_engine(url)) "
                "or, on the command line, a spanner+spanner:// URL"
            )
        checked_file(source)
        raw = rows_from_file(source)
    elif isinstance(source, Iterable) and not isinstance(source, Mapping):
        raw = source
    else:
        raise ShardTypeError(
            "source must be an Engine on Spanner, an iterable of dicts keyed by the split "
            f"statistics columns, or a CSV/JSON file path; got {source!r}"
        )
    where = f"{str(source)!r} row" if isinstance(source, (str, Path)) else "row"
    return _split_rows(raw, where, since)


def _split_rows(raw: Iterable[Any], where: str, since: dt.datetime | None) -> Iterator[SplitRow]:
    for i, r in enumerate(raw):
        row = split_row(r, f"{where} {i + 1}")
        if since is None or row.interval_end >= since:
            yield row
