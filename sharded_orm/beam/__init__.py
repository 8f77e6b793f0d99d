"""sharded-orm on Apache Beam: loads and reshard backfills that scale past one machine.

Install the extra: ``pip install 'sharded-orm[beam]'`` (apache-beam[gcp]). ``import
sharded_orm`` never imports this package. Its Spanner reads and writes are DoFns on the
google-cloud-spanner client (:mod:`sharded_orm.beam.spanner_io`; no deprecated or
cross-language connector), so the same pipeline runs on the DirectRunner, in-process or
``multi_processing`` (tests, a laptop; against the emulator when ``SPANNER_EMULATOR_HOST``
is set), and on Dataflow, Flink or Spark with pipeline options only. See docs/at_scale.md.

* :class:`WriteSharded`: rows to a sharded table, shards and ids filled by the library,
  bad rows to a dead-letter output with the reason.
* :class:`Backfill`: the client-side reshard backfill (crc32), read in partitions.
* :func:`run`: run a pipeline with readable progress on the driver.
"""

from __future__ import annotations

from typing import Any

from apache_beam.metrics.metric import MetricsFilter
from apache_beam.runners.runner import PipelineState

from sharded_orm.beam.backfill import UNHASHABLE, Backfill, backfill_query
from sharded_orm.beam.rows import RowPlan, RowRejected
from sharded_orm.beam.write import DEAD_LETTER, NAMESPACE, WriteSharded
from sharded_orm.progress import progress

__all__ = [
    "DEAD_LETTER",
    "UNHASHABLE",
    "Backfill",
    "RowPlan",
    "RowRejected",
    "WriteSharded",
    "backfill_query",
    "counters",
    "run",
]


def counters(result: Any) -> dict[str, int]:
    """The pipeline's sharded-orm counters (rows_prepared, dead_letters, rows_backfilled)."""
    out: dict[str, int] = {}
    query = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))
    for c in query["counters"]:
        try:
            value = c.committed
        except Exception:  # some runners report attempted values only
            value = None
        out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(
            value if value is not None else c.attempted or 0
        )
    return out


def run(
    pipeline: Any,
    *,
    total: int | None = None,
    description: str = "pipeline",
    counter: str = "rows_prepared",
    poll_seconds: float = 10.0,
    progress_mode: Any = "auto",
) -> Any:
    """Run ``pipeline`` and report ``counter`` as progress until it ends; its result.

    On the DirectRunner ``run`` returns when the pipeline is done; on Dataflow the driver
    polls every ``poll_seconds`` and shows the rows done, rate and ETA (a bar on a terminal,
    log lines elsewhere). Raises if the pipeline fails.
    """
    result = pipeline.run()
    done = 0
    with progress(total, description, mode=progress_mode) as bar:
        while True:
            state = result.wait_until_finish(duration=int(poll_seconds * 1000))
            now = counters(result).get(counter, 0)
            if now > done:
                bar.advance(now - done)
                done = now
            if state is not None and PipelineState.is_terminal(state):
                break
    if state != PipelineState.DONE:
        raise RuntimeError(f"{description}: the pipeline ended in state {state}")
    return result
