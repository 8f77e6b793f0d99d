"""Bulk loading the way Spanner wants it.

The seeds' advice: never write in primary-key order; cut the key space into ranges
(about ten per worker); give each worker its own ranges; commit 1 to 10 MB at a time;
build secondary indexes after the load. ``bulk_load`` does exactly that:

1. Every row is prepared and checked first (missing key column, wrong type, an INT64
   out of range, two rows with one key, a column given twice with different values, a
   lone surrogate in a string, a row too large for one commit): an error names
   the row's position and nothing is written. Python-side defaults, ids and shard
   columns are filled exactly as the ORM would (:mod:`sharded_orm.load.prepare`).
2. Rows are sorted by key and cut into ``10 * workers`` contiguous ranges; range ``r``
   belongs to worker ``r % workers``, so no two workers write the same part of the key
   space; each worker commits its batches in a shuffled order, so no stream runs in key
   order. The input is read once and staged on disk to do this
   (:mod:`sharded_orm.load.staging`): memory is bounded by the batch and worker
   settings, not by the number of rows.
3. On Spanner each batch is one commit through the mutation API (``insert`` or
   ``insert_or_update``), within 80,000 mutations, 100 MB and ``batch_bytes`` (bytes
   as the commit carries them: index entries and a successor's rows included), each
   attempt bounded by ``commit_timeout`` and the whole load by ``deadline`` (cleanup
   included: sessions are deleted within what is left of it); retries
   follow :mod:`sharded_orm.retry` (:mod:`sharded_orm.load.writers`). Elsewhere,
   batched ``executemany`` in one connection (SQLite cannot take parallel writers).
4. A batch that fails for good stops the load: ``BulkLoadError.report`` lists the
   batches committed. Re-running with ``mode="insert_or_update"`` completes the load with
   no duplicate and no loss (and re-creates indexes a failed ``defer_indexes`` load left
   dropped).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterable, Mapping
from contextlib import suppress
from typing import Any

import sqlalchemy as sa

from sharded_orm.checks import check_positive_int, check_seconds, shown
from sharded_orm.errors import ShardConfigError, ShardTypeError, UnsupportedOnDialectError
from sharded_orm.greenlets import refuse_async_bind
from sharded_orm.limits import SPANNER_COMMIT_BYTES, SPANNER_MUTATIONS, row_mutations
from sharded_orm.load.prepare import BulkValidationError, RowPreparer, written_columns
from sharded_orm.load.staging import close_batches, stage
from sharded_orm.load.writers import (
    BulkLoadError,
    BulkLoadReport,
    Job,
    create_indexes,
    drop_indexes,
    load_core,
    load_spanner,
    stopped,
)
from sharded_orm.progress import progress as progress_bar
from sharded_orm.retry import DEFAULTS, Deadline, RetryPolicy
from sharded_orm.schema.columns import table_of
from sharded_orm.spanner import is_spanner
from sharded_orm.telemetry import operation
from sharded_orm.write.successor import plan as mirror_plan
from sharded_orm.write.successor import successor_of

__all__ = ["BulkLoadError", "BulkLoadReport", "BulkValidationError", "bulk_load"]

MAX_MUTATIONS = SPANNER_MUTATIONS  # (sharded_orm.limits)
MAX_COMMIT_BYTES = SPANNER_COMMIT_BYTES
#: More threads than this only queue up on Spanner's side (and may exhaust the process).
MAX_WORKERS = 256
MODES = ("insert", "insert_or_update")
#: The most of ``deadline`` one commit attempt may take (``commit_timeout`` if smaller).
ATTEMPT_SHARE = 1 / 3
_PROGRESS = {None: "auto", True: "auto", False: "off"}


def _is_database(bind: object) -> bool:
    """A google-cloud-spanner ``Database`` (duck-typed: no google import here)."""
    return callable(getattr(bind, "batch", None)) and hasattr(bind, "spanner_api")


def _check_arguments(bind: Any, workers: Any, batch_bytes: Any, mode: Any, seed: Any,
                     progress: Any, commit_timeout: Any, deadline: Any) -> None:  # fmt: skip
    if not isinstance(bind, (sa.Engine, sa.Connection)) and not _is_database(bind):
        hint = " (create_engine(url) first)" if isinstance(bind, str) else ""
        raise ShardTypeError(
            "bind must be a SQLAlchemy Engine or Connection, or a google-cloud-spanner "
            f"Database; got {type(bind).__name__} {shown(bind)}{hint}"
        )
    check_positive_int(workers, "workers")
    if workers > MAX_WORKERS:
        raise ShardConfigError(
            f"workers must be at most {MAX_WORKERS}, got {workers}: each worker is a thread "
            "with its own session; more only queue up (split the load over processes instead)"
        )
    check_positive_int(batch_bytes, "batch_bytes")
    if batch_bytes > MAX_COMMIT_BYTES:
        raise ShardConfigError(
            f"batch_bytes must be at most {MAX_COMMIT_BYTES} (100 MB, what one Spanner commit "
            f"may carry), got {batch_bytes}"
        )
    if mode not in MODES:
        raise ShardConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ShardTypeError(f"seed must be an int, got {seed!r}")
    if progress not in _PROGRESS:
        raise ShardTypeError(f"progress must be True, False or None (auto), got {progress!r}")
    if isinstance(commit_timeout, bool) or not isinstance(commit_timeout, (int, float)):
        raise ShardTypeError(f"commit_timeout must be a number of seconds, got {commit_timeout!r}")
    if not 0 < commit_timeout <= 3600:
        raise ShardConfigError(f"commit_timeout must be in (0, 3600] s, got {commit_timeout}")
    if deadline is not None:
        if isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
            raise ShardTypeError(f"deadline must be a number of seconds or None, got {deadline!r}")
        # the library's one rule for durations: no inf (None is "no overall limit")
        check_seconds(deadline, "deadline")


def _check_successor(table: sa.Table, mode: str, on_spanner: bool) -> None:
    """A load is mirrored exactly when each row's successor row follows from the row
    alone: always for ``insert``; for ``insert_or_update`` only through Spanner's
    mutations (elsewhere it is INSERT OR REPLACE, which deletes the rows a unique index
    conflicts with) and when the new key follows from the old key (a row loaded over
    another would move in the successor, and a mutation cannot delete its old place)."""
    successor = successor_of(table)
    if successor is None or mode != "insert_or_update":
        return
    if not on_spanner or not mirror_plan(table, successor).follows_key:
        why = (
            "off Spanner it is INSERT OR REPLACE, which deletes any row a unique index "
            "conflicts with"
            if not on_spanner
            else f"{successor.name}'s key depends on columns a loaded row may change, and "
            "a mutation cannot delete the row's old place there"
        )
        raise ShardConfigError(
            f"bulk_load(mode='insert_or_update') into {table.name}, which has a successor "
            f"({successor.name}, a key reshard under way), cannot be mirrored: {why}. Load "
            "new rows with mode='insert' and change existing ones with update(), or load "
            "before declare_successor (the copy then takes the rows across)."
        )


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
    deadline: float | None = None,
    commit_timeout: float = DEFAULTS["commit"],
    seed: int = 0,
) -> BulkLoadReport:
    """Load ``rows`` into a table: key-range partitioned, parallel, retried, reported.

    ``bind`` is an Engine or Connection (or, on Spanner, a google-cloud-spanner
    ``Database``); ``rows`` are mappings keyed by attribute or column key, each key once,
    any iterable (a generator is read once, as it comes: the rows are staged in a
    temporary directory, not held in memory). Every row is checked before anything is
    written. A failed commit is retried at most
    ``max_retries`` times (backoff with jitter); each attempt waits at most
    ``commit_timeout`` seconds (and at most a third of ``deadline``, so a hung commit
    leaves time for another attempt), and the whole load ends within ``deadline`` seconds
    (None: no overall limit). ``progress``: a bar on a terminal, log lines elsewhere
    (None: auto, False: off).

    Raises ``BulkValidationError`` (with the row's position) for a bad row, and
    ``BulkLoadError`` (with ``.report``) when a batch fails for good, retries or time run
    out; its message says what was committed. Run the same load with
    ``mode="insert_or_update"`` to finish it.
    """
    refuse_async_bind(bind, "bulk_load")
    _check_arguments(bind, workers, batch_bytes, mode, seed, progress, commit_timeout, deadline)
    if not isinstance(defer_indexes, bool):
        raise ShardTypeError(f"defer_indexes must be True or False, got {defer_indexes!r}")
    if rows is None or isinstance(rows, Mapping) or not isinstance(rows, Iterable):
        raise ShardTypeError(
            f"rows must be an iterable of mappings (column -> value), got {type(rows).__name__}"
        )
    policy = RetryPolicy.for_retries(max_retries, deadline)
    # one commit may take at most a third of the deadline: a hung one leaves time to retry
    share = policy.deadline * ATTEMPT_SHARE if policy.deadline is not None else commit_timeout
    policy = RetryPolicy(
        attempts=policy.attempts,
        deadline=policy.deadline,
        call_timeout=float(max(0.001, min(commit_timeout, share))),
    )
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
    cols = written_columns(table, on_spanner)
    mutations_module: Any = None
    processors = key_order = None
    if on_spanner:
        from sharded_orm.spanner import mutations as mutations_module

        processors = mutations_module.bind_processors(cols, mutations_module.dialect_of(bind))
        key_order = mutations_module.key_order
    # a key reshard's successor: written in the same commits (elsewhere the engine hook
    # mirrors the Core inserts)
    _check_successor(table, mode, on_spanner)
    successor = successor_of(table) if on_spanner else None
    preparer = RowPreparer(table, cols, processors, key_order)
    also: tuple[Any, RowPreparer] | None = None
    # as Spanner counts a commit: each column written, each index entry's cells and the
    # delete of the entry a replaced row had (insert_or_update, and the rewrite of a batch
    # whose commit went unanswered even in mode insert: sharded_orm.load.writers)
    per_row = row_mutations(table, len(cols), indexes=not defer_indexes, replaces=True)
    if successor is not None:
        cols2 = written_columns(successor, on_spanner)
        processors2 = mutations_module.bind_processors(cols2, mutations_module.dialect_of(bind))
        preparer2 = RowPreparer(successor, cols2, processors2, key_order)
        also = (mirror_plan(table, successor), preparer2)
        per_row += row_mutations(successor, len(cols2), replaces=True)  # insert_or_update
    if per_row > MAX_MUTATIONS:
        raise ShardConfigError(
            f"one row of {table.name!r} is {per_row} mutations (columns + index cells), more "
            f"than a commit may hold ({MAX_MUTATIONS}); try defer_indexes=True"
        )
    # rows are read once and staged on disk (memory bounded by the batch settings)
    with (
        operation("bulk_load", bind, table.name, mode=mode, workers=workers) as traced,
        tempfile.TemporaryDirectory(prefix="sharded-orm-bulk-load-") as directory,
    ):
        staged = stage(
            rows, preparer, also, directory, workers=workers,
            byte_limit=min(batch_bytes, MAX_COMMIT_BYTES),
            rows_per_commit=MAX_MUTATIONS // per_row, seed=seed, indexes=not defer_indexes,
        )  # fmt: skip
        traced.set(rows=staged.total, bytes=staged.bytes, batches=len(staged.counts))
        report = BulkLoadReport(batches=len(staged.counts), mutations_per_row=per_row)
        try:
            report.write_order = {
                w: [staged.batch_range[b] for b in bs] for w, bs in staged.by_worker.items()
            }
            with progress_bar(
                staged.total,
                f"bulk_load {table.name}",
                mode=_PROGRESS[progress],  # type: ignore[arg-type]
            ) as bar:
                successor_columns = None if also is None else (also[1].table.name, also[1].names)
                job = Job(table, preparer.names, staged, mode, policy, Deadline(deadline),
                          report, bar.advance, successor=successor_columns)  # fmt: skip
                _run(job, engine, bind, defer_indexes, on_spanner)
        finally:
            close_batches(staged)
            traced.set(
                rows_written=report.rows_written, commits=report.commits,
                rows_unknown=report.rows_unknown, retries=report.retries,
            )  # fmt: skip
    return report


def _run(job: Job, engine: Any, bind: Any, defer_indexes: bool, on_spanner: bool) -> None:
    """Write the staged batches (dropping and re-creating indexes around them if asked)."""
    table, report = job.table, job.report
    start = time.monotonic()
    try:
        if defer_indexes:
            drop_indexes(engine, table, report)
        if on_spanner:
            from sharded_orm.spanner import mutations

            load_spanner(mutations, mutations.database_of(bind), job)
        else:
            load_core(engine, job)
        if defer_indexes:
            create_indexes(engine, table, report)
    except BulkLoadError as err:
        if not defer_indexes:
            raise
        _restore_indexes(engine, table, report)
        cause = err.__cause__ or err
        raise stopped(report, cause) from cause
    except Exception as exc:
        if defer_indexes:
            _restore_indexes(engine, table, report)
        raise stopped(report, exc) from exc
    finally:
        report.elapsed = time.monotonic() - start


def _restore_indexes(engine: Any, table: sa.Table, report: BulkLoadReport) -> None:
    """After a failed load, put the dropped indexes back if the database still answers;
    if not, ``report.dropped_indexes`` (and the error) say that re-running re-creates them."""
    with suppress(Exception):
        create_indexes(engine, table, report)
