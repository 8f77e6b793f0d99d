"""One retry policy for every long operation of the library (bulk loads, id pools, backfills).

Why one: retries written in several places drift apart (one loops for ever on an error
chain that cycles, another nests under the client's own retries, a third has no
deadline). Here an error is classified once, by walking ``__cause__``/``__context__``
with a cycle check (google-cloud-spanner raises errors whose chain loops back on
itself):

* ``RETRY``: the call did not happen, a new attempt can win (Spanner's ABORTED, a
  conflict our own code detected, SQLite's writer lock, the emulator's
  one-writer-at-a-time errors, RESOURCE_EXHAUSTED).
* ``UNKNOWN``: the call may or may not have been applied (DEADLINE_EXCEEDED,
  UNAVAILABLE, a dropped connection). Retried only when the operation is idempotent
  (``idempotent=True``: an ``insert_or_update`` of the same rows, a read).
* ``PERMANENT``: anything else (duplicate key, value too long, permission denied,
  invalid argument, not found...): never retried.

:func:`retry_call` runs a callable under a :class:`RetryPolicy`: bounded attempts,
exponential backoff with full jitter, and an overall deadline the caller sets; the
callable receives the seconds left so it can bound its own RPCs with them (never leave
the client's hour-long defaults in place). The final error, :class:`RetryError`, says
what was attempted, how often, why it stopped and how to resume.

Layer 0: imports only the standard library and :mod:`sharded_orm.errors`; errors are
recognised by class name and gRPC status name, so no Google package is imported.
"""

from __future__ import annotations

import enum
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

from sharded_orm.errors import ShardConfigError, ShardingError, ShardTypeError
from sharded_orm.telemetry.spans import retried

T = TypeVar("T")


class Outcome(enum.Enum):
    """What a failed call tells about the work it was asked to do."""

    RETRY = "retryable"  # not applied; a new attempt can succeed
    UNKNOWN = "unknown outcome"  # may have been applied
    PERMANENT = "permanent"  # a new attempt fails the same way


class TransientError(ShardingError, RuntimeError):
    """Raised by library code for a conflict a new attempt can win (e.g. a counter moved
    between our read and our write). Always classified ``RETRY``."""


class RetryError(ShardingError, RuntimeError):
    """An operation gave up: its last error was permanent, or attempts or time ran out.

    ``attempts``, ``elapsed``, ``outcome`` (of the last error) and ``last_error`` say why;
    the message also says what was committed and how to resume, as the caller knows it.
    """

    def __init__(
        self,
        message: str,
        *,
        attempts: int,
        elapsed: float,
        outcome: Outcome,
        last_error: BaseException,
    ) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.elapsed = elapsed
        self.outcome = outcome
        self.last_error = last_error


class RetryDeadlineError(RetryError, TimeoutError):
    """The overall deadline passed before the operation succeeded."""


#: google.api_core exception class names, and gRPC status names, by outcome.
_RETRY_NAMES = frozenset(
    {"Aborted", "ABORTED", "ResourceExhausted", "TooManyRequests", "RESOURCE_EXHAUSTED"}
)
_UNKNOWN_NAMES = frozenset(
    {
        "DeadlineExceeded",
        "DEADLINE_EXCEEDED",
        "ServiceUnavailable",
        "UNAVAILABLE",
        "Cancelled",  # not by us: the server (or a proxy) dropped the call mid-way
        "CANCELLED",
        "RetryError",  # api_core gave up its own retries (of UNAVAILABLE, mostly)
        "ConnectionError",
        "ConnectionResetError",
        "ConnectionRefusedError",
        "BrokenPipeError",
    }
)
_PERMANENT_NAMES = frozenset(
    {
        "AlreadyExists",
        "ALREADY_EXISTS",
        "FailedPrecondition",
        "FAILED_PRECONDITION",
        "InvalidArgument",
        "INVALID_ARGUMENT",
        "NotFound",
        "NOT_FOUND",
        "PermissionDenied",
        "PERMISSION_DENIED",
        "Unauthenticated",
        "UNAUTHENTICATED",
        "OutOfRange",
        "OUT_OF_RANGE",
        "Unimplemented",
        "UNIMPLEMENTED",
        "IntegrityError",
        "RetryAborted",  # the DB-API replayed a transaction and saw other results
    }
)
#: Message fragments of contention a new attempt can win.
_RETRY_TEXT = (
    "transaction not found",  # the emulator, with concurrent writers
    "invalid transaction",
    "database is locked",  # SQLite's writer lock
    "transaction was aborted",
    "rst_stream",  # a reset stream (INTERNAL), which Google's clients retry too
    "received rst_stream",
)
_UNKNOWN_TEXT = ("deadline exceeded", "deadline_exceeded", "failed to connect", "socket closed")


