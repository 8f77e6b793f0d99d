"""Where split statistics come from: a Spanner database, exported rows, or a file.

Spanner keeps them in ``SPANNER_SYS.SPLIT_STATS_TOP_MINUTE``, ``_10MINUTE`` and ``_HOUR``
(columns ``INTERVAL_END``, ``SPLIT_START``, ``SPLIT_LIMIT``, ``CPU_USAGE_SCORE``,
``AFFECTED_TABLES`` and, in newer versions, ``UNSPLITTABLE_REASONS``). The emulator has
none of them.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sharded_orm.checks import render_url, shown
from sharded_orm.errors import ShardConfigError, ShardingError, ShardTypeError, ShardValueError
from sharded_orm.tools.doctor.keys import parse_timestamp

VIEWS = {
    "minute": "SPANNER_SYS.SPLIT_STATS_TOP_MINUTE",
    "10minute": "SPANNER_SYS.SPLIT_STATS_TOP_10MINUTE",
    "hour": "SPANNER_SYS.SPLIT_STATS_TOP_HOUR",
}
#: seconds per interval of each view
INTERVAL_SECONDS = {"minute": 60, "10minute": 600, "hour": 3600}
REQUIRED = ("INTERVAL_END", "SPLIT_START", "SPLIT_LIMIT", "CPU_USAGE_SCORE")
EMULATOR_MESSAGE = (
    "the Spanner emulator has no hot-split statistics (SPANNER_SYS.SPLIT_STATS_TOP_*) and "
    "no load-based splitting: run `sharded-orm simulate` against your models to see where "
    "writes would land, or export the statistics from a real instance (console or `gcloud "
    "spanner databases execute-sql`) and pass the CSV or JSON file to `sharded-orm doctor`"
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


def _names(value: Any) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                loaded = json.loads(text)
            except ValueError:
                text = text.strip("[]")
            else:
                return tuple(str(v) for v in loaded)
        return tuple(p.strip().strip('"') for p in text.split(",") if p.strip())
    return tuple(str(v) for v in value)


def split_row(row: Mapping[str, Any], where: str) -> SplitRow:
    """A dict keyed by the view's column names (any case) as a :class:`SplitRow`."""
    if not isinstance(row, Mapping):
        raise ShardTypeError(f"{where}: expected a dict keyed by column names, got {row!r}")
    upper = {str(k).upper(): v for k, v in row.items()}
    missing = [c for c in REQUIRED if c not in upper]
    if missing:
        raise ShardValueError(
            f"{where}: missing column(s) {', '.join(missing)}; rows need the split statistics "
            f"columns {', '.join(REQUIRED)} (and AFFECTED_TABLES, UNSPLITTABLE_REASONS)"
        )
    try:
        score = int(float(upper["CPU_USAGE_SCORE"]))
    except (TypeError, ValueError, OverflowError):
        raise ShardValueError(
            f"{where}: CPU_USAGE_SCORE {upper['CPU_USAGE_SCORE']!r} is not a number"
        ) from None
    return SplitRow(
        _timestamp(upper["INTERVAL_END"], where),
        str(upper["SPLIT_START"]),
        str(upper["SPLIT_LIMIT"]),
        score,
        _names(upper.get("AFFECTED_TABLES")),
        _names(upper.get("UNSPLITTABLE_REASONS")),
        str(upper.get("SOURCE") or ""),
    )


#: the largest export doctor reads (a minute view keeps at most 100 rows per interval)
MAX_FILE_BYTES = 512 << 20
#: the largest row of a JSON export (a row is a few hundred bytes)
MAX_ROW_CHARS = 1 << 20
_CHUNK = 1 << 16


def _not_utf8(p: Path, exc: UnicodeDecodeError) -> ShardValueError:
    return ShardValueError(
        f"{str(p)!r} is not UTF-8 text (byte {exc.object[exc.start]:#04x} near offset "
        f"{exc.start} of a block): export the statistics as UTF-8 CSV or JSON"
    )


