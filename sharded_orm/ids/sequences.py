"""Pooled id generators that never hand out a duplicate.

``SpannerSequence``: Spanner's own ``bit_reversed_positive`` SEQUENCE, read a block at a
time (``GET_NEXT_SEQUENCE_VALUE`` over ``UNNEST(GENERATE_ARRAY(1, @n))``: one query per
block, in a read-write transaction, the only kind in which the function may run).
``TableSequence``: the seeds' portable Sequences table (``Sequence_ID``, ``Next_Value``),
reserving a block of N values in one read-write transaction, on any database.

Both hand values out from a local pool under a lock (thread-safe). Only values from a
committed reservation are handed out, and the database is the only source of truth for
reservations (process-safe: two engines or processes never share a block). A reservation
that fails with Spanner's ABORTED, or with the emulator's one-writer-at-a-time errors, or
SQLite's writer lock, is retried with bounded, jittered backoff. Values lost with a dying
pool or a failed attempt are gaps, never duplicates.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy as sa

from sharded_orm.checks import check_identifier
from sharded_orm.errors import (
    ShardConfigError,
    ShardingError,
    ShardTypeError,
    UnsupportedOnDialectError,
)
from sharded_orm.ids.mixins import INT64_MAX, bit_reverse
from sharded_orm.spanner import is_spanner

T = TypeVar("T")

#: Error texts of contention a new attempt can win: Spanner's ABORTED (and the DB-API's
#: "aborted and could not be retried" when its own replay sees other values), the
#: emulator's lost-transaction errors under concurrent writers, SQLite's writer lock.
RETRYABLE_MARKERS = (
    "aborted",
    "transaction not found",
    "invalid transaction",
    "database is locked",
)


class SequenceExhausted(ShardingError, OverflowError):
    """The sequence reached INT64's maximum: no value is left to hand out."""


class ReservationConflict(ShardingError, RuntimeError):
    """Another client moved ``Next_Value`` between our read and our write: try again."""


