"""Every read on our dialect has a deadline: the ``timeout`` execution option.

The Spanner client streams query results under its default timeout of one hour, and
restarts a stream cut with UNAVAILABLE from its resume token, again and again, with no
overall bound: a silent server or a stopped one held a read for an hour or for ever. The
DB-API passes no ``timeout``/``retry`` to ``Snapshot.execute_sql`` /
``Transaction.execute_sql``, which accept both; google-api-core owns what they mean.

So each statement our dialect executes gets one absolute deadline, ``timeout`` seconds
from its execution (``conn.execution_options(timeout=30)``, on an engine, a connection,
a statement or an ORM execution; :data:`DEFAULT_READ_TIMEOUT` when unset; ``None``
restores the client's own default). Its DB-API cursor sees the connection through
:class:`DeadlineConnection`, which passes to every ``execute_sql`` of that statement:

* ``timeout``: an api-core timeout decorator giving each attempt the time left until the
  deadline, so a silent server ends the read with DEADLINE_EXCEEDED, and a stream restart
  after the deadline ends at once;
* ``retry``: api-core's ``Retry`` for UNAVAILABLE when a stream starts (or restarts after
  a cut, from its resume token), with backoff, until the same deadline.

A read that misses its deadline, or is cut and cannot resume, fails with the DB-API's
``OperationalError`` (``sqlalchemy.exc.OperationalError``) saying it changed nothing and
can be retried; the client's error is its ``__cause__``.

Writes (DML) run under the same deadline: a single INSERT/UPDATE/DELETE through
``execute_sql``, and batch DML (``ExecuteBatchDml``: an ``executemany``, a ``RUN BATCH``),
whose requests the DB-API sent under the client's own per-request default (30 s,
whatever ``timeout`` was given) and, when one failed, followed with a
``BeginTransaction`` under another 30 s. Every batch is sent in requests of at most
:data:`BATCH_DML_STATEMENTS` statements and :data:`BATCH_DML_BYTES` bytes as sent (SQL
text and parameters), one after another in the same transaction (an autocommit batch's
too: all its requests run in the one transaction it commits), each under the time left
until the deadline (:func:`batch_dml_requests`). What the caller sees is what one request
would answer: the statements run in order, the first that fails stops the batch and its
status is the batch's, and the row counts are those of the statements that ran. (The
emulator's time grows faster than its statements: 2,500 UPDATEs in one request never
finished within the client's 30 s; in requests of 100 they take about a minute there.)
A write that misses its deadline fails with an ``OperationalError`` saying what holds for
a write: nothing of it is committed, and its transaction must be rolled back and run
again; so does one whose result stream (``THEN RETURN``) fails while it is fetched.
"""

from __future__ import annotations

import contextvars
import functools
import queue
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from google.api_core import exceptions as _api
from google.api_core.retry import Retry, if_exception_type
from google.cloud.spanner_dbapi import Cursor
from google.cloud.spanner_dbapi import exceptions as _dbapi

from sharded_orm.checks import MAX_SECONDS, is_seconds
from sharded_orm.limits import (
    SPANNER_REQUEST_BYTES,
    SPANNER_REQUEST_OVERHEAD,
    commit_chunks,
    param_bytes,
)
from sharded_orm.retry import DEFAULTS, Deadline
from sharded_orm.telemetry import carried

#: google.rpc.Code.OK: the status of a batch DML whose statements all ran
OK_CODE = 0

#: Execution option naming a statement's deadline, in seconds.
TIMEOUT_OPTION = "timeout"
#: Seconds a statement may take when no ``timeout`` execution option is set (the
#: ``statement`` entry of :data:`sharded_orm.retry.DEFAULTS`).
DEFAULT_READ_TIMEOUT = DEFAULTS["statement"]

#: How much longer than a deadline we wait for a call run in a thread of its own
#: (:func:`finished_within`), so that the RPCs it makes under the same deadline report
#: their own error first.
WAIT_GRACE = 0.5

#: Calls waited for until a deadline (:func:`finished_within`) that may still be running
#: after it, each holding a thread, before new ones are refused at once
#: (:class:`SpannerNotAnswering`): a silent server holds at most about this many threads.
MAX_STUCK_CALLS = 64

#: Seconds a worker thread of :func:`finished_within` waits idle for another call before
#: it ends.
IDLE_WORKER_SECONDS = 2.0

