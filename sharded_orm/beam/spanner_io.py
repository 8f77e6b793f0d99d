"""Spanner reads and writes for the Beam transforms: DoFns on the google-cloud-spanner client.

Why not apache-beam's connectors: ``apache_beam.io.gcp.experimental.spannerio`` is
deprecated (Beam 2.68) and ignores mutation grouping by key; ``apache_beam.io.gcp.spanner``
needs a Java expansion service. These DoFns use only the client's public API, carry
nothing but picklable values between steps (so they run on the DirectRunner's
``multi_processing`` mode and on Dataflow alike), and honour ``credentials=``.

* :class:`ReadQuery`: a root transform; one DoFn partitions the query in one batch
  snapshot (``generate_query_batches``), a reshuffle spreads the partitions, another
  DoFn reads each (``process_query_batch``): one consistent snapshot, read in parallel.
  Each call carries ``read_timeout`` (the client's own is an hour per streamed read):
  the partitioning, and each partition's whole read, stream restarts included.
* :class:`WriteMutations`: :class:`Mutation` records buffered per bundle, **sorted by
  table and key** (Spanner commits faster when a batch touches few splits), cut into
  batches under the row, cell and byte limits, each committed as one batch. Re-running a
  bundle is safe for ``insert_or_update``/``update``/``replace``. Each commit attempt
  carries ``commit_timeout`` (the client's ``Batch.commit`` waits up to an hour and
  retries UNAVAILABLE for another): a batch is retried (ABORTED, UNAVAILABLE, no answer)
  for at most ``COMMIT_ATTEMPTS_SPAN`` times that, then its bundle fails with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from sharded_orm.checks import check_seconds
from sharded_orm.retry import DEFAULTS, RetryPolicy, retry_call
from sharded_orm.spanner.deadlines import call_options
from sharded_orm.spanner.mutations import RawSpanner, key_order

#: The writer's counters (``SpannerBatches``, ``rows_written``): apart from the
#: transforms' own ``sharded_orm`` counters.
NAMESPACE = "sharded_orm.spanner_io"
OPS = ("insert", "insert_or_update", "replace", "update")
#: Seconds one commit attempt of a batch may take.
DEFAULT_COMMIT_TIMEOUT = DEFAULTS["commit"]
#: A batch's attempts together take at most this many ``commit_timeout``.
COMMIT_ATTEMPTS_SPAN = 3
#: Seconds the partitioning of a query, and the read of each partition, may take.
DEFAULT_READ_TIMEOUT = DEFAULTS["partition_read"]


@dataclass(frozen=True)
class Mutation:
    """One row to write: ``op`` on ``table``; its first ``key_size`` values are its key."""

    op: str
    table: str
    columns: tuple[str, ...]
    values: tuple[Any, ...]
    key_size: int


@dataclass(frozen=True)
class Database:
    """Where to connect (picklable: each worker opens its own client)."""

    project_id: str
    instance_id: str
    database_id: str
    credentials: Any = None

    def client(self) -> Any:
        """A new google-cloud-spanner ``Client`` with these credentials (None: the
        environment's default credentials; the emulator's, where it is set)."""
        from google.cloud import spanner

        return spanner.Client(project=self.project_id, credentials=self.credentials)

    def open(self) -> Any:
        return self.client().instance(self.instance_id).database(self.database_id)

    def writer(self) -> Any:
        """Commits with our timeout and no client retries (``RawSpanner.commit_writes``)."""
        return RawSpanner(self.open())


class _PartitionFn(beam.DoFn):
    def __init__(self, db: Database, sql: str, timeout: float) -> None:
        self.db, self.sql, self.timeout = db, sql, timeout

    def process(self, _: Any) -> Any:
        snapshot = self.db.open().batch_snapshot()
        state = snapshot.to_dict()
        # listing the partitions is one kind of call with its own default, as verify's
        listing = min(self.timeout, DEFAULTS["partition_query"])
        batches = snapshot.generate_query_batches(self.sql, **call_options(listing))
        for batch in batches:
            yield state, batch


class _ReadPartitionFn(beam.DoFn):
    def __init__(self, db: Database, timeout: float) -> None:
        self.db, self.timeout = db, timeout

    def setup(self) -> None:
        self.database = self.db.open()

    def process(self, item: tuple[dict[str, Any], dict[str, Any]]) -> Any:
        from google.cloud.spanner_v1.database import BatchSnapshot

        state, batch = item
        snapshot = BatchSnapshot.from_dict(self.database, state)
        for row in snapshot.process_query_batch(batch, **call_options(self.timeout)):
            yield list(row)


class ReadQuery(beam.PTransform[Any, Any]):
    """``pipeline | ReadQuery(db, sql)``: the rows of ``sql`` (lists of values);
    ``timeout``: seconds for the partitioning and for each partition's read."""

    def __init__(self, db: Database, sql: str, *, timeout: float = DEFAULT_READ_TIMEOUT) -> None:
        super().__init__()
        self.db, self.sql, self.timeout = db, sql, check_seconds(timeout, "read_timeout")

    def expand(self, root: Any) -> Any:
        return (
            root
            | "Start" >> beam.Create([None])
            | "Partition" >> beam.ParDo(_PartitionFn(self.db, self.sql, self.timeout))
            | "Spread partitions" >> beam.Reshuffle()
            | "Read partitions" >> beam.ParDo(_ReadPartitionFn(self.db, self.timeout))
        )


