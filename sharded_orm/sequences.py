"""Pooled id generators that never hand out a duplicate.

``SpannerSequence``: Spanner's own ``bit_reversed_positive`` SEQUENCE, read a block at a
time (``GET_NEXT_SEQUENCE_VALUE`` over ``UNNEST(GENERATE_ARRAY(1, @n))``: one round trip
per block). ``TableSequence``: the seeds' portable Sequences table
(``Sequence_ID``, ``Next_Value``), reserving a block of N values in one read-write
transaction, on any database.

Both hand values out from a local pool under a lock (thread-safe); the database is the
only source of truth for reservations (process-safe); a reservation that fails with
Spanner's ABORTED (or the emulator's lost-transaction errors) is retried with backoff.
Values lost with a dying process or pool are gaps, never duplicates.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from .errors import ShardConfigError, ShardingError, ShardTypeError
from .ids import INT64_MAX, bit_reverse
from .query import check_identifier

# Spanner's ABORTED, the emulator's one-writer-at-a-time errors, SQLite's writer lock.
RETRYABLE_MARKERS = (
    "aborted",
    "transaction not found",
    "invalid transaction",
    "database is locked",
)


class SequenceExhausted(ShardingError, OverflowError):
    """The sequence reached INT64's maximum."""


class ReservationConflict(RuntimeError):
    """Another client moved Next_Value between our read and our write: try again."""


def is_retryable(exc: BaseException) -> bool:
    """Contention that a new attempt can win (see ``RETRYABLE_MARKERS``)."""
    if isinstance(exc, ReservationConflict):
        return True
    seen: BaseException | None = exc
    while seen is not None:
        name = type(seen).__name__.lower()
        text = str(seen).lower()
        if name == "aborted" or any(m in text for m in RETRYABLE_MARKERS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def with_retries(fn: Callable[[], Any], *, attempts: int = 12, base_delay: float = 0.02) -> Any:
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as exc:
            if attempt == attempts - 1 or not is_retryable(exc):
                raise
            time.sleep(base_delay * (2**attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def _check_block(block_size: object) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise ShardTypeError(f"block_size must be an int, got {block_size!r}")
    if block_size <= 0:
        raise ShardConfigError(f"block_size must be at least 1, got {block_size}")
    return block_size


class _Pooled:
    def __init__(self, block_size: int) -> None:
        self.block_size = _check_block(block_size)
        self._pool: deque[int] = deque()
        self._lock = threading.Lock()
        self.reservations = 0

    def _reserve(self) -> list[int]:
        raise NotImplementedError

    def next_id(self) -> int:
        with self._lock:
            if not self._pool:
                self._pool.extend(with_retries(self._reserve))
                self.reservations += 1
            return self._pool.popleft()


class SpannerSequence(_Pooled):
    """A ``bit_reversed_positive`` SEQUENCE on Spanner, read ``block_size`` values at a time."""

    def __init__(self, engine: sa.Engine, name: str, *, block_size: int = 100) -> None:
        super().__init__(block_size)
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
        """``CREATE SEQUENCE`` with bit-reversed values, optionally skipping a range."""
        opts = ["sequence_kind = 'bit_reversed_positive'"]
        if skip_range is not None:
            lo, hi = skip_range
            for v in (lo, hi):
                if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= INT64_MAX:
                    raise ShardConfigError(f"skip_range bounds are positive INT64s, got {v!r}")
            if lo > hi:
                raise ShardConfigError(f"skip_range minimum {lo} is above its maximum {hi}")
            opts += [f"skip_range_min = {lo}", f"skip_range_max = {hi}"]
        if start_counter is not None:
            if isinstance(start_counter, bool) or not isinstance(start_counter, int):
                raise ShardTypeError(f"start_counter must be an int, got {start_counter!r}")
            opts.append(f"start_with_counter = {start_counter}")
        return (
            f"CREATE SEQUENCE {check_identifier(name, 'sequence name')} OPTIONS ({', '.join(opts)})"
        )

    def _reserve(self) -> list[int]:
        with self.engine.begin() as conn:
            return [int(v) for (v,) in conn.execute(self._sql, {"n": self.block_size})]


class TableSequence(_Pooled):
    """The seeds' Sequences table: ``Sequence_ID`` -> ``Next_Value``, blocks of N values."""

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
        self.table.create(self.engine, checkfirst=True)

    def _reserve(self) -> list[int]:
        t, n = self.table, self.block_size
        with self.engine.begin() as conn:
            current = conn.execute(
                sa.select(t.c.Next_Value).where(t.c.Sequence_ID == self.name)
            ).scalar()
            start = 1 if current is None else int(current)
            if start > INT64_MAX or start + n - 1 > INT64_MAX:
                raise SequenceExhausted(
                    f"sequence {self.name!r} is exhausted: the next block would pass INT64's "
                    f"maximum ({INT64_MAX}). Start a new sequence."
                )
            if current is None:
                try:
                    conn.execute(t.insert(), {"Sequence_ID": self.name, "Next_Value": start + n})
                except sa.exc.IntegrityError as exc:  # another client created it first
                    raise ReservationConflict(self.name) from exc
            else:
                done = conn.execute(
                    t.update()
                    .where(t.c.Sequence_ID == self.name, t.c.Next_Value == current)
                    .values(Next_Value=start + n)
                )
                if done.rowcount != 1:  # someone reserved first: retried by with_retries
                    raise RuntimeError(
                        "sequence reservation was aborted by a concurrent one"
                    )  # retried
        values = range(start, start + n)
        return [bit_reverse(v) for v in values] if self.bit_reversed else list(values)
