"""Deadlines and retries for the commits a migration makes itself.

google-cloud-spanner's DB-API ``Connection.commit()`` takes no timeout: its Commit RPC
waits up to the client's default hour on a silent server, and on ABORTED it replays the
transaction and commits again, without end while another writer keeps aborting it. It
offers no hook to bound either, so :func:`commit_within` runs it under the dialect's
commit deadline (``sharded_orm.spanner.commits``: a replay stops at it too) and the
migration waits for it at most ``seconds``: past that it fails with what is known and
how to go on. Any other error of the commit becomes a :class:`MigrationError` (one
``FAILED:`` line from the CLI, not a traceback).

:func:`run_alone` runs a small write (the revision in ``alembic_version``) in a
read-write transaction of its own, through the Spanner client: an ABORTED attempt (another
writer won; the emulator runs one read-write transaction at a time and aborts the others)
is retried with the contention waits of :class:`sharded_orm.retry.RetryPolicy` (tens of
milliseconds, growing to 2 s: an attempt is cheap, and a busy writer's next gap is a
fraction of a second away) until the same deadline, logged to ``alembic.sharded_orm`` at
the first abort and then at most every :data:`WAIT_LINE_EVERY` seconds.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event

from sharded_orm.errors import ShardConfigError
from sharded_orm.retry import DEFAULTS, RetryPolicy
from sharded_orm.spanner import mutations
from sharded_orm.spanner.commits import CommitTimeout
from sharded_orm.spanner.commits import commit_within as _bounded_commit
from sharded_orm.spanner.deadlines import finished_within

from .errors import MigrationError
from .steps import PROGRESS_LOGGER

#: ``alembic.config.Config.attributes`` key: the seconds a migration's own commit (before
#: a schema change, at its end, of its revision) may take (default ``DEFAULT_COMMIT_TIMEOUT``).
COMMIT_TIMEOUT_ATTRIBUTE = "sharded_orm.commit_timeout"
DEFAULT_COMMIT_TIMEOUT = DEFAULTS["commit"]

T = TypeVar("T")

#: seconds between two lines of a write retried on ABORTED (the first abort is logged)
WAIT_LINE_EVERY = 5.0
#: the waits between attempts of such a write: the contention waits of every retry
_WAITS = RetryPolicy()

_VERSION_UPDATE = re.compile(
    r"SET\s+\S*version_num\S*\s*=\s*'([^']+)'.*WHERE.*version_num\S*\s*=\s*'([^']+)'",
    re.IGNORECASE | re.DOTALL,
)
_VERSION_INSERT = re.compile(r"VALUES\s*\(\s*'([^']+)'\s*\)", re.IGNORECASE)
_VERSION_DELETE = re.compile(r"WHERE.*version_num\S*\s*=\s*'([^']+)'", re.IGNORECASE | re.DOTALL)
#: statements that only read (a statement hint may lead): they leave nothing to commit
_READ = re.compile(r"^\s*(?:@\{[^}]*\}\s*)?\(*\s*(?:SELECT|WITH)\b", re.IGNORECASE)
_log = logging.getLogger(PROGRESS_LOGGER)


def commit_timeout(attributes: dict[str, Any], dialect: Any = None) -> float:
    """The seconds a migration's own commit may take: ``config.attributes``' setting, else
    the engine's commit deadline (``sqlalchemy.commit_timeout`` in alembic.ini, on the
    library's dialect), else ``DEFAULT_COMMIT_TIMEOUT``. One deadline for a commit."""
    value = attributes.get(COMMIT_TIMEOUT_ATTRIBUTE)
    if value is None:
        engine_limit: Any = getattr(dialect, "commit_timeout", None)
        ok = isinstance(engine_limit, (int, float)) and not isinstance(engine_limit, bool)
        value = engine_limit if ok and engine_limit > 0 else DEFAULT_COMMIT_TIMEOUT
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
        raise MigrationError(
            f"config.attributes[{COMMIT_TIMEOUT_ATTRIBUTE!r}] must be a positive number of "
            f"seconds, got {value!r}"
        )
    return float(value)


def one_line(exc: BaseException) -> str:
    """``exc`` as ``Type: message`` on one line (a ``FAILED:`` line stays one line)."""
    text = " ".join(str(exc).split()) or repr(exc)
    return f"{type(exc).__name__}: {text[:500]}"


def is_aborted(exc: BaseException) -> bool:
    """True when Spanner aborted the transaction (ABORTED, anywhere in the error chain):
    a new attempt may succeed. Nothing else is retried."""
    return mutations.is_aborted(exc)


