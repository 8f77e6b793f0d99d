"""A replay of an aborted transaction ends within the deadline of the call that set it off.

When Spanner aborts a read-write transaction, the Spanner DB-API replays its statements
in a new one, on cursors of its own: with ``timeout=4`` and the server silent during the
replay, the statement was still running at 45 s, through a Connection and a Session.
Our DB-API connection (``sharded_orm.spanner.connection``) opens the replay's cursors
under the statement's deadline (or the commit's), and a replay out of time ends with
``ReplayTimeout``: the transaction was aborted, nothing of it is committed, run it again.
Faults come from ``FaultProxy`` in front of the emulator.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from sharded_orm.spanner.commits import CommitTimeout
from sharded_orm.spanner.connection import ReplayTimeout, ShardedConnection

DEADLINE = 4.0
#: Slack for the client to notice and unwind (the deadline itself is the bound).
SLACK = 3.0
#: How long the proxy stays silent: past the deadline, short of the client's own hour
#: (the code before this fix ended when the proxy gave up, after SILENCE seconds).
SILENCE = 25.0

INSERT = "INSERT INTO ReplayRows (Id) VALUES ('{}')"


@pytest.fixture
def events(spanner_emulator: Any, spanner_faults: Any) -> Iterator[tuple[sa.Engine, Any, Any]]:
    db = spanner_emulator.create_database()
    direct = spanner_emulator.engine(db)
    with direct.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE ReplayRows (Id STRING(36)) PRIMARY KEY (Id)")
    try:
        with spanner_faults.engine(spanner_emulator, db, commit_timeout=DEADLINE) as engine:
            yield engine, spanner_faults, direct
    finally:
        direct.dispose()


def _ids(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return [r[0] for r in conn.exec_driver_sql("SELECT Id FROM ReplayRows ORDER BY Id")]


def _abort_then(proxy: Any, silent: bool) -> None:
    """The next statement is aborted by Spanner; with ``silent``, every statement after it
    (the replay's) gets no answer."""
    proxy.fail("ExecuteStreamingSql", "ABORTED")
    if silent:
        proxy.hang("ExecuteStreamingSql", SILENCE, times=1000)


def _through_a_connection(engine: sa.Engine, proxy: Any, silent: bool) -> None:
    with engine.connect() as conn:
        conn = conn.execution_options(timeout=DEADLINE)
        conn.execute(sa.text(INSERT.format("a")))
        _abort_then(proxy, silent)
        conn.execute(sa.text(INSERT.format("b")))
        conn.commit()


def _through_a_session(engine: sa.Engine, proxy: Any, silent: bool) -> None:
    with Session(engine.execution_options(timeout=DEADLINE)) as session:
        session.execute(sa.text(INSERT.format("a")))
        _abort_then(proxy, silent)
        session.execute(sa.text(INSERT.format("b")))
        session.commit()


WAYS: dict[str, Callable[[sa.Engine, Any, bool], None]] = {
    "connection": _through_a_connection,
    "session": _through_a_session,
}


@pytest.mark.emulator
@pytest.mark.parametrize(
    "way",
    [
        "connection",
        # the same replay under the same deadline, waited for again (seconds); quick loop:
        # test_a_replay_on_a_silent_server_ends_within_the_statement_s_deadline[connection],
        # test_a_replay_that_succeeds_still_succeeds[session]
        pytest.param("session", marks=pytest.mark.slow),
    ],
)
def test_a_replay_on_a_silent_server_ends_within_the_statement_s_deadline(
    events: tuple[sa.Engine, Any, Any], way: str
) -> None:
    engine, proxy, direct = events
    start = time.monotonic()
    with pytest.raises(sa.exc.OperationalError) as caught:
        WAYS[way](engine, proxy, True)
    took = time.monotonic() - start
    assert took < DEADLINE + SLACK, f"took {took:.1f} s, deadline {DEADLINE} s"
    assert isinstance(caught.value.orig, ReplayTimeout)
    message = str(caught.value)
    assert "the transaction was aborted" in message
    assert f"within its deadline of {DEADLINE:g} s" in message
    assert "can be retried" in message
    assert proxy.count("ExecuteStreamingSql", "failed ABORTED") == 1
    assert proxy.count("ExecuteStreamingSql", "hung") >= 1  # the replay's statement
    proxy.clear()
    assert _ids(direct) == []  # nothing of the aborted transaction is committed
    WAYS[way](engine, proxy, False)  # the engine works on: the transaction run again
    assert _ids(direct) == ["a", "b"]


@pytest.mark.emulator
@pytest.mark.parametrize("way", list(WAYS))
def test_a_replay_that_succeeds_still_succeeds(
    events: tuple[sa.Engine, Any, Any], way: str
) -> None:
    engine, proxy, direct = events
    WAYS[way](engine, proxy, False)
    assert proxy.count("ExecuteStreamingSql", "failed ABORTED") == 1
    # a, b (aborted), then the replay's a and b again
    assert proxy.count("ExecuteStreamingSql", "passed") >= 3
    assert _ids(direct) == ["a", "b"]


@pytest.mark.emulator
def test_a_replay_at_commit_ends_within_commit_timeout(
    events: tuple[sa.Engine, Any, Any],
) -> None:
    """An abort at commit: the replay runs in the commit's thread, whose caller stops
    waiting at commit_timeout (CommitTimeout: its outcome unknown); the replay ends
    just after (before, it ran on in the background for as long as the server was
    silent, up to the client's hour)."""
    engine, proxy, direct = events
    earlier = set(_commit_threads())  # other tests' abandoned commits, if any
    start = time.monotonic()
    with pytest.raises(sa.exc.OperationalError) as caught, engine.connect() as conn:
        conn.execute(sa.text(INSERT.format("a")))
        proxy.fail("Commit", "ABORTED")
        proxy.hang("ExecuteStreamingSql", SILENCE, times=1000)
        conn.commit()
    assert time.monotonic() - start < DEADLINE + SLACK
    assert isinstance(caught.value.orig, CommitTimeout), str(caught.value)
    # the replay in the commit's thread ends at the deadline too (it ran on for as long
    # as the server stayed silent)
    ends = time.monotonic() + SLACK
    while set(_commit_threads()) - earlier and time.monotonic() < ends:
        time.sleep(0.1)
    assert not set(_commit_threads()) - earlier
    proxy.clear()
    assert _ids(direct) == []


def _commit_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sharded-orm-commit" and t.is_alive()]


def test_our_engines_open_our_connection(spanner_emulator: Any) -> None:
    engine = spanner_emulator.engine(spanner_emulator.create_database())
    with engine.connect() as conn:
        driver = conn.connection.driver_connection
        assert isinstance(driver, ShardedConnection)
        assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    engine.dispose()


def test_upstream_replays_through_these_hooks() -> None:
    """Trips when the Spanner DB-API changes how it replays an aborted transaction: the
    connection makes its retry helper in ``__init__`` (``_transaction_helper``), the
    helper opens the replay's cursors with ``connection.cursor()`` and takes a
    ``default_retry_delay``, and a replay is set off from the cursor's execute and
    fetches and from the connection's commit, through that helper."""
    from google.cloud.spanner_dbapi import connect
    from google.cloud.spanner_dbapi.connection import Connection
    from google.cloud.spanner_dbapi.cursor import Cursor
    from google.cloud.spanner_dbapi.exceptions import OperationalError, RetryAborted
    from google.cloud.spanner_dbapi.transaction_helper import TransactionRetryHelper

    assert "self._transaction_helper = TransactionRetryHelper(self)" in inspect.getsource(
        Connection.__init__
    )
    retry = inspect.getsource(TransactionRetryHelper.retry_transaction)
    assert "self._connection.cursor()" in retry
    assert "_set_connection_for_retry()" in retry
    assert "RetryAborted(RETRY_ABORTED_ERROR, ex)" in retry  # the replay's error as args[1]
    retry_parameters = inspect.signature(TransactionRetryHelper.retry_transaction).parameters
    assert "default_retry_delay" in retry_parameters
    assert "self.transaction_helper.retry_transaction()" in inspect.getsource(
        Cursor._execute_in_rw_transaction
    )
    assert "self.transaction_helper.retry_transaction()" in inspect.getsource(Cursor._fetch)
    assert "self._transaction_helper.retry_transaction()" in inspect.getsource(Connection.commit)
    # what rollback() and close() skip once a replay gave up
    skipped = "if self._spanner_transaction_started and not self._read_only:"
    for method in (Connection.rollback, Connection.close):
        assert skipped in inspect.getsource(method)
    assert issubclass(RetryAborted, OperationalError)
    # connect() makes the connection from these, and passes the rest to it
    source = inspect.getsource(connect)
    assert "conn = Connection(" in source and "conn._own_pool = False" in source
    assert {"instance", "database", "read_only"} <= set(inspect.signature(Connection).parameters)


@pytest.mark.emulator
@pytest.mark.parametrize(
    "cparams", [{}, {"read_only": True}, {"ignore_transaction_warnings": True}, {"pool": "own"}]
)
def test_our_connect_makes_the_connection_the_stock_one_makes(
    spanner_emulator: Any, cparams: dict[str, Any]
) -> None:
    """The same state as the DB-API's own connect() gives, but our class (which trips
    when connect() starts passing something else to its connection)."""
    from google.cloud.spanner_dbapi import connect as stock_connect
    from google.cloud.spanner_v1.pool import FixedSizePool

    from sharded_orm.spanner.connection import connect

    db = spanner_emulator.create_database()
    if cparams.get("pool") == "own":
        cparams = {"pool": FixedSizePool(size=1)}
    args = (spanner_emulator.instance_id, db, spanner_emulator.project)
    ours = connect(*args, client=spanner_emulator.client, **cparams)
    stock = stock_connect(*args, client=spanner_emulator.client, **cparams)
    assert type(ours) is ShardedConnection
    mine = {
        k: v for k, v in vars(ours).items() if k not in ("deadline", "replay_gave_up", "run_owned")
    }
    theirs = vars(stock)
    assert sorted(mine) == sorted(theirs)
    for name, value in theirs.items():
        if name in ("_transaction_helper", "_database"):
            continue
        assert mine[name] == value, name
    assert ours.database.name == stock.database.name


# ---- through the async engine (spanner+spanner_async): the same bodies, in its greenlet


@pytest.fixture
def events_async(
    spanner_emulator: Any, spanner_faults: Any, events: tuple[sa.Engine, Any, Any]
) -> Iterator[tuple[Any, Any, Any]]:
    """``events``' database through the fault proxy, on an async engine."""
    from sharded_orm.testing.async_engines import dispose, run_through

    engine, proxy, direct = events
    database_id = str(engine.url.database).rsplit("/", 1)[-1]
    async_engine = spanner_faults.emulator(spanner_emulator).async_engine(
        database_id, commit_timeout=DEADLINE
    )
    run_through(async_engine, _ids)  # warm the pool and a session before any fault
    try:
        yield async_engine, proxy, direct
    finally:
        proxy.clear()
        dispose(async_engine)


def _through_async(events_async: tuple[Any, Any, Any], body: Any, *args: Any) -> None:
    from sharded_orm.testing.async_engines import run_through

    async_engine, proxy, direct = events_async
    run_through(async_engine, lambda engine: body((engine, proxy, direct), *args))


@pytest.mark.emulator
def test_a_replay_that_succeeds_through_the_async_engine(
    events_async: tuple[Any, Any, Any],
) -> None:
    _through_async(events_async, test_a_replay_that_succeeds_still_succeeds, "session")


# async variant; quick loop: test_a_replay_that_succeeds_through_the_async_engine
@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.parametrize(
    ("body", "args"),
    [
        (test_a_replay_on_a_silent_server_ends_within_the_statement_s_deadline, ("connection",)),
        (test_a_replay_on_a_silent_server_ends_within_the_statement_s_deadline, ("session",)),
        (test_a_replay_that_succeeds_still_succeeds, ("connection",)),
        (test_a_replay_at_commit_ends_within_commit_timeout, ()),
    ],
    ids=lambda v: v.__name__ if callable(v) else "-".join(v),
)
def test_replays_through_the_async_engine(
    events_async: tuple[Any, Any, Any], body: Any, args: tuple[str, ...]
) -> None:
    _through_async(events_async, body, *args)
