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
import enum
import json
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

from sharded_orm.checks import check_positive_int
from sharded_orm.errors import (
    ShardConfigError,
    ShardingError,
    ShardTypeError,
    UnsupportedOnDialectError,
)
from sharded_orm.schema.columns import ATTR_COLUMNS_KEY, ShardComputed, shard_columns, table_of
from sharded_orm.spanner import is_spanner
from sharded_orm.write.sql import MISSING, evaluate_default

MAX_MUTATIONS = 80_000
MAX_COMMIT_BYTES = 100 * 1024 * 1024
RANGES_PER_WORKER = 10
MODES = ("insert", "insert_or_update")


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
    """What a load did. Batches are numbered 0..batches-1 in key order of their rows."""

    rows_written: int = 0
    commits: int = 0
    retries: int = 0
    elapsed: float = 0.0
    batches: int = 0
    committed_batches: list[int] = field(default_factory=list)
    failed_batch: int | None = None
    write_order: dict[int, list[int]] = field(default_factory=dict)  # worker -> ranges
    mutations_per_row: int = 0  # as Spanner counts them: columns written + index entries
    dropped_indexes: list[str] = field(default_factory=list)  # not re-created yet

    @property
    def complete(self) -> bool:
        return self.failed_batch is None and len(self.committed_batches) == self.batches


