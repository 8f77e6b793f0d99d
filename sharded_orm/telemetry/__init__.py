"""OpenTelemetry traces and metrics of sharded-orm's operations (the ``otel`` extra).

Every sharded read (``merged``, ``page``), bulk load, backfill, copy, verify and reshard
step, and pooled sequence refill is a span under the caller's current span, attributed by
OpenTelemetry's stable database conventions plus ``sharded_orm.*`` figures, and records
``db.client.operation.duration``. Rows written per shard feed the write-skew gauge
(:mod:`.skew`). Nothing is recorded, and next to nothing is spent, until the app
configures an OpenTelemetry SDK (or passes providers to :func:`configure`). See
docs/observability.md.
"""

from __future__ import annotations

from sharded_orm.telemetry.api import configure
from sharded_orm.telemetry.conventions import database_attributes
from sharded_orm.telemetry.skew import (
    SkewFigure,
    configure_window,
    rows_written,
    track,
    write_skew,
)
from sharded_orm.telemetry.spans import (
    Operation,
    carried,
    operation,
    position_digest,
    progress,
    traced,
)

__all__ = [
    "Operation",
    "SkewFigure",
    "carried",
    "configure",
    "configure_window",
    "database_attributes",
    "operation",
    "position_digest",
    "progress",
    "rows_written",
    "track",
    "traced",
    "write_skew",
]