def commit_within(
    commit: Callable[[], None],
    seconds: float,
    driver: Any = None,
    *,
    when: str = "before its next schema change",
) -> None:
    """``commit()`` (the DB-API ``driver``'s), or :class:`MigrationError` if it has not
    returned within ``seconds`` (its outcome then unknown: a replay stops at the
    deadline, the connection is discarded) or failed."""
    try:
        _bounded_commit(commit, seconds, driver)
    except MigrationError:
        raise
    except CommitTimeout as exc:
        raise MigrationError(
            f"The commit of this migration's statements {when} did not finish within "
            f"{seconds:g} s (the server is silent, or another writer keeps aborting the "
            "transaction); whether it was applied is unknown, and nothing after it was "
            "sent. Check the database is reachable, then run `alembic upgrade` again: the "
            "revision is not recorded, so it runs again (a backfill resumes where it "
            f"stopped). config.attributes[{COMMIT_TIMEOUT_ATTRIBUTE!r}] sets this limit."
        ) from exc
    except Exception as exc:
        why = (
            "another read-write transaction kept aborting it (the app's writers; the "
            "emulator runs one at a time) and the Spanner DB-API's replay gave up"
            if is_aborted(exc) or "aborted" in str(exc).lower()
            else "Spanner refused it"
        )
        raise MigrationError(
            f"The commit of this migration's statements {when} failed: {why} "
            f"({one_line(exc)}). Nothing of this transaction was applied and the revision "
            "is not recorded. Run `alembic upgrade` again: the revision runs again (a "
            "backfill resumes where it stopped), once the cause is gone."
        ) from exc


def run_alone(
    database: Any,
    work: Callable[[Any], T],
    *,
    seconds: float,
    what: str,
    advice: str,
) -> T:
    """``work(transaction)`` in a read-write transaction of its own on the client
    ``database``, committed; returns what ``work`` returned.

    ABORTED (:func:`is_aborted`) is retried with contention waits until ``seconds``, logged
    at the first abort, then every ``WAIT_LINE_EVERY`` s, and once it got through;
    then :class:`MigrationError` says so (``what``: the write, ``advice``: how to go on).
    An attempt still running at ``seconds`` is left to its thread and reported as of
    unknown outcome. Every other error is raised as it is.
    """
    start = time.monotonic()
    end = start + seconds
    aborts = 0
    said = -math.inf  # when the last line was logged
    while True:
        result: list[T] = []
        begun: list[Any] = []

        def tracked(transaction: Any, begun: list[Any] = begun) -> T:
            begun.append(transaction)
            return work(transaction)

        def attempt(result: list[T] = result) -> None:
            # timeout_secs=0: one attempt; the client's own retry (2**n s waits) is ours
            result.append(mutations.transaction_once(database, tracked))

        try:
            done = finished_within(attempt, max(0.001, end - time.monotonic()))
        except Exception as exc:
            if not is_aborted(exc):
                raise
            # ended on our side too: an ABORTED that did not come from the server (a proxy,
            # a client-side abort) would otherwise leave its locks until the server's idle
            # timeout, and the emulator aborts every transaction after it meanwhile
            finished_within(functools.partial(_roll_back, begun), 5.0)
            now = time.monotonic()
            # one last try before the end
            delay = min(_WAITS.delay(aborts), end - now - 0.05)
            aborts += 1
            if delay <= 0:
                raise MigrationError(
                    f"{what} was aborted {aborts} time(s) in {now - start:.0f} s "
                    f"({one_line(exc)}): another read-write transaction kept conflicting with "
                    "it (the app's writers; the emulator runs one at a time and aborts the "
                    f"others), and the next retry would pass the {seconds:g} s limit "
                    f"(config.attributes[{COMMIT_TIMEOUT_ATTRIBUTE!r}]). It was not applied. "
                    f"{advice}"
                ) from exc
            if now - said >= WAIT_LINE_EVERY:  # a line per wait made a loop of lines
                said = now
                _log.info(
                    "%s aborted by a concurrent transaction (%d time(s) so far); retrying "
                    "until it gets through (waited %.0f s of %g s)",
                    what, aborts, now - start, seconds,
                )  # fmt: skip
            time.sleep(delay)
            continue
        if not done:
            raise MigrationError(
                f"{what} did not finish within {seconds:g} s (the server is silent, or "
                "another writer keeps aborting it); whether it was applied is unknown. "
                f"Check the database is reachable, then: {advice} "
                f"config.attributes[{COMMIT_TIMEOUT_ATTRIBUTE!r}] sets this limit."
            )
        if aborts:
            _log.info(
                "%s done, after %d aborted attempt(s) in %.1f s", what, aborts,
                time.monotonic() - start,
            )  # fmt: skip
        return result[0]


def _roll_back(transactions: list[Any]) -> None:
    for transaction in transactions:
        mutations.roll_back(transaction)