#: Statements per ``ExecuteBatchDml`` request (a larger batch is sent in several, in the
#: same transaction): the emulator's time per statement grows with a request's.
BATCH_DML_STATEMENTS = 100

#: Bytes of one ``ExecuteBatchDml`` request, its statements' SQL texts and parameters as
#: sent ("Request size other than for commits | 10 MiB", less what the request carries
#: besides its statements).
BATCH_DML_BYTES = SPANNER_REQUEST_BYTES - SPANNER_REQUEST_OVERHEAD

#: Bytes one statement of a batch carries besides its SQL text and its parameters'
#: values: its parameters' names and types, its framing (an upper bound).
BATCH_STATEMENT_OVERHEAD = 64

#: The longest wait between two attempts of an autocommit batch aborted again (and at
#: most an eighth of the time left).
AUTOCOMMIT_REPLAY_DELAY = 2.0

#: A statement the DB-API sends as DML (its own classification: INSERT, UPDATE, DELETE).
_DML = re.compile(r"\s*(?:insert|update|delete)\b", re.IGNORECASE)

#: Errors a read cannot outlive: missed deadline, server gone, stream cut for good.
_READ_FAILURES = (
    _api.DeadlineExceeded,
    _api.ServiceUnavailable,
    _api.Cancelled,
    _api.RetryError,
)


def timeout_of(options: Any, default: float | None = DEFAULT_READ_TIMEOUT) -> float | None:
    """The ``timeout`` execution option (seconds), checked; ``default`` when unset."""
    seconds = options.get(TIMEOUT_OPTION, default)
    if seconds is None:
        return None
    if not is_seconds(seconds):  # (inf, 1e300: the client's deadline overflowed at once)
        raise _dbapi.ProgrammingError(
            f"execution option {TIMEOUT_OPTION}={seconds!r}: give the seconds a statement "
            f"may take, a number > 0 and below {MAX_SECONDS:g} (or None for the Spanner "
            "client's own default)"
        )
    return float(seconds)


class StatementDeadline:
    """The DB-API-facing adapter of the one :class:`~sharded_orm.retry.Deadline`: an
    api-core timeout decorator giving each attempt the time left until that deadline.

    One per statement (its cursor's); a replay of an aborted transaction that statement
    set off runs under the same one (:mod:`.connection`). It keeps no clock of its own:
    ``deadline`` is the statement's (or the commit's) :class:`~sharded_orm.retry.Deadline`."""

    def __init__(self, deadline: Deadline | float, what: str = "its deadline") -> None:
        #: the one deadline this adapter hands to the client
        self.deadline = deadline if isinstance(deadline, Deadline) else Deadline(deadline, what)
        #: the last attempt failed for want of time or of a server
        self.failed = False

    @property
    def seconds(self) -> float:
        """The seconds asked for."""
        return self.deadline.seconds

    @property
    def what(self) -> str:
        """What the deadline is, for messages ("its deadline", "commit_timeout")."""
        return self.deadline.what

    @property
    def left(self) -> float:
        """Seconds until the deadline (0 once it passed)."""
        return self.deadline.remaining()

    @property
    def given_up(self) -> bool:
        """The deadline passed, or an attempt under it failed: the read is over."""
        return self.failed or self.deadline.expired

    def exceeded(self) -> Exception:
        """The client's DEADLINE_EXCEEDED for a call made after the deadline."""
        return _api.DeadlineExceeded(f"deadline of {self.seconds:g} s reached")  # type: ignore[no-untyped-call]

    def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def within_deadline(*args: Any, **kwargs: Any) -> Any:
            if self.deadline.expired:
                raise self.exceeded()
            kwargs["timeout"] = self.deadline.call_timeout()
            try:
                result = func(*args, **kwargs)
            except _READ_FAILURES:
                self.failed = True
                raise
            self.failed = False
            return result

        return within_deadline


class SpannerNotAnswering(_dbapi.OperationalError):  # type: ignore[misc]
    """A bounded call refused at once: :data:`MAX_STUCK_CALLS` earlier ones are still
    running past their deadlines (Spanner is not answering them)."""


class _Call:
    """One call handed to a worker thread, and what became of it."""

    __slots__ = ("abandoned", "call", "done", "error", "finished")

    def __init__(self, call: Callable[[], Any]) -> None:
        self.call = call
        self.done = threading.Event()
        self.error: BaseException | None = None
        #: it returned (or raised); set under the pool's lock
        self.finished = False
        #: its caller stopped waiting before it returned; set under the pool's lock
        self.abandoned = False


