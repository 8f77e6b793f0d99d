"""The DB-API connection and cursor our dialect opens: google-cloud-spanner's, subclassed.

**Replays of an aborted transaction run under the deadline of the call that set them
off.** When Spanner aborts a read-write transaction, the DB-API replays its statements
in a new one (``TransactionRetryHelper.retry_transaction``): on cursors it opens with
``connection.cursor()``, outside the statement's :class:`~.deadlines.DeadlineCursor`, so
with ``timeout=4`` and a server silent during the replay the call was still running at
45 s. Here ``ShardedConnection.cursor()`` opens :class:`ShardedCursor` under the
deadline of the call under way (a statement's ``timeout``; for an abort at commit, the
commit's ``commit_timeout``, whose wait raises ``CommitTimeout`` first), and the
connection's retry helper turns a replay that runs out of that time into
:class:`ReplayTimeout`: the transaction was aborted, nothing of it is committed, and it
can be run again. The rollback after it sends nothing to a server that did not answer
(Spanner aborted the transaction; the replay's own one expires there). A replay aborted
again waits at most an eighth of the time left (the DB-API waits ``2**n`` s when the
server gives no retry delay). ``timeout=None`` keeps the DB-API's own behaviour.

**The statement classification is memoised** (:mod:`.statements`): the cursor's
``_execute`` is the DB-API's own code, run with its ``parse_utils`` seen through
:class:`~.statements.ParseUtilsView`, whose ``classify_statement`` answers from
:data:`STATEMENTS` (``tests/test_statement_memo.py``).

``tests/test_replay_deadlines.py`` shows the replays on the emulator through
``FaultProxy``, and trips when upstream changes the replay hooks relied on here.

**A session Spanner no longer knows is replaced** (NOT_FOUND ``Session not found``: the
server restarted, or deleted a session idle for an hour). The client library keeps using
its multiplexed session (or hands the lost pooled one out again), so every statement of
the engine failed from then on. Here the connection drops the lost session (the database's
multiplexed one is rebuilt once, under its lock), and the statement is run again on a new
one where that is safe: a statement outside a transaction (a read, or an autocommit write:
its transaction never began on the server) and a transaction's first statement. A later
statement of a transaction fails with :class:`SessionLost` (the transaction is gone:
nothing of it is committed, run it again), and so does a commit; a rollback of such a
transaction sends nothing (``tests/test_call_bounds.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from google.api_core.exceptions import NotFound
from google.cloud.spanner_dbapi import connect as _stock_connect
from google.cloud.spanner_dbapi.connection import Connection
from google.cloud.spanner_dbapi.cursor import Cursor
from google.cloud.spanner_dbapi.exceptions import InterfaceError, OperationalError, RetryAborted
from google.cloud.spanner_dbapi.transaction_helper import TransactionRetryHelper

from sharded_orm.retry import DEFAULTS, Deadline
from sharded_orm.spanner.deadlines import (
    TIMEOUT_OPTION,
    DeadlineCursor,
    StatementDeadline,
    finished_within,
)
from sharded_orm.spanner.statements import ParseUtilsView, StatementMemo, run_with_names

#: The longest wait between two replays of a transaction aborted again (and at most an
#: eighth of the time left).
REPLAY_DELAY = 2.0

#: One memo of statement classifications for the process (texts repeat across engines).
STATEMENTS = StatementMemo()


class ReplayTimeout(RetryAborted):  # type: ignore[misc]
    """Spanner aborted the transaction, and replaying it did not finish within the
    deadline of the call: nothing of the transaction is committed; run it again."""


class SessionLost(OperationalError):  # type: ignore[misc]
    """Spanner no longer knows the session a transaction ran in: the transaction is gone,
    nothing of it is committed; run it again (a new session is used)."""


def lost_session(exc: BaseException | None) -> bool:
    """``exc`` (or an error it was raised from) is Spanner's NOT_FOUND for a session."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, NotFound) and "session not found" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _session_lost_error(exc: BaseException, what: str) -> SessionLost:
    why = getattr(exc, "message", None) or str(exc).split(",", 1)[0]
    return SessionLost(
        f"Spanner no longer knows the session {what} ran in (the server restarted, or "
        f"deleted the session after an hour idle): {why}. The transaction is lost and "
        "nothing of it is committed: roll back and run the whole transaction again (it "
        "runs on a new session)."
    )