def write_revision(
    database: Any, table: str, column: str, version_table: str, from_: str | None,
    to_: str | None, *, seconds: float,
) -> int:  # fmt: skip
    """Replace revision ``from_`` by ``to_`` in the version table (``table``, ``column``:
    quoted names) in one transaction of its own (:func:`run_alone`): DELETE and INSERT
    commit together, an abort is retried. Alembic's check that exactly one row was
    replaced is made before anything commits. Returns the rows replaced (1)."""

    def write(txn: Any) -> int:
        if from_ is not None:
            found = mutations.update_with_strings(
                txn, f"DELETE FROM {table} WHERE {column} = @v", {"v": from_}
            )
            if found != 1:  # Alembic's own check (a CommandError), before anything commits
                change = f"updating {from_!r} to {to_!r}" if to_ else f"deleting {from_!r}"
                raise MigrationError(
                    f"Online migration expected to match one row when {change} in "
                    f"{version_table!r}; {found} found"
                )
        if to_ is not None:
            mutations.update_with_strings(
                txn, f"INSERT INTO {table} ({column}) VALUES (@v)", {"v": to_}
            )
        return 1

    if to_ is not None:
        what = f"The write of revision {to_} to {version_table}"
    else:
        what = f"The removal of revision {from_} from {version_table}"
    before = f"revision {from_}" if from_ else "no revision"
    advice = (
        f"The migration's work before it is committed; {version_table} still records "
        f"{before}. Check with `alembic current`, then record the revision without "
        f"running the migration again: `alembic stamp {to_ or 'base'}` (or run the "
        "command again, which repeats the migration; every step of it is safe to repeat)."
    )
    return run_alone(database, write, seconds=seconds, what=what, advice=advice)


def version_change(construct: Any, sql: str) -> tuple[str | None, str | None]:
    """(revision removed, revision added) by Alembic's write of its version table
    (``construct``, compiled as ``sql``)."""
    if isinstance(construct, sa.Update):
        m = _VERSION_UPDATE.search(sql)
        if m is not None:
            return m.group(2), m.group(1)
    elif isinstance(construct, sa.Insert):
        m = _VERSION_INSERT.search(sql)
        if m is not None:
            return None, m.group(1)
    else:
        m = _VERSION_DELETE.search(sql)
        if m is not None:
            return m.group(1), None
    # pragma: no cover - Alembic changed how it writes the version
    raise ShardConfigError(f"unexpected alembic_version write: {sql}")


def watch_writes(connection: sa.Connection, impl: Any) -> None:
    """Keep ``impl._writes_pending`` (SQLAlchemy's events: every statement of the
    connection that may write, the impl's and the migration's own, and the ends of its
    transactions)."""
    ref = weakref.ref(impl)

    def executed(conn: sa.Connection, cursor: Any, statement: str, *rest: Any) -> None:
        me = ref()
        if me is not None and not _READ.match(statement):
            me._writes_pending = True

    def ended(conn: sa.Connection) -> None:
        me = ref()
        if me is not None:
            me._writes_pending = False

    event.listen(connection, "before_cursor_execute", executed)
    event.listen(connection, "commit", ended)
    event.listen(connection, "rollback", ended)


def end_reads(driver: Any, seconds: float) -> None:
    """Roll back the DB-API ``driver``'s transaction, which only read (Alembic's read of
    the version table among them): it must hold no lock the revision's write waits on."""
    try:
        finished_within(driver.rollback, seconds)
    except Exception as exc:
        raise MigrationError(
            "Ending the migration's transaction (it only read) before writing its revision "
            f"failed: {one_line(exc)}. Check the database is reachable, then run `alembic "
            "upgrade` again."
        ) from exc


def write_revision_on(
    connection: Any, table: Any, from_: str | None, to_: str | None, *,
    seconds: float,
) -> int:  # fmt: skip
    """:func:`write_revision` for the migration's ``connection``: its transaction, which
    holds no write, ended first (:func:`end_reads`)."""
    driver: Any = connection.connection.driver_connection
    if not driver.autocommit and connection.in_transaction():
        end_reads(driver, seconds)
    prep = connection.dialect.identifier_preparer
    return write_revision(
        driver.database, prep.format_table(table), prep.quote("version_num"), table.name,
        from_, to_, seconds=seconds,
    )  # fmt: skip


def revision_alone(connection: Any, writes_pending: bool) -> bool:
    """True when the revision is written in a transaction of its own: the driver's
    transaction holds no write (the migration's work was committed before a schema change
    or a step, or it only read), or each statement is its own (AUTOCOMMIT)."""
    driver: Any = connection.connection.driver_connection
    if driver is None or getattr(driver, "database", None) is None:
        return False
    return bool(driver.autocommit) or not writes_pending
