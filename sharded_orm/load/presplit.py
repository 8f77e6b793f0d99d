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
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from sharded_orm.checks import check_positive_int, shown
from sharded_orm.errors import ShardConfigError, ShardTypeError, UnsupportedOnDialectError
from sharded_orm.limits import SPANNER_SPLIT_POINTS, SPANNER_SPLIT_REQUEST_BYTES
from sharded_orm.schema.columns import get_shard_column, is_shard_column, table_of
from sharded_orm.schema.indexes import ShardedIndex
from sharded_orm.spanner import is_spanner

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


def _field_bytes(size: int) -> int:
    """Bytes a length-delimited protobuf field of ``size`` bytes takes: its tag (one byte
    for the field numbers used here), its length as a varint, itself."""
    return 1 + max(1, -(-size.bit_length() // 7)) + size


def _requests(
    points: list[SplitPoint],
    expire_time: Any,
    per_request: int,
    byte_limit: int = SPANNER_SPLIT_REQUEST_BYTES,
    fixed: int = 0,
) -> list[Any]:
    """AddSplitPoints request bodies, in order, each with at most ``per_request`` keys and
    at most ``byte_limit`` bytes as serialised (``fixed``: the request's own fields, its
    database and initiator), counted from the split points as sent: each key's parts and
    each table and index group (names and expire time). A point alone over the limit is a
    request of its own, for Spanner to refuse with its own message."""
    from google.cloud.spanner_admin_database_v1.types import SplitPoints
    from google.protobuf import struct_pb2

    out: list[Any] = []
    groups: dict[tuple[str, str | None], list[Any]] = {}
    sizes: dict[tuple[str, str | None], int] = {}  # each group's serialised bytes
    bases: dict[tuple[str, str | None], int] = {}  # a group with no keys, by table and index
    count = used = 0

    def flush() -> None:
        out.append(
            [
                SplitPoints(table=t, index=i or "", keys=keys, expire_time=expire_time)
                for (t, i), keys in groups.items()
            ]
        )

    for p in points:
        parts = struct_pb2.ListValue(values=[struct_pb2.Value(string_value=str(v)) for v in p.key])
        key = SplitPoints.Key(key_parts=parts)
        entry = _field_bytes(SplitPoints.Key.pb(key).ByteSize())
        at = (p.table, p.index)
        if at not in bases:
            empty = SplitPoints(table=p.table, index=p.index or "", expire_time=expire_time)
            bases[at] = SplitPoints.pb(empty).ByteSize()
        before = sizes.get(at)
        after = (bases[at] if before is None else before) + entry
        grows = _field_bytes(after) - (0 if before is None else _field_bytes(before))
        if count and (count + 1 > per_request or fixed + used + grows > byte_limit):
            flush()
            groups, sizes, count, used = {}, {}, 0, 0
            after = bases[at] + entry
            grows = _field_bytes(after)
        groups.setdefault(at, []).append(key)
        sizes[at] = after
        count += 1
        used += grows
    if count:
        flush()
    return out


def _is_not_implemented(exc: BaseException) -> bool:
    code = getattr(exc, "code", None)
    return type(exc).__name__ == "MethodNotImplemented" or getattr(code, "value", code) == 501


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
) -> PresplitReport:
    """Add split points at the shard boundaries of ``model``'s table key and sharded indexes.

    ``engine`` is a Spanner Engine or Connection; ``indexes=False`` leaves indexes alone;
    ``expire_after`` (at most 30 days) is how long Spanner keeps the points; ``nodes``
    holds the total to Google's 10 points per node. Each request holds at most
    ``per_request`` points (at most 100) and ``request_bytes`` bytes as sent (at most 1
    MiB), Spanner's limits on one AddSplitPoints request. Returns a :class:`PresplitReport`.
    """
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
    points, notes = split_points(model, indexes=indexes, nodes=nodes)
    report = PresplitReport(points=points, notes=notes)
    for note in notes:
        _log.info("presplit: %s", note)
    if not points:
        report.skipped = "no shard boundaries to split at"
        return report

    from google.protobuf import timestamp_pb2

    from sharded_orm.spanner.mutations import admin_api, database_of

    expire_time = timestamp_pb2.Timestamp()
    expire_time.FromDatetime(dt.datetime.now(dt.timezone.utc) + expire_after)
    database = database_of(engine)
    api = admin_api(database)
    from google.cloud.spanner_admin_database_v1.types import AddSplitPointsRequest

    fixed = AddSplitPointsRequest.pb(
        AddSplitPointsRequest(database=database.name, initiator=initiator)
    ).ByteSize()
    bodies = _requests(points, expire_time, per_request, request_bytes, fixed)
    for i, body in enumerate(bodies):
        request = AddSplitPointsRequest(
            database=database.name, split_points=body, initiator=initiator
        )
        try:
            api.add_split_points(request=request)
        except Exception as exc:
            if i == 0 and _is_not_implemented(exc):
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