def error_chain(exc: BaseException, limit: int = 64) -> Iterator[BaseException]:
    """``exc`` and its causes/contexts, each once, at most ``limit`` of them (cycles end)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < limit:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _status_name(exc: BaseException) -> str:
    """The gRPC status name of an error (``exc.code()`` on a grpc.RpcError, ``exc.grpc_status_code``
    on google.api_core errors), or ''."""
    code: object = getattr(exc, "grpc_status_code", None)
    if code is None:
        fn = getattr(exc, "code", None)
        if callable(fn):
            try:
                code = fn()
            except Exception:
                code = None
    return str(getattr(code, "name", "") or "")


def classify(exc: BaseException) -> Outcome:
    """The outcome the error chain tells: ``PERMANENT`` wins over ``UNKNOWN`` over ``RETRY``
    (a duplicate key wrapped in an ABORTED-looking message is still a duplicate key)."""
    found: set[Outcome] = set()
    for e in error_chain(exc):
        if isinstance(e, TransientError):
            found.add(Outcome.RETRY)
            continue
        if isinstance(e, RetryError):
            found.add(Outcome.PERMANENT)
            continue
        names = {type(e).__name__, _status_name(e)}
        text = str(e).lower()
        if names & _PERMANENT_NAMES:
            found.add(Outcome.PERMANENT)
        elif names & _UNKNOWN_NAMES:
            found.add(Outcome.UNKNOWN)
        elif names & _RETRY_NAMES or any(m in text for m in _RETRY_TEXT):
            found.add(Outcome.RETRY)
        elif any(m in text for m in _UNKNOWN_TEXT):
            found.add(Outcome.UNKNOWN)
    for outcome in (Outcome.PERMANENT, Outcome.UNKNOWN, Outcome.RETRY):
        if outcome in found:
            return outcome
    return Outcome.PERMANENT


def is_retryable(exc: BaseException, *, idempotent: bool = False) -> bool:
    """True when a new attempt is safe and may succeed (``UNKNOWN`` only if idempotent)."""
    return _may_retry(classify(exc), idempotent)


def _may_retry(outcome: Outcome, idempotent: bool) -> bool:
    return outcome is Outcome.RETRY or (idempotent and outcome is Outcome.UNKNOWN)


#: The one default deadline, in seconds, of each kind of call the library makes to a
#: database (docs/deadlines.md, "Defaults"); every module reads its default here.
#:
#: * ``statement``: one statement through the dialect (a read or a DML write), from its
#:   execution through its last row, the replays of an aborted transaction it sets off,
#:   a session rebuilt for it, and the commit of an autocommit write;
#: * ``commit``: one commit (SQLAlchemy's, a migration's, a ``bulk_load`` batch's, Beam's);
#: * ``partition_read``: one partition of a partitioned read streamed whole (``verify``,
#:   Beam's reads), restarts of its stream included;
#: * ``partition_query``: the ``PartitionQuery`` that lists a partitioned read's partitions
#:   (``verify``), before any partition is read;
#: * ``schema_change``: one batch of DDL, from sending it to Spanner's "done";
#: * ``schema_change_call``: Spanner silent while a schema change is awaited;
#: * ``pdml``: one Partitioned DML statement (a backfill's, or an autocommit write in
#:   the DB-API's ``PARTITIONED_NON_ATOMIC`` mode).
DEFAULTS: Mapping[str, float] = MappingProxyType(
    {
        "statement": 60.0,
        "commit": 60.0,
        "partition_read": 900.0,
        "partition_query": 120.0,
        "schema_change": 6 * 3600.0,
        "schema_change_call": 60.0,
        "pdml": 60.0,
    }
)

#: The shortest timeout an RPC is sent with: a call with no time left fails at once.
MIN_CALL_TIMEOUT = 0.001


def _number(value: object, what: str, *, minimum: float, allow_none: bool = False) -> float:
    if value is None and allow_none:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ShardTypeError(f"{what} must be a number of seconds, got {value!r}")
    if math.isnan(value) or value < minimum:
        raise ShardConfigError(f"{what} must be at least {minimum}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class RetryPolicy:
    """How long and how often to try.

    ``attempts``: calls at most (1 = no retry) when they fail with an unknown outcome or
    transient error. ``contention_attempts``: calls at most while they fail with ABORTED
    and the like (contention: nothing was applied; Spanner's own clients retry these
    until their deadline, so they get a budget of their own). ``deadline``: seconds for the whole
    operation, attempts and waits included (None: no overall limit; every RPC is still
    bounded by ``call_timeout``). ``call_timeout``: the most one attempt's RPC may take.
    Waits grow as ``base_delay * 2**n`` up to ``max_delay``, with full jitter.
    """

    attempts: int = 8
    contention_attempts: int = 100
    deadline: float | None = 2 * DEFAULTS["commit"]
    call_timeout: float = DEFAULTS["commit"]
    base_delay: float = 0.05
    max_delay: float = 2.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ShardTypeError(f"attempts must be an int, got {self.attempts!r}")
        if not 1 <= self.attempts <= 10_000:
            raise ShardConfigError(f"attempts must be between 1 and 10000, got {self.attempts}")
        if isinstance(self.contention_attempts, bool) or not isinstance(
            self.contention_attempts, int
        ):
            raise ShardTypeError(
                f"contention_attempts must be an int, got {self.contention_attempts!r}"
            )
        if not 1 <= self.contention_attempts <= 10_000:
            raise ShardConfigError(
                f"contention_attempts must be between 1 and 10000, got {self.contention_attempts}"
            )
        _number(self.deadline, "deadline", minimum=0.0, allow_none=True)
        if _number(self.call_timeout, "call_timeout", minimum=0.001) == math.inf:
            raise ShardConfigError("call_timeout must be finite")
        _number(self.base_delay, "base_delay", minimum=0.0)
        if _number(self.max_delay, "max_delay", minimum=0.0) < self.base_delay:
            raise ShardConfigError(
                f"max_delay ({self.max_delay}) must be at least base_delay ({self.base_delay})"
            )

    @classmethod
    def for_retries(
        cls, max_retries: object, deadline: object = 2 * DEFAULTS["commit"]
    ) -> RetryPolicy:
        """The policy for a public ``max_retries=`` / ``deadline=`` pair, checked."""
        if isinstance(max_retries, bool) or not isinstance(max_retries, int):
            raise ShardTypeError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if not 0 <= max_retries < 10_000:
            raise ShardConfigError(f"max_retries must be between 0 and 9999, got {max_retries}")
        if deadline is not None:
            _number(deadline, "deadline", minimum=0.001)
        assert deadline is None or isinstance(deadline, (int, float))
        most = DEFAULTS["commit"]
        timeout = most if deadline is None else max(MIN_CALL_TIMEOUT, min(most, float(deadline)))
        return cls(attempts=max_retries + 1, deadline=deadline, call_timeout=timeout)

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0-based): full jitter."""
        cap = min(self.max_delay, self.base_delay * (2 ** min(retry, 32)))
        return (rng or random).uniform(cap / 2, cap)


