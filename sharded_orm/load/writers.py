"""Bulk loading, step 3: the batches written, retried under one policy, and reported.

On Spanner each batch is one single-use commit of mutations, sent through
:class:`sharded_orm.spanner.mutations.RawSpanner` (our timeout, no client retries), by
``workers`` threads; elsewhere one transaction per batch in this thread (SQLite takes one
writer). Retries follow :mod:`sharded_orm.retry`: ABORTED and the like are retried; a
commit whose outcome is unknown (DEADLINE_EXCEEDED, UNAVAILABLE, a lost reply) is sent
again as ``insert_or_update``, which cannot fail on rows it wrote itself and writes each
row once; anything else stops the load at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from sharded_orm.errors import ShardingError
from sharded_orm.load.staging import StagedLoad
from sharded_orm.retry import Deadline, Outcome, RetryError, RetryPolicy, classify, retry_call
from sharded_orm.telemetry import carried

#: The most closing a load's sessions may take, and what it gets when the deadline has
#: passed already (one quick try: a live server answers in milliseconds).
CLOSE_TIMEOUT = 5.0
CLOSE_GRACE = 0.3


@dataclass
class BulkLoadReport:
    """What a load did. Batches are numbered 0..batches-1 in key order of their rows.

    ``rows_written`` counts rows of committed batches only, each once. ``unknown_batches``
    are batches whose last commit may or may not have been applied (a lost reply, a
    deadline, a server gone mid-commit), ``rows_unknown`` their rows: the table holds at
    least ``rows_written`` and at most ``rows_written + rows_unknown`` of the load's rows.
    Re-running the load with ``mode="insert_or_update"`` settles them.
    """

    rows_written: int = 0
    commits: int = 0
    retries: int = 0
    elapsed: float = 0.0
    batches: int = 0
    committed_batches: list[int] = field(default_factory=list)
    failed_batch: int | None = None
    unknown_batches: list[int] = field(default_factory=list)
    rows_unknown: int = 0  # rows of unknown_batches: in the table or not
    write_order: dict[int, list[int]] = field(default_factory=dict)  # worker -> ranges
    mutations_per_row: int = 0  # as Spanner counts them: columns written + index entries
    dropped_indexes: list[str] = field(default_factory=list)  # not re-created yet

    @property
    def complete(self) -> bool:
        return self.failed_batch is None and len(self.committed_batches) == self.batches


class BulkLoadError(ShardingError, RuntimeError):
    """A load that stopped; ``report`` says what was committed."""

    def __init__(self, message: str, report: BulkLoadReport) -> None:
        super().__init__(message)
        self.report = report


def stopped(report: BulkLoadReport, exc: BaseException) -> BulkLoadError:
    """The error of a load that stopped: what failed, what is committed, how to finish."""
    why = str(exc) if isinstance(exc, RetryError) else f"{type(exc).__name__}: {exc}"
    unknown = (
        f" Batch(es) {sorted(report.unknown_batches)} ({report.rows_unknown} rows) may "
        "have been applied (their reply was lost)."
        if report.unknown_batches
        else ""
    )
    indexes = (
        f" Indexes {', '.join(report.dropped_indexes)} are dropped: run the same call again "
        "(defer_indexes=True) and they are created after the load."
        if report.dropped_indexes
        else ""
    )
    return BulkLoadError(
        f"bulk_load stopped at batch {report.failed_batch}: {why}. "
        f"Committed: {len(report.committed_batches)} of {report.batches} batches "
        f"({report.rows_written} rows).{unknown} Run the same load again with "
        f"mode='insert_or_update' to complete it: rows already written are rewritten "
        f"with the same values, none is doubled.{indexes}",
        report,
    )


@dataclass
class Job:
    """One load's plan and its shared state."""

    table: sa.Table
    columns: list[str]
    staged: StagedLoad
    mode: str
    policy: RetryPolicy
    deadline: Deadline
    report: BulkLoadReport
    advance: Callable[[int], None]
    #: a key reshard's successor table (name, columns): each commit writes its rows
    #: there too (``insert_or_update``), atomically
    successor: tuple[str, list[str]] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def by_worker(self) -> dict[int, list[int]]:
        return self.staged.by_worker

    def done(self, b: int) -> None:
        rows = self.staged.counts[b]
        with self.lock:
            self.report.commits += 1
            self.report.rows_written += rows
            self.report.committed_batches.append(b)
            if b in self.report.unknown_batches:
                self.report.unknown_batches.remove(b)
                self.report.rows_unknown -= rows
        self.advance(rows)

    def failed(self, b: int, exc: BaseException) -> bool:
        """Record the failure of batch ``b``; True for the first failure of the load."""
        with self.lock:
            outcome = exc.outcome if isinstance(exc, RetryError) else classify(exc)
            if outcome is Outcome.UNKNOWN and b not in self.report.unknown_batches:
                self.report.unknown_batches.append(b)
                self.report.rows_unknown += self.staged.counts[b]
            first = self.report.failed_batch is None
            if first:
                self.report.failed_batch = b
            return first

    def retried(self) -> None:
        with self.lock:
            self.report.retries += 1


