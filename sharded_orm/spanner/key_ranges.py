"""Key ranges read, and rewritten, on a session of our own: the client backfill's calls
(:mod:`alembic_ext.backfill_io`) and ``copy_table``'s reads (:mod:`sharded_orm.load.copy`).

A backfill walks a table in its stored order (DESC key parts included) with a key cursor:
each batch reads the next rows through the Read API's ``KeyRange`` (one seek, never a
rescan) and commits the changed ones as one UPDATE mutation, in one read-write
transaction. The client's ``Database`` offers no read-write transaction whose RPCs take
our timeout (``run_in_transaction`` replays ABORTED itself and its commit waits up to an
hour on a silent server), so :class:`KeyRangeSession` sends the Spanner stub's RPCs
itself: every one under the caller's :class:`~sharded_orm.retry.Deadline` and with
``retry=None``; :mod:`sharded_orm.retry` decides what is retried.

Values cross this module as the client hands them out and takes them in a key or a
mutation (BYTES base64-encoded): the caller converts them to and from column values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from typing import Any

from sharded_orm.retry import Deadline
from sharded_orm.spanner.mutations import database_of
from sharded_orm.spanner.pdml import list_value

__all__ = ["KeyRangeSession"]

#: the most a best-effort cleanup waits (a rollback after a failed batch, deleting the
#: session): a transaction or session the server never hears of again ends by itself
CLEANUP_SECONDS = 2.0


class KeyRangeSession:
    """One session of the database behind ``bind`` (an Engine or Connection), created at
    its first call and deleted by :meth:`close`; :meth:`forget` drops it after a failure
    that may have lost it (a dead server, an expired session), so the next call starts a
    new one."""

    def __init__(self, bind: Any) -> None:
        self._database: Any = database_of(bind)
        self._api: Any = self._database.spanner_api
        self._metadata = [
            ("google-cloud-resource-prefix", self._database.name),
            ("x-goog-spanner-route-to-leader", "true"),
        ]
        self._session: str | None = None

    def _name(self, deadline: Deadline) -> str:
        if self._session is None:
            from google.cloud.spanner_v1 import CreateSessionRequest

            made = self._api.create_session(
                request=CreateSessionRequest(database=self._database.name),
                metadata=self._metadata, timeout=deadline.call_timeout(), retry=None,
            )  # fmt: skip
            self._session = str(made.name)
        return self._session

    def forget(self) -> None:
        """Start a new session at the next call (the server may have lost this one)."""
        self._session = None

    def query(self, sql: str, deadline: Deadline) -> list[list[Any]]:
        """The rows of ``sql``, a strong single-use read-only query, read whole within
        ``deadline``."""
        from google.cloud.spanner_v1 import ExecuteSqlRequest
        from google.cloud.spanner_v1.streamed import StreamedResultSet

        request = ExecuteSqlRequest(session=self._name(deadline), sql=sql)
        stream = self._api.execute_streaming_sql(
            request=request, metadata=self._metadata, timeout=deadline.call_timeout(), retry=None
        )
        return [list(r) for r in StreamedResultSet(stream)]

    def read_range(
        self,
        table: str,
        columns: Sequence[str],
        after: Sequence[Any] | None,
        last: Sequence[Any],
        limit: int,
        deadline: Deadline,
    ) -> Iterator[list[Any]]:
        """At most ``limit`` rows of ``table`` (``columns``) whose key is past ``after``
        (from the first when None) and at most ``last``, in stored order: one strong
        single-use streaming ``Read``, within ``deadline``. The rows stream as they are
        iterated (the caller may keep only some of them)."""
        from google.cloud.spanner_v1 import (
            ReadRequest,
            TransactionOptions,
            TransactionSelector,
        )
        from google.cloud.spanner_v1.streamed import StreamedResultSet

        strong = TransactionOptions(read_only=TransactionOptions.ReadOnly(strong=True))
        request = ReadRequest(
            session=self._name(deadline), transaction=TransactionSelector(single_use=strong),
            table=table, columns=list(columns), key_set=_key_range(after, last), limit=limit,
        )  # fmt: skip
        stream = self._api.streaming_read(
            request=request, metadata=self._metadata, timeout=deadline.call_timeout(), retry=None
        )
        return (list(r) for r in StreamedResultSet(stream))

    def rewrite_range(
        self,
        table: str,
        columns: Sequence[str],
        after: Sequence[Any] | None,
        last: Sequence[Any],
        limit: int,
        written: Sequence[str],
        rewrite: Callable[[list[list[Any]]], list[list[Any]]],
        deadline: Deadline,
    ) -> None:
        """One read-write transaction, within ``deadline``: read at most ``limit`` rows of
        ``table`` (``columns``) in the key range of :meth:`read_range`, then commit the
        rows ``rewrite(rows)`` returns (values of the ``written`` columns, the key's
        first) as one UPDATE mutation (none: an empty commit). Any failure, ``rewrite``'s
        included, rolls the transaction back (best effort, bounded) and is raised."""
        from google.cloud.spanner_v1 import (
            BeginTransactionRequest,
            CommitRequest,
            Mutation,
            ReadRequest,
            TransactionOptions,
            TransactionSelector,
        )
        from google.cloud.spanner_v1.streamed import StreamedResultSet

        session = self._name(deadline)
        begun = self._api.begin_transaction(
            request=BeginTransactionRequest(
                session=session,
                options=TransactionOptions(read_write=TransactionOptions.ReadWrite()),
            ),
            metadata=self._metadata, timeout=deadline.call_timeout(), retry=None,
        )  # fmt: skip
        txn_id = begun.id
        try:
            request = ReadRequest(
                session=session, transaction=TransactionSelector(id=txn_id), table=table,
                columns=list(columns), key_set=_key_range(after, last), limit=limit,
            )  # fmt: skip
            stream = self._api.streaming_read(
                request=request, metadata=self._metadata, timeout=deadline.call_timeout(),
                retry=None,
            )  # fmt: skip
            updates = rewrite([list(r) for r in StreamedResultSet(stream)])
            mutations = []
            if updates:
                write = Mutation.Write(
                    table=table, columns=list(written), values=[list_value(u) for u in updates]
                )
                mutations.append(Mutation(update=write))
            self._api.commit(
                request=CommitRequest(session=session, transaction_id=txn_id, mutations=mutations),
                metadata=self._metadata, timeout=deadline.call_timeout(), retry=None,
            )  # fmt: skip
        except BaseException:
            with suppress(Exception):
                self._api.rollback(
                    session=session, transaction_id=txn_id, metadata=self._metadata,
                    timeout=min(CLEANUP_SECONDS, deadline.call_timeout() + 0.5), retry=None,
                )  # fmt: skip
            raise

    def close(self) -> None:
        """Delete the session (best effort, bounded: a dead server keeps it; it expires)."""
        name, self._session = self._session, None
        if name is not None:
            with suppress(Exception):
                self._api.delete_session(
                    name=name, metadata=self._metadata, timeout=CLEANUP_SECONDS, retry=None
                )


def _key_range(after: Sequence[Any] | None, last: Sequence[Any]) -> Any:
    """The wire ``KeySet`` of keys past ``after`` (from the first when None) up to ``last``."""
    from google.cloud.spanner_v1.types import KeyRange, KeySet  # the wire messages

    first = {"start_closed": list_value([])}
    start = first if after is None else {"start_open": list_value(after)}
    return KeySet(ranges=[KeyRange(**start, end_closed=list_value(last))])
