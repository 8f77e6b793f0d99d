"""The last Spanner calls that ran under the client's own timeouts now end within the
caller's deadline (issue 44's leftovers, issue 45's one ``Deadline``).

* the ``Commit`` that ``Database.run_in_transaction`` sends for an autocommit write (one
  DML or an ``executemany``): upstream takes no timeout there (an hour);
* an autocommit write in the DB-API's ``PARTITIONED_NON_ATOMIC`` mode
  (``Database.execute_partitioned_dml``: BeginTransaction and the stream under the
  client's own timeouts), and ``spanner.pdml``'s own Partitioned DML calls;
* the rebuild of the multiplexed session Spanner lost (``CreateSession`` under the
  client's own timeout and retries).

Faults come from ``FaultProxy`` in front of the emulator; each test prints ``requested``
and ``observed`` seconds (``pytest -s``) for the closing note.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
import test_call_bounds
from test_call_bounds import DEADLINE, INSERT, ROWS, SLACK

from sharded_orm.retry import Deadline
from sharded_orm.spanner.pdml import SpannerCalls

#: the emulator database with a ``BoundRows`` table, its engine through the fault proxy
bound_rows = test_call_bounds.bound_rows
#: deletes every session of the engine's database on the server, as Spanner does
forget_every_session = test_call_bounds._forget_every_session

#: How long the proxy keeps a call waiting (then DEADLINE_EXCEEDED): longer than any
#: deadline here, shorter than a test run before the fix should take.
SILENCE = 30.0

PDML = "DELETE FROM BoundRows WHERE Id = 'no such row'"


def _stored(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return [r[0] for r in conn.exec_driver_sql("SELECT Id FROM BoundRows ORDER BY Id")]


def _timed(call: Callable[[], Any]) -> tuple[BaseException, float]:
    start = time.monotonic()
    with pytest.raises(Exception) as caught:
        call()
    return caught.value, time.monotonic() - start


def _autocommit(engine: sa.Engine, params: Any) -> None:
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT", timeout=DEADLINE).execute(
            sa.text(INSERT), params
        )


AUTOCOMMIT_WRITES = {"one DML": ROWS[0], "executemany": ROWS}


@pytest.mark.emulator
@pytest.mark.parametrize(
    "write",
    [
        "one DML",
        # the same Commit under the same deadline, waited for again (seconds); quick loop:
        # test_the_commit_inside_run_in_transaction_ends_within_the_statement_s_deadline[one DML]
        pytest.param("executemany", marks=pytest.mark.slow),
    ],
)
def test_the_commit_inside_run_in_transaction_ends_within_the_statement_s_deadline(
    bound_rows: tuple[sa.Engine, Any, Any], write: str
) -> None:
    engine, proxy, direct = bound_rows
    proxy.hang("Commit", SILENCE, times=1000)
    error, took = _timed(lambda: _autocommit(engine, AUTOCOMMIT_WRITES[write]))
    print(f"\nautocommit {write}, Commit silent: requested {DEADLINE:g} s, observed {took:.1f} s")
    assert took < DEADLINE + SLACK, f"took {took:.1f} s, deadline {DEADLINE:g} s"
    assert isinstance(error, sa.exc.OperationalError)
    message = str(error)
    assert f"within its deadline of {DEADLINE:g} s" in message
    assert "outcome is unknown" in message
    assert "Check whether its changes are there" in message
    assert proxy.count("Commit") >= 1  # the commit was sent, and not answered
    proxy.clear()
    assert _stored(direct) == []  # the proxy never forwarded it
    _autocommit(engine, AUTOCOMMIT_WRITES[write])  # the engine works on
    expected = ROWS if write == "executemany" else ROWS[:1]
    assert _stored(direct) == sorted(r["id"] for r in expected)


def _partitioned(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        auto = conn.execution_options(isolation_level="AUTOCOMMIT", timeout=DEADLINE)
        auto.exec_driver_sql("SET AUTOCOMMIT_DML_MODE = PARTITIONED_NON_ATOMIC")
        try:
            return auto.exec_driver_sql(PDML).rowcount
        finally:
            auto.exec_driver_sql("SET AUTOCOMMIT_DML_MODE = TRANSACTIONAL")


@pytest.mark.emulator
@pytest.mark.parametrize(
    "method",
    [
        "BeginTransaction",
        # the same deadline on the next call, waited for again (seconds); quick loop:
        # test_partitioned_dml_in_autocommit_mode_ends_within_the_statement_s_deadline
        pytest.param("ExecuteStreamingSql", marks=pytest.mark.slow),
    ],
)
def test_partitioned_dml_in_autocommit_mode_ends_within_the_statement_s_deadline(
    bound_rows: tuple[sa.Engine, Any, Any], method: str
) -> None:
    engine, proxy, direct = bound_rows
    with direct.begin() as conn:
        conn.execute(sa.text(INSERT), ROWS)
    proxy.hang(method, SILENCE, times=1000)
    error, took = _timed(lambda: _partitioned(engine))
    print(f"\nPDML autocommit, {method} silent: requested {DEADLINE:g} s, observed {took:.1f} s")
    assert took < DEADLINE + SLACK, f"took {took:.1f} s, deadline {DEADLINE:g} s"
    assert isinstance(error, sa.exc.OperationalError)
    message = str(error)
    assert f"within its deadline of {DEADLINE:g} s" in message
    assert "Partitioned DML is not atomic" in message
    proxy.clear()
    assert _partitioned(engine) >= 0  # the engine works on
    assert _stored(direct) == sorted(r["id"] for r in ROWS)


@pytest.fixture
def pdml_calls(bound_rows: tuple[sa.Engine, Any, Any]) -> Iterator[tuple[SpannerCalls, Any]]:
    engine, proxy, _ = bound_rows
    raw = engine.raw_connection()
    try:
        driver: Any = raw.driver_connection
        calls = SpannerCalls(driver.database)
        try:
            yield calls, proxy
        finally:
            calls.close()
    finally:
        raw.close()


@pytest.mark.emulator
@pytest.mark.parametrize(
    "method",
    [
        # the earlier calls of the same deadline, each waited for (seconds); quick loop:
        # test_load_pdml_calls_share_one_deadline[ExecuteStreamingSql] (the last call, sent
        # with what the session and the begin left of the deadline)
        pytest.param("CreateSession", marks=pytest.mark.slow),
        pytest.param("BeginTransaction", marks=pytest.mark.slow),
        "ExecuteStreamingSql",
    ],
)
def test_load_pdml_calls_share_one_deadline(
    pdml_calls: tuple[SpannerCalls, Any], method: str
) -> None:
    """``spanner.pdml`` sends each RPC with the time left of one deadline: a session, a
    begin and a stream together end within it, whichever of them is silent."""
    calls, proxy = pdml_calls
    proxy.hang(method, SILENCE, times=1000)
    deadline = Deadline.after(DEADLINE)
    error, took = _timed(lambda: calls.partitioned_update(PDML, deadline))
    print(f"\nspanner.pdml, {method} silent: requested {DEADLINE:g} s, observed {took:.1f} s")
    assert took < DEADLINE + SLACK, f"took {took:.1f} s, deadline {DEADLINE:g} s"
    assert "Deadline" in type(error).__name__ or "deadline" in str(error).lower()
    proxy.clear()
    assert calls.partitioned_update(PDML, DEADLINE) >= 0


def _read(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        rows = conn.execution_options(timeout=DEADLINE).exec_driver_sql(
            "SELECT Id FROM BoundRows ORDER BY Id"
        )
        return [r[0] for r in rows]


@pytest.mark.emulator
def test_rebuilding_a_lost_session_ends_within_the_statement_s_deadline(
    bound_rows: tuple[sa.Engine, Any, Any],
) -> None:
    engine, proxy, direct = bound_rows
    with direct.begin() as conn:
        conn.execute(sa.text(INSERT), ROWS)
    assert _read(engine) == sorted(r["id"] for r in ROWS)  # the engine holds a session
    assert forget_every_session(direct) >= 1
    proxy.hang("CreateSession", SILENCE, times=1000)
    error, took = _timed(lambda: _read(engine))
    print(f"\nsession rebuild, CreateSession silent: requested {DEADLINE:g} s, "
          f"observed {took:.1f} s")  # fmt: skip
    assert took < DEADLINE + SLACK, f"took {took:.1f} s, deadline {DEADLINE:g} s"
    assert isinstance(error, sa.exc.OperationalError)
    message = str(error)
    assert "Spanner no longer knows this connection's session" in message
    assert f"within its deadline of {DEADLINE:g} s" in message
    assert "Nothing was run" in message
    proxy.clear()
    for _ in range(3):  # the engine works on, on a new session
        assert _read(engine) == sorted(r["id"] for r in ROWS)