def is_retryable(exc: BaseException) -> bool:
    """Contention that a new attempt can win (see :data:`RETRYABLE_MARKERS`)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ReservationConflict):
            return True
        if isinstance(seen, SequenceExhausted):
            return False
        text = str(seen).lower()
        if type(seen).__name__ == "Aborted" or any(m in text for m in RETRYABLE_MARKERS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def with_retries(
    fn: Callable[[], T],
    *,
    attempts: int = 12,
    base_delay: float = 0.02,
    max_delay: float = 1.0,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """``fn()``, again after a retryable failure: at most ``attempts`` calls, waiting
    ``base_delay * 2**attempt`` (capped at ``max_delay``, jittered) in between."""
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as exc:
            if attempt == attempts - 1 or not is_retryable(exc):
                raise
            if on_retry is not None:
                on_retry(exc)
            delay = min(max_delay, base_delay * (2**attempt))
            time.sleep(delay * (0.5 + random.random()))
    raise AssertionError("unreachable")


def _check_block(block_size: object) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise ShardTypeError(
            f"block_size must be an int (how many values one reservation takes), got {block_size!r}"
        )
    if block_size <= 0:
        raise ShardConfigError(f"block_size must be at least 1, got {block_size}")
    return block_size


class _Pooled:
    """The local pool: handed out under a lock, refilled by one reservation at a time."""

    def __init__(self, block_size: int) -> None:
        self.block_size = _check_block(block_size)
        self._pool: deque[int] = deque()
        self._lock = threading.Lock()
        #: reservations that succeeded, and failed attempts that were retried
        self.reservations = 0
        self.retries = 0

    def _reserve(self) -> list[int]:
        raise NotImplementedError

    def _count_retry(self, exc: BaseException) -> None:
        self.retries += 1

    def next_id(self) -> int:
        """The next value: from the pool, or from a new reservation when it is empty."""
        with self._lock:
            if not self._pool:
                self._pool.extend(with_retries(self._reserve, on_retry=self._count_retry))
                self.reservations += 1
            return self._pool.popleft()

    __call__ = next_id  # usable as a column default: ``default=seq``


def _check_counter(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ShardTypeError(f"{what} must be an int, got {value!r}")
    if not 1 <= value <= INT64_MAX:
        raise ShardConfigError(f"{what} must be between 1 and 2**63 - 1, got {value}")
    return value


class SpannerSequence(_Pooled):
    """A ``bit_reversed_positive`` SEQUENCE on Spanner, read ``block_size`` values at a time.

    Values come out as Spanner makes them: bit-reversed, positive, never in the sequence's
    ``skip_range``. Create the sequence with :meth:`create_ddl` (or your migrations).
    """

    def __init__(self, engine: sa.Engine, name: str, *, block_size: int = 100) -> None:
        super().__init__(block_size)
        if not is_spanner(engine):
            raise UnsupportedOnDialectError(
                f"SpannerSequence needs a Spanner engine, got {engine.dialect.name!r}; "
                "use TableSequence, which works on any database"
            )
        self.engine = engine
        self.name = check_identifier(name, "sequence name")
        self._sql = sa.text(
            f"SELECT GET_NEXT_SEQUENCE_VALUE(SEQUENCE {self.name}) "
            "FROM UNNEST(GENERATE_ARRAY(1, :n))"
        )

    @staticmethod
    def create_ddl(
        name: str, *, skip_range: tuple[int, int] | None = None, start_counter: int | None = None
    ) -> str:
        """``CREATE SEQUENCE`` with bit-reversed values.

        ``skip_range=(lo, hi)``: values ``lo <= v <= hi`` (both ends included) are never
        returned, e.g. to keep legacy ids free. ``start_counter``: the first counter value
        (the value returned is its bit reversal).
        """
        opts = ["sequence_kind = 'bit_reversed_positive'"]
        if skip_range is not None:
            if not isinstance(skip_range, tuple) or len(skip_range) != 2:
                raise ShardTypeError(f"skip_range is a (min, max) tuple, got {skip_range!r}")
            lo = _check_counter(skip_range[0], "skip_range minimum")
            hi = _check_counter(skip_range[1], "skip_range maximum")
            if lo > hi:
                raise ShardConfigError(
                    f"skip_range minimum {lo} is above its maximum {hi}: give (min, max)"
                )
            opts += [f"skip_range_min = {lo}", f"skip_range_max = {hi}"]
        if start_counter is not None:
            opts.append(f"start_with_counter = {_check_counter(start_counter, 'start_counter')}")
        return (
            f"CREATE SEQUENCE {check_identifier(name, 'sequence name')} OPTIONS ({', '.join(opts)})"
        )

    def _reserve(self) -> list[int]:
        try:
            with self.engine.begin() as conn:
                return [int(v) for (v,) in conn.execute(self._sql, {"n": self.block_size})]
        except sa.exc.DBAPIError as exc:
            if "is exhausted" in str(getattr(exc.orig, "__cause__", None) or exc.orig).lower():
                raise SequenceExhausted(
                    f"sequence {self.name!r} is exhausted: Spanner has no counter left for "
                    f"a block of {self.block_size} (its values are INT64s). Create a new "
                    "sequence, or draw the last values with block_size=1."
                ) from exc
            raise


class TableSequence(_Pooled):
    """The seeds' Sequences table: ``Sequence_ID`` -> ``Next_Value``, blocks of N values.

    A reservation reads ``Next_Value`` and writes ``Next_Value + N`` only if it is still
    the value read (optimistic: a lost race is retried), in one read-write transaction;
    the block ``[Next_Value, Next_Value + N)`` is then this generator's alone. Values start
    at 1; the last value handed out is ``2**63 - 2`` (``Next_Value`` must stay an INT64),
    after which :class:`SequenceExhausted` is raised. ``bit_reversed=True`` hands out
    ``bit_reverse(v)``: unique too, spread over the key space.
    """

    def __init__(
        self,
        engine: sa.Engine,
        name: str,
        *,
        block_size: int = 100,
        table_name: str = "Sequences",
        bit_reversed: bool = False,
    ) -> None:
        super().__init__(block_size)
        if not isinstance(name, str) or not name:
            raise ShardTypeError(f"a sequence name is a non-empty str, got {name!r}")
        if not isinstance(bit_reversed, bool):
            raise ShardTypeError(f"bit_reversed must be a bool, got {bit_reversed!r}")
        self.engine = engine
        self.name = name
        self.bit_reversed = bit_reversed
        self.table = sa.Table(
            check_identifier(table_name, "table name"),
            sa.MetaData(),
            sa.Column("Sequence_ID", sa.String(128), primary_key=True),
            sa.Column("Next_Value", sa.BigInteger, nullable=False),
        )

    def create_table(self) -> None:
        """Create the Sequences table if it does not exist."""
        with_retries(lambda: self.table.create(self.engine, checkfirst=True))

    def _reserve(self) -> list[int]:
        t = self.table
        with self.engine.begin() as conn:
            current = conn.execute(
                sa.select(t.c.Next_Value).where(t.c.Sequence_ID == self.name)
            ).scalar()
            start = 1 if current is None else int(current)
            end = min(start + self.block_size, INT64_MAX)  # exclusive; stays an INT64
            if start >= end:
                raise SequenceExhausted(
                    f"sequence {self.name!r} is exhausted: it handed out every value up to "
                    f"2**63 - 2 (Next_Value is {start}). Start a new sequence."
                )
            if current is None:
                try:
                    conn.execute(t.insert(), {"Sequence_ID": self.name, "Next_Value": end})
                except sa.exc.IntegrityError as exc:  # another client created it first
                    raise ReservationConflict(self.name) from exc
            else:
                done = conn.execute(
                    t.update()
                    .where(t.c.Sequence_ID == self.name, t.c.Next_Value == current)
                    .values(Next_Value=end)
                )
                if done.rowcount != 1:
                    raise ReservationConflict(f"{self.name}: Next_Value moved under us")
        # committed: the block is ours
        values = range(start, end)
        return [bit_reverse(v) for v in values] if self.bit_reversed else list(values)
