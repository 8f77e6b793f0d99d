"""``WriteSharded``: load rows into a sharded table from an Apache Beam pipeline."""

from __future__ import annotations

from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import Metrics

from sharded_orm.beam.rows import (
    RowPlan,
    RowRejected,
    load_model,
    model_path,
    refuse_server_filled_keys,
)
from sharded_orm.beam.spanner_io import (
    DEFAULT_COMMIT_TIMEOUT,
    Database,
    Mutation,
    WriteMutations,
)
from sharded_orm.errors import ShardConfigError
from sharded_orm.load.bulk import MAX_MUTATIONS
from sharded_orm.schema.columns import table_of
from sharded_orm.write.successor_plan import successor_of

#: Tag of the dead-letter output: ``{"row": <the input>, "reason": "..."}`` per bad row.
DEAD_LETTER = "dead_letter"
MODES = ("insert", "insert_or_update", "replace")
#: Spanner allows 80,000 mutations (cells, index entries included) and 100 MB per commit;
#: the batches stay far below, at a size that commits quickly (as Beam's Java connector).
DEFAULT_BATCH_BYTES = 1024 * 1024
DEFAULT_BATCH_ROWS = 500
DEFAULT_BATCH_CELLS = 5000
NAMESPACE = "sharded_orm"


def spanner_writer(
    project_id: str,
    instance_id: str,
    database_id: str,
    *,
    batch_bytes: int,
    batch_rows: int,
    batch_cells: int,
    credentials: Any = None,
    commit_timeout: float = DEFAULT_COMMIT_TIMEOUT,
) -> beam.PTransform[Any, Any]:
    """Our Spanner writer (:mod:`sharded_orm.beam.spanner_io`): mutations sorted by key and
    batched under the limits, ``credentials`` honoured, each commit within
    ``commit_timeout`` seconds."""
    if not 0 < batch_cells <= MAX_MUTATIONS:
        raise ShardConfigError(
            f"batch_cells must be in 1..{MAX_MUTATIONS} (Spanner's mutations per commit), "
            f"got {batch_cells}"
        )
    db = Database(project_id, instance_id, database_id, credentials)
    return WriteMutations(
        db,
        batch_rows=batch_rows,
        batch_cells=batch_cells,
        batch_bytes=batch_bytes,
        commit_timeout=commit_timeout,
    )


class _PrepareFn(beam.DoFn):
    """Each input row to one mutation, or to the dead-letter output with the reason."""

    def __init__(self, path: str, mode: str) -> None:
        self.path = path
        self.mode = mode
        self.plan: RowPlan | None = None
        self.ok = Metrics.counter(NAMESPACE, "rows_prepared")
        self.bad = Metrics.counter(NAMESPACE, "dead_letters")

    def setup(self) -> None:
        self.plan = RowPlan(load_model(self.path))
        self.key_size = len(self.plan.table.primary_key.columns)
        names = list(self.plan.column_names)
        self.order = [names.index(c.name) for c in self.plan.table.primary_key.columns]
        self.order += [i for i in range(len(names)) if i not in self.order]
        self.columns = tuple(names[i] for i in self.order)

    def process(self, raw: Any) -> Any:
        assert self.plan is not None
        try:
            values = self.plan.prepare(raw)
        except RowRejected as exc:
            self.bad.inc()
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, {"row": raw, "reason": str(exc)})
            return
        self.ok.inc()
        yield Mutation(
            self.mode, self.plan.table.name, self.columns,
            tuple(values[i] for i in self.order), self.key_size,
        )  # fmt: skip


class WriteSharded(beam.PTransform[Any, Any]):
    """Write dicts (or model instances) to ``model``'s Spanner table, shards filled.

    Each row is prepared by the library (defaults and client-side ids, every shard column
    computed with ``ShardColumn.compute``, values checked and converted), then written as
    mutations sorted by key and batched under Spanner's commit limits
    (:mod:`sharded_orm.beam.spanner_io`). A row that fails goes to the ``dead_letter`` output as
    ``{"row": ..., "reason": ...}``; nothing else stops the pipeline.

    ``mode="insert_or_update"`` (default) keeps a retried bundle or a rerun from failing
    on rows already written; ``"insert"`` fails on them. A model whose key is filled by the
    database (IDENTITY, sequence) is refused when the transform is built. Each commit
    attempt takes at most ``commit_timeout`` seconds (retried, ABORTED and no answer
    included, for at most 3 times that; then the bundle fails with the reason).

    Applying it returns ``{"written": <PCollection of committed batches>, "dead_letter":
    <PCollection of dicts>}``.
    """

    def __init__(
        self,
        model: Any,
        *,
        project_id: str,
        instance_id: str,
        database_id: str,
        mode: str = "insert_or_update",
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        batch_cells: int = DEFAULT_BATCH_CELLS,
        credentials: Any = None,
        commit_timeout: float = DEFAULT_COMMIT_TIMEOUT,
    ) -> None:
        super().__init__()
        if mode not in MODES:
            raise ShardConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.path = model_path(model)
        refuse_server_filled_keys(table_of(model))  # now, not on the workers
        successor = successor_of(table_of(model))
        if successor is not None:
            raise ShardConfigError(
                f"{table_of(model).name} has a successor ({successor.name}, a key reshard "
                "under way): a pipeline's mutations would reach it alone, not the successor. "
                "Load it before declare_successor (the copy takes the rows across), after the "
                f"contract into {successor.name}, or meanwhile with bulk_load (both tables in "
                "each commit)."
            )
        self.mode = mode
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

    def expand(self, rows: Any) -> dict[str, Any]:
        prepared = rows | "Prepare rows" >> beam.ParDo(
            _PrepareFn(self.path, self.mode)
        ).with_outputs(DEAD_LETTER, main="mutations")
        written = prepared.mutations | "Write to Spanner" >> self.writer
        return {"written": written, "dead_letter": prepared[DEAD_LETTER]}