class Deadline:
    """The instant an operation must end by (monotonic clock): the library's one deadline.

    Made once where a user's seconds enter the library (``timeout=``, ``deadline=``,
    ``commit_timeout=``...: :meth:`after`), then passed down to every call made on the
    operation's behalf: each takes :meth:`remaining` (or :meth:`cap` of its own limit)
    as its RPC timeout, and :meth:`check` raises the one error once time is up.
    ``seconds`` is what was asked for (for messages); ``what`` names the limit
    ("its deadline", "commit_timeout").
    """

    __slots__ = ("end", "seconds", "start", "what")

    def __init__(self, seconds: float | None, what: str = "its deadline") -> None:
        self.start = time.monotonic()
        self.seconds = math.inf if seconds is None else float(seconds)
        self.end = self.start + self.seconds
        self.what = what

    @classmethod
    def after(cls, seconds: float | None, what: str = "its deadline") -> Deadline:
        """The deadline ``seconds`` from now (None: none at all)."""
        return cls(seconds, what)

    def remaining(self) -> float:
        """Seconds left (0 once it passed; ``inf`` for no deadline)."""
        return max(0.0, self.end - time.monotonic())

    @property
    def expired(self) -> bool:
        """The deadline passed."""
        return time.monotonic() >= self.end

    def elapsed(self) -> float:
        """Seconds since the deadline was set."""
        return time.monotonic() - self.start

    def cap(self, seconds: float) -> float:
        """The timeout of one call whose own limit is ``seconds``: the smaller of that and
        the time left, never below :data:`MIN_CALL_TIMEOUT` (a call with no time left
        times out at once)."""
        return max(MIN_CALL_TIMEOUT, min(seconds, self.end - time.monotonic()))

    def call_timeout(self) -> float:
        """The timeout of one RPC under this deadline (see :meth:`cap`)."""
        return self.cap(math.inf)

    def sooner(self, other: Deadline | None) -> Deadline:
        """The earlier of this deadline and ``other`` (this one for None)."""
        return self if other is None or self.end <= other.end else other

    def check(self, what: str) -> None:
        """Raise :class:`RetryDeadlineError` (a ``TimeoutError``) naming ``what`` and the
        seconds, if the deadline passed."""
        if self.expired:
            raise self.error(what)

    def error(self, what: str) -> RetryDeadlineError:
        """The error for ``what`` not finished by this deadline."""
        return RetryDeadlineError(
            f"{what} did not finish within {self.what} of {self.seconds:g} s "
            f"({self.elapsed():.1f} s elapsed)",
            attempts=0,
            elapsed=self.elapsed(),
            outcome=Outcome.UNKNOWN,
            last_error=TimeoutError(what),
        )

    def __repr__(self) -> str:
        return f"Deadline({self.seconds:g} s, {self.remaining():.3f} s left)"


