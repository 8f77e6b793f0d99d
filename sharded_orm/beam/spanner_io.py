"""Spanner reads and writes for the Beam transforms: DoFns on the google-cloud-spanner client.

Why not apache-beam's connectors: ``apache_beam.io.gcp.experimental.spannerio`` is
deprecated (Beam 2.68) and ignores mutation grouping by key; ``apache_beam.io.gcp.spanner``
needs a Java expansion service. These DoFns use only the client's public API, carry
nothing but picklable values between steps (so they run on the DirectRunner's
``multi_processing`` mode and on Dataflow alike), and honour ``credentials=``.

* :class:`ReadQuery`: a root transform; one DoFn partitions the query in one batch
  snapshot (``generate_query_batches``), a reshuffle spreads the partitions, another
  DoFn reads each (``process_query_batch``): one consistent snapshot, read in parallel.
* :class:`WriteMutations`: :class:`Mutation` records buffered per bundle, **sorted by
  table and key** (Spanner commits faster when a batch touches few splits), cut into
  batches under the row, cell and byte limits, each committed as one batch. Re-running a
  bundle is safe for ``insert_or_update``/``update``/``replace``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from sharded_orm.spanner.mutations import key_order

#: The writer's counters (``SpannerBatches``, ``rows_written``): apart from the
#: transforms' own ``sharded_orm`` counters.
NAMESPACE = "sharded_orm.spanner_io"
OPS = ("insert", "insert_or_update", "replace", "update")


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


class _PartitionFn(beam.DoFn):
    def __init__(self, db: Database, sql: str) -> None:
        self.db, self.sql = db, sql

    def process(self, _: Any) -> Any:
        snapshot = self.db.open().batch_snapshot()
        state = snapshot.to_dict()
        for batch in snapshot.generate_query_batches(self.sql):
            yield state, batch


class _ReadPartitionFn(beam.DoFn):
    def __init__(self, db: Database) -> None:
        self.db = db

    def setup(self) -> None:
        self.database = self.db.open()

    def process(self, item: tuple[dict[str, Any], dict[str, Any]]) -> Any:
        from google.cloud.spanner_v1.database import BatchSnapshot

        state, batch = item
        snapshot = BatchSnapshot.from_dict(self.database, state)
        for row in snapshot.process_query_batch(batch):
            yield list(row)


class ReadQuery(beam.PTransform[Any, Any]):
    """``pipeline | ReadQuery(db, sql)``: the rows of ``sql`` (lists of values)."""

    def __init__(self, db: Database, sql: str) -> None:
        super().__init__()
        self.db, self.sql = db, sql

    def expand(self, root: Any) -> Any:
        return (
            root
            | "Start" >> beam.Create([None])
            | "Partition" >> beam.ParDo(_PartitionFn(self.db, self.sql))
            | "Spread partitions" >> beam.Reshuffle()
            | "Read partitions" >> beam.ParDo(_ReadPartitionFn(self.db))
        )


def _sort_key(m: Mutation) -> tuple[Any, ...]:
    key = [key_order(v) for v in m.values[: m.key_size]]
    return (m.table, [(v is not None, v) for v in key])


class _WriteFn(beam.DoFn):
    def __init__(self, db: Database, batch_rows: int, batch_cells: int, batch_bytes: int) -> None:
        self.db = db
        self.limits = (batch_rows, batch_cells, batch_bytes)
        self.batches = Metrics.counter(NAMESPACE, "SpannerBatches")
        self.rows = Metrics.counter(NAMESPACE, "rows_written")

    def setup(self) -> None:
        self.database = self.db.open()

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
        with self.database.batch() as b:
            for m in batch:
                getattr(b, m.op)(table=m.table, columns=list(m.columns), values=[list(m.values)])
        self.batches.inc()
        self.rows.inc(len(batch))
        return len(batch)


class WriteMutations(beam.PTransform[Any, Any]):
    """:class:`Mutation` records to Spanner, sorted by key and batched under the limits;
    the output is the size of each committed batch."""

    def __init__(
        self, db: Database, *, batch_rows: int, batch_cells: int, batch_bytes: int
    ) -> None:
        super().__init__()
        self.fn = _WriteFn(db, batch_rows, batch_cells, batch_bytes)

    def expand(self, mutations: Any) -> Any:
        return mutations | "Commit batches" >> beam.ParDo(self.fn)
