"""Bulk loading the way Spanner wants it.

The seeds' advice: never write in primary-key order; cut the key space into ranges
(about ten per worker); give each worker its own ranges; commit 1 to 10 MB at a time;
build secondary indexes after the load. ``bulk_load`` does exactly that:

1. Every row is prepared and checked first (missing key column, wrong type, a row too
   large for one commit): an error names the row's position and nothing is written.
   Python-side defaults, ids and shard columns are filled exactly as the ORM would.
2. Rows are sorted by key and cut into ``10 * workers`` contiguous ranges; range ``r``
   belongs to worker ``r % workers``, so no two workers write the same part of the key
   space; each worker commits its batches in a shuffled order, so no stream runs in key
   order.
3. On Spanner each batch is one commit through the mutation API (``insert`` or
   ``insert_or_update``), within 80,000 mutations, 100 MB and ``batch_bytes``;
   ABORTED and transient errors are retried with backoff. Elsewhere, batched
   ``executemany`` in one connection (SQLite cannot take parallel writers).
4. A batch that still fails stops the load: ``BulkLoadError.report`` lists the batches
   committed. Re-running with ``mode="insert_or_update"`` completes the load with no
   duplicate and no loss.
"""

from __future__ import annotations

import datetime as dt
import random
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import types as sqltypes

from .columns import ATTR_COLUMNS_KEY, ShardComputed, shard_columns, table_of
from .errors import ShardConfigError, ShardingError, UnsupportedOnDialectError
from .execution import _MISSING, _evaluate_default
from .query import check_positive_int
from .sequences import is_retryable
from .spanner import is_spanner

MAX_MUTATIONS = 80_000
MAX_COMMIT_BYTES = 100 * 1024 * 1024
RANGES_PER_WORKER = 10
MODES = ("insert", "insert_or_update")
_TRANSIENT = ("Aborted", "ServiceUnavailable", "DeadlineExceeded", "InternalServerError")


class BulkLoadError(ShardingError, RuntimeError):
    """A load that stopped; ``report`` says what was committed."""

    def __init__(self, message: str, report: BulkLoadReport) -> None:
        super().__init__(message)
        self.report = report