def retry_call(
    fn: Callable[[float], T],
    policy: RetryPolicy,
    *,
    what: str,
    idempotent: bool = False,
    resume: str = "",
    deadline: Deadline | None = None,
    on_retry: Callable[[BaseException, Outcome], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> T:
    """``fn(timeout)`` until it succeeds, under ``policy``; ``timeout`` is the most the
    attempt may take (the smaller of ``policy.call_timeout`` and the time left).

    Raises :class:`RetryError` (``RetryDeadlineError`` when time ran out) with
    ``what`` and ``resume`` (what was committed, how to finish) in its message; the
    original error is its ``__cause__``. ``should_stop()`` true ends the retries early
    (another worker failed). ``deadline`` shares one overall deadline between calls.
    """
    clock = deadline or Deadline(policy.deadline)
    attempt = failed = contended = 0
    last: BaseException
    while True:
        attempt += 1
        timeout = min(policy.call_timeout, clock.remaining())
        if timeout <= 0:
            raise RetryDeadlineError(
                f"{what}: the deadline of {policy.deadline} s passed before attempt "
                f"{attempt}. {resume}".rstrip(),
                attempts=attempt - 1,
                elapsed=clock.elapsed(),
                outcome=Outcome.UNKNOWN,
                last_error=TimeoutError(what),
            )
        try:
            return fn(timeout)
        except ShardingError as exc:
            if not isinstance(exc, TransientError):
                raise  # the library's own clear error (bad input, exhausted...): as it is
            outcome, retry, last = Outcome.RETRY, True, exc
        except Exception as exc:
            outcome, last = classify(exc), exc
            retry = _may_retry(outcome, idempotent)
        wait = policy.delay(attempt - 1)
        why = ""
        if not retry:
            why = f"not retryable ({outcome.value})"
        elif (
            outcome is Outcome.RETRY and (contended := contended + 1) >= policy.contention_attempts
        ):
            why = f"{attempt} attempts made, {contended} of them aborted by contention"
        elif outcome is not Outcome.RETRY and (failed := failed + 1) >= policy.attempts:
            why = f"{attempt} attempts made, none succeeded"
        elif should_stop is not None and should_stop():
            why = "stopped because another part of the operation failed"
        elif clock.remaining() <= wait:
            why = f"the deadline of {policy.deadline} s passed"
        if why:
            cls = RetryDeadlineError if why.startswith("the deadline") else RetryError
            unknown = (
                " Its last attempt may have been applied (the outcome is unknown)."
                if outcome is Outcome.UNKNOWN
                else ""
            )
            raise cls(
                f"{what} failed: {why}, after {attempt} attempt(s) in "
                f"{clock.elapsed():.1f} s; last error: {_describe(last)}.{unknown} "
                f"{resume}".rstrip(),
                attempts=attempt,
                elapsed=clock.elapsed(),
                outcome=outcome,
                last_error=last,
            ) from last
        if on_retry is not None:
            on_retry(last, outcome)
        retried(last, attempt, wait)
        time.sleep(wait)


def _describe(exc: BaseException) -> str:
    """The most telling line of an error chain: the innermost message that says something."""
    found: list[tuple[int, str]] = []
    for e in error_chain(exc):
        text = " ".join(str(e).split())
        if not text or text in ("[]", "None") or text.startswith("<"):
            continue  # the DB-API's empty wrappers, grpc's raw RpcError repr
        # an error with a status (google.api_core's) says most; then the outermost
        rank = 0 if _status_name(e) and not type(e).__name__.startswith("_") else 1
        found.append((rank, f"{type(e).__name__}: {text[:300]}"))
    if not found:
        return f"{type(exc).__name__}: {exc!r}"[:300]
    return min(found, key=lambda f: f[0])[1]