_PYTHON_TYPES: list[tuple[type[sqltypes.TypeEngine[Any]], tuple[type, ...]]] = [
    (sqltypes.Boolean, (bool,)),
    (sqltypes.Integer, (int,)),
    (sqltypes.Float, (float, int, Decimal)),
    (sqltypes.Numeric, (Decimal, int)),
    (sqltypes.DateTime, (dt.datetime,)),
    (sqltypes.Date, (dt.date,)),
    (sqltypes.Enum, (str, enum.Enum)),
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


def _check_value(col: sa.Column[Any], want: tuple[type, ...] | None, v: Any) -> str | None:
    """Why ``v`` cannot go into ``col``, or None."""
    if want is not None and (not isinstance(v, want) or (bool not in want and isinstance(v, bool))):
        return (
            f"column {col.key!r} takes {'/'.join(t.__name__ for t in want)}, "
            f"got {type(v).__name__} {v!r}"
        )
    if isinstance(v, dt.datetime) and v.tzinfo is None:
        return f"column {col.key!r}: naive datetime {v!r}; give it a timezone (UTC)"
    length = getattr(col.type, "length", None)
    if isinstance(v, (str, bytes)) and isinstance(length, int) and len(v) > length:
        return f"column {col.key!r} holds at most {length} characters, got {len(v)}"
    return None


def _size(value: Any) -> int:
    """Bytes a value takes in a commit, roughly (strings by their UTF-8 length)."""
    if value is None:
        return 1
    if isinstance(value, str):
        return len(value.encode()) + 8
    if isinstance(value, bytes):
        return len(value) + 8
    if isinstance(value, (list, tuple)):
        return 8 + sum(_size(v) for v in value)
    if isinstance(value, dict):
        return len(json.dumps(value, default=str)) + 8
    return 16


@dataclass
class _Prepared:
    columns: list[str]
    rows: list[tuple[Any, ...]]  # in input order, as they will be sent
    keys: list[tuple[Any, ...]]  # primary-key values as stored (for the range order)
    sizes: list[int]


def _written_columns(table: sa.Table, on_spanner: bool) -> list[sa.Column[Any]]:
    """Columns the load sends: not the server's generated ones, except our server-side
    shards off Spanner, which the client fills there."""
    server_made = {sc.key for sc in shard_columns(table) if sc.server_side and on_spanner}
    return [
        c
        for c in table.columns
        if c.key not in server_made
        and (c.computed is None or (not on_spanner and isinstance(c.computed, ShardComputed)))
    ]


def _prepare(
    table: sa.Table,
    rows: Iterable[Mapping[str, Any]],
    cols: list[sa.Column[Any]],
    processors: list[Any] | None,
    key_order: Any,
) -> _Prepared:
    """Fill defaults, ids and shards, check every value, convert for the wire.

    ``processors`` are the columns' bind processors (on Spanner: the mutation API runs
    none of SQLAlchemy's) and ``key_order`` maps a bound key value to its stored order;
    None elsewhere, where Core converts.
    """
    attr_map: dict[str, Any] = table.info.get(ATTR_COLUMNS_KEY, {})
    written = {c.key for c in cols}
    shards = [sc for sc in shard_columns(table) if sc.key in written]
    for c in table.primary_key.columns:
        if c.identity is not None or c.server_default is not None:
            raise ShardConfigError(
                f"bulk_load needs every key value up front, but {table.name}.{c.key} is filled "
                "by the server; give the rows their ids (e.g. from a SpannerSequence pool)"
            )
    names = [c.key for c in cols]
    pk_index = [names.index(c.key) for c in table.primary_key.columns]
    expected = [_expected(c) for c in cols]
    out, keys, sizes = [], [], []
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
            if c.key not in row and c.default is not None and "sharded_orm.shard" not in c.info:
                v = evaluate_default(c, row)
                if v is not MISSING:
                    row[c.key] = v
        for sc in shards:
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
        values = []
        for c, want in zip(cols, expected, strict=True):
            v = row.get(c.key)
            if v is None:
                if c.primary_key:
                    raise BulkValidationError(f"key column {c.key!r} is missing", pos)
                if not c.nullable:
                    raise BulkValidationError(f"column {c.key!r} is NOT NULL but has no value", pos)
            else:
                problem = _check_value(c, want, v)
                if problem:
                    raise BulkValidationError(problem, pos)
            values.append(v)
        if processors is not None:
            try:
                values = [p(v) if p is not None else v for p, v in zip(processors, values)]  # noqa: B905
            except Exception as exc:
                raise BulkValidationError(f"cannot convert the row: {exc!r}", pos) from exc
        keys.append(tuple(key_order(values[i]) if key_order else values[i] for i in pk_index))
        out.append(tuple(values))
        sizes.append(sum(_size(v) for v in values))
    return _Prepared(names, out, keys, sizes)


def _mutations_per_row(table: sa.Table, n_columns: int, skip_indexes: bool) -> int:
    """Spanner counts an insert as one mutation per column written; each secondary index
    adds its entry's cells. We count every column of every kept index (key parts and
    STORING), an upper bound, so a commit never exceeds the limit."""
    per_row = n_columns
    if not skip_indexes:
        for ix in table.indexes:
            storing = ix.dialect_kwargs.get("spanner_storing") or ()
            per_row += len(ix.expressions) + len(storing)
    return per_row


def _plan_batches(
    prep: _Prepared, workers: int, byte_limit: int, rows_per_commit: int, seed: int
) -> tuple[list[list[int]], dict[int, list[int]], list[int]]:
    """(batches of row positions, worker -> batch ids in commit order, batch -> range).

    Rows are sorted by key and cut into ``RANGES_PER_WORKER * workers`` contiguous ranges;
    a batch never spans two ranges; range ``r`` belongs to worker ``r % workers``, which
    commits its batches in a shuffled order.
    """
    try:
        order = sorted(range(len(prep.rows)), key=prep.keys.__getitem__)
    except TypeError as exc:
        raise ShardTypeError(
            f"key values of mixed types cannot be ordered ({exc}); give every row the same "
            "type of value in each key column"
        ) from None
    n_ranges = max(1, min(len(order), RANGES_PER_WORKER * workers))
    per_range = -(-len(order) // n_ranges) if order else 1
    ranges = [order[i : i + per_range] for i in range(0, len(order), per_range)]
    batches: list[list[int]] = []
    batch_range: list[int] = []
    for r, positions in enumerate(ranges):
        current: list[int] = []
        current_bytes = 0
        for p in positions:
            size = prep.sizes[p]
            if current and (current_bytes + size > byte_limit or len(current) >= rows_per_commit):
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


class _Progress:
    """One stderr line, redrawn: rows done and rows per second."""

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
    """Load ``rows`` into a table: key-range partitioned, parallel, retried, reported.

    ``bind`` is an Engine or Connection (or, on Spanner, a google-cloud-spanner
    ``Database``); ``rows`` are mappings keyed by attribute or column key. Every row is
    checked before anything is written. Raises ``BulkValidationError`` (with the row's
    position) for a bad row and ``BulkLoadError`` (with ``.report``) when a batch fails
    after retries; run the same load with ``mode="insert_or_update"`` to finish it.
    """
    check_positive_int(workers, "workers")
    check_positive_int(batch_bytes, "batch_bytes")
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise ShardConfigError(f"max_retries must be an int >= 0, got {max_retries!r}")
    if mode not in MODES:
        raise ShardConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    table = table_of(model_or_table)
    if not table.primary_key.columns:
        raise ShardConfigError(f"{table.name!r} has no primary key: Spanner tables need one")
    engine = bind if isinstance(bind, (sa.Engine, sa.Connection)) else None
    on_spanner = engine is None or is_spanner(engine.dialect)
    if defer_indexes and engine is None:
        raise ShardConfigError(
            "defer_indexes=True runs index DDL through SQLAlchemy: pass an Engine, not a Database"
        )
    dialect_name = engine.dialect.name if engine is not None else "spanner"
    if not on_spanner and mode == "insert_or_update" and dialect_name != "sqlite":
        raise UnsupportedOnDialectError(
            f"mode='insert_or_update' is implemented for Spanner and SQLite, not {dialect_name}"
        )
    cols = _written_columns(table, on_spanner)
    mutations_module: Any = None
    processors = key_order = None
    if on_spanner:
        from sharded_orm.spanner import mutations as mutations_module

        processors = mutations_module.bind_processors(cols, mutations_module.dialect_of(bind))
        key_order = mutations_module.key_order
    prep = _prepare(table, rows, cols, processors, key_order)
    byte_limit = min(batch_bytes, MAX_COMMIT_BYTES)
    for pos, size in enumerate(prep.sizes):
        if size > byte_limit:
            raise BulkValidationError(
                f"about {size} bytes: larger than one commit may carry ({byte_limit} bytes; "
                "raise batch_bytes up to 100 MB, or load this row on its own)",
                pos,
            )
    per_row = _mutations_per_row(table, len(cols), skip_indexes=defer_indexes)
    if per_row > MAX_MUTATIONS:
        raise ShardConfigError(
            f"one row of {table.name!r} is {per_row} mutations (columns + index cells), more "
            f"than a commit may hold ({MAX_MUTATIONS}); try defer_indexes=True"
        )
    batches, by_worker, batch_range = _plan_batches(
        prep, workers, byte_limit, MAX_MUTATIONS // per_row, seed
    )
    report = BulkLoadReport(batches=len(batches), mutations_per_row=per_row)
    report.write_order = {w: [batch_range[b] for b in bs] for w, bs in by_worker.items()}
    bar = _Progress(len(prep.rows), progress)
    start = time.monotonic()
    try:
        if defer_indexes:
            _drop_indexes(engine, table, report)
        if on_spanner:
            database = mutations_module.database_of(bind)
            _load_spanner(
                mutations_module, database, table, prep, batches, by_worker, mode, max_retries,
                report, bar,
            )  # fmt: skip
        else:
            _load_core(engine, table, prep, batches, by_worker, mode, report, bar)
        if defer_indexes:
            _create_indexes(engine, table, report)
    finally:
        report.elapsed = time.monotonic() - start
        bar.close()
    return report


def _drop_indexes(engine: Any, table: sa.Table, report: BulkLoadReport) -> None:
    """Drop the table's secondary indexes; those already gone (a failed load dropped
    them) are skipped, so the same call can be run again."""
    present = {ix["name"] for ix in sa.inspect(engine).get_indexes(table.name)}
    for ix in sorted(table.indexes, key=lambda i: str(i.name)):
        if ix.name in present:
            ix.drop(engine)
        report.dropped_indexes.append(str(ix.name))


def _create_indexes(engine: Any, table: sa.Table, report: BulkLoadReport) -> None:
    for ix in sorted(table.indexes, key=lambda i: str(i.name)):
        ix.create(engine)
        report.dropped_indexes.remove(str(ix.name))


def _stopped(report: BulkLoadReport, exc: BaseException, after: str) -> BulkLoadError:
    indexes = (
        f" Indexes {', '.join(report.dropped_indexes)} are dropped: run again with "
        "defer_indexes=True and they are created after the load."
        if report.dropped_indexes
        else ""
    )
    return BulkLoadError(
        f"batch {report.failed_batch} failed{after} ({exc!r}); "
        f"{len(report.committed_batches)} of {report.batches} batches were committed "
        f"({report.rows_written} rows). Run the same load again with "
        f"mode='insert_or_update' to complete it.{indexes}",
        report,
    )


def _load_spanner(
    mutations: Any,
    database: Any,
    table: sa.Table,
    prep: _Prepared,
    batches: list[list[int]],
    by_worker: dict[int, list[int]],
    mode: str,
    max_retries: int,
    report: BulkLoadReport,
    bar: _Progress,
) -> None:
    """Each worker commits its batches; the first failure stops all of them."""
    stop = threading.Event()
    lock = threading.Lock()
    errors: list[BaseException] = []
    attempts: dict[int, int] = {}

    def commit(b: int) -> None:
        values = [prep.rows[p] for p in batches[b]]
        op = mode
        for attempt in range(max_retries + 1):
            attempts[b] = attempt + 1
            try:
                mutations.commit(database, table.name, prep.columns, values, op)
                break
            except Exception as exc:
                if attempt == max_retries or stop.is_set() or not mutations.is_transient(exc):
                    raise
                if mutations.is_ambiguous(exc):
                    # The commit may have landed: rewrite the same rows rather than
                    # failing on our own rows with ALREADY_EXISTS.
                    op = "insert_or_update"
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
        tries = attempts.get(report.failed_batch or 0, 1)
        after = f" after {tries - 1} retries" if tries > 1 else " (not retryable)"
        raise _stopped(report, errors[0], after) from errors[0]


def _load_core(
    engine: Any,
    table: sa.Table,
    prep: _Prepared,
    batches: list[list[int]],
    by_worker: dict[int, list[int]],
    mode: str,
    report: BulkLoadReport,
    bar: _Progress,
) -> None:
    """Other dialects: one transaction per batch, in this thread (SQLite takes one writer).

    Batches go round-robin over the workers' shuffled lists, the order the Spanner
    workers would interleave in; SQLAlchemy's write hook checks the shard values again.
    """
    stmt = table.insert()
    if mode == "insert_or_update":
        stmt = stmt.prefix_with("OR REPLACE", dialect="sqlite")
    lists = list(by_worker.values())
    order = [ws[i] for i in range(max(map(len, lists), default=0)) for ws in lists if i < len(ws)]
    for b in order:
        rows = [dict(zip(prep.columns, prep.rows[p], strict=True)) for p in batches[b]]
        try:
            if isinstance(engine, sa.Engine):
                with engine.begin() as conn:
                    conn.execute(stmt, rows)
            else:
                engine.execute(stmt, rows)
        except Exception as exc:
            report.failed_batch = b
            raise _stopped(report, exc, "") from exc
        report.commits += 1
        report.rows_written += len(rows)
        report.committed_batches.append(b)
        bar.add(len(rows))