class BulkValidationError(ShardingError, ValueError):
    """A row that cannot be loaded; ``position`` is its index in the input."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"row {position}: {message}")
        self.position = position


@dataclass
class BulkLoadReport:
    rows_written: int = 0
    commits: int = 0
    retries: int = 0
    elapsed: float = 0.0
    batches: int = 0
    committed_batches: list[int] = field(default_factory=list)
    failed_batch: int | None = None
    write_order: dict[int, list[int]] = field(default_factory=dict)  # worker -> ranges

    @property
    def complete(self) -> bool:
        return self.failed_batch is None and len(self.committed_batches) == self.batches


_PYTHON_TYPES: list[tuple[type[sqltypes.TypeEngine[Any]], tuple[type, ...]]] = [
    (sqltypes.Boolean, (bool,)),
    (sqltypes.Integer, (int,)),
    (sqltypes.DateTime, (dt.datetime,)),
    (sqltypes.Date, (dt.date,)),
    (sqltypes.Numeric, (Decimal, int)),
    (sqltypes.String, (str,)),
    (sqltypes._Binary, (bytes,)),
    (sqltypes.Uuid, (uuid.UUID, str)),
]


def _expected(col: sa.Column[Any]) -> tuple[type, ...] | None:
    t = col.type
    if isinstance(t, sqltypes.TypeDecorator):
        t = t.impl_instance
    for sa_type, py in _PYTHON_TYPES:
        if isinstance(t, sa_type):
            return py
    return None


def _size(value: Any) -> int:
    if isinstance(value, (str, bytes)):
        return len(value) + 8
    return 16


@dataclass
class _Prepared:
    columns: list[str]
    rows: list[tuple[Any, ...]]  # in input order
    sizes: list[int]
    key_index: list[int]


def _prepare(table: sa.Table, rows: Iterable[Mapping[str, Any]], on_spanner: bool) -> _Prepared:
    attr_map: dict[str, Any] = table.info.get(ATTR_COLUMNS_KEY, {})
    shards = shard_columns(table)
    server_made = {sc.key for sc in shards if sc.server_side and on_spanner}
    # Generated columns are the server's, except our server-side shards off Spanner,
    # which the client fills there.
    cols = [
        c
        for c in table.columns
        if c.key not in server_made
        and (c.computed is None or (not on_spanner and isinstance(c.computed, ShardComputed)))
    ]
    for c in table.primary_key.columns:
        if c.identity is not None or c.server_default is not None:
            raise ShardConfigError(
                f"bulk_load needs every key value up front, but {table.name}.{c.key} is filled "
                "by the server; give the rows their ids (e.g. from a SpannerSequence pool)"
            )
    names = [c.key for c in cols]
    pk = [c.key for c in table.primary_key.columns]
    expected = {c.key: _expected(c) for c in cols}
    out, sizes = [], []
    for pos, raw in enumerate(rows):
        if not isinstance(raw, Mapping):
            raise BulkValidationError(f"rows are mappings of column to value, got {raw!r}", pos)
        row: dict[str, Any] = {}
        for k, v in raw.items():
            col = attr_map.get(k)
            key = col.key if col is not None else k
            if key not in table.c:
                raise BulkValidationError(f"{k!r} is not a column of {table.name!r}", pos)
            row[key] = v
        for c in cols:
            if c.key not in row and not (c.info and "sharded_orm.shard" in c.info):
                v = _evaluate_default(c, row) if c.default is not None else _MISSING
                if v is not _MISSING:
                    row[c.key] = v
        for sc in shards:
            if sc.key in server_made:
                continue
            try:
                shard = sc.compute([row.get(k) for k in sc.source_keys])
            except ShardingError as exc:
                raise BulkValidationError(f"shard column {sc.name!r}: {exc}", pos) from None
            given = row.get(sc.key)
            if given is not None and given != shard:
                raise BulkValidationError(
                    f"{sc.name}={given!r} disagrees with its sources, which hash to {shard}", pos
                )
            row[sc.key] = shard
        for k in pk:
            if row.get(k) is None:
                raise BulkValidationError(f"key column {k!r} is missing", pos)
        size = 0
        for c in cols:
            v = row.get(c.key)
            if v is None:
                if not c.nullable:
                    raise BulkValidationError(f"column {c.key!r} is NOT NULL but has no value", pos)
                continue
            want = expected[c.key]
            if want is not None and (
                not isinstance(v, want)
                or (bool not in want and v is True)
                or (bool not in want and v is False)
            ):
                raise BulkValidationError(
                    f"column {c.key!r} takes {'/'.join(t.__name__ for t in want)}, "
                    f"got {type(v).__name__} {v!r}",
                    pos,
                )
            if isinstance(v, dt.datetime) and v.tzinfo is None:
                raise BulkValidationError(f"column {c.key!r}: naive datetime {v!r}", pos)
            size += _size(v)
        out.append(tuple(row.get(n) for n in names))
        sizes.append(size)
    return _Prepared(names, out, sizes, [names.index(k) for k in pk])


def _plan_batches(
    prep: _Prepared, workers: int, batch_bytes: int, seed: int
) -> tuple[list[list[int]], dict[int, list[int]], list[int]]:
    """(batches of row positions, worker -> batch ids, batch -> range)."""
    order = sorted(
        range(len(prep.rows)), key=lambda i: tuple(prep.rows[i][k] for k in prep.key_index)
    )
    n_ranges = max(1, min(len(order), RANGES_PER_WORKER * workers))
    per_range = -(-len(order) // n_ranges) if order else 0
    ranges = [order[i : i + per_range] for i in range(0, len(order), per_range)] if order else []
    limit_cells = MAX_MUTATIONS // max(1, len(prep.columns))
    byte_limit = min(batch_bytes, MAX_COMMIT_BYTES)
    batches: list[list[int]] = []
    batch_range: list[int] = []
    for r, positions in enumerate(ranges):
        current: list[int] = []
        current_bytes = 0
        for p in positions:
            size = prep.sizes[p]
            if current and (current_bytes + size > byte_limit or len(current) >= limit_cells):
                batches.append(current)
                batch_range.append(r)
                current, current_bytes = [], 0
            current.append(p)
            current_bytes += size
        if current:
            batches.append(current)
            batch_range.append(r)
    rng = random.Random(seed)
    by_worker: dict[int, list[int]] = {w: [] for w in range(workers)}
    for b, r in enumerate(batch_range):
        by_worker[r % workers].append(b)
    for w in by_worker:
        rng.shuffle(by_worker[w])  # no stream in key order
    return batches, by_worker, batch_range


def _spanner_database(bind: Any) -> Any:
    if hasattr(bind, "batch") and not isinstance(bind, (sa.Engine, sa.Connection)):
        return bind  # a google-cloud-spanner Database (or a stand-in)
    raw: Any = bind.raw_connection() if isinstance(bind, sa.Engine) else bind.connection
    try:
        return raw.driver_connection.database
    finally:
        if isinstance(bind, sa.Engine):
            raw.close()


class _Progress:
    def __init__(self, total: int, enabled: bool | None) -> None:
        self.total, self.done, self.start = total, 0, time.monotonic()
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            if self.enabled:
                rate = self.done / max(1e-9, time.monotonic() - self.start)
                sys.stderr.write(f"\rbulk_load: {self.done}/{self.total} rows, {rate:,.0f} rows/s")
                sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def bulk_load(
    bind: Any,
    model_or_table: Any,
    rows: Iterable[Mapping[str, Any]],
    *,
    workers: int = 4,
    batch_bytes: int = 4 * 1024 * 1024,
    mode: str = "insert",
    defer_indexes: bool = False,
    progress: bool | None = None,
    max_retries: int = 8,
    seed: int = 0,
) -> BulkLoadReport:
    """Load ``rows`` into a table: key-range partitioned, parallel, retried, reported."""
    check_positive_int(workers, "workers")
    check_positive_int(batch_bytes, "batch_bytes")
    if mode not in MODES:
        raise ShardConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    table = table_of(model_or_table)
    if not table.primary_key.columns:
        raise ShardConfigError(f"{table.name!r} has no primary key: Spanner tables need one")
    engine = bind if isinstance(bind, (sa.Engine, sa.Connection)) else None
    on_spanner = engine is None or is_spanner(engine.dialect)
    prep = _prepare(table, rows, on_spanner)
    byte_limit = min(batch_bytes, MAX_COMMIT_BYTES)
    for pos, size in enumerate(prep.sizes):
        if size > byte_limit:
            raise BulkValidationError(
                f"about {size} bytes: larger than one commit may carry ({byte_limit} bytes)", pos
            )
    if (
        not on_spanner
        and mode == "insert_or_update"
        and engine is not None
        and (engine.dialect.name != "sqlite")
    ):
        raise UnsupportedOnDialectError(
            "mode='insert_or_update' is implemented for Spanner and SQLite, "
            f"not {engine.dialect.name}"
        )
    batches, by_worker, batch_range = _plan_batches(prep, workers, batch_bytes, seed)
    report = BulkLoadReport(batches=len(batches))
    report.write_order = {w: [batch_range[b] for b in bs] for w, bs in by_worker.items()}
    bar = _Progress(len(prep.rows), progress)
    start = time.monotonic()
    indexes = list(table.indexes) if defer_indexes else []
    lock = threading.Lock()
    try:
        if indexes and engine is not None:
            for ix in indexes:
                ix.drop(engine, checkfirst=False)
        if on_spanner:
            database = _spanner_database(bind)
            _load_spanner(
                database, table, prep, batches, by_worker, mode, max_retries, report, bar, lock
            )
        else:
            assert engine is not None
            _load_core(engine, table, prep, batches, mode, report, bar)
        if indexes and engine is not None:
            for ix in indexes:
                ix.create(engine)
    finally:
        report.elapsed = time.monotonic() - start
        bar.close()
    return report


def _load_spanner(
    database: Any,
    table: sa.Table,
    prep: _Prepared,
    batches: list[list[int]],
    by_worker: dict[int, list[int]],
    mode: str,
    max_retries: int,
    report: BulkLoadReport,
    bar: _Progress,
    lock: threading.Lock,
) -> None:
    stop = threading.Event()
    errors: list[BaseException] = []

    def commit(b: int) -> None:
        values = [prep.rows[p] for p in batches[b]]
        for attempt in range(max_retries + 1):
            try:
                with database.batch() as batch:
                    getattr(batch, mode)(table.name, columns=prep.columns, values=values)
                break
            except Exception as exc:
                transient = type(exc).__name__ in _TRANSIENT or is_retryable(exc)
                if not transient or attempt == max_retries:
                    raise
                with lock:
                    report.retries += 1
                time.sleep(min(2.0, 0.02 * 2**attempt) * (0.5 + random.random()))
        with lock:
            report.commits += 1
            report.rows_written += len(values)
            report.committed_batches.append(b)
        bar.add(len(values))

    def worker(w: int) -> None:
        for b in by_worker[w]:
            if stop.is_set():
                return
            try:
                commit(b)
            except BaseException as exc:
                with lock:
                    errors.append(exc)
                    if report.failed_batch is None:
                        report.failed_batch = b
                stop.set()
                return

    with ThreadPoolExecutor(max_workers=len(by_worker)) as pool:
        list(pool.map(worker, list(by_worker)))
    if errors:
        raise BulkLoadError(
            f"batch {report.failed_batch} failed after retries ({errors[0]!r}); "
            f"{len(report.committed_batches)} of {report.batches} batches were committed. "
            "Run the same load again with mode='insert_or_update' to complete it.",
            report,
        ) from errors[0]


def _load_core(
    engine: Any,
    table: sa.Table,
    prep: _Prepared,
    batches: list[list[int]],
    mode: str,
    report: BulkLoadReport,
    bar: _Progress,
) -> None:
    """Other dialects: one transaction per batch, in this thread (SQLite takes one writer)."""
    stmt = table.insert()
    if mode == "insert_or_update":
        stmt = stmt.prefix_with("OR REPLACE", dialect="sqlite")
    for b, positions in enumerate(batches):
        rows = [dict(zip(prep.columns, prep.rows[p], strict=True)) for p in positions]
        try:
            if isinstance(engine, sa.Engine):
                with engine.begin() as conn:
                    conn.execute(stmt, rows)
            else:
                engine.execute(stmt, rows)
        except Exception as exc:
            report.failed_batch = b
            raise BulkLoadError(
                f"batch {b} failed ({exc!r}); {len(report.committed_batches)} of "
                f"{report.batches} batches were committed. Run the same load again with "
                "mode='insert_or_update' to complete it.",
                report,
            ) from exc
        report.commits += 1
        report.rows_written += len(rows)
        report.committed_batches.append(b)
        bar.add(len(rows))
