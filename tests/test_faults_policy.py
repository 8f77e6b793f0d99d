"""sharded_orm.retry: classification (cycles included), bounds, deadline, final errors.

Pure: no database. The behaviour under real faults is in test_faults.py.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sharded_orm.errors import ShardConfigError, ShardTypeError, ShardValueError
from sharded_orm.retry import (
    Deadline,
    Outcome,
    RetryDeadlineError,
    RetryError,
    RetryPolicy,
    TransientError,
    classify,
    error_chain,
    is_retryable,
    retry_call,
)

FAST = RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.002)


def named(name: str, message: str = "") -> Exception:
    """An exception whose class has ``name``, as google.api_core's errors are recognised."""
    return type(name, (Exception,), {})(message)


class Aborted(Exception):
    pass


class AlreadyExists(Exception):
    pass


class DeadlineExceeded(Exception):
    pass


def test_outcomes_by_name_and_message() -> None:
    assert classify(Aborted("x")) is Outcome.RETRY
    assert classify(named("ResourceExhausted")) is Outcome.RETRY
    assert classify(RuntimeError("database is locked")) is Outcome.RETRY
    assert classify(RuntimeError("INTERNAL: Transaction not found")) is Outcome.RETRY
    assert classify(DeadlineExceeded()) is Outcome.UNKNOWN
    assert classify(named("ServiceUnavailable")) is Outcome.UNKNOWN
    for permanent in ("AlreadyExists", "PermissionDenied", "InvalidArgument", "NotFound",
                      "FailedPrecondition", "OutOfRange", "IntegrityError"):  # fmt: skip
        assert classify(named(permanent, "aborted")) is Outcome.PERMANENT, permanent
    assert classify(ValueError("anything else")) is Outcome.PERMANENT
    assert classify(TransientError("conflict")) is Outcome.RETRY


def test_grpc_status_names_are_read_too() -> None:
    class RpcError(Exception):
        def code(self) -> Any:
            return type("Code", (), {"name": "ABORTED"})()

    assert classify(RpcError()) is Outcome.RETRY


def test_a_permanent_cause_wins_over_a_retryable_wrapper() -> None:
    outer = RuntimeError("transaction was aborted")
    outer.__cause__ = AlreadyExists("row exists")
    assert classify(outer) is Outcome.PERMANENT
    assert not is_retryable(outer, idempotent=True)


def test_a_cyclic_chain_ends() -> None:
    """google-cloud-spanner raises errors whose chain loops back on itself."""
    a, b = RuntimeError("wrapper"), AlreadyExists("409 Row already exists")
    a.__context__, b.__context__ = b, a
    assert [type(e) for e in error_chain(a)] == [RuntimeError, AlreadyExists]
    assert classify(a) is Outcome.PERMANENT


@given(
    st.lists(
        st.sampled_from(["Aborted", "AlreadyExists", "DeadlineExceeded", "Other"]),
        min_size=1,
        max_size=8,
    ),  # fmt: skip
    st.integers(min_value=0, max_value=7),
    st.booleans(),
)
def test_any_chain_ends_and_permanent_dominates(names: list[str], back: int, cause: bool) -> None:
    errors = [named(n) for n in names]
    for outer, inner in zip(errors, errors[1:], strict=False):
        if cause:
            outer.__cause__ = inner
        else:
            outer.__context__ = inner
    errors[-1].__context__ = errors[min(back, len(errors) - 1)]  # may loop
    chain = list(error_chain(errors[0]))
    assert len(chain) == len({id(e) for e in chain}) <= len(errors)
    if "AlreadyExists" in names or set(names) == {"Other"}:
        expected = Outcome.PERMANENT
    elif "DeadlineExceeded" in names:
        expected = Outcome.UNKNOWN
    else:
        expected = Outcome.RETRY
    assert classify(errors[0]) is expected


@given(st.integers(min_value=0, max_value=10_000))
def test_delays_grow_and_stay_capped(retry: int) -> None:
    policy = RetryPolicy(base_delay=0.05, max_delay=2.0)
    cap = min(2.0, 0.05 * 2 ** min(retry, 32))
    assert cap / 2 <= policy.delay(retry) <= cap


def test_retried_then_success() -> None:
    calls: list[float] = []

    def flaky(timeout: float) -> str:
        calls.append(timeout)
        if len(calls) < 3:
            raise Aborted("409 aborted")
        return "ok"

    seen: list[Outcome] = []
    assert retry_call(flaky, FAST, what="t", on_retry=lambda e, o: seen.append(o)) == "ok"
    assert len(calls) == 3 and seen == [Outcome.RETRY] * 2
    assert all(0 < t <= FAST.call_timeout for t in calls)


def test_permanent_is_not_retried_and_says_how_to_resume() -> None:
    calls: list[int] = []

    def dup(timeout: float) -> None:
        calls.append(1)
        raise AlreadyExists("409 Row {Int64(7)} already exists")

    with pytest.raises(RetryError) as info:
        retry_call(dup, FAST, what="loading batch 3", resume="Batches 0-2 are in; run again.")
    assert calls == [1]
    text = str(info.value)
    assert "loading batch 3 failed: not retryable (permanent)" in text
    assert "AlreadyExists: 409 Row {Int64(7)} already exists" in text
    assert text.endswith("Batches 0-2 are in; run again.")
    assert info.value.outcome is Outcome.PERMANENT and info.value.attempts == 1
    assert isinstance(info.value.__cause__, AlreadyExists)


