"""Pooled id generators that never hand out a duplicate, and never wait for ever.

``SpannerSequence``: Spanner's own ``bit_reversed_positive`` SEQUENCE, read a block at a
time (``GET_NEXT_SEQUENCE_VALUE`` over ``UNNEST(GENERATE_ARRAY(1, @n))``: one query per
block, in a read-write transaction, the only kind in which the function may run).
``TableSequence``: the seeds' portable Sequences table (``Sequence_ID``, ``Next_Value``),
reserving a block of N values in one read-write transaction, on any database.

Like Hibernate's pooled generator, a block is reserved in a transaction of its own. On
Spanner that transaction is sent with the client's internal retries off
(:class:`~sharded_orm.spanner.mutations.RawSpanner`: the DB-API would replay an ABORTED
commit under our retries, hundreds of times), and every call is bounded; retries follow
:mod:`sharded_orm.retry`, and the whole reservation (waiting for the lock included) ends
within ``deadline`` seconds with a clear error. Values are handed out from a local pool
under a lock (thread-safe) that is never held across a reservation: one caller reserves
while the others wait for its block (one reservation per block). Only values of a
committed reservation are handed out, and the database alone decides reservations
(process-safe). A retry after an unknown outcome reserves a new block: values of a lost
block are a gap, never a duplicate.

On an async engine (``create_async_engine``; pass it or its ``sync_engine``), a flush
computing ``default=seq`` runs in SQLAlchemy's greenlet on the event loop's thread: a
reservation that blocks (Spanner's client, a sync driver) runs on a thread there and is
awaited, and callers waiting for it await too, so the event loop never waits on the
database; ``await seq.next_id_async()`` does the same from a coroutine.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from sharded_orm.checks import check_identifier, shown
from sharded_orm.errors import (
    ShardConfigError,
    ShardingError,
    ShardTypeError,
    UnsupportedOnDialectError,
)
from sharded_orm.greenlets import await_here, on_event_loop
from sharded_orm.hashing import INT64_MAX
from sharded_orm.ids.mixins import bit_reverse
from sharded_orm.retry import (
    Deadline,
    Outcome,
    RetryDeadlineError,
    RetryPolicy,
    TransientError,
    retry_call,
)
from sharded_orm.spanner import is_spanner
from sharded_orm.telemetry import operation

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

#: The largest block one reservation may take: the pool holds it in memory (about 36
#: bytes a value), and Spanner's GENERATE_ARRAY returns at most this many elements.
MAX_BLOCK_SIZE = 100_000
#: Sequence_ID is a STRING(128).
MAX_NAME_LENGTH = 128


class SequenceExhausted(ShardingError, OverflowError):
    """The sequence reached INT64's maximum: no value is left to hand out."""


class PoolStarved(ShardConfigError):
    """A reservation found no free connection in its engine's pool (sized too small)."""


class ReservationConflict(TransientError):
    """Another client moved ``Next_Value`` between our read and our write: try again."""


def _check_block(block_size: object) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise ShardTypeError(
            f"block_size must be an int (how many values one reservation takes), got {block_size!r}"
        )
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise ShardConfigError(
            f"block_size must be between 1 and {MAX_BLOCK_SIZE:,}, got {block_size}: the "
            "pool holds a block in memory (a few hundred values is typical)"
        )
    return block_size


#: One attempt of a reservation may take at most this share of ``deadline`` (and at most
#: MAX_ATTEMPT_TIMEOUT seconds): a call that hangs leaves time for a second attempt.
ATTEMPT_SHARE = 1 / 3
MAX_ATTEMPT_TIMEOUT = 60.0
#: next_id() waits at most this long: a day is far beyond any sane reservation.
MAX_DEADLINE = 86_400.0


def attempt_timeout(deadline: float) -> float:
    """The most one reservation attempt may take within ``deadline`` seconds."""
    return min(MAX_ATTEMPT_TIMEOUT, max(0.001, deadline * ATTEMPT_SHARE))


