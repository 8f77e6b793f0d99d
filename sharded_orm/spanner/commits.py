"""Every commit SQLAlchemy makes on our dialect ends within ``commit_timeout`` seconds.

The Spanner DB-API's ``Connection.commit()`` takes no timeout: its Commit RPC waits up to
the client's default hour (retrying UNAVAILABLE for an hour), and on ABORTED it replays
the transaction's statements and commits again, without end while another writer keeps
aborting it. Neither it nor ``Transaction.commit`` accepts a ``timeout`` or ``retry``, so
there is no per-call seam (reads have one: :mod:`.deadlines`). The commit therefore runs
in a daemon thread and the caller waits for it at most ``commit_timeout`` seconds
(``create_engine(url, commit_timeout=...)``, ``sqlalchemy.commit_timeout`` in
alembic.ini; ``None``: the client's own behaviour). Past it the commit's outcome is
unknown: :class:`CommitTimeout` says so, SQLAlchemy invalidates the connection (the
dialect reports it as a disconnect) and the pool never hands it out again; it is marked
closed, so a replay of an aborted transaction stops at its next statement, and closing
it skips the DB-API's rollback, which would wait on the same silent server.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from google.cloud.spanner_dbapi import exceptions as _dbapi

from sharded_orm.checks import is_seconds
from sharded_orm.retry import DEFAULTS, Deadline
from sharded_orm.spanner.deadlines import finished_within

__all__ = [
    "COMMIT_TIMEOUT_ARGUMENT",
    "DEFAULT_COMMIT_TIMEOUT",
    "CommitTimeout",
    "check_commit_timeout",
    "commit_within",
    "is_abandoned",
]

#: ``create_engine`` keyword (and ``sqlalchemy.`` option of ``engine_from_config``).
COMMIT_TIMEOUT_ARGUMENT = "commit_timeout"
#: Seconds a commit may take when ``commit_timeout`` is not given (the ``commit`` entry
#: of :data:`sharded_orm.retry.DEFAULTS`).
DEFAULT_COMMIT_TIMEOUT = DEFAULTS["commit"]

# DB-API connections whose commit was abandoned, still running in its thread
_abandoned: weakref.WeakSet[Any] = weakref.WeakSet()


class CommitTimeout(_dbapi.OperationalError):  # type: ignore[misc]
    """The commit did not finish in time: whether it was applied is unknown."""


def check_commit_timeout(value: Any) -> float | None:
    """``value`` as seconds (a positive number, or None for the client's own timeout)."""
    if value is None:
        return None
    if not is_seconds(value):
        raise _dbapi.ProgrammingError(
            f"{COMMIT_TIMEOUT_ARGUMENT}={value!r}: give the seconds a commit may take, a "
            "number > 0 (or None for the Spanner client's own timeout of an hour)"
        )
    return float(value)


def is_abandoned(dbapi_connection: Any) -> bool:
    """True for a DB-API connection whose commit is still running after its deadline."""
    return dbapi_connection in _abandoned


def commit_within(commit: Callable[[], None], seconds: float | None, driver: Any) -> None:
    """``commit()``, or :class:`CommitTimeout` if it has not returned within ``seconds``
    (``driver``, the DB-API connection, is then marked abandoned)."""
    if seconds is None:
        commit()
        return
    # loaded with the first commit, not with the dialect (issue 45); a commit has a
    # connection, so the module is in memory by then anyway
    from sharded_orm.spanner.connection import commit_deadline

    # a replay of the transaction, if Spanner aborts it at commit, ends by then too
    commit_deadline(driver, seconds)
    deadline = Deadline.after(seconds, COMMIT_TIMEOUT_ARGUMENT)
    try:
        done = finished_within(commit, deadline)
    except BaseException:
        commit_deadline(driver, None)
        raise
    if done:
        commit_deadline(driver, None)
        return
    if driver is not None:
        _abandoned.add(driver)
        # marked closed (without the DB-API's rollback): a replay of an aborted
        # transaction, under way in the commit's thread, fails at its next statement
        # (and ends at the commit's deadline anyway)
        driver.is_closed = True
    raise CommitTimeout(
        f"the commit did not finish within {seconds:g} s (the server is silent, or "
        "another writer keeps aborting the transaction, which the Spanner DB-API "
        "replays); its outcome is unknown: a commit request already sent may still be "
        "applied, no new replay starts. The connection was discarded. Check whether "
        "the transaction's changes are there before making them again (or make the "
        "write idempotent); raise create_engine(url, "
        f"{COMMIT_TIMEOUT_ARGUMENT}=<seconds>) if commits need longer."
    )
