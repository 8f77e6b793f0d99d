"""Reads the library sends outside SQLAlchemy: a strong read with its read timestamp and a
partitioned read of one batch snapshot, each call under a Deadline.

``verify`` reads a whole table as it was at one moment: a strong single-use read gives the
moment (its read timestamp), then a batch read-only transaction at that timestamp lists a
query's partitions (``PartitionQuery``) and streams each one. The handles these functions
take and give back (the ``Database`` of :func:`~sharded_orm.spanner.mutations.database_of`,
a batch snapshot, a partition) are opaque to the callers, which see no client type and
make no client call; :func:`call_failure` turns the client's errors into plain values.
Key ranges (``copy_table``'s batches, the backfill's) are read on a session of our own:
:class:`~sharded_orm.spanner.key_ranges.KeyRangeSession`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sharded_orm.retry import Deadline

__all__ = [
    "CallFailure",
    "snapshot_at",
    "call_failure",
    "partition_rows",
    "partitions",
    "strong_first_row",
]


def strong_first_row(database: Any, sql: str, deadline: Deadline) -> tuple[list[Any], Any]:
    """The first row of ``sql`` in a strong single-use read of ``database`` (a
    :func:`~sharded_orm.spanner.mutations.database_of`: its stream, restarts included,
    ends within ``deadline``), and the read's timestamp."""
    with database.snapshot() as strong:
        result = strong.execute_sql(sql, timeout=deadline.call_timeout())
        row = list(next(iter(result)))
        return row, result.metadata.transaction.read_timestamp


@contextmanager
def snapshot_at(database: Any, read_timestamp: Any) -> Iterator[Any]:
    """A batch read-only transaction of ``database`` at ``read_timestamp``, closed on exit:
    the handle :func:`partitions` and :func:`partition_rows` read from."""
    snapshot = database.batch_snapshot(read_timestamp=read_timestamp)
    try:
        yield snapshot
    finally:
        snapshot.close()


def partitions(snapshot: Any, sql: str, deadline: Deadline) -> list[Any]:
    """The partitions of ``sql`` in ``snapshot`` (one ``PartitionQuery``, within ``deadline``).

    The first call on a snapshot also begins its read-only transaction at the read
    timestamp (``BeginTransaction``), which the client sends with no timeout of ours (its
    own 30 s, retried): a silent server held verify 30 s past a 1.5 s deadline. So the
    partitions are listed on a worker thread, waited for until ``deadline``
    (:func:`~sharded_orm.spanner.deadlines.finished_within`); past it, DEADLINE_EXCEEDED
    (:func:`call_failure` reads it as ``timed_out``)."""
    from google.api_core import exceptions as api

    from sharded_orm.spanner.deadlines import finished_within

    found: list[list[Any]] = []

    def listing() -> None:
        found.append(list(snapshot.generate_query_batches(sql, timeout=deadline.call_timeout())))

    if not finished_within(listing, deadline):
        raise api.DeadlineExceeded(  # type: ignore[no-untyped-call]
            f"Spanner did not begin the read-only transaction nor list the partitions of "
            f"the query within {deadline.seconds:g} s ({deadline.what})"
        )
    return found[0]


def partition_rows(snapshot: Any, partition: Any, deadline: Deadline) -> Iterable[Any]:
    """The rows of one of :func:`partitions`, streamed whole within ``deadline``."""
    rows: Iterable[Any] = snapshot.process_query_batch(partition, timeout=deadline.call_timeout())
    return rows


@dataclass(frozen=True)
class CallFailure:
    """A Spanner call's error as plain values: its gRPC ``status`` name
    (``"DEADLINE_EXCEEDED"``, ``"NOT_FOUND"``, ...) and the server's ``message``."""

    status: str
    message: str

    @property
    def timed_out(self) -> bool:
        """The call ran out of time (DEADLINE_EXCEEDED)."""
        return self.status == "DEADLINE_EXCEEDED"


def call_failure(exc: BaseException) -> CallFailure | None:
    """``exc`` as a :class:`CallFailure` when it is a Spanner call's error (google-api-core's
    ``GoogleAPICallError``); None for every other error."""
    from google.api_core import exceptions as api

    if not isinstance(exc, api.GoogleAPICallError):
        return None
    if isinstance(exc, api.DeadlineExceeded):
        status = "DEADLINE_EXCEEDED"
    else:
        code = exc.grpc_status_code
        status = str(getattr(code, "name", "") or type(exc).__name__)
    return CallFailure(status, str(exc.message or exc))