class BoundedCalls:
    """Worker threads for calls waited for until a deadline (:func:`finished_within`).

    A call goes to an idle worker if one is waiting, else to a new thread: it never
    waits for a busy worker, so the wait is the call's own. A worker idle for
    ``idle_seconds`` ends, so the threads are those of the calls running (and of the
    last few seconds). A call its caller gave up on keeps its thread until the client
    call it is blocked in ends (the client's own timeout, up to an hour): it is counted
    as *stuck* until then, and while ``max_stuck`` are, a new call is refused at once
    with :class:`SpannerNotAnswering` instead of taking one more thread. So a silent
    server holds at most about ``max_stuck`` threads (calls admitted at the same moment
    may each add one), however many calls are made meanwhile."""

    def __init__(self, max_stuck: int | None = None, idle_seconds: float | None = None) -> None:
        #: stuck calls past which new calls are refused
        self.max_stuck = MAX_STUCK_CALLS if max_stuck is None else max_stuck
        #: seconds an idle worker waits for another call before it ends
        self.idle_seconds = IDLE_WORKER_SECONDS if idle_seconds is None else idle_seconds
        self._lock = threading.Lock()
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._idle = 0  # workers waiting for a call, less the calls queued for them
        self._stuck = 0
        self._workers = 0

    @property
    def stuck(self) -> int:
        """Calls still running after their caller's deadline passed."""
        return self._stuck

    @property
    def workers(self) -> int:
        """Worker threads alive (running a call or idle)."""
        return self._workers

    def finished_within(self, call: Callable[[], Any], deadline: Deadline | float) -> bool:
        """See :func:`finished_within`."""
        wait = deadline.remaining() if isinstance(deadline, Deadline) else max(0.0, deadline)
        # the call reports to the caller's span (its client span nests under it)
        job = _Call(carried(call))
        with self._lock:
            stuck = self._stuck
            start = False
            if stuck < self.max_stuck:
                if self._idle:
                    self._idle -= 1
                    self._calls.put(job)
                else:
                    self._workers += 1
                    start = True
        if stuck >= self.max_stuck:
            raise self._refusal(stuck)
        if start:
            self._start(job)
        if not job.done.wait(wait):
            with self._lock:
                if not job.finished:
                    job.abandoned = True
                    self._stuck += 1
                    return False
        if job.error is not None:
            raise job.error
        return True

    def _refusal(self, stuck: int) -> SpannerNotAnswering:
        return SpannerNotAnswering(
            f"{stuck} calls to Spanner have not returned after their deadlines passed "
            "(each still holds a thread, until the Spanner client's own timeout of the "
            "call ends it): the server is not answering. This call was refused at once, "
            "and nothing of it was sent, rather than hold one more thread (at most "
            f"{self.max_stuck} are left waiting: sharded_orm.spanner.deadlines."
            "MAX_STUCK_CALLS). Check that this process reaches Spanner (the instance, "
            "the network, SPANNER_EMULATOR_HOST for the emulator) and try again: calls "
            "are accepted again as soon as the stuck ones return."
        )

    def _start(self, job: _Call) -> None:
        worker = threading.Thread(
            target=self._work, args=(job,), name="sharded-orm-bounded", daemon=True
        )
        try:
            worker.start()
        except BaseException:  # (no thread to be had: nothing runs the call)
            with self._lock:
                self._workers -= 1
            raise

    def _work(self, job: _Call) -> None:
        while True:
            self._run(job)
            with self._lock:
                self._idle += 1
            try:
                job = self._calls.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:  # a call queued as the wait ended is still run
                    try:
                        job = self._calls.get_nowait()
                    except queue.Empty:
                        self._idle -= 1
                        self._workers -= 1
                        return

    def _run(self, job: _Call) -> None:
        try:
            # a context of its own: nothing one call sets is seen by the next
            contextvars.Context().run(job.call)
        except BaseException as exc:  # handed to the waiting thread
            job.error = exc
        with self._lock:
            job.finished = True
            if job.abandoned:
                self._stuck -= 1
        job.done.set()


#: the worker threads of :func:`finished_within`, one set for the process
BOUNDED_CALLS = BoundedCalls()


