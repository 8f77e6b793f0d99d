"""Spanner calls sent by the library itself: bulk_load's mutations, the id pools' blocks,
a migration's revision written in a transaction of its own.

``sharded_orm.load.bulk`` and ``sharded_orm.ids.sequences`` import this module only when
the bind is Spanner, because the database handle and the stand-in dialect come from
google-cloud-spanner. :class:`RawSpanner` sends every call with our timeout and with the
client's own retries off, so :mod:`sharded_orm.retry` alone decides what is retried.

Mutations bypass SQLAlchemy, so nothing converts values on the way: this module applies
each column type's bind processor for the Spanner dialect, as a DML insert would: a
``Uuid`` becomes the same 32-hex string the ORM writes, an ``Enum`` member its name, a
JSON value the client's ``JsonObject``, a ``TypeDecorator`` runs ``process_bind_param``,
and BYTES are base64-encoded by the DB-API's ``Binary`` (the mutation encoder expects
them encoded; raw bytes that happen to be valid UTF-8 would be stored decoded: garbage).
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import sqlalchemy as sa

from sharded_orm.retry import Deadline, TransientError, error_chain
from sharded_orm.spanner.databases import known_database, note_database, remember_database

T = TypeVar("T")


def database_of(bind: Any) -> Any:
    """The google-cloud-spanner ``Database`` behind an Engine or Connection (or ``bind``
    itself when it already is one), seen through
    :class:`~sharded_orm.spanner.streams.ReadBoundedDatabase`: a snapshot's ``read`` or
    ``execute_sql`` given ``timeout=<seconds>`` ends within them, the client's restarts of
    a cut stream included.

    An Engine that has connected before (:func:`remember_database`) answers from memory:
    no connection is checked out, so a caller holding every pooled connection (a flush
    waiting for ids) never waits for one; only an engine's very first call connects."""
    from sharded_orm.spanner.streams import ReadBoundedDatabase

    if isinstance(bind, ReadBoundedDatabase):
        return bind
    if not isinstance(bind, (sa.Engine, sa.Connection)):
        return ReadBoundedDatabase(bind)
    known = known_database(bind.dialect)
    if known is not None:
        return ReadBoundedDatabase(known)
    if isinstance(bind, sa.Engine):
        remember_database(bind)  # an engine made on the stock dialect class
    raw: Any = bind.raw_connection() if isinstance(bind, sa.Engine) else bind.connection
    try:
        # spanner_dbapi.Connection.database
        database = raw.driver_connection.database
        note_database(bind.dialect, database)
        return ReadBoundedDatabase(database)
    finally:
        if isinstance(bind, sa.Engine):
            raw.close()


def dialect_of(bind: Any) -> sa.Dialect:
    """The bind's dialect, or sharded-orm's Spanner dialect for a bare ``Database``."""
    dialect = getattr(bind, "dialect", None)
    if isinstance(dialect, sa.Dialect):
        return dialect
    from sharded_orm.spanner.dialect import SpannerDialect

    # with its DB-API, whose Binary base64-encodes BYTES as the mutation encoder wants
    return SpannerDialect(dbapi=SpannerDialect.import_dbapi())


def bind_processors(
    columns: Sequence[sa.Column[Any]], dialect: sa.Dialect
) -> list[Callable[[Any], Any] | None]:
    """Each column's bind processor on ``dialect`` (None where values pass as they are)."""
    return [c.type.dialect_impl(dialect).bind_processor(dialect) for c in columns]


def key_order(value: Any) -> Any:
    """A bound key value as Spanner orders it: BYTES by their decoded bytes."""
    if isinstance(value, bytes):
        return base64.b64decode(value)
    return value


def is_aborted(exc: BaseException) -> bool:
    """True when Spanner aborted the transaction (ABORTED, anywhere in the error chain)."""
    from google.api_core import exceptions as api

    return any(isinstance(e, api.Aborted) for e in error_chain(exc))


def transaction_once(database: Any, work: Callable[[Any], T]) -> T:
    """``work(transaction)`` in one read-write transaction of the client's ``database``,
    committed: one attempt (the client's own replays of ABORTED, waits of ``2**n`` s, are
    off: an ABORTED is raised for the caller's policy). ``work`` writes with
    :func:`update_with_strings`. Bound it with ``spanner.deadlines.finished_within``: the
    client's commit inside takes no timeout (docs/upstream.md, U10)."""
    result: T = database.run_in_transaction(work, timeout_secs=0)
    return result


