"""``Backfill``: the client-side reshard backfill (crc32 shards) as a Beam pipeline."""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import sqlalchemy as sa
from apache_beam.metrics.metric import Metrics

from sharded_orm.beam.rows import load_model, model_path
from sharded_orm.beam.spanner_io import (
    DEFAULT_COMMIT_TIMEOUT,
    DEFAULT_READ_TIMEOUT,
    Database,
    Mutation,
    ReadQuery,
)
from sharded_orm.beam.write import (
    DEFAULT_BATCH_BYTES,
    DEFAULT_BATCH_CELLS,
    DEFAULT_BATCH_ROWS,
    NAMESPACE,
    spanner_writer,
)
from sharded_orm.errors import ShardConfigError
from sharded_orm.load.verify import quote, row_decoder
from sharded_orm.schema.columns import ShardColumn, get_shard_column, table_of

#: Tag of the output of rows whose shard cannot be computed: ``{"key": ..., "reason": ...}``.
UNHASHABLE = "unhashable"


def read_columns(table: sa.Table, sc: ShardColumn) -> list[sa.Column[Any]]:
    """The columns a backfill reads: the key, then the sources not in it."""
    columns = list(table.primary_key.columns)
    return columns + [c for c in sc.sources if c not in columns]


def backfill_query(model: Any, column: str, only_missing: bool) -> tuple[str, list[Any]]:
    """The partitionable read: key columns and sources (each once), NULL rows only if asked."""
    table = table_of(model)
    sc = get_shard_column(table, column)
    columns = read_columns(table, sc)
    sql = f"SELECT {', '.join(quote(c.name) for c in columns)} FROM {quote(table.name, 'table')}"
    if only_missing:
        sql += f" WHERE {quote(sc.name)} IS NULL"
    return sql, columns


class _ShardFn(beam.DoFn):
    """A read row (key + sources) to an update mutation of the new shard column."""

    def __init__(self, path: str, column: str) -> None:
        self.path, self.column = path, column
        self.done = Metrics.counter(NAMESPACE, "rows_backfilled")

    def setup(self) -> None:
        from sharded_orm.spanner.mutations import bind_processors, dialect_of

        table = table_of(load_model(self.path))
        self.table = table.name
        self.shard = get_shard_column(table, self.column)
        columns = read_columns(table, self.shard)
        dialect = dialect_of(None)
        self.decode = row_decoder(columns, dialect)
        self.keys = list(table.primary_key.columns)
        self.key_at = [columns.index(c) for c in self.keys]
        self.source_at = [columns.index(c) for c in self.shard.sources]
        self.encode = bind_processors(self.keys, dialect)
        self.columns = (*[c.name for c in self.keys], self.shard.name)

    def process(self, raw: Any) -> Any:
        row = self.decode(raw)
        key = [row[i] for i in self.key_at]
        try:
            shard = self.shard.compute([row[i] for i in self.source_at])
        except Exception as exc:
            yield beam.pvalue.TaggedOutput(UNHASHABLE, {"key": key, "reason": str(exc)})
            return
        bound = [p(v) if p is not None else v for p, v in zip(self.encode, key, strict=True)]
        self.done.inc()
        yield Mutation("update", self.table, self.columns, (*bound, shard), len(bound))


class Backfill(beam.PTransform[Any, Any]):
    """Fill ``model``'s new shard ``column`` for every row: read, hash, update.

    Applied to the pipeline root (``pipeline | Backfill(...)``). Spanner's batch API
    reads the key and sources in parallel partitions (one consistent snapshot); each row's
    shard is computed by ``ShardColumn.compute`` (any algorithm; this is the path for crc32,
    which Spanner cannot compute: farm_fingerprint columns are faster with
    ``backfill_server_side``); update mutations are written in batches under Spanner's
    limits. Idempotent: a rerun writes the same values, and with ``only_missing=True``
    (default) reads only the rows still NULL, so it also resumes an interrupted run.
    ``read_timeout`` bounds the partitioning and each partition's read, ``commit_timeout``
    each commit attempt (the client's defaults: an hour each).

    Returns ``{"written": ..., "unhashable": <rows whose sources cannot be hashed>}``.
    """

    def __init__(
        self,
        model: Any,
        column: str,
        *,
        project_id: str,
        instance_id: str,
        database_id: str,
        only_missing: bool = True,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        batch_cells: int = DEFAULT_BATCH_CELLS,
        credentials: Any = None,
        commit_timeout: float = DEFAULT_COMMIT_TIMEOUT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
    ) -> None:
        super().__init__()
        self.path = model_path(model)
        sc = get_shard_column(model, column)
        if sc.server_side:
            raise ShardConfigError(
                f"{sc.name} is a generated column (server_side=True): Spanner fills it itself"
            )
        self.column = sc.key
        self.sql, _ = backfill_query(model, column, only_missing)
        db = Database(project_id, instance_id, database_id, credentials)
        self.read = ReadQuery(db, self.sql, timeout=read_timeout)
        self.writer = spanner_writer(
            project_id,
            instance_id,
            database_id,
            batch_bytes=batch_bytes,
            batch_rows=batch_rows,
            batch_cells=batch_cells,
            credentials=credentials,
            commit_timeout=commit_timeout,
        )

    def expand(self, root: Any) -> dict[str, Any]:
        shards = (
            root
            | "Read keys and sources" >> self.read
            | "Compute shards"
            >> beam.ParDo(_ShardFn(self.path, self.column)).with_outputs(
                UNHASHABLE, main="mutations"
            )
        )
        written = shards.mutations | "Write shards" >> self.writer
        return {"written": written, "unhashable": shards[UNHASHABLE]}
