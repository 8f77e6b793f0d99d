"""A migration's data statement that Spanner aborted for good: one ``FAILED:`` line.

``op.execute(...)``, ``op.get_bind().execute(...)`` and ``op.bulk_insert`` run on the
migration's connection. When Spanner aborts their transaction (another read-write
transaction won: the app's writers; the emulator runs one at a time and aborts the
others), the Spanner DB-API replays it, and when it gives up the error reached the user
as a raw traceback: a bare ``google.api_core.exceptions.Aborted`` (AUTOCOMMIT on
sqlalchemy-spanner's dialect), the DB-API's ``RetryAborted`` ("The transaction was
aborted and could not be retried ...", sharded-orm's ``ReplayTimeout`` among them), or
an ``OperationalError`` raised from an ``Aborted``. :func:`report_aborted_statements`
turns those into a :class:`~alembic_ext.errors.MigrationError` (Alembic's CLI prints one
``FAILED:`` line) saying what failed, what was applied and what to do, chained to the
original error. It is SQLAlchemy's ``handle_error`` event, which lives on the dialect:
the listener acts only for the connections given here (the impl's), and every other
error (a syntax error, a duplicate key) keeps its own type and message.
"""

from __future__ import annotations

import contextlib
import weakref

from sqlalchemy import event
from sqlalchemy.engine import Connection, ExceptionContext

from sharded_orm.retry import error_chain

from .commit import is_aborted, one_line
from .errors import MigrationError

#: the connections migrations run on (the impl's), while they live
_MIGRATING: weakref.WeakSet[Connection] = weakref.WeakSet()
#: the text of the DB-API's ``RetryAborted`` (and of the emulator's aborts)
_ABORTED_TEXT = ("transaction was aborted", "aborted due to active transaction")
#: errors that say the statement itself is wrong, whatever their text quotes of it
_PERMANENT = frozenset({"ProgrammingError", "IntegrityError", "InvalidArgument", "DataError"})


def report_aborted_statements(connection: Connection) -> None:
    """Statements of ``connection`` (a migration's) whose transaction Spanner aborted, the
    DB-API's retries spent, fail as one :class:`MigrationError` (see the module)."""
    _MIGRATING.add(connection)
    dialect = connection.dialect
    if not event.contains(dialect, "handle_error", _aborted_statement):
        event.listen(dialect, "handle_error", _aborted_statement)


def gave_up_aborted(exc: BaseException) -> bool:
    """True when ``exc`` says Spanner aborted the transaction and the DB-API's retries of
    it gave up: an ``Aborted`` anywhere in its chain, the DB-API's ``RetryAborted``, or
    their text."""
    if is_aborted(exc):
        return True
    chain = list(error_chain(exc))
    names = [{c.__name__ for c in type(e).__mro__} for e in chain]
    if any("RetryAborted" in n for n in names):
        return True
    if any(n & _PERMANENT for n in names):
        return False
    return any(text in str(e).lower() for e in chain for text in _ABORTED_TEXT)


def _autocommit(connection: Connection) -> bool:
    with contextlib.suppress(Exception):  # invalidated, closed: say what a transaction does
        return bool(getattr(connection.connection.driver_connection, "autocommit", False))
    return False


def _statement(statement: str | None) -> str:
    if not statement:
        return "A statement of the migration (or the commit of its transaction)"
    text = " ".join(statement.split())
    return f"The migration's statement `{text[:200]}{'...' if len(text) > 200 else ''}`"


def aborted_message(statement: str | None, error: BaseException, autocommit: bool) -> str:
    """The one line a migration's aborted ``statement`` fails with."""
    if autocommit:
        applied = (
            "It was not applied; the migration's statements before it were, each committed "
            "on its own (AUTOCOMMIT)."
        )
    else:
        applied = (
            "Nothing of its transaction was applied: neither it nor the migration's "
            "statements since its last schema change or step (those before it were "
            "committed then)."
        )
    return (
        f"{_statement(statement)} was aborted by Spanner and the Spanner DB-API's retries "
        f"gave up ({one_line(error)[:300]}): another read-write transaction kept "
        "conflicting with it (the app's writers; the emulator runs one at a time and aborts "
        f"the others). {applied} The revision is not recorded. Check with `alembic "
        "current`, then run `alembic upgrade` again when fewer writers run: the revision "
        "runs again from its start, so its data statements must be safe to repeat."
    )


def _aborted_statement(context: ExceptionContext) -> BaseException | None:
    """SQLAlchemy's ``handle_error``: the error to raise instead (SQLAlchemy raises it
    ``from`` the original), or None to leave it as it is."""
    connection = context.connection
    if connection is None or connection not in _MIGRATING:
        return None
    original = context.original_exception
    if isinstance(original, MigrationError) or not gave_up_aborted(original):
        return None
    return MigrationError(aborted_message(context.statement, original, _autocommit(connection)))
