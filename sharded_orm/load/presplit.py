"""Pre-splitting: ask Spanner for splits at shard boundaries before the first heavy writes.

Spanner splits a table by load, but not instantly: a new table, a bulk load or a reshard
that starts at full speed lands on one split until Spanner has learned where to cut.
``presplit`` tells it up front with the ``AddSplitPoints`` admin API: for a table whose key
leads with a shard column, and for every :class:`~sharded_orm.ShardedIndex` (whose key
always does), one split point at each shard boundary ``(1,) .. (count - 1,)``.

Google's guidance (https://cloud.google.com/spanner/docs/pre-splitting-overview and
https://cloud.google.com/spanner/docs/create-manage-split-points): about 10 split points
per node; at most 100 split points and 1 MiB in one request (more are sent in several
requests, never refused); points expire after ``expire_after`` (Spanner's default 10 days, at most
30). Small instances need no pre-splitting.

The emulator does not implement the API (it answers 501): there ``presplit`` logs that it
skipped and returns a report saying so; it never fails the job it was called from.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from sharded_orm.checks import check_positive_int, check_seconds, shown
from sharded_orm.errors import (
    ShardConfigError,
    ShardingError,
    ShardTypeError,
    UnsupportedOnDialectError,
)
from sharded_orm.greenlets import refuse_async_bind
from sharded_orm.limits import SPANNER_SPLIT_POINTS, SPANNER_SPLIT_REQUEST_BYTES
from sharded_orm.retry import DEFAULTS, Deadline
from sharded_orm.schema.columns import get_shard_column, is_shard_column, table_of
from sharded_orm.schema.indexes import ShardedIndex
from sharded_orm.spanner import admin, is_spanner

__all__ = [
    "MAX_POINTS_PER_REQUEST",
    "MAX_REQUEST_BYTES",
    "POINTS_PER_NODE",
    "PresplitReport",
    "presplit",
    "split_points",
]

_log = logging.getLogger("sharded_orm.presplit")

#: Spanner's limit of split points in one AddSplitPoints request (``sharded_orm.limits``).
MAX_POINTS_PER_REQUEST = SPANNER_SPLIT_POINTS
#: Spanner's limit of bytes in one AddSplitPoints request (``sharded_orm.limits``).
MAX_REQUEST_BYTES = SPANNER_SPLIT_REQUEST_BYTES
#: Google's recommendation of split points per node.
POINTS_PER_NODE = 10
#: Spanner keeps split points at most this long.
MAX_EXPIRE_AFTER = dt.timedelta(days=30)


@dataclass(frozen=True)
class SplitPoint:
    """One split key: on ``table`` (or its ``index`` when given), at ``key`` (a prefix)."""

    table: str
    index: str | None
    key: tuple[Any, ...]


@dataclass
class PresplitReport:
    """The points asked for, in how many requests; ``skipped`` says why none were sent."""

    points: list[SplitPoint] = field(default_factory=list)
    requests: int = 0
    skipped: str | None = None
    notes: list[str] = field(default_factory=list)


def _spread(boundaries: list[int], keep: int) -> list[int]:
    """``keep`` of the boundaries, evenly spaced (all of them when keep >= their number)."""
    if keep >= len(boundaries):
        return boundaries
    step = (len(boundaries) + 1) / (keep + 1)
    return sorted({boundaries[round(step * (i + 1)) - 1] for i in range(keep)})


def split_points(
    model: Any, *, indexes: bool = True, nodes: int | None = None
) -> tuple[list[SplitPoint], list[str]]:
    """The split points ``presplit`` asks for, and notes on objects it leaves alone.

    Pure (no I/O). With ``nodes`` the total is held to ``POINTS_PER_NODE * nodes``, spread
    evenly over the objects' boundaries; without, every shard boundary is a point.
    """
    table = table_of(model)
    objects: list[tuple[str | None, int]] = []  # (index name or None, shard count)
    notes: list[str] = []
    key = list(table.primary_key.columns)
    if key and is_shard_column(key[0]):
        objects.append((None, get_shard_column(table, key[0].key).count))
    else:
        lead = key[0].name if key else "nothing"
        notes.append(
            f"table {table.name}: its key starts with {lead}, not a shard column, so it has "
            "no shard boundaries to split at (split points on it would need its key values)"
        )
    if indexes:
        for ix in sorted(table.indexes, key=lambda i: str(i.name)):
            if isinstance(ix, ShardedIndex):
                objects.append((str(ix.name), ix.shard_column.count))
            else:
                notes.append(f"index {ix.name}: not a ShardedIndex, left alone")
    per_object = [list(range(1, count)) for _, count in objects]
    if nodes is not None:
        budget = POINTS_PER_NODE * check_positive_int(nodes, "nodes")
        total = sum(len(b) for b in per_object)
        if total > budget:
            share = [max(1, budget * len(b) // total) if b else 0 for b in per_object]
            per_object = [_spread(b, s) for b, s in zip(per_object, share, strict=True)]
            notes.append(f"{total} shard boundaries held to {budget} points ({nodes} nodes)")
    points = [
        SplitPoint(table.name, index, (k,))
        for (index, _), bounds in zip(objects, per_object, strict=True)
        for k in bounds
    ]
    return points, notes


def presplit(
    engine: Any,
    model: Any,
    *,
    indexes: bool = True,
    expire_after: dt.timedelta = dt.timedelta(days=10),
    nodes: int | None = None,
    initiator: str = "sharded-orm-presplit",
    per_request: int = MAX_POINTS_PER_REQUEST,
    request_bytes: int = MAX_REQUEST_BYTES,
    timeout: float = DEFAULTS["schema_change_call"],
) -> PresplitReport:
    """Add split points at the shard boundaries of ``model``'s table key and sharded indexes.

    ``engine`` is a Spanner Engine or Connection; ``indexes=False`` leaves indexes alone;
    ``expire_after`` (at most 30 days) is how long Spanner keeps the points; ``nodes``
    holds the total to Google's 10 points per node. Each request holds at most
    ``per_request`` points (at most 100) and ``request_bytes`` bytes as sent (at most 1
    MiB), Spanner's limits on one AddSplitPoints request. ``timeout``: the most Spanner
    may stay silent on one request (its silences retried until then; the client's own
    default is an hour, retried for another). Returns a :class:`PresplitReport`.
    """
    refuse_async_bind(engine, "presplit")
    if not isinstance(engine, (sa.Engine, sa.Connection)):
        raise ShardTypeError(
            f"presplit takes a SQLAlchemy Engine or Connection, got {shown(engine)}"
        )
    if not is_spanner(engine):
        raise UnsupportedOnDialectError(
            f"presplit asks Spanner's AddSplitPoints API for splits; {engine.dialect.name!r} "
            "has no such thing (run it against a Spanner engine)"
        )
    if not isinstance(expire_after, dt.timedelta) or not (
        dt.timedelta(0) < expire_after <= MAX_EXPIRE_AFTER
    ):
        raise ShardConfigError(
            f"expire_after must be a timedelta in (0, 30 days] (Spanner keeps split points at "
            f"most 30 days), got {expire_after!r}"
        )
    check_positive_int(per_request, "per_request")
    per_request = min(per_request, MAX_POINTS_PER_REQUEST)
    check_positive_int(request_bytes, "request_bytes")
    request_bytes = min(request_bytes, MAX_REQUEST_BYTES)
    check_seconds(timeout, "timeout")
    points, notes = split_points(model, indexes=indexes, nodes=nodes)
    report = PresplitReport(points=points, notes=notes)
    for note in notes:
        _log.info("presplit: %s", note)
    if not points:
        report.skipped = "no shard boundaries to split at"
        return report

    from sharded_orm.spanner.mutations import database_of

    database = database_of(engine)
    requests = admin.split_point_requests(
        database,
        points,
        expire_at=dt.datetime.now(dt.timezone.utc) + expire_after,
        initiator=initiator,
        per_request=per_request,
        byte_limit=request_bytes,
    )
    for i, request in enumerate(requests):
        try:
            deadline = Deadline.after(timeout, "presplit's timeout")
            _send(database, request, deadline, report.requests, len(requests))
        except Exception as exc:
            if i == 0 and admin.is_not_implemented(exc):
                report.skipped = (
                    "this Spanner endpoint does not implement AddSplitPoints (the emulator "
                    "answers 501); nothing to pre-split there"
                )
                _log.info("presplit %s: skipped: %s", table_of(model).name, report.skipped)
                return report
            raise
        report.requests += 1
    _log.info(
        "presplit %s: %d split points in %d requests",
        table_of(model).name,
        len(points),
        report.requests,
    )
    return report


def _send(database: Any, request: Any, deadline: Deadline, sent: int, total: int) -> None:
    """One AddSplitPoints request (``sent`` of ``total`` already sent), sent again while
    Spanner is silent until ``deadline``; then an error saying what was added and what to
    do (adding a split point twice is harmless)."""
    while True:
        try:
            admin.send_split_points(database, request, deadline)
            return
        except Exception as exc:
            if not admin.is_silence(exc):
                raise
            if deadline.remaining() <= 0.1:
                raise ShardingError(
                    f"presplit: Spanner did not answer AddSplitPoints request {sent + 1} of "
                    f"{total} within {deadline.seconds:g} s (the timeout): {exc}. The "
                    f"{sent} request(s) before it were applied; run presplit again (a split "
                    "point added twice is harmless), or give it a larger timeout="
                ) from exc
            time.sleep(deadline.cap(0.5))