def finished_within(call: Callable[[], Any], deadline: Deadline | float) -> bool:
    """Run ``call`` on a worker thread and wait for it until ``deadline`` (a
    :class:`~sharded_orm.retry.Deadline`, or seconds from now): True if it returned (its
    exception is raised here), False if it is still running (left to its own end: the
    client's own timeout of the call it is blocked in).

    For the client calls that take no timeout (``Transaction.commit`` inside
    ``run_in_transaction``, ``execute_partitioned_dml``, a session's ``create``): the wait
    is bounded, the call is not. The threads are: while :data:`MAX_STUCK_CALLS` calls
    are still running past their deadlines, a new one is refused at once with
    :class:`SpannerNotAnswering` (:class:`BoundedCalls`)."""
    return BOUNDED_CALLS.finished_within(call, deadline)


def call_options(seconds: float | Deadline | StatementDeadline | None) -> dict[str, Any]:
    """``timeout`` and ``retry`` for ``execute_sql``: one deadline ``seconds`` from now
    (or the given one, shared with the calls already under it)."""
    if seconds is None:
        return {}
    deadline = seconds if isinstance(seconds, StatementDeadline) else StatementDeadline(seconds)
    retry = Retry(
        predicate=if_exception_type(_api.ServiceUnavailable),
        initial=0.05,
        maximum=1.0,
        multiplier=2.0,
        timeout=deadline.deadline.call_timeout(),
    )
    return {"timeout": deadline, "retry": retry}


class Through:
    """Another object, every attribute read and written through it: the one proxy of this
    package's wrappers (a subclass overrides only the calls it bounds)."""

    def __init__(self, inner: Any) -> None:
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)