class _ReplaysInTime(TransactionRetryHelper):  # type: ignore[misc]
    def __init__(self, connection: ShardedConnection) -> None:
        super().__init__(connection)
        self.sharded = connection

    def retry_transaction(self, default_retry_delay: float | None = None) -> None:
        deadline = self.sharded.deadline
        if deadline is None:
            super().retry_transaction(default_retry_delay)
            return
        if default_retry_delay is None:
            default_retry_delay = min(REPLAY_DELAY, deadline.left / 8)
        try:
            super().retry_transaction(default_retry_delay)
        except Exception as exc:
            if not deadline.given_up:
                raise
            self.sharded.replay_gave_up = True
            cause = getattr(exc, "args", ())[1:2] or (exc,)
            why = getattr(cause[0], "message", None) or cause[0]
            raise ReplayTimeout(
                "the transaction was aborted by Spanner (a concurrent transaction, or the "
                "server ended it), and replaying its statements did not finish within "
                f"{deadline.what} of {deadline.seconds:g} s: {why}. Nothing of it is "
                "committed: roll back and run the transaction again (it can be retried); "
                f"raise execution_options({TIMEOUT_OPTION}=<seconds>) (or commit_timeout "
                "for a commit) if it needs longer."
            ) from exc


class ShardedConnection(Connection):  # type: ignore[misc]
    """The Spanner DB-API connection, whose replays of an aborted transaction keep the
    deadline of the call that set them off."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._transaction_helper = _ReplaysInTime(self)
        #: the deadline of the statement or commit under way (None: none of ours)
        self.deadline: StatementDeadline | None = None
        #: a replay ran out of time: the transaction is over on the server's side
        self.replay_gave_up = False
        #: where this connection's calls belong when something other than the dialect
        #: makes them (sqlalchemy-spanner's pool ``reset`` hook rolls back the driver
        #: itself): the async dialect sets its worker's runner; None runs them here
        self.run_owned: Callable[[Callable[[], None]], None] | None = None

    def cursor(self) -> ShardedCursor:
        """A cursor under the deadline of the call under way (the DB-API's replay opens
        its cursors here)."""
        if self.is_closed:
            raise InterfaceError("Connection is already closed")
        return ShardedCursor(self, self.deadline)

    def deadline_cursor(self, seconds: float | None) -> ShardedCursor:
        """A cursor for one statement under ``seconds`` (its ``timeout``): the dialect's
        ``create_cursor`` asks the connection, so the dialect module need not import
        this one (it loads at the first connect, not at ``create_engine``)."""
        return ShardedCursor(self, seconds)

    def drop_lost_session(self, exc: BaseException) -> None:
        """Forget the session Spanner lost, and the transaction on it: the next statement
        runs on a new session (the database's multiplexed one, rebuilt once for all
        connections, or a new pooled one)."""
        lost: Any = getattr(self, "_session", None)
        self._session = None  # a pooled session Spanner lost is not handed out again
        self._transaction = None
        self._snapshot = None
        self._spanner_transaction_started = False
        self._transaction_helper.reset()
        database = self.database
        manager: Any = getattr(database, "sessions_manager", None) if database else None
        lock = getattr(manager, "_multiplexed_session_lock", None)
        if lock is None:
            return
        with lock:
            current = manager._multiplexed_session
            if current is None or not (lost is current or current.name in str(exc)):
                return  # another connection rebuilt it already, or it was a pooled one

        def rebuild() -> None:
            # CreateSession under the client's own timeout and retries (``Session.create``
            # takes none); installed when it answers, unless another rebuild was first
            built = manager._build_multiplexed_session()
            with lock:
                if manager._multiplexed_session is current:
                    # the client's maintenance thread renews whichever session is current
                    manager._multiplexed_session = built

        # the rebuild is waited for until the deadline of the call under way
        deadline = self.deadline.deadline if self.deadline is not None else None
        deadline = deadline or Deadline.after(DEFAULTS["statement"])
        if not finished_within(rebuild, deadline):
            raise SessionLost(
                "Spanner no longer knows this connection's session (the server restarted, "
                "or deleted it after an hour idle), and did not answer the request for a "
                f"new one within {deadline.what} of {deadline.seconds:g} s. Nothing was "
                "run: try again once Spanner answers (the new session is used as soon as "
                "it is made); raise execution_options("
                f"{TIMEOUT_OPTION}=<seconds>) if it needs longer."
            ) from exc

    def commit(self) -> None:
        try:
            super().commit()
        except Exception as exc:
            if not lost_session(exc):
                raise
            self.drop_lost_session(exc)
            raise _session_lost_error(exc, "this transaction") from exc

    def _forget_given_up(self) -> None:
        # the original transaction was aborted by Spanner, the replay's never answered:
        # nothing to roll back that a silent server would answer
        if self.replay_gave_up:
            self.replay_gave_up = False
            self._spanner_transaction_started = False

    def rollback(self) -> None:
        if self.run_owned is not None:
            self.run_owned(self._rollback_here)
        else:
            self._rollback_here()

    def _rollback_here(self) -> None:
        self._forget_given_up()
        try:
            super().rollback()
        except Exception as exc:
            if not lost_session(exc):
                raise
            # Spanner forgot the transaction with its session; a new session that Spanner
            # does not make in time is made again by the next statement
            with suppress(SessionLost):
                self.drop_lost_session(exc)

    def close(self) -> None:
        self._forget_given_up()
        super().close()


class ShardedCursor(DeadlineCursor):
    """A :class:`DeadlineCursor` whose calls lend their deadline to the replays they set
    off, and whose statement classification is memoised."""

    _execute = run_with_names(Cursor._execute, parse_utils=ParseUtilsView(STATEMENTS))

    def __init__(self, connection: Any, seconds: float | StatementDeadline | None) -> None:
        super().__init__(connection, seconds)
        self.driver = connection

    def _lend(self) -> StatementDeadline | None:
        driver = self.driver
        previous: StatementDeadline | None = driver.deadline
        driver.deadline = self.deadline
        return previous

    def _on_a_live_session(self, run: Any, *args: Any) -> Any:
        """``run(*args)``; if Spanner lost the session, once more on a new one when the
        statement began nothing that was lost (outside a transaction, or the transaction's
        first statement), else :class:`SessionLost`."""
        driver = self.driver
        first = not (driver._client_transaction_started and driver._spanner_transaction_started)
        try:
            return run(*args)
        except Exception as exc:
            if not lost_session(exc) or not isinstance(driver, ShardedConnection):
                raise
            driver.drop_lost_session(exc)
            if not first or self._in_retry_mode:
                raise _session_lost_error(exc, "this transaction") from exc
        return run(*args)

    def execute(self, sql: Any, args: Any = None) -> Any:
        previous = self._lend()
        try:
            return self._on_a_live_session(super().execute, sql, args)
        finally:
            self.driver.deadline = previous

    def executemany(self, operation: Any, seq_of_params: Any) -> Any:
        previous = self._lend()
        try:
            return self._on_a_live_session(super().executemany, operation, seq_of_params)
        finally:
            self.driver.deadline = previous

    def fetchone(self) -> Any:
        previous = self._lend()
        try:
            return super().fetchone()
        finally:
            self.driver.deadline = previous

    def fetchmany(self, size: int | None = None) -> Any:
        previous = self._lend()
        try:
            return super().fetchmany(size)
        finally:
            self.driver.deadline = previous

    def fetchall(self) -> Any:
        previous = self._lend()
        try:
            return super().fetchall()
        finally:
            self.driver.deadline = previous


#: How much longer than the commit's own wait a replay at commit may run: the caller's
#: wait ends first, always with ``CommitTimeout`` (its outcome unknown, the connection
#: discarded), and the replay in the commit's thread ends just after.
COMMIT_REPLAY_GRACE = 0.5


def commit_deadline(driver: Any, seconds: float | None) -> None:
    """The replays of the commit about to run on ``driver`` end within ``seconds`` (and
    :data:`COMMIT_REPLAY_GRACE`; None: the commit is over, or has no deadline)."""
    if isinstance(driver, ShardedConnection):
        driver.deadline = (
            None
            if seconds is None
            else StatementDeadline(Deadline.after(seconds + COMMIT_REPLAY_GRACE, "commit_timeout"))
        )


#: ``connect()``'s own parameters; the rest are the connection's (``read_only``, ...)
_CONNECT_PARAMETERS = frozenset(inspect.signature(_stock_connect).parameters) - {"kwargs"}


def connect(*cargs: Any, **cparams: Any) -> ShardedConnection:
    """The DB-API's ``connect()``, giving a :class:`ShardedConnection`: the client,
    instance and database are made by the DB-API's own ``connect``, the connection
    from them as it makes its own."""
    stock = _stock_connect(*cargs, **cparams)
    variables = {k: v for k, v in cparams.items() if k not in _CONNECT_PARAMETERS}
    conn = ShardedConnection(
        stock.instance,
        stock.database,
        data_boost_enabled=stock.data_boost_enabled,
        auto_partition_mode=stock.auto_partition_mode,
        **variables,
    )
    if cparams.get("pool") is not None:
        conn._own_pool = False  # the caller's pool: closing the connection keeps it
    return conn