def _sort_key(m: Mutation) -> tuple[Any, ...]:
    key = [key_order(v) for v in m.values[: m.key_size]]
    return (m.table, [(v is not None, v) for v in key])


class _WriteFn(beam.DoFn):
    def __init__(
        self, db: Database, batch_rows: int, batch_cells: int, batch_bytes: int, timeout: float
    ) -> None:
        self.db = db
        self.limits = (batch_rows, batch_cells, batch_bytes)
        self.policy = RetryPolicy(call_timeout=timeout, deadline=timeout * COMMIT_ATTEMPTS_SPAN)
        self.batches = Metrics.counter(NAMESPACE, "SpannerBatches")
        self.rows = Metrics.counter(NAMESPACE, "rows_written")

    def setup(self) -> None:
        self.raw = self.db.writer()

    def teardown(self) -> None:
        raw = getattr(self, "raw", None)
        if raw is not None:
            raw.close()

    def start_bundle(self) -> None:
        self.pending: list[Mutation] = []

    def process(self, m: Mutation) -> Any:
        self.pending.append(m)
        if len(self.pending) >= 20 * self.limits[0]:
            yield from self._flush()

    def finish_bundle(self) -> Any:
        for n in self._flush():
            yield WindowedValue(n, GlobalWindow().max_timestamp(), (GlobalWindow(),))

    def _flush(self) -> Any:
        rows, cells, size = self.limits
        pending, self.pending = sorted(self.pending, key=_sort_key), []
        batch: list[Mutation] = []
        used = [0, 0]
        for m in pending:
            c, b = len(m.values), len(repr(m.values))
            if batch and (len(batch) >= rows or used[0] + c > cells or used[1] + b > size):
                yield self._commit(batch)
                batch, used = [], [0, 0]
            batch.append(m)
            used[0] += c
            used[1] += b
        if batch:
            yield self._commit(batch)

    def _commit(self, batch: list[Mutation]) -> int:
        writes = [(m.op, m.table, m.columns, [list(m.values)]) for m in batch]
        retry_call(
            lambda timeout: self.raw.commit_writes(writes, timeout),
            self.policy,
            what=f"committing a batch of {len(batch)} mutations to {self.db.database_id}",
            # an unknown outcome is retried only where writing twice gives the same rows
            idempotent=all(m.op != "insert" for m in batch),
            resume="Re-running the pipeline is safe with mode='insert_or_update'.",
        )
        self.batches.inc()
        self.rows.inc(len(batch))
        return len(batch)


class WriteMutations(beam.PTransform[Any, Any]):
    """:class:`Mutation` records to Spanner, sorted by key and batched under the limits;
    the output is the size of each committed batch."""

    def __init__(
        self,
        db: Database,
        *,
        batch_rows: int,
        batch_cells: int,
        batch_bytes: int,
        commit_timeout: float = DEFAULT_COMMIT_TIMEOUT,
    ) -> None:
        super().__init__()
        timeout = check_seconds(commit_timeout, "commit_timeout")
        self.fn = _WriteFn(db, batch_rows, batch_cells, batch_bytes, timeout)

    def expand(self, mutations: Any) -> Any:
        return mutations | "Commit batches" >> beam.ParDo(self.fn)