class _Bounded(Through):
    """A Snapshot or Transaction whose ``execute_sql`` carries the statement's deadline."""

    def __init__(self, inner: Any, options: dict[str, Any]) -> None:
        super().__init__(inner)
        object.__setattr__(self, "_options", options)

    def execute_sql(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.execute_sql(*args, **{**self._options, **kwargs})


def statement_bytes(statement: Any) -> int:
    """Bytes one statement of a batch (``batch_update``'s SQL text, or its ``(sql, params,
    param_types)``) takes in an ``ExecuteBatchDml`` request, about: its SQL text (UTF-8),
    each parameter's name and value (:func:`~sharded_orm.limits.param_bytes`) and
    :data:`BATCH_STATEMENT_OVERHEAD`."""
    if isinstance(statement, str):
        return len(statement.encode()) + BATCH_STATEMENT_OVERHEAD
    sql, params = statement[0], statement[1] or {}
    size = len(sql.encode()) + BATCH_STATEMENT_OVERHEAD
    for name, value in params.items():
        size += len(name) + 16 + param_bytes(value)
    return size


def batch_dml_requests(
    statements: list[Any],
    most: int = BATCH_DML_STATEMENTS,
    byte_limit: int = BATCH_DML_BYTES,
) -> list[tuple[int, int]]:
    """A batch's statements cut into ``ExecuteBatchDml`` requests, as ``[start, end)``
    ranges in order: each of at most ``most`` statements and ``byte_limit`` bytes as sent
    (:func:`statement_bytes`). A statement alone over the bytes is a request of its own,
    for Spanner to refuse with its own message."""
    if len(statements) <= most:  # (the common batch: one request unless its bytes say more)
        sizes = [statement_bytes(st) for st in statements]
        if sum(sizes) <= byte_limit:
            return [(0, len(statements))] if statements else []
    else:
        sizes = [statement_bytes(st) for st in statements]
    return commit_chunks(sizes, 1, mutations=most, byte_limit=byte_limit)


class _BoundedTransaction(_Bounded):
    """A read-write Transaction whose reads and batch DML carry the statement's deadline."""

    def batch_update(
        self,
        statements: Any,
        request_options: Any = None,
        last_statement: bool = False,
        **kwargs: Any,
    ) -> Any:
        """The client's ``batch_update``, the batch sent in requests of at most
        :data:`BATCH_DML_STATEMENTS` statements and :data:`BATCH_DML_BYTES` bytes, one
        after another in this transaction, each under the time left until the deadline.
        Answers as one request would: the first statement that fails ends the batch, its
        status is returned with the row counts of the statements run before it."""
        kwargs = {**self._options, **kwargs}
        statements = list(statements)
        requests = batch_dml_requests(statements)
        if len(requests) <= 1:
            return self._inner.batch_update(statements, request_options, last_statement, **kwargs)
        counts: list[int] = []
        status: Any = None
        for i, (start, end) in enumerate(requests):
            last = last_statement and i == len(requests) - 1  # (the commit follows it)
            status, got = self._inner.batch_update(
                statements[start:end], request_options, last, **kwargs
            )
            counts.extend(got)
            if status.code != OK_CODE:
                break
        return status, counts

    def _reset_and_begin(self) -> Any:
        # The DB-API begins the transaction explicitly when a batch that was to begin it
        # failed (under the client's own 30 s): once the deadline gave up, that would only
        # wait on a server that did not answer; the batch's error stands.
        deadline = self._options.get("timeout")
        if isinstance(deadline, StatementDeadline) and deadline.given_up:
            raise deadline.exceeded()
        return self._inner._reset_and_begin()


class _BoundedDatabase(_Bounded):
    """A Database whose single-use snapshots and autocommit transactions carry the
    statement's deadline."""

    @contextmanager
    def snapshot(self, **kwargs: Any) -> Iterator[Any]:
        with self._inner.snapshot(**kwargs) as snapshot:
            yield _Bounded(snapshot, self._options)

    def run_in_transaction(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # An autocommit write runs here (one DML, or an executemany): the client's
        # execute_sql / batch_update, its replays of an ABORTED transaction until 120 s,
        # and its Commit, which takes no timeout (the client's hour). The statements and
        # replays carry the statement's deadline (a replay waits at most an eighth of
        # the time left); the whole call, its Commit included, is waited for until then.
        deadline = self._options.get("timeout")
        options = self._options
        if not isinstance(deadline, StatementDeadline):  # (its batches cut to size all the same)

            def sized(transaction: Any, *a: Any, **kw: Any) -> Any:
                return func(_BoundedTransaction(transaction, options), *a, **kw)

            return self._inner.run_in_transaction(sized, *args, **kwargs)
        kwargs.setdefault("timeout_secs", deadline.left)
        kwargs.setdefault("default_retry_delay", min(AUTOCOMMIT_REPLAY_DELAY, deadline.left / 8))
        committing: list[bool] = []

        def bounded(transaction: Any, *a: Any, **kw: Any) -> Any:
            if deadline.given_up:
                raise deadline.exceeded()
            result = func(_BoundedTransaction(transaction, options), *a, **kw)
            committing.append(True)  # the client commits once this returns
            return result

        result: list[Any] = []
        grace = Deadline(deadline.left + WAIT_GRACE)
        call = functools.partial(self._inner.run_in_transaction, bounded, *args, **kwargs)
        if finished_within(lambda: result.append(call()), grace):
            return result[0]
        if not committing:  # (its statements are bounded: they end within the grace)
            raise deadline.exceeded()
        raise _dbapi.OperationalError(
            f"the autocommit write (DML) did not finish within its deadline of "
            f"{deadline.seconds:g} s: its statements ran and Spanner did not answer its "
            "commit, so its outcome is unknown (the commit may still be applied; it is "
            "not sent again). Check whether its changes are there before making them "
            f"again (or make the write idempotent); raise execution_options("
            f"{TIMEOUT_OPTION}=<seconds>) if it needs longer."
        )

    def execute_partitioned_dml(self, dml: str, *args: Any, **kwargs: Any) -> Any:
        # An autocommit write in the DB-API's PARTITIONED_NON_ATOMIC mode: the client
        # sends its BeginTransaction and ExecuteStreamingSql with no timeout (its hour)
        # and retries ABORTED itself. Waited for until the statement's deadline.
        deadline = self._options.get("timeout")
        if not isinstance(deadline, StatementDeadline):
            return self._inner.execute_partitioned_dml(dml, *args, **kwargs)
        result: list[Any] = []
        call = functools.partial(self._inner.execute_partitioned_dml, dml, *args, **kwargs)
        if finished_within(lambda: result.append(call()), deadline.deadline):
            return result[0]
        raise _dbapi.OperationalError(
            f"the Partitioned DML statement did not finish within its deadline of "
            f"{deadline.seconds:g} s (autocommit_dml_mode PARTITIONED_NON_ATOMIC): Spanner "
            "may have applied it to some partitions and may still apply it to others "
            "(Partitioned DML is not atomic). Run it again once Spanner answers (a "
            "Partitioned DML statement must be idempotent); raise execution_options("
            f"{TIMEOUT_OPTION}=<seconds>) if it needs longer."
        )


class DeadlineConnection(_Bounded):
    """The DB-API connection as one statement's cursor sees it: every read it starts
    (``run_statement`` in a transaction, the read-only or single-use snapshots) is
    sent with the statement's ``timeout`` and ``retry``. Everything else is the
    connection itself (attributes are read and written through)."""

    def run_statement(self, statement: Any, request_options: Any = None) -> Any:
        transaction = self._inner.transaction_checkout()
        return transaction.execute_sql(
            statement.sql,
            statement.params,
            param_types=statement.param_types,
            request_options=request_options or self._inner.request_options,
            **self._options,
        )

    def __setattr__(self, name: str, value: Any) -> None:
        # the DB-API keeps an autocommit statement's transaction on the connection: keep
        # the client's own there, not this statement's view of it
        setattr(self._inner, name, value._inner if isinstance(value, _Bounded) else value)

    @property
    def _transaction(self) -> Any:
        # When a statement's first read fails in a new read-write transaction, the DB-API
        # cursor begins the transaction explicitly (``BeginTransaction``, under the
        # client's own 30 s retry, with no deadline of ours) and runs it again. Once the
        # read gave up that can only fail later: show it no transaction to begin, so it
        # raises the read's error now.
        deadline = self._options.get("timeout")
        if isinstance(deadline, StatementDeadline) and deadline.given_up:
            return None
        return self._inner._transaction

    def transaction_checkout(self) -> Any:
        transaction = self._inner.transaction_checkout()
        return None if transaction is None else _BoundedTransaction(transaction, self._options)

    def snapshot_checkout(self) -> Any:
        snapshot = self._inner.snapshot_checkout()
        return None if snapshot is None else _Bounded(snapshot, self._options)

    @property
    def database(self) -> Any:
        database = self._inner.database
        return None if database is None else _BoundedDatabase(database, self._options)


def _what_failed(e: Exception, seconds: float | None, lost_detail: str = "") -> str:
    """What happened to a statement that failed with ``e`` (one of ``_READ_FAILURES``)."""
    if isinstance(e, _api.DeadlineExceeded | _api.RetryError) and seconds is not None:
        return f"did not finish within its deadline of {seconds:g} s"
    return f"lost its connection to Spanner {lost_detail}".rstrip()


@contextmanager
def read_errors(seconds: float | None) -> Iterator[None]:
    """Raise a read's missed deadline or lost stream as a DB-API ``OperationalError``
    that says the read can be retried."""
    try:
        yield
    except _READ_FAILURES as e:
        what = _what_failed(e, seconds, "(the stream could not be resumed)")
        raise _dbapi.OperationalError(
            f"the statement {what}: {getattr(e, 'message', None) or e}. A read changed "
            "nothing and can be retried; raise the deadline with "
            f"execution_options({TIMEOUT_OPTION}=<seconds>) if it needs longer."
        ) from e


@contextmanager
def write_errors(
    seconds: float | None, deadline: StatementDeadline | None = None
) -> Iterator[None]:
    """Raise a write's (DML's) missed deadline or lost connection as a DB-API
    ``OperationalError`` that says what holds for a write (and an autocommit write whose
    every attempt Spanner aborted until ``deadline``)."""
    try:
        yield
    except _api.Aborted as e:
        if deadline is None:  # (its retries end only at the deadline, or the next would)
            raise
        raise _dbapi.OperationalError(
            f"the write (DML) was aborted by Spanner on every attempt within its deadline "
            f"of {deadline.seconds:g} s (another transaction holds the rows it writes): "
            f"{getattr(e, 'message', None) or e}. Nothing of it is committed: run it "
            f"again; raise the deadline with execution_options({TIMEOUT_OPTION}=<seconds>) "
            "if it needs longer."
        ) from e
    except _READ_FAILURES as e:
        what = _what_failed(e, seconds)
        raise _dbapi.OperationalError(
            f"the write (DML) {what}: {getattr(e, 'message', None) or e}. Nothing of it is "
            "committed, but its transaction may hold part of it: roll the transaction back "
            "and run it again; raise the deadline with "
            f"execution_options({TIMEOUT_OPTION}=<seconds>) if it needs longer (a large "
            "executemany is sent in batches of "
            f"{BATCH_DML_STATEMENTS} statements, all under that one deadline)."
        ) from e


class DeadlineCursor(Cursor):  # type: ignore[misc]
    """The DB-API cursor on a :class:`DeadlineConnection`; fetches map read failures.

    The DB-API's fetches catch every error of the result's stream and return the rows
    read before it (``Cursor._fetch``: it keeps the error only for its transaction
    retry): a stream that stalls past its deadline or is cut for good after some rows
    came back as a shorter result, with no error. On Spanner, which sends resume tokens
    as it streams, that is a silent truncation (the emulator sends none, so its faults
    surface in ``execute``). So the rows are iterated here, the error that ends them
    kept, and raised once the DB-API's fetch returns
    (``tests/test_read_streams.py`` trips when upstream raises it itself)."""

    def __init__(
        self, connection: Any, seconds: float | Deadline | StatementDeadline | None
    ) -> None:
        options = call_options(seconds)
        super().__init__(DeadlineConnection(connection, options))
        #: the statement's deadline (None: the client's own timeouts)
        self.deadline: StatementDeadline | None = options.get("timeout")
        self.deadline_seconds = None if self.deadline is None else self.deadline.seconds
        #: the error that ended the result's stream during the current fetch
        self.stream_error: Exception | None = None

    #: the statement executed last is a write (DML): its rows (``THEN RETURN``) are a
    #: write's, and a failure fetching them is worded as one
    wrote = False

    def execute(self, sql: Any, args: Any = None) -> Any:
        self.wrote = isinstance(sql, str) and _DML.match(sql) is not None
        if self.wrote:
            with write_errors(self.deadline_seconds, self._autocommit_deadline()):
                return super().execute(sql, args)
        return super().execute(sql, args)

    def executemany(self, operation: Any, seq_of_params: Any) -> Any:
        self.wrote = isinstance(operation, str) and _DML.match(operation) is not None
        if not self.wrote:
            return super().executemany(operation, seq_of_params)
        # (its requests are cut to size by the transaction: _BoundedTransaction)
        with write_errors(self.deadline_seconds, self._autocommit_deadline()):
            # (a list: the DB-API keeps it to replay the batch after an ABORTED)
            rows = seq_of_params if isinstance(seq_of_params, list) else list(seq_of_params)
            return super().executemany(operation, rows)

    def _autocommit_deadline(self) -> StatementDeadline | None:
        # an ABORTED that escapes a statement in a transaction is the DB-API's own
        # replay signal (a replay's cursor raises it to the replay loop): only an
        # autocommit write's, whose retries the deadline ended, is worded here
        if self.connection._client_transaction_started:
            return None
        return self.deadline

    def __iter__(self) -> Iterator[Any]:
        return self._watched(super().__iter__())

    def _watched(self, rows: Iterator[Any]) -> Iterator[Any]:
        self.stream_error = None  # a fetch the DB-API runs again (after ABORTED) starts anew
        try:
            yield from rows
        except Exception as e:
            self.stream_error = e
            raise

    def __next__(self) -> Any:
        try:
            row = super().__next__()
        except StopIteration:
            self.stream_error = None
            raise
        except Exception as e:
            self.stream_error = e
            raise
        if self.stream_error is not None:  # read again after ABORTED: not the end
            self.stream_error = None
        return row

    def _fetched(self, rows: Any, count: int) -> Any:
        error, self.stream_error = self.stream_error, None
        if error is None:
            return rows
        if isinstance(error, (*_READ_FAILURES, _dbapi.Error)):
            raise error
        raise _dbapi.OperationalError(
            f"the statement's result stream failed after {count} rows of this fetch: "
            f"{getattr(error, 'message', None) or error}. They are not returned: the "
            "result is incomplete."
        ) from error

    def _fetch_errors(self) -> Any:
        """How a failure of this fetch is worded: a write's rows (``THEN RETURN``) as a
        write's, anything else as a read's."""
        if self.wrote:
            return write_errors(self.deadline_seconds)
        return read_errors(self.deadline_seconds)

    def fetchone(self) -> Any:
        with self._fetch_errors():
            self.stream_error = None
            row = super().fetchone()
            return self._fetched(row, int(row is not None))

    def fetchmany(self, size: int | None = None) -> Any:
        with self._fetch_errors():
            self.stream_error = None
            rows = super().fetchmany(size)
            return self._fetched(rows, len(rows))

    def fetchall(self) -> Any:
        with self._fetch_errors():
            self.stream_error = None
            rows = super().fetchall()
            return self._fetched(rows, len(rows))
