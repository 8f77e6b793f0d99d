"""Where the tracer and meter come from: the providers an app configured, or none.

The OpenTelemetry API is optional (the ``otel`` extra). It is imported on the first
operation, never by ``import sharded_orm``. With it absent, or present with only its own
default providers (no SDK configured), :func:`tracer` and :func:`meter` return ``None``
and the library records nothing: one function call and an ``isinstance`` per operation.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from sharded_orm.errors import ShardTypeError

#: the instrumentation scope every span and metric of the library carries
SCOPE = "sharded_orm"
#: the semantic conventions the attributes follow (the stable database conventions)
SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"

_lock = threading.Lock()
_modules: tuple[Any, Any] | None | bool = False  # False: not tried yet; None: API absent
_given: dict[str, Any] = {"tracer_provider": None, "meter_provider": None}
#: how long an answer is believed before the global providers are asked again (asking
#: costs microseconds: an operation pays it at most once a second)
RECHECK_SECONDS = 1.0
_idle_until: dict[str, float] = {"tracer_provider": 0.0, "meter_provider": 0.0}
#: kind -> (the provider, the tracer or meter it made, monotonic time until which it is
#: taken without asking the providers again). Two keys at most, replaced when stale and
#: emptied by :func:`configure`: state with a lifetime, not a cache to bound (no Memo)
_made: dict[str, tuple[Any, Any, float]] = {}


def _api() -> tuple[Any, Any] | None:
    """``(opentelemetry.trace, opentelemetry.metrics)``, or None where the API is absent."""
    global _modules
    if _modules is False:
        with _lock:
            if _modules is False:
                try:
                    from opentelemetry import metrics, trace
                except ImportError:
                    _modules = None
                else:
                    _modules = (trace, metrics)
    return _modules  # type: ignore[return-value]


def _is_default(provider: Any, module: Any) -> bool:
    """The API's own provider (a proxy waiting for an SDK, or the no-op one)."""
    return type(provider).__module__.startswith(module.__name__)


def configure(*, tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Record through these providers instead of the global ones (``None``: the global
    ones, the default). For tests and for apps that keep a provider of their own."""
    for name, value in (("tracer_provider", tracer_provider), ("meter_provider", meter_provider)):
        if value is not None and not hasattr(
            value, "get_tracer" if name == "tracer_provider" else "get_meter"
        ):
            raise ShardTypeError(f"{name} must be an OpenTelemetry {name}, got {value!r}")
    with _lock:
        _given["tracer_provider"] = tracer_provider
        _given["meter_provider"] = meter_provider
        _made.clear()
        _idle_until.update(dict.fromkeys(_idle_until, 0.0))


def _resolve(kind: str) -> Any:
    now = time.monotonic()
    made = _made.get(kind)
    if made is not None and made[2] > now:
        return made[1]
    if _idle_until[kind] > now:
        return None
    modules = _api()
    if modules is None:
        _idle_until[kind] = float("inf")  # the API is not installed: it will not appear
        return None
    trace, metrics = modules
    module = trace if kind == "tracer_provider" else metrics
    provider = _given[kind]
    if provider is None:
        provider = (
            trace.get_tracer_provider()
            if kind == "tracer_provider"
            else metrics.get_meter_provider()
        )
        if _is_default(provider, module):
            _idle_until[kind] = time.monotonic() + RECHECK_SECONDS
            return None
    if made is not None and made[0] is provider:  # the same provider: believed a while more
        _made[kind] = (provider, made[1], now + RECHECK_SECONDS)
        return made[1]
    from sharded_orm.telemetry.version import version

    if kind == "tracer_provider":
        got = provider.get_tracer(SCOPE, version(), schema_url=SCHEMA_URL)
    else:
        got = provider.get_meter(SCOPE, version(), schema_url=SCHEMA_URL)
    _made[kind] = (provider, got, now + RECHECK_SECONDS)
    return got


def tracer() -> Any:
    """The library's tracer, or None when nothing would record its spans."""
    return _resolve("tracer_provider")


def meter() -> Any:
    """The library's meter, or None when nothing would read its metrics."""
    return _resolve("meter_provider")


def trace_module() -> Any:
    modules = _api()
    return None if modules is None else modules[0]