def _check_deadline(deadline: object) -> float:
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
        raise (ShardConfigError if deadline is None else ShardTypeError)(
            f"deadline must be a number of seconds (next_id() is bounded), got {deadline!r}"
        )
    if not 0 < deadline <= MAX_DEADLINE:  # also refuses NaN and infinity
        raise ShardConfigError(
            f"deadline must be more than 0 and at most {MAX_DEADLINE:,.0f} s (one day), got "
            f"{deadline!r}: next_id() always ends, with a value or an error; a value "
            "that large would only hide a dead database"
        )
    return float(deadline)


class _Pooled:
    """The local pool: values handed out under a lock, refilled by one reservation at a
    time (the others wait for it); the lock is never held across a reservation.

    Handing out is a pop under ``_lock``. An empty pool is refilled by the caller that
    finds it empty: it registers the refill (a :class:`concurrent.futures.Future`) under
    the lock, reserves with the lock released, puts the block into the pool under the
    lock, and keeps the block's first value; callers that find a refill under way wait
    for it (within their deadline), then take a value. So one reservation per block, as
    when the reservation ran under the lock, and an async engine's flush can run it on a
    thread and await it: no other task on the event loop thread ever waits on the lock
    while it holds its value for an ``await`` (which would freeze the loop).
    """

    def __init__(
        self, engine: sa.Engine | AsyncEngine, block_size: int, deadline: float, max_retries: int
    ) -> None:
        # an AsyncEngine: its sync engine (the one its flushes run through)
        sync_engine = getattr(engine, "sync_engine", None)
        if isinstance(sync_engine, sa.Engine):
            engine = sync_engine
        if not isinstance(engine, sa.Engine):
            raise ShardTypeError(f"engine must be a SQLAlchemy Engine, got {shown(engine)}")
        self.engine = engine
        self.block_size = _check_block(block_size)
        self.deadline: float = _check_deadline(deadline)
        policy = RetryPolicy.for_retries(max_retries, self.deadline)
        # one attempt gets a share of the deadline, so a hung call leaves time to retry
        self.policy = dataclasses.replace(policy, call_timeout=attempt_timeout(self.deadline))
        self._pool: deque[int] = deque()
        self._lock = threading.Lock()  # held for pool and refill bookkeeping only, no I/O
        #: the reservation under way (its result: the block's first value), if any
        self._refill: Future[int] | None = None
        self._raw: Any = None
        #: reservations that succeeded, and failed attempts that were retried
        self.reservations = 0
        self.retries = 0

    @property
    def raw(self) -> Any:
        """On Spanner, the client calls with our timeouts and no internal retries.

        One session serves every reservation: only one runs at a time (``_refill``)."""
        if self._raw is None:
            from sharded_orm.spanner.mutations import RawSpanner, database_of

            # the Database noted at the engine's connects: no checkout (a flush holding
            # the pool's last connection still gets its block); an engine that never
            # connected checks one out (an async engine's awaits, in its greenlet):
            # never under the lock
            raw = RawSpanner(database_of(self.engine), per_thread=False)
            with self._lock:
                if self._raw is None:
                    self._raw = raw
        return self._raw

    def _reserve(self, timeout: float) -> list[int]:
        raise NotImplementedError

    #: reservations go through :attr:`raw` (Spanner's client: blocking calls)
    _uses_raw = True

    def _count_retry(self, exc: BaseException, outcome: object) -> None:
        self.retries += 1

    def next_id(self) -> int:
        """The next value: from the pool, or from a new reservation when it is empty.

        Ends within ``deadline`` seconds (waiting for another caller's reservation
        included) with a value or an error. In an async engine's flush (SQLAlchemy's
        greenlet, on the event loop's thread) a reservation runs on a thread and is
        awaited: the event loop runs on meanwhile."""
        with self._lock:  # never held across I/O: a short wait at most
            if self._pool:
                return self._pool.popleft()
        clock = Deadline(self.deadline)  # waits and the reservation share it
        on_loop = on_event_loop()
        while True:
            with self._lock:
                if self._pool:
                    return self._pool.popleft()
                refill, mine = self._refill, False
                if refill is None:
                    refill = self._refill = Future()
                    mine = True
            if mine:
                return self._refill_pool(refill, clock, on_loop)
            self._wait_for(refill, clock, on_loop)

    __call__ = next_id  # usable as a column default: ``default=seq``

    async def next_id_async(self) -> int:
        """:meth:`next_id` from a coroutine: a reservation is awaited, never blocking
        the event loop (a pool hit costs no more than in :meth:`next_id`)."""
        from sqlalchemy.util import greenlet_spawn

        value: int = await greenlet_spawn(self.next_id)
        return value

    def _refill_pool(self, refill: Future[int], clock: Deadline, on_loop: bool) -> int:
        """Reserve a block: the rest into the pool, its first value is the caller's."""
        # an async driver's statements (TableSequence off Spanner) await by themselves
        blocking = self._uses_raw or not self.engine.dialect.is_async
        if not (on_loop and blocking):
            return self._fill(refill, clock)
        if self._uses_raw and self._raw is None:
            try:  # here, in the greenlet: an async engine's checkout awaits
                self.raw  # noqa: B018
            except BaseException as exc:
                with self._lock:
                    self._refill = None
                refill.set_exception(exc)
                raise
        import asyncio
        import contextvars

        # the caller's context on the thread: telemetry parents the refill's span there
        run = contextvars.copy_context().run
        loop = asyncio.get_running_loop()
        value: int = await_here(loop.run_in_executor(None, run, self._fill, refill, clock))
        return value

    def _fill(self, refill: Future[int], clock: Deadline) -> int:
        """The reservation, retried within ``clock``; ``refill`` is resolved either way
        (a cancelled awaiting task leaves the block in the pool)."""
        try:
            retries = self.retries
            # the table a TableSequence reserves in; a Spanner sequence's own name
            table = getattr(getattr(self, "table", None), "name", None)
            name = getattr(self, "name", None)
            with operation("sequence.refill", self.engine, table or name, sequence=name) as traced:
                block = retry_call(
                    self._reserve,
                    self.policy,
                    what=f"reserving a block of {self.block_size} values for {self!r}",
                    idempotent=True,  # a block reserved twice is a gap, never a duplicate
                    resume="No value of a failed block is handed out; call next_id() again.",
                    deadline=clock,
                    on_retry=self._count_retry,
                )
                traced.set(block_size=len(block), retries=self.retries - retries)
        except BaseException as exc:
            with self._lock:
                self._refill = None
            refill.set_exception(exc)
            raise
        with self._lock:
            self._pool.extend(block[1:])
            self.reservations += 1
            self._refill = None
        refill.set_result(block[0])
        return block[0]

    def _wait_for(self, refill: Future[int], clock: Deadline, on_loop: bool) -> None:
        """Wait until another caller's reservation ends (success or not), within ``clock``."""
        left = clock.remaining()
        try:
            if on_loop:
                import asyncio

                # shield: this task's timeout or cancellation leaves the refill alone
                waited = asyncio.shield(asyncio.wrap_future(refill))
                await_here(asyncio.wait_for(waited, max(left, 0.0)))
            else:
                refill.result(timeout=max(left, 0.0))
            return
        except (TimeoutError, FutureTimeout):
            pass
        except Exception:  # its reservation failed: ours is tried next, within our deadline
            if clock.remaining() > 0:
                return
            raise  # its error says why better than ours would
        raise RetryDeadlineError(
            f"{self!r}: no value within {self.deadline} s: another thread or task has held "
            "the pool's lock (its reservation of a block) that long (is the database "
            "reachable?)",
            attempts=0,
            elapsed=clock.elapsed(),
            outcome=Outcome.UNKNOWN,
            last_error=TimeoutError("waiting for another reservation"),
        )

    def close(self) -> None:
        """Release the Spanner sessions this generator holds (unused values are a gap)."""
        if self._raw is not None:
            self._raw.close()
            self._raw = None