def load_spanner(mutations: Any, database: Any, job: Job) -> None:
    """Each worker commits its batches; the first failure stops all of them."""
    raw = mutations.RawSpanner(database)
    stop = threading.Event()
    errors: list[BaseException] = []
    table = job.table.name

    def commit(b: int) -> None:
        values, successor_rows = job.staged.rows(b)  # this batch only, read from disk
        op = [job.mode]
        also = []
        if job.successor is not None:
            name, columns = job.successor
            also.append((name, columns, successor_rows or []))

        def attempt(timeout: float) -> None:
            raw.commit_mutations(table, job.columns, values, op[0], timeout, also=also)

        def on_retry(exc: BaseException, outcome: Outcome) -> None:
            if outcome is Outcome.UNKNOWN:
                # the commit may have landed: rewrite the same rows rather than failing
                # on our own rows with ALREADY_EXISTS
                op[0] = "insert_or_update"
            job.retried()

        retry_call(
            attempt,
            job.policy,
            what=f"committing batch {b} ({len(values)} rows)",
            idempotent=True,
            deadline=job.deadline,
            on_retry=on_retry,
            should_stop=stop.is_set,
        )
        job.done(b)

    def worker(w: int) -> None:
        for b in job.by_worker[w]:
            if stop.is_set():
                return
            try:
                commit(b)
            except BaseException as exc:
                if job.failed(b, exc):
                    errors.append(exc)
                stop.set()
                return

    try:
        with ThreadPoolExecutor(max_workers=len(job.by_worker)) as pool:
            # each worker reports to the load's span (its retries are the load's events)
            list(pool.map(carried(worker), list(job.by_worker)))
    finally:
        # deleting the sessions must not outlast the load's deadline (a silent server
        # answers no DeleteSession: the sessions then expire on their own)
        raw.close(timeout=min(CLOSE_TIMEOUT, max(CLOSE_GRACE, job.deadline.remaining())))
    if errors:
        raise stopped(job.report, errors[0]) from errors[0]


def load_core(engine: Any, job: Job) -> None:
    """Other dialects: one transaction per batch, in this thread (SQLite takes one writer).

    Batches go round-robin over the workers' shuffled lists, the order the Spanner
    workers would interleave in; SQLAlchemy's write hook checks the shard values again.
    """
    stmt = job.table.insert()
    if job.mode == "insert_or_update":
        stmt = stmt.prefix_with("OR REPLACE", dialect="sqlite")
    lists = list(job.by_worker.values())
    order = [ws[i] for i in range(max(map(len, lists), default=0)) for ws in lists if i < len(ws)]
    for b in order:
        values, _ = job.staged.rows(b)
        rows = [dict(zip(job.columns, v, strict=True)) for v in values]
        del values

        def attempt(timeout: float, rows: list[dict[str, Any]] = rows) -> None:
            if isinstance(engine, sa.Engine):
                with engine.begin() as conn:
                    conn.execute(stmt, rows)
            else:
                engine.execute(stmt, rows)

        try:
            retry_call(
                attempt,
                job.policy,
                what=f"writing batch {b} ({len(rows)} rows)",
                deadline=job.deadline,
                on_retry=lambda exc, outcome: job.retried(),
            )
        except Exception as exc:
            job.failed(b, exc)
            raise stopped(job.report, exc) from exc
        job.done(b)


def present_indexes(engine: Any, table: sa.Table) -> set[str]:
    return {str(ix["name"]) for ix in sa.inspect(engine).get_indexes(table.name)}


def drop_indexes(engine: Any, table: sa.Table, report: BulkLoadReport) -> None:
    """Drop the table's secondary indexes; those already gone (a failed load dropped
    them) are skipped, so the same call can be run again."""
    present = present_indexes(engine, table)
    for ix in sorted(table.indexes, key=lambda i: str(i.name)):
        if ix.name in present:
            ix.drop(engine)
        report.dropped_indexes.append(str(ix.name))


def create_indexes(engine: Any, table: sa.Table, report: BulkLoadReport) -> None:
    """Create the indexes this load dropped (those present already are left alone)."""
    present = present_indexes(engine, table)
    for ix in sorted(table.indexes, key=lambda i: str(i.name)):
        if str(ix.name) in report.dropped_indexes:
            if ix.name not in present:
                ix.create(engine)
            report.dropped_indexes.remove(str(ix.name))
