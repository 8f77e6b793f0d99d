"""What a sharded read takes from around its statement, and how its statements are sent.

A merge's statements (the bound round, the rows statement) are the user's read: they run
through the caller's Session or Connection, on the bind the Session resolves for the
statement (``Session(binds=...)`` per mapper, base class or table), as a read of the
statement's mapped entity (``do_orm_execute`` listeners see them, with ``bind_mapper``),
with the statement's execution options (``EXECUTION_OPTIONS`` says which ones the bound
round leaves to the rows statement). Where the parameters may reach the backend's limit,
each statement is counted as it is handed to the DB-API (``sharded_orm.read.limits``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from sharded_orm.checks import check_seconds, shown
from sharded_orm.errors import ShardTypeError
from sharded_orm.read.limits import ParameterGuard
from sharded_orm.retry import Deadline

#: where the user's statement's execution options go: the rows statement is the user's
#: own and carries all of them; the bound round (a read of the same mapped table, of its
#: sort keys alone) carries those marked "every". A key not listed (an application's
#: own, as a ``do_orm_execute`` listener reads it: ``tenant="a"``) goes to every
#: statement: what it selects, the bound round must select too. "connection": SQLAlchemy
#: takes it only on a Connection (or Engine), never on a statement; every statement of a
#: read runs on that connection, with it. One line per option SQLAlchemy (Core, ORM) and
#: the Spanner dialect document for a SELECT.
EXECUTION_OPTIONS: dict[str, str] = {
    # Core (Connection.execution_options, Executable.execution_options)
    "schema_translate_map": "every",  # the tables each statement reads
    "compiled_cache": "connection",
    "logging_token": "every",
    "isolation_level": "connection",
    "no_parameters": "every",
    "driver_column_names": "every",  # (the bound round reads its rows by position)
    "preserve_rowcount": "every",
    "insertmanyvalues_page_size": "every",  # (DML only: nothing on a SELECT)
    "stream_results": "rows",  # how the user's rows arrive; the keys are read at once
    "max_row_buffer": "rows",
    "yield_per": "rows",
    # ORM (Session.execute)
    "populate_existing": "rows",  # refreshes loaded objects: the bound round loads none
    "autoflush": "every",  # both statements see the same flushed state
    "identity_token": "every",
    "synchronize_session": "every",  # (DML only)
    "dml_strategy": "every",  # (DML only)
    "is_delete_using": "every",  # (DML only)
    "is_update_from": "every",  # (DML only)
    "render_nulls": "every",  # (DML only)
    # the Spanner dialect
    "read_only": "every",
    "staleness": "every",
    "request_priority": "every",
    "request_tag": "every",
    "transaction_tag": "every",
    "ignore_transaction_warnings": "every",
    # sharded_orm: each statement gets what is left of a read's timeout=
    "timeout": "every",
}


def read_deadline(timeout: object) -> Deadline | None:
    """The one deadline of a read, made where ``merged()``/``page()`` take ``timeout=``
    (seconds, checked; None: no deadline of the read's own, each statement has the
    ``timeout`` execution option it would have had). Every statement of the read, and
    every restart of its result streams, runs within it."""
    if timeout is None:
        return None
    return Deadline.after(check_seconds(timeout, "timeout"), "timeout")


def bound_round_options(stmt: Any) -> dict[str, Any]:
    """The execution options of ``stmt`` its bound round carries (``EXECUTION_OPTIONS``)."""
    return {
        k: v for k, v in stmt.get_execution_options().items() if EXECUTION_OPTIONS.get(k) != "rows"
    }


def subject_of(stmt: Any) -> Any:
    """The mapped entity ``stmt`` reads first (SQLAlchemy's ``plugin_subject``: what
    ``do_orm_execute`` listeners see as ``bind_mapper`` and a Session picks its bind by),
    None for a Core statement."""
    attrs = stmt._propagate_attrs
    if attrs.get("compile_state_plugin") != "orm":
        return None
    return attrs.get("plugin_subject")


def bind_arguments_of(stmt: Any) -> dict[str, Any]:
    """The bind arguments a Session resolves ``stmt``'s bind with, as it does for the
    statement itself (``Session.get_bind(mapper=..., clause=...)``): per mapper, per
    base class, per table (``Session(binds=...)``), or the Session's one bind."""
    subject = subject_of(stmt)
    args: dict[str, Any] = {"clause": stmt}
    if subject is not None:
        args["mapper"] = subject.mapper
    return args


