"""Calls waited for until a deadline hold a bounded number of threads (issue 45).

``finished_within`` (``sharded_orm/spanner/deadlines.py``) runs the client calls that
take no timeout (a commit, Partitioned DML, a session's creation) on a thread of their
own and stops waiting at the deadline; the call goes on until the client's own timeout
(an hour for a commit). It started a new thread per call with no count: a server silent
for an hour under load held one more thread (and its memory) per call. Now the calls
still running past their deadlines are counted, and once ``MAX_STUCK_CALLS`` are, a new
call is refused at once with an error that says the server is not answering and what to
do; each stuck call frees its place when it returns, and its thread goes back to the
pool, which shrinks to nothing when idle. A call never waits for a busy worker.

The stand-in for a silent server is a call blocked on an ``Event``.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharded_orm.spanner.deadlines import (
    BOUNDED_CALLS,
    MAX_STUCK_CALLS,
    BoundedCalls,
    SpannerNotAnswering,
    finished_within,
)

#: the deadline given to a call that will not return in time
SHORT = 0.02


def eventually(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while not check():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def stuck_is(pool: BoundedCalls, count: int) -> Callable[[], bool]:
    return lambda: pool.stuck == count


@pytest.fixture
def pool() -> BoundedCalls:
    """A pool of its own, as the process's (``BOUNDED_CALLS``) is made: calls other
    tests left stuck on a silent server (until the client's own timeout) are not its."""
    return BoundedCalls()


@pytest.fixture
def silent(pool: BoundedCalls) -> Iterator[threading.Event]:
    """The server: silent until the event is set (always set at the end)."""
    server = threading.Event()
    yield server
    server.set()
    assert eventually(lambda: pool.stuck == 0)


def test_past_the_cap_a_call_is_refused_at_once_saying_what_to_do(
    pool: BoundedCalls, silent: threading.Event
) -> None:
    returned: list[int] = []

    def blocked(i: int) -> None:
        silent.wait()
        returned.append(i)

    # MAX_STUCK_CALLS - 1 calls left running: the next is still run (and waited for)
    for i in range(MAX_STUCK_CALLS - 1):
        assert pool.finished_within(functools.partial(blocked, i), SHORT) is False
    assert pool.stuck == MAX_STUCK_CALLS - 1
    ran: list[bool] = []
    assert pool.finished_within(lambda: ran.append(True), 5.0) is True
    assert ran == [True]  # a quick call is not made to wait for the stuck ones' threads
    assert pool.finished_within(lambda: blocked(-1), SHORT) is False
    assert pool.stuck == MAX_STUCK_CALLS

    # one more: refused at once, without running, though it was given 30 s
    called: list[bool] = []
    start = time.monotonic()
    with pytest.raises(SpannerNotAnswering) as refused:
        pool.finished_within(lambda: called.append(True), 30.0)
    assert time.monotonic() - start < 0.5
    assert called == []
    message = str(refused.value)
    assert message.startswith(
        f"{MAX_STUCK_CALLS} calls to Spanner have not returned after their deadlines passed"
    )
    assert "the server is not answering" in message
    assert "nothing of it was sent" in message
    assert "Check that this process reaches Spanner" in message
    assert "MAX_STUCK_CALLS" in message
    # a DB-API error: SQLAlchemy raises it as sqlalchemy.exc.OperationalError
    from google.cloud.spanner_dbapi.exceptions import OperationalError

    assert isinstance(refused.value, OperationalError)
    assert pool.workers <= MAX_STUCK_CALLS + 1

    # the server answers: every stuck call returns and frees its place
    silent.set()
    assert eventually(lambda: pool.stuck == 0)
    assert sorted(returned) == [-1, *range(MAX_STUCK_CALLS - 1)]
    assert pool.finished_within(lambda: called.append(True), 5.0) is True
    assert called == [True]
    # and the threads end once idle
    assert eventually(lambda: pool.workers == 0)


def test_a_stuck_call_that_fails_later_frees_its_place(
    pool: BoundedCalls, silent: threading.Event
) -> None:
    def fails_late() -> None:
        silent.wait()
        raise RuntimeError("late")

    assert pool.finished_within(fails_late, SHORT) is False
    assert pool.stuck == 1
    silent.set()
    assert eventually(lambda: pool.stuck == 0)


def test_results_and_errors_come_back_and_threads_are_reused(pool: BoundedCalls) -> None:
    out: list[int] = []
    for i in range(50):
        assert pool.finished_within(functools.partial(out.append, i), 5.0) is True
    assert out == list(range(50))
    assert pool.workers <= 1  # one after another: one worker, reused
    with pytest.raises(ZeroDivisionError):
        pool.finished_within(lambda: 1 // 0, 5.0)
    assert pool.stuck == 0
    assert eventually(lambda: pool.workers == 0)


def test_finished_within_runs_on_the_process_s_pool(silent: threading.Event) -> None:
    """``finished_within`` is ``BOUNDED_CALLS``: a call it gives up on is counted there
    until it returns (relative counts: other tests' calls may still be stuck)."""
    before = BOUNDED_CALLS.stuck
    assert finished_within(silent.wait, SHORT) is False
    assert BOUNDED_CALLS.stuck >= before + 1
    silent.set()
    assert eventually(lambda: BOUNDED_CALLS.stuck <= before)
    assert finished_within(lambda: None, 5.0) is True


def test_a_value_set_by_one_call_is_not_seen_by_the_next() -> None:
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("h6_probe", default="unset")
    seen: list[str] = []
    assert finished_within(lambda: var.set("first"), 5.0) is True
    assert finished_within(lambda: seen.append(var.get()), 5.0) is True
    assert seen == ["unset"]


# -- any interleaving of stuck calls, quick calls, failures and answers


ACTIONS = st.lists(
    st.one_of(
        st.just(("stuck", 0)),
        st.just(("quick", 0)),
        st.just(("fails", 0)),
        st.tuples(st.just("answer"), st.integers(0, 10)),
    ),
    max_size=14,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ACTIONS, st.integers(1, 4))
def test_any_interleaving_refuses_exactly_while_the_cap_is_reached(
    actions: list[tuple[str, int]], cap: int
) -> None:
    pool = BoundedCalls(max_stuck=cap, idle_seconds=0.05)
    waiting: list[threading.Event] = []  # the stuck calls' servers, oldest first
    try:
        for kind, which in actions:
            full = len(waiting) >= cap
            if kind == "answer":
                if waiting:
                    waiting.pop(which % len(waiting)).set()
                    expected = len(waiting)
                    assert eventually(stuck_is(pool, expected)), (pool.stuck, expected)
                continue
            server = threading.Event()
            calls: dict[str, Callable[[], object]] = {
                "stuck": server.wait,
                "quick": lambda: None,
                "fails": lambda: 1 // 0,
            }
            call = calls[kind]
            if full:
                with pytest.raises(SpannerNotAnswering, match=f"^{cap} calls to Spanner"):
                    pool.finished_within(call, SHORT if kind == "stuck" else 5.0)
                continue
            if kind == "stuck":
                assert pool.finished_within(call, SHORT) is False
                waiting.append(server)
            elif kind == "quick":
                assert pool.finished_within(call, 5.0) is True
            else:
                with pytest.raises(ZeroDivisionError):
                    pool.finished_within(call, 5.0)
            assert pool.stuck == len(waiting)
    finally:
        for server in waiting:
            server.set()
    assert eventually(lambda: pool.stuck == 0)
    assert eventually(lambda: pool.workers == 0)