def _note_database(engine: sa.Engine) -> None:
    """From now on, ``engine``'s connects note its client Database, so the first
    reservation checks no connection out (our dialect does it at ``create_engine``; this
    covers an engine made on the stock dialect class before ``import sharded_orm``)."""
    from sharded_orm.spanner.databases import remember_database

    remember_database(engine)


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
    ``deadline``: seconds one ``next_id()`` may take at most; ``max_retries``: retries of
    a failed reservation.
    """

    def __init__(
        self,
        engine: sa.Engine | AsyncEngine,
        name: str,
        *,
        block_size: int = 100,
        deadline: float = 30.0,
        max_retries: int = 8,
    ) -> None:
        super().__init__(engine, block_size, deadline, max_retries)
        if not is_spanner(self.engine):
            raise UnsupportedOnDialectError(
                f"SpannerSequence needs a Spanner engine, got {self.engine.dialect.name!r}; "
                "use TableSequence, which works on any database"
            )
        self.name = check_identifier(name, "sequence name")
        _note_database(self.engine)
        # Spanner's counters are not transactional: a block that runs past the end fails
        # and still uses up the counters it drew. So the block is cut to the counters
        # left (the internal state is the next counter; NULL before the first draw).
        seq = f"SEQUENCE `{self.name}`"
        self._sql = (
            f"SELECT GET_NEXT_SEQUENCE_VALUE({seq}) FROM UNNEST(GENERATE_ARRAY(1, LEAST(@n, "
            f"{INT64_MAX} - COALESCE(GET_INTERNAL_SEQUENCE_STATE({seq}), 0))))"
        )

    def __repr__(self) -> str:
        return f"SpannerSequence({self.name!r})"

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

    def _reserve(self, timeout: float) -> list[int]:
        try:
            rows = self.raw.read_write(
                lambda t: t.query(self._sql, {"n": self.block_size}), timeout
            )
        except Exception as exc:
            if "is exhausted" in str(exc).lower():
                raise SequenceExhausted(
                    f"sequence {self.name!r} is exhausted: Spanner has no counter left for "
                    f"a block of {self.block_size} (its counters are INT64s; the first block "
                    "of a sequence started near the end can use up the last ones). Create a new "
                    f"sequence, e.g. SpannerSequence.create_ddl({self.name + '_2'!r}), and "
                    "switch to it."
                ) from exc
            raise
        if not rows:
            raise SequenceExhausted(
                f"sequence {self.name!r} is exhausted: Spanner handed out its last counter "
                "(its counters are INT64s). Create a new sequence, e.g. "
                f"SpannerSequence.create_ddl({self.name + '_2'!r}), and switch to it."
            )
        return [int(v) for (v,) in rows]


class TableSequence(_Pooled):
    """The seeds' Sequences table: ``Sequence_ID`` -> ``Next_Value``, blocks of N values.

    A reservation reads ``Next_Value`` and writes ``Next_Value + N`` only if it is still
    the value read (optimistic: a lost race is retried), in one read-write transaction;
    the block ``[Next_Value, Next_Value + N)`` is then this generator's alone. Values start
    at 1; the last value handed out is ``2**63 - 2`` (``Next_Value`` must stay an INT64;
    the last block may be shorter), after which :class:`SequenceExhausted` is raised.
    ``bit_reversed=True`` hands out ``bit_reverse(v)``: unique too, spread over the key
    space. ``deadline`` and ``max_retries`` as for :class:`SpannerSequence`.
    """

    def __init__(
        self,
        engine: sa.Engine | AsyncEngine,
        name: str,
        *,
        block_size: int = 100,
        table_name: str = "Sequences",
        bit_reversed: bool = False,
        deadline: float = 30.0,
        max_retries: int = 8,
    ) -> None:
        super().__init__(engine, block_size, deadline, max_retries)
        if not isinstance(name, str) or not name:
            raise ShardTypeError(f"a sequence name is a non-empty str, got {name!r}")
        if len(name) > MAX_NAME_LENGTH:
            raise ShardConfigError(
                f"a sequence name holds at most {MAX_NAME_LENGTH} characters (Sequence_ID is "
                f"a STRING({MAX_NAME_LENGTH})), got {len(name)}: {name[:40]!r}..."
            )
        if not isinstance(bit_reversed, bool):
            raise ShardTypeError(f"bit_reversed must be a bool, got {bit_reversed!r}")
        self.name = name
        self.bit_reversed = bit_reversed
        self.table = sa.Table(
            check_identifier(table_name, "table name"),
            sa.MetaData(),
            sa.Column("Sequence_ID", sa.String(MAX_NAME_LENGTH), primary_key=True),
            sa.Column("Next_Value", sa.BigInteger, nullable=False),
        )
        self._on_spanner = is_spanner(self.engine)
        self._uses_raw = self._on_spanner
        if self._on_spanner:
            _note_database(self.engine)

    def __repr__(self) -> str:
        return f"TableSequence({self.name!r})"

    def create_table(self) -> None:
        """Create the Sequences table if it does not exist."""

        def create(timeout: float) -> None:
            self.table.create(self.engine, checkfirst=True)

        retry_call(create, self.policy, what=f"creating table {self.table.name}", idempotent=True)

    def _block(self, current: int | None) -> tuple[int, int]:
        start = 1 if current is None else int(current)
        end = min(start + self.block_size, INT64_MAX)  # exclusive; stays an INT64
        if start >= end:
            raise SequenceExhausted(
                f"sequence {self.name!r} is exhausted: it handed out every value up to "
                f"2**63 - 2 (Next_Value is {start}). Start a new sequence (another name)."
            )
        return start, end

    def _reserve(self, timeout: float) -> list[int]:
        start, end = (self._reserve_spanner if self._on_spanner else self._reserve_sql)(timeout)
        # committed: the block is ours
        values = range(start, end)
        return [bit_reverse(v) for v in values] if self.bit_reversed else list(values)

    def _reserve_spanner(self, timeout: float) -> tuple[int, int]:
        table = f"`{self.table.name}`"

        def work(txn: Any) -> tuple[int, int]:
            found = txn.query(
                f"SELECT Next_Value FROM {table} WHERE Sequence_ID = @name", {"name": self.name}
            )
            current = int(found[0][0]) if found else None
            start, end = self._block(current)
            if current is None:
                sql = f"INSERT INTO {table} (Sequence_ID, Next_Value) VALUES (@name, @end)"
                params: dict[str, int | str] = {"name": self.name, "end": end}
            else:
                sql = (
                    f"UPDATE {table} SET Next_Value = @end "
                    "WHERE Sequence_ID = @name AND Next_Value = @current"
                )
                params = {"name": self.name, "end": end, "current": current}
            try:
                changed = txn.update(sql, params)
            except Exception as exc:
                if "already exists" in str(exc).lower():  # another client created it first
                    raise ReservationConflict(self.name) from exc
                raise
            if changed != 1:
                raise ReservationConflict(f"{self.name}: Next_Value moved under us")
            return start, end

        result: tuple[int, int] = self.raw.read_write(work, timeout)
        return result

    def _reserve_sql(self, timeout: float) -> tuple[int, int]:
        t = self.table
        try:  # a connection of its own: the block is committed whatever the caller's fate
            connection = self.engine.connect()
        except sa.exc.TimeoutError as exc:  # the pool's wait for a connection, only
            raise PoolStarved(
                f"{self!r} found no free connection in its engine's pool to reserve a block "
                f"({self.engine.pool.status()}): a TableSequence off Spanner reserves each "
                "block in a transaction of its own, on a connection of its own, while the "
                "flush asking for the id holds its connection. Size the pool above the "
                "flushes that take ids at once (pool_size + max_overflow at least one "
                "more), or give the TableSequence an engine of its own, e.g. "
                "TableSequence(create_engine(url, poolclass=NullPool), ...)"
            ) from exc
        with connection as conn, conn.begin():
            current = conn.execute(
                sa.select(t.c.Next_Value).where(t.c.Sequence_ID == self.name)
            ).scalar()
            start, end = self._block(current)
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
        return start, end