def _checked(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_file():
        raise ShardConfigError(f"no such file: {str(p)!r} (give a CSV or JSON export)")
    size = p.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ShardValueError(
            f"{str(p)!r} is {size:,} bytes, more than doctor reads ({MAX_FILE_BYTES:,}): "
            "export a shorter window (--since, or a WHERE INTERVAL_END >= ... in the export)"
        )
    return p


def rows_from_file(path: str | Path) -> Iterator[dict[str, Any]]:
    """Rows exported as CSV (a header of column names) or JSON (a list of objects), read
    as a stream: memory holds one block and one row, whatever the file's size."""
    p = _checked(path)
    try:
        with p.open(encoding="utf-8-sig", newline="") as f:
            head = f.read(1)
            while head.isspace():
                head = f.read(1)
            f.seek(0)
            if p.suffix.lower() == ".json" or head in ("[", "{"):
                yield from _json_rows(p, f)
            else:
                yield from _csv_rows(p, f)
    except UnicodeDecodeError as exc:
        raise _not_utf8(p, exc) from None


def _csv_rows(p: Path, f: Any) -> Iterator[dict[str, Any]]:
    try:
        for i, row in enumerate(csv.DictReader(f)):
            if None in row or None in row.values():  # a short or long line: a truncated file
                raise ShardValueError(
                    f"{str(p)!r} line {i + 2}: {len([v for v in row.values() if v is not None])}"
                    " fields where the header has a different number (a truncated or edited "
                    "export?)"
                )
            yield row
    except csv.Error as exc:
        raise ShardValueError(f"{str(p)!r} is not a readable CSV export: {exc}") from None


def _json_rows(p: Path, f: Any) -> Iterator[Any]:
    """The objects of a JSON list, decoded one at a time (``raw_decode`` over a buffer of
    blocks); an export that is one object (``{"rows": [...]}``) is read whole."""
    buf = f.read(_CHUNK).lstrip()
    if not buf:
        raise ShardValueError(f"{str(p)!r} is empty: not a JSON export (truncated?)")
    if buf[0] != "[":
        yield from _json_whole(p, buf + f.read())
        return
    decoder = json.JSONDecoder()
    pos, done = 1, False

    def more() -> bool:
        nonlocal buf, pos
        chunk = f.read(_CHUNK)
        buf, pos = buf[pos:] + chunk, 0
        return bool(chunk)

    while True:
        while True:  # the next non-space character
            while pos < len(buf) and buf[pos].isspace():
                pos += 1
            if pos < len(buf) or not more():
                break
        if pos >= len(buf):
            raise ShardValueError(f"{str(p)!r} is not valid JSON (truncated?): no closing ]")
        if buf[pos] == "]" and not done:
            pos += 1
            break
        while True:
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except RecursionError:
                raise ShardValueError(
                    f"{str(p)!r} is nested too deeply to be a split statistics export "
                    "(a JSON list of row objects)"
                ) from None
            except ValueError as exc:
                if len(buf) - pos > MAX_ROW_CHARS:
                    raise ShardValueError(
                        f"{str(p)!r}: a row of more than {MAX_ROW_CHARS:,} characters, or not "
                        f"valid JSON: {exc}"
                    ) from None
                if more():
                    continue
                raise ShardValueError(f"{str(p)!r} is not valid JSON (truncated?): {exc}") from None
            break
        yield obj
        pos, done = end, True
        while True:  # "," or "]"
            while pos < len(buf) and buf[pos].isspace():
                pos += 1
            if pos < len(buf) or not more():
                break
        if pos < len(buf) and buf[pos] == ",":
            pos += 1
            done = False
            continue
        if pos < len(buf) and buf[pos] == "]":
            pos += 1
            break
        raise ShardValueError(f"{str(p)!r} is not valid JSON (truncated?): expected , or ]")
    rest = buf[pos:] + f.read(_CHUNK)
    if rest.strip():
        raise ShardValueError(f"{str(p)!r} is not valid JSON: text after the list")


def _json_whole(p: Path, text: str) -> Iterator[Any]:
    try:
        data = json.loads(text)
    except RecursionError:
        raise ShardValueError(
            f"{str(p)!r} is nested too deeply to be a split statistics export "
            "(a JSON list of row objects)"
        ) from None
    except ValueError as exc:
        raise ShardValueError(f"{str(p)!r} is not valid JSON (truncated?): {exc}") from None
    if isinstance(data, dict):
        data = data.get("rows", data.get("results", [data]))
    if not isinstance(data, list):
        raise ShardValueError(f"{str(p)!r}: expected a JSON list of rows")
    yield from data


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
        _checked(source)
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
