"""The client backfill's walk: the table's key once, in stored order, with a key cursor.

Used by :func:`alembic_ext.backfill.backfill_shard` (see its module docstring).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sharded_orm import telemetry
from sharded_orm.progress import Mode, Progress
from sharded_orm.progress import progress as progress_bar
from sharded_orm.retry import Deadline, retry_call

from .backfill_io import BATCH_POLICY, Plan, SpannerWriter, SqlWriter, utc

#: Batches planned by one key-only read (its keys are read, every ``batch_size``-th kept).
PLAN_BATCHES = 64

#: Seconds the count of the rows to walk may take (it gives the lines their ETA).
COUNT_TIMEOUT = 30.0


@dataclass(frozen=True)
class BackfillProgress:
    """Where a backfill stands after a batch."""

    table: str
    column: str
    done: int  # rows filled (were NULL) by this run so far
    total: int  # rows read by this run so far (the walk's position)
    batches: int
    elapsed: float
    phase: str = "fill"  # "fill" (the walk); "verify" for the partitioned DML's one report
    fixed: int = 0  # stale rows rewritten so far


@dataclass(frozen=True)
class BackfillResult:
    """What a backfill run did."""

    table: str
    column: str
    rows: int  # rows filled by this run (0: the column was already complete)
    batches: int
    method: str  # "partitioned_dml", "mutations" (Spanner), "client_batches", "external"
    # or "nothing_to_do"
    elapsed: float
    verified: int = 0  # rows read by the walk
    fixed: int = 0  # stale rows it rewrote


ProgressCallback = Callable[[BackfillProgress], None]


def callback_of(progress: object) -> ProgressCallback | None:
    return progress if callable(progress) else None


def mode_of(progress: object) -> Mode:
    """The :mod:`sharded_orm.progress` mode of a backfill's ``progress=`` argument: off
    for False, None or a callback (it gets the reports instead), auto for True."""
    if progress in (False, None) or callable(progress):
        return "off"
    return "auto" if progress is True else progress  # type: ignore[return-value]


def resume_hint(table: str, column: str) -> str:
    return (
        f"Nothing filled is lost: run the step again (alembic upgrade head, or sharded-orm "
        f"backfill <url> {table} {column} ...) and it completes {table}.{column}."
    )


class Walk:
    """One walk of the key, from its start to the last key found when it began."""

    def __init__(
        self, plan: Plan, fn: Callable[[Sequence[object]], int], batch_size: int,
        writer: SpannerWriter | SqlWriter, progress: object, start: float, verify: bool,
    ) -> None:  # fmt: skip
        self.plan = plan
        self.fn = fn
        self.batch_size = batch_size
        self.writer = writer
        self.callback = callback_of(progress)
        self.mode: Mode = mode_of(progress)
        self.start = start
        self.verify = verify
        self.done = self.batches = self.verified = self.fixed = 0
        self.count_note = ""
        self.clock = Deadline(None)
        names = [c.name for c in plan.read_cols]
        self.key_at = [names.index(c.name) for c in plan.key]
        self.src_at = [names.index(c.name) for c in plan.sources]
        self.target_at = names.index(plan.target.name)
        self._filled = self._stale = 0

    def _changes(self, rows: list[Any]) -> list[tuple[Any, int]]:
        out = []
        filled = stale = 0
        for r in rows:
            current = r[self.target_at]
            if current is not None and not self.verify:
                continue
            value = self.fn([utc(r[i]) for i in self.src_at])
            if current != value:
                out.append(([r[i] for i in self.key_at], value))
                if current is None:
                    filled += 1
                else:
                    stale += 1
        self._filled, self._stale = filled, stale  # of the attempt that commits
        return out

    def walk(self, clock: Deadline, batch_timeout: float) -> None:
        """Plan ``PLAN_BATCHES`` batches at a time from a key-only read, then run each on
        its own closed key range: a batch reads only its rows (the emulator's Read, and
        Spanner's locks in a read-write transaction, cost the range asked, not the rows
        returned; an open-ended range made every batch pay for the rest of the table)."""
        self.clock = clock
        p = self.plan
        what = f"backfill of {p.table.name}.{p.target.name}"
        policy = dataclasses.replace(BATCH_POLICY, call_timeout=batch_timeout)
        resume = resume_hint(p.table.name, p.target.name)
        bound = retry_call(
            self.writer.last_key, policy, what=f"{what} (its last key)", idempotent=True,
            resume=resume, deadline=clock,
        )  # fmt: skip
        if bound is None:
            return  # an empty table
        after: list[Any] | None = None
        limit = 2 * self.batch_size  # a range grown by concurrent inserts takes 2+ batches
        with progress_bar(None, f"backfill {p.table.name}.{p.target.name}", mode=self.mode) as bar:
            if bar.mode != "off":
                self._count(bar, min(batch_timeout, COUNT_TIMEOUT, clock.remaining()))
            done = False
            while not done:
                uppers, done = retry_call(
                    functools.partial(
                        self.writer.plan_batches, after, bound, self.batch_size, PLAN_BATCHES
                    ),
                    policy, what=f"{what} (planning batches after {self.verified} rows)",
                    idempotent=True, resume=resume, deadline=clock,
                )  # fmt: skip
                for upper in uppers:
                    while True:
                        rows = retry_call(
                            functools.partial(
                                self.writer.batch, after, upper, limit, self._changes
                            ),
                            policy,
                            what=f"{what} (batch {self.batches + 1}, after {self.verified} rows)",
                            idempotent=True, resume=resume, deadline=clock,
                        )  # fmt: skip
                        self._advance(rows, bar)
                        if len(rows) < limit:
                            after = upper
                            break
                        after = [rows[-1][i] for i in self.key_at]

    def _count(self, bar: Progress, timeout: float) -> None:
        """The rows to walk, so the lines give a percentage and an ETA (without it a long
        fill said only rows and rate: how long was left was anyone's guess). One key-only
        ``COUNT(*)``, a fraction of the walk, which reads and writes every row; the clock's
        lines go on meanwhile. The count is for the lines only: one attempt within
        ``timeout``, and on a failure the walk goes on without a total, saying so."""
        try:
            bar.set_total(self.writer.count_rows(timeout))
        except Exception as e:  # noqa: BLE001 - the lines' total only; the walk goes on
            self.count_note = f"; rows not counted ({type(e).__name__}): no ETA"
            bar.set_detail(self.count_note.lstrip("; "))

    def _advance(self, rows: list[list[Any]], bar: Any) -> None:
        if not rows:  # its rows were deleted since the plan
            return
        p = self.plan
        self.verified += len(rows)
        self.done += self._filled
        self.fixed += self._stale
        self._filled = self._stale = 0
        self.batches += 1
        bar.set_detail(f"{self.done:,} filled, {self.fixed:,} fixed{self.count_note}")
        bar.advance(len(rows))
        telemetry.progress(
            rows_done=self.done, rows_read=self.verified, rows_fixed=self.fixed,
            batches=self.batches,
            # where the walk stands, as a count in key order: never the row's key (an
            # e-mail address, say) in a trace
            resume_position=self.verified,
        )  # fmt: skip
        if self.callback is not None:
            self.callback(
                BackfillProgress(
                    p.table.name, p.target.name, self.done, self.verified,
                    self.batches, time.monotonic() - self.start, "fill", self.fixed,
                )
            )  # fmt: skip