class ReadContext:
    """The caller's Session or Connection as the user's statement ``stmt`` meets it: its
    bind, dialect and Connection, and the statements of the read sent through it
    (``deadline``: the whole read's, ``read_deadline``; each statement is given what is
    left of it)."""

    def __init__(self, conn: Any, stmt: Any, deadline: Deadline | None = None) -> None:
        if not isinstance(conn, (Connection, Session)):
            raise ShardTypeError(
                f"merged()/page() read through a Connection or Session (or their async "
                f"forms, awaited), got {shown(conn)}"
            )
        self.conn = conn
        #: what a Session resolves the statement's bind with (its mapper, the statement)
        self.bind_arguments = bind_arguments_of(stmt)
        #: the Engine or Connection the statement runs on
        self.bind = conn.get_bind(**self.bind_arguments) if isinstance(conn, Session) else conn
        self.dialect = self.bind.dialect
        #: the mapped entity the statement reads: the bound round is a read of it too
        self.subject = subject_of(stmt)
        self.round_options = bound_round_options(stmt)
        self._connection: Connection | None = conn if isinstance(conn, Connection) else None
        #: the read's one deadline (None: each statement keeps its own ``timeout`` option)
        self.deadline = deadline

    @property
    def connection(self) -> Connection:
        """The Connection the statement runs on (a Session's: resolved as for the
        statement itself, ``bind_arguments``)."""
        if self._connection is None:
            session: Any = self.conn  # (a Connection is its own, from the start)
            self._connection = session.connection(bind_arguments=self.bind_arguments)
        return self._connection

    def mapped(self, *columns: Any) -> Any:
        """A SELECT of ``columns`` that is a read of the statement's mapped entity, as the
        statement is (an ORM statement: ``do_orm_execute`` listeners see it, with
        ``bind_mapper``, a Session binds it by the mapper), with the statement's
        execution options but those of its rows alone (``EXECUTION_OPTIONS``)."""
        shell = select(self.subject.entity) if self.subject is not None else select()
        q = shell.with_only_columns(*columns)
        return q.execution_options(**self.round_options) if self.round_options else q

    def execute(
        self, stmt: Any, limit: int | None = None, params: dict[str, Any] | None = None
    ) -> Any:
        """``stmt`` run as the user's statement runs: through the caller's Session (its
        ``do_orm_execute`` listeners, the bind it resolves for the statement) or
        Connection, with ``params``; with ``limit``, counted as it is sent
        (``Oversized`` over it)."""
        options: dict[str, Any] = {}
        if self.deadline is not None:
            # the time left, as the dialect's ``timeout`` option takes it (seconds): the
            # statement's deadline, its stream restarts included, ends with the read's. A
            # deadline already passed still goes to the client (the least call timeout),
            # which ends the statement at once with its usual error
            options["timeout"] = self.deadline.call_timeout()
        if limit is None:
            return self._send(stmt, options, params or None)
        with ParameterGuard(self.connection, limit):
            return self._send(stmt, options, params or None)

    def _send(self, stmt: Any, options: dict[str, Any], params: dict[str, Any] | None) -> Any:
        if isinstance(self.conn, Session):
            return self.conn.execute(
                stmt, params, execution_options=options, bind_arguments=self.bind_arguments
            )
        return self.conn.execute(stmt, params, execution_options=options)