def update_with_strings(transaction: Any, sql: str, params: dict[str, str]) -> int:
    """Run DML ``sql`` in a :func:`transaction_once` transaction, each parameter a STRING;
    the rows it changed."""
    from google.cloud.spanner_v1 import param_types

    types = {name: param_types.STRING for name in params}
    return int(transaction.execute_update(sql, params=params, param_types=types))


def roll_back(transaction: Any) -> None:
    """End a :func:`transaction_once` transaction on the server (best effort: one already
    gone there has nothing to end)."""
    with suppress(Exception):
        transaction.rollback()


class SessionLost(TransientError):
    """The server forgot our session (it expired, or the server restarted): a new session
    and a new attempt can succeed."""


class RawSpanner:
    """google-cloud-spanner's Spanner API calls with *our* timeout and no client retries.

    Why: the client retries a commit's UNAVAILABLE for up to an hour (its commit deadline
    is 3,600 s) and the DB-API replays ABORTED transactions internally, so retries of our
    own nest under the client's and a dead server is noticed after an hour. Every call
    here passes ``retry=None`` and the caller's ``timeout``: :mod:`sharded_orm.retry`
    decides alone. One session per thread (or one in all, ``per_thread=False``), created on
    first use, deleted by :meth:`close`.
    """

    def __init__(self, database: Any, *, per_thread: bool = True) -> None:
        self.database = database
        self.api = database.spanner_api
        self.metadata = [
            ("google-cloud-resource-prefix", database.name),
            ("x-goog-spanner-route-to-leader", "true"),
        ]
        # a session per thread for parallel commits; one for all when calls are serial
        # (an id pool reserves under its lock), so no thread leaves a session behind
        self._local: Any = threading.local() if per_thread else _Slot()
        self._lock = threading.Lock()
        self._sessions: set[str] = set()

    def _session(self, deadline: Deadline) -> str:
        name: str | None = getattr(self._local, "session", None)
        if name is None:
            from google.cloud.spanner_v1 import CreateSessionRequest

            request = CreateSessionRequest(database=self.database.name)
            made = self.api.create_session(
                request=request,
                metadata=self.metadata,
                timeout=deadline.call_timeout(),
                retry=None,
            )
            name = str(made.name)
            self._local.session = name
            with self._lock:
                self._sessions.add(name)
        return name

    @contextmanager
    def _session_checked(self) -> Iterator[None]:
        """A 'Session not found' becomes :class:`SessionLost` (and the session is forgotten)."""
        try:
            yield
        except Exception as exc:
            if "session not found" in str(exc).lower():
                with self._lock:
                    self._sessions.discard(getattr(self._local, "session", None) or "")
                self._local.session = None
                raise SessionLost(f"the server lost our session: {exc}") from exc
            raise

    def commit_mutations(
        self,
        table: str,
        columns: Sequence[str],
        values: list[Any],
        mode: str,
        timeout: float | Deadline,
        also: Sequence[tuple[str, Sequence[str], list[Any]]] = (),
    ) -> None:
        """One single-use commit writing ``values`` with ``insert`` or ``insert_or_update``,
        and ``also`` (table, columns, values) with ``insert_or_update`` in the same commit."""
        writes = [(mode, table, columns, values)]
        writes += [("insert_or_update", t, c, v) for t, c, v in also]
        self.commit_writes(writes, timeout)

    def commit_writes(
        self,
        writes: Sequence[tuple[str, str, Sequence[str], list[Any]]],
        timeout: float | Deadline,
    ) -> None:
        """One single-use commit of ``writes``, each (op, table, columns, rows) with op one
        of the client's ``Batch`` methods: insert, insert_or_update, replace, update."""
        from google.cloud.spanner_v1 import CommitRequest, TransactionOptions
        from google.cloud.spanner_v1.batch import Batch

        # the client's Batch encodes the values; its commit (with the client's hour-long
        # retries) is never called: we send its mutations ourselves
        collector = Batch(self.database.session())  # type: ignore[no-untyped-call]
        for op, table, columns, values in writes:
            getattr(collector, op)(table, columns=list(columns), values=values)
        deadline = _deadline(timeout)
        with self._session_checked():
            request = CommitRequest(
                session=self._session(deadline),
                mutations=collector._mutations,
                single_use_transaction=TransactionOptions(
                    read_write=TransactionOptions.ReadWrite()
                ),
            )
            self.api.commit(
                request=request,
                metadata=self.metadata,
                timeout=deadline.call_timeout(),
                retry=None,
            )

    def read_write(self, work: Callable[[RawTransaction], T], timeout: float | Deadline) -> T:
        """``work(txn)`` in one read-write transaction, committed; rolled back on failure.

        Nothing is replayed here: an ABORTED commit raises, and the caller's policy runs
        ``work`` again from the start (reading fresh values)."""
        from google.cloud.spanner_v1 import CommitRequest

        deadline = _deadline(timeout)
        with self._session_checked():
            session = self._session(deadline)
            txn = RawTransaction(self, session, deadline)  # begun inline by its first query
            try:
                result = work(txn)
                if txn.id is None:  # no statement ran: nothing to commit
                    return result
                request = CommitRequest(session=session, transaction_id=txn.id)
                self.api.commit(
                    request=request,
                    metadata=self.metadata,
                    timeout=deadline.call_timeout(),
                    retry=None,
                )
            except BaseException:
                if txn.id is not None:
                    with suppress(Exception):
                        self.api.rollback(
                            session=session,
                            transaction_id=txn.id,
                            metadata=self.metadata,
                            timeout=min(2.0, deadline.call_timeout() + 0.5),
                            retry=None,
                        )
                raise
            return result

    def close(self, timeout: float = 2.0) -> None:
        """Delete our sessions within ``timeout`` seconds in all (best effort: a silent
        server keeps them until they expire; the caller's deadline comes first)."""
        with self._lock:
            names, self._sessions = self._sessions, set()
        deadline = Deadline.after(timeout)
        for name in names:
            left = deadline.cap(2.0)
            if left <= 0.001:
                return
            with suppress(Exception):
                self.api.delete_session(name=name, metadata=self.metadata, timeout=left, retry=None)


