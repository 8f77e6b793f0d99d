"""One span and one duration measurement per library operation.

Spans are database client spans as OpenTelemetry's stable database conventions name them:
``{db.operation.name} {db.collection.name}`` (``merged Events``), kind CLIENT, with
``db.system.name``, ``db.namespace``, ``db.collection.name``, ``db.operation.name`` and, when
the operation failed, ``error.type``; what the library knows beyond that goes under
``sharded_orm.*``. The statements an operation sends are the Spanner client's (or the
driver instrumentation's) spans, children of ours. Each operation also records
``db.client.operation.duration`` (seconds; a batch operation is one operation, as the
conventions say).
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import os
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

from sharded_orm.memo import Memo
from sharded_orm.telemetry import api
from sharded_orm.telemetry.conventions import database_attributes, dialect_and_url

#: the explicit bucket boundaries the conventions advise for db.client.operation.duration
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)
NAMESPACE = "sharded_orm."
#: at most one progress event per this many seconds on a long operation's span
PROGRESS_EVENT_SECONDS = 5.0

_instruments: dict[int, Any] = {}
P = ParamSpec("P")
R = TypeVar("R")


#: figures that hold where a walk stands: never a row's key (a key can be an e-mail address)
POSITION_FIGURES = frozenset({"resume_position"})
#: the per-process key of :func:`position_digest` (a key's digest cannot be looked up)
_DIGEST_KEY = os.urandom(16)


def position_digest(position: Any) -> str:
    """An opaque digest of a walk's position: equal positions give equal digests in one
    process, and nothing of the key can be read back or guessed from it."""
    text = position if isinstance(position, str) else repr(position)
    digest = hashlib.blake2b(text.encode(), digest_size=8, key=_DIGEST_KEY).hexdigest()
    return "blake2b:" + digest


def _figure(name: str, value: Any) -> Any:
    """A figure as an attribute; a position that is not a count becomes a digest."""
    if name in POSITION_FIGURES and not (isinstance(value, int) and not isinstance(value, bool)):
        return position_digest(value)
    return _attribute(value)


def _figures(figures: Mapping[str, Any]) -> dict[str, Any]:
    return {NAMESPACE + k: _figure(k, v) for k, v in figures.items() if v is not None}


def _attribute(value: Any) -> Any:
    """A value OpenTelemetry accepts as an attribute (str, bool, int, float or a list)."""
    if isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        kinds = {type(v) for v in value}
        if len(kinds) == 1 and kinds <= {str, bool, int, float}:
            return list(value)
        return [str(v) for v in value]  # OpenTelemetry takes sequences of one type only
    return str(value)


class Operation:
    """The span of one operation: ``set`` figures as they become known."""

    __slots__ = ("_span", "_last_event", "retries", "_lock")

    def __init__(self, span: Any) -> None:
        self._span = span
        self._last_event = 0.0
        self.retries = 0
        self._lock = threading.Lock()  # retries come from the operation's worker threads

    @property
    def recording(self) -> bool:
        return self._span is not None

    def set(self, **figures: Any) -> None:
        """Set ``sharded_orm.<name>`` attributes (``None`` values are left out)."""
        if self._span is None:
            return
        self._span.set_attributes(_figures(figures))

    def set_all(self, figures: Mapping[str, Any]) -> None:
        self.set(**figures)

    def progress(self, **figures: Any) -> None:
        """A long operation's progress: the attributes now, an event at most every
        ``PROGRESS_EVENT_SECONDS`` (so a trace shows how it went, not every batch)."""
        if self._span is None:
            return
        self.set(**figures)
        now = time.monotonic()
        if now - self._last_event >= PROGRESS_EVENT_SECONDS:
            self._last_event = now
            self._span.add_event("progress", _figures(figures))


def _duration_histogram(meter: Any) -> Any:
    made = _instruments.get(id(meter))
    if made is None or made[0] is not meter:
        histogram = meter.create_histogram(
            "db.client.operation.duration",
            unit="s",
            description="Duration of database client operations.",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        made = (meter, histogram)
        _instruments[id(meter)] = made
    return made[1]


_METRIC_KEYS = (
    "db.system.name",
    "db.namespace",
    "db.collection.name",
    "db.operation.name",
    "server.address",
    "server.port",
)


class _Idle(Operation):
    """What an operation gets when nothing records: a context manager that does nothing."""

    __slots__ = ()

    def __enter__(self) -> Operation:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_IDLE = _Idle(None)
_current: ContextVar[Operation | None] = ContextVar("sharded_orm_operation", default=None)


def retried(error: BaseException, attempt: int, wait: float) -> None:
    """A retry inside the operation being recorded: counted in ``sharded_orm.retries``,
    and an event with the error that caused it."""
    op = _current.get()
    if op is None or op._span is None:
        return
    with op._lock:
        op.retries += 1
        op._span.set_attribute(NAMESPACE + "retries", op.retries)
    op._span.add_event(
        "retry",
        {
            "error.type": _error_type(error),
            NAMESPACE + "attempt": attempt,
            NAMESPACE + "wait_seconds": round(wait, 3),
        },
    )


def carried(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run in the context it was wrapped in, whichever thread calls it: a worker
    thread of the library then reports to the caller's span (its client spans nest under
    it, its retries are the operation's ``retry`` events). Wrap in the thread that owns
    the operation, once per worker: ``pool.map(carried(work), items)``."""
    if _current.get() is None and api.tracer() is None:  # nothing to carry
        return fn
    context = contextvars.copy_context()

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        # a copy per call: one Context cannot be entered by two threads at once
        return context.copy().run(fn, *args, **kwargs)

    return call