def test_unknown_outcome_is_retried_only_when_idempotent() -> None:
    def late(timeout: float) -> None:
        raise DeadlineExceeded("504")

    with pytest.raises(RetryError, match="not retryable.*may have been applied"):
        retry_call(late, FAST, what="commit")
    with pytest.raises(RetryError, match="4 attempts made") as info:
        retry_call(late, FAST, what="commit", idempotent=True)
    assert info.value.attempts == 4


def test_contention_has_its_own_budget() -> None:
    calls: list[int] = []

    def busy(timeout: float) -> None:
        calls.append(1)
        raise Aborted("409")

    policy = RetryPolicy(attempts=2, contention_attempts=6, base_delay=0.0, max_delay=0.0)
    with pytest.raises(RetryError, match="6 of them aborted by contention"):
        retry_call(busy, policy, what="t")
    assert len(calls) == 6


def test_the_deadline_bounds_everything() -> None:
    policy = RetryPolicy(attempts=10_000, contention_attempts=10_000, deadline=0.3,
                         base_delay=0.01, max_delay=0.05)  # fmt: skip
    timeouts: list[float] = []

    def busy(timeout: float) -> None:
        timeouts.append(timeout)
        raise Aborted("409")

    started = time.monotonic()
    with pytest.raises(RetryDeadlineError, match="deadline of 0.3 s passed"):
        retry_call(busy, policy, what="t")
    assert time.monotonic() - started < 0.5
    assert all(t <= 0.3 for t in timeouts)  # each attempt gets only the time left


def test_a_shared_deadline_and_should_stop() -> None:
    clock = Deadline(0.0)
    with pytest.raises(RetryDeadlineError, match="before attempt 1"):
        retry_call(lambda t: "never", FAST, what="t", deadline=clock)
    with pytest.raises(RetryError, match="another part of the operation failed"):
        retry_call(lambda t: (_ for _ in ()).throw(Aborted()), FAST, what="t",
                   should_stop=lambda: True)  # fmt: skip


def test_the_librarys_own_errors_pass_through() -> None:
    def bad(timeout: float) -> None:
        raise ShardValueError("a clear error already")

    with pytest.raises(ShardValueError, match="a clear error already"):
        retry_call(bad, FAST, what="t")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"attempts": 0}, ShardConfigError, "attempts"),
        ({"attempts": True}, ShardTypeError, "attempts"),
        ({"contention_attempts": 0}, ShardConfigError, "contention_attempts"),
        ({"deadline": -1}, ShardConfigError, "deadline"),
        ({"deadline": float("nan")}, ShardConfigError, "deadline"),
        ({"deadline": "1"}, ShardTypeError, "deadline"),
        ({"call_timeout": 0}, ShardConfigError, "call_timeout"),
        ({"call_timeout": float("inf")}, ShardConfigError, "finite"),
        ({"base_delay": 1.0, "max_delay": 0.5}, ShardConfigError, "max_delay"),
    ],
)
def test_bad_policies(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        RetryPolicy(**kwargs)


@pytest.mark.parametrize(
    ("max_retries", "error"),
    [
        (-1, ShardConfigError),
        (1.0, ShardTypeError),
        (True, ShardTypeError),
        (10**6, ShardConfigError),
    ],
)
def test_max_retries_is_checked(max_retries: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="max_retries"):
        RetryPolicy.for_retries(max_retries)


def test_retry_is_layer_zero() -> None:
    """Only the standard library, sharded_orm.errors and the telemetry's retry hook (layer
    0 too, with OpenTelemetry imported only once an SDK records): usable from every layer."""
    import ast

    import sharded_orm.retry as module

    tree = ast.parse(Path(module.__file__).read_text())
    imported = {
        (n.module or "") if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    ours = {m for m in imported if m.split(".")[0] == "sharded_orm"}
    assert ours == {"sharded_orm.errors", "sharded_orm.telemetry.spans"}
    spans = ast.parse(Path(sys.modules["sharded_orm.telemetry.spans"].__file__ or "").read_text())
    top_level = {
        (n.module or "") if isinstance(n, ast.ImportFrom) else a.name
        for n in spans.body
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    ours = {m for m in top_level if m.split(".")[0] == "sharded_orm"}
    # (sharded_orm.memo: the one bounded cache, standard library only, layer 0)
    assert ours == {
        "sharded_orm.memo",
        "sharded_orm.telemetry",
        "sharded_orm.telemetry.conventions",
    }
    assert all(m.split(".")[0] in sys.stdlib_module_names | {"__future__", "sharded_orm"}
               for m in top_level)  # fmt: skip
    # the conventions' attributes: the standard library only
    import sharded_orm.telemetry.conventions as conventions

    tree = ast.parse(Path(conventions.__file__).read_text())
    names = {
        (n.module or "") if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    assert all(m.split(".")[0] in sys.stdlib_module_names | {"__future__"} for m in names), names
    assert all(m.split(".")[0] in sys.stdlib_module_names | {"__future__", "sharded_orm"}
               for m in imported)  # fmt: skip