class RawTransaction:
    """Statements inside :meth:`RawSpanner.read_write` (parameters: INT64 and STRING)."""

    def __init__(self, raw: RawSpanner, session: str, deadline: Deadline) -> None:
        self.raw, self.session, self.deadline = raw, session, deadline
        self.id: bytes | None = None  # set by the first statement, which begins it
        self.seqno = 0

    def _execute(self, sql: str, params: dict[str, int | str]) -> Any:
        from google.cloud.spanner_v1 import (
            ExecuteSqlRequest,
            TransactionOptions,
            TransactionSelector,
            Type,
            TypeCode,
        )
        from google.protobuf import struct_pb2

        fields, types = {}, {}
        for key, v in params.items():
            code = TypeCode.STRING if isinstance(v, str) else TypeCode.INT64
            fields[key] = struct_pb2.Value(string_value=str(v))
            types[key] = Type(code=code)
        self.seqno += 1
        request = ExecuteSqlRequest(
            session=self.session,
            transaction=(
                TransactionSelector(id=self.id)
                if self.id is not None
                else TransactionSelector(
                    begin=TransactionOptions(read_write=TransactionOptions.ReadWrite())
                )
            ),
            sql=sql,
            params=struct_pb2.Struct(fields=fields),
            param_types=types,
            seqno=self.seqno,
        )
        result = self.raw.api.execute_sql(
            request=request,
            metadata=self.raw.metadata,
            timeout=self.deadline.call_timeout(),
            retry=None,
        )
        if self.id is None:
            self.id = bytes(result.metadata.transaction.id)
        return result

    def query(self, sql: str, params: dict[str, int | str]) -> list[list[Any]]:
        """Rows of a query, each cell as sent (INT64 as a decimal string, NULL as None)."""
        result = self._execute(sql, params)
        return [[_cell(v) for v in row] for row in result.rows]

    def update(self, sql: str, params: dict[str, int | str]) -> int:
        """Run a DML statement; the number of rows it changed."""
        return int(self._execute(sql, params).stats.row_count_exact)


class _Slot:
    """The shared stand-in for ``threading.local``: one ``session`` attribute for all."""

    session: str | None = None


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    kind = value.WhichOneof("kind")
    return None if kind == "null_value" else getattr(value, kind)


def _deadline(timeout: float | Deadline) -> Deadline:
    """The caller's deadline, or one ``timeout`` seconds from now."""
    return timeout if isinstance(timeout, Deadline) else Deadline.after(timeout)