def progress(**figures: Any) -> None:
    """Report progress to the operation being recorded in this context, if any (a long
    job's walk calls this after each batch without being handed the operation)."""
    op = _current.get()
    if op is not None:
        op.progress(**figures)


def operation(
    name: str, bind: Any = None, table: str | None = None, **figures: Any
) -> AbstractContextManager[Operation]:
    """A span named ``{name} {table}`` under the caller's current span, and its duration.

    With no SDK configured this returns an idle context manager and records nothing.
    """
    tracer = api.tracer()
    meter = api.meter()
    if tracer is None and meter is None:
        return _IDLE
    return _Recorded(tracer, meter, name, bind, table, figures)


#: (dialect, url, operation, table) -> (span attributes, metric attributes), computed once
_described: Memo[tuple[Any, Any, str, str | None], tuple[dict[str, Any], dict[str, Any]]] = Memo(
    "telemetry.described", 512
)


def _describe(bind: Any, name: str, table: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    dialect, url = dialect_and_url(bind)
    key = (dialect, url, name, table)
    try:
        found = _described.get(key)
    except TypeError:  # an unhashable URL of some other library: not kept
        found, key = None, None  # type: ignore[assignment]
    if found is None:
        attrs = database_attributes(bind, name, table)
        found = (attrs, {k: attrs[k] for k in _METRIC_KEYS if k in attrs})
        if key is not None:
            _described.put(key, found)
    return found


class _Recorded:
    """One recorded operation: its span made current (the SDK's ``start_span`` and the
    context's ``attach``, without the SDK's layered context managers: a recorded operation
    is paid by every read), our ``Operation`` in the context, and the duration."""

    __slots__ = ("_tracer", "_meter", "_name", "_table", "_attrs", "_figures", "_start",
                 "_span", "_attached", "_token", "_op")  # fmt: skip

    def __init__(
        self, tracer: Any, meter: Any, name: str, bind: Any, table: str | None, figures: Any
    ) -> None:
        self._tracer, self._meter, self._name, self._table = tracer, meter, name, table
        self._attrs = _describe(bind, name, table)
        self._figures = figures
        self._span: Any = None
        self._attached: Any = None
        self._token: Any = None
        self._op: Operation = _IDLE

    def __enter__(self) -> Operation:
        self._start = time.perf_counter()
        if self._tracer is None:
            return _IDLE
        from opentelemetry import context

        span_attrs = self._attrs[0]
        if self._figures:
            span_attrs = dict(span_attrs)
            span_attrs.update(_figures(self._figures))
        table, name = self._table, self._name
        trace = api.trace_module()
        # the SDK's own recording of an exception would put its text in the span (a
        # database error's text holds the statement and its values): ours does not
        self._span = span = self._tracer.start_span(
            f"{name} {table}" if table else name,
            kind=trace.SpanKind.CLIENT,
            attributes=span_attrs,
            record_exception=False,
            set_status_on_exception=False,
        )
        self._attached = context.attach(trace.set_span_in_context(span))
        # a span the sampler dropped takes no attributes: figures are not even made
        self._op = op = Operation(span if span.is_recording() else None)
        self._token = _current.set(op)
        return op

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        error_type = None if error is None else _error_type(error)
        if self._span is not None:
            from opentelemetry import context

            _current.reset(self._token)
            context.detach(self._attached)
            if error is not None and self._op._span is not None:
                _record_error(self._op._span, error, error_type)  # type: ignore[arg-type]
            self._span.end()
        if self._meter is not None:
            metric_attrs = self._attrs[1]
            if error_type is not None:
                metric_attrs = {**metric_attrs, "error.type": error_type}
            _duration_histogram(self._meter).record(time.perf_counter() - self._start, metric_attrs)


#: the packages whose exceptions' text is the library's own (it names no row's values)
_OWN = ("sharded_orm.", "alembic_ext.")
MESSAGE_LIMIT = 300


def error_message(error: BaseException) -> str:
    """What a span says of ``error``: the library's own refusals as they read (their
    text names no row's values); any other error by its classes only, since a database
    error's text holds the statement and, unless the engine hides them, its values, and
    a driver's text can quote a key (``Row [...] already exists``)."""
    if type(error).__module__.startswith(_OWN) and not _wraps_foreign(error):
        text = str(error).splitlines()[0] if str(error) else ""
        return text[:MESSAGE_LIMIT]
    chain = [_error_type(error)]
    inner = getattr(error, "orig", None) or error.__cause__
    if isinstance(inner, BaseException) and inner is not error:
        chain.append(_error_type(inner))
    return " from ".join(chain) + " (its text is not recorded: it can hold the statement's values)"


def _wraps_foreign(error: BaseException) -> bool:
    """An error of the library's raised over a database's or a driver's (whose text it
    may quote): its cause or context is neither the library's nor a builtin one."""
    for inner in (error.__cause__, error.__context__):
        module = type(inner).__module__
        if inner is not None and module != "builtins" and not module.startswith(_OWN):
            return True
    return False


def _record_error(span: Any, error: BaseException, error_type: str) -> None:
    """The conventions' error: ``error.type``, an error status and one exception event,
    with :func:`error_message` for text and the frames of the traceback (no messages)."""
    message = error_message(error)
    trace = api.trace_module()
    span.set_attribute("error.type", error_type)
    span.set_status(trace.Status(trace.StatusCode.ERROR, f"{error_type}: {message}"))
    frames = "".join(traceback.format_tb(error.__traceback__))
    span.add_event(
        "exception",
        {
            "exception.type": error_type,
            "exception.message": message,
            "exception.stacktrace": f"Traceback (most recent call last):\n{frames}{error_type}",
            "exception.escaped": True,
        },
    )


def _error_type(e: BaseException) -> str:
    cls = type(e)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def traced(
    name: str,
    target: Callable[..., tuple[Any, str | None]],
    figures: Callable[[Any], Mapping[str, Any]] | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Make each call of the decorated function an :func:`operation`.

    ``target`` takes the function's arguments and gives ``(bind, table name)``; ``figures``
    takes its result and gives the ``sharded_orm.*`` figures to record. With nothing
    recording, the function is called as is.
    """

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            if api.tracer() is None and api.meter() is None:
                return fn(*args, **kwargs)
            try:
                bind, table = target(*args, **kwargs)
            except Exception:  # arguments the function itself refuses, with its own error
                bind, table = None, None
            with operation(name, bind, table) as op:
                result = fn(*args, **kwargs)
                if figures is not None:
                    op.set_all(figures(result))
                return result

        return call

    return wrap
