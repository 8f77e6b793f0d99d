"""Spanner's database admin API: schema changes and split points, each call under a Deadline.

The one module that reaches the admin stub of a google-cloud-spanner ``Database``
(docs/upstream.md, U9): ``Database.update_ddl`` sends ``UpdateDatabaseDdl`` with no
timeout and polls it for hours, and ``AddSplitPoints`` has no ``Database`` method at all.
Every call here is one RPC with the caller's :class:`~sharded_orm.retry.Deadline` and the
client's retries off; the policy (what to retry, how long to wait, how to size requests)
stays with the callers, :mod:`alembic_ext.schema_change` and :mod:`sharded_orm.load.presplit`,
which see no client type: they get plain values (:class:`DdlOperation`) and predicates on
the errors (:func:`is_silence`, :func:`is_failed_precondition`, :func:`is_not_implemented`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sharded_orm.retry import Deadline

__all__ = [
    "DdlOperation",
    "SplitKey",
    "send_split_points",
    "admin_api",
    "is_failed_precondition",
    "is_not_implemented",
    "is_silence",
    "operation_error",
    "poll_ddl",
    "send_ddl",
    "split_point_requests",
]


def admin_api(database: Any) -> Any:
    """The database admin stub of ``database``'s client: the one reach for it (U9)."""
    return database._instance._client.database_admin_api


def _metadata(database: Any) -> list[tuple[str, str]]:
    return [("google-cloud-resource-prefix", str(database.name))]


@dataclass(frozen=True)
class DdlOperation:
    """A schema change's long-running operation as last seen: ``done``, and its error's
    ``code`` (a google.rpc code, 0 for none) and ``message`` once done."""

    done: bool
    code: int = 0
    message: str = ""


def _operation(raw: Any) -> DdlOperation:
    error = getattr(raw, "error", None)
    return DdlOperation(
        done=bool(raw.done),
        code=int(getattr(error, "code", 0) or 0),
        message=str(getattr(error, "message", "") or ""),
    )


def send_ddl(
    database: Any, statements: Sequence[str], operation_id: str, deadline: Deadline
) -> DdlOperation | None:
    """Send ``statements`` as one ``UpdateDatabaseDdl`` named ``operation_id``, within
    ``deadline``: its operation, or None when an earlier send of the same
    ``operation_id`` reached Spanner (ALREADY_EXISTS: poll it with :func:`poll_ddl`)."""
    from google.api_core import exceptions as api
    from google.cloud.spanner_admin_database_v1.types import UpdateDatabaseDdlRequest

    request = UpdateDatabaseDdlRequest(
        database=database.name, statements=list(statements), operation_id=operation_id
    )
    try:
        sent = admin_api(database).update_database_ddl(
            request=request,
            metadata=_metadata(database),
            timeout=deadline.call_timeout(),
            retry=None,
        )
    except api.AlreadyExists:
        return None
    return _operation(sent.operation)


def poll_ddl(database: Any, operation_id: str, deadline: Deadline) -> DdlOperation:
    """The operation :func:`send_ddl` started as ``operation_id``, asked within ``deadline``."""
    raw = admin_api(database).get_operation(
        request={"name": f"{database.name}/operations/{operation_id}"},
        metadata=_metadata(database),
        timeout=deadline.call_timeout(),
        retry=None,
    )
    return _operation(raw)


def operation_error(code: int, message: str) -> Exception:
    """The client's exception for a failed operation's google.rpc ``code`` and ``message``
    (``FailedPrecondition`` for 9, ...), as ``update_ddl().result()`` would raise it."""
    from google.api_core import exceptions as api

    error: Exception = api.from_grpc_status(code, message)  # type: ignore[no-untyped-call]
    return error


def is_silence(exc: BaseException) -> bool:
    """No answer (or none usable) from Spanner: DEADLINE_EXCEEDED, UNAVAILABLE or
    RESOURCE_EXHAUSTED, so the same call may be made again."""
    from google.api_core import exceptions as api

    return isinstance(exc, (api.DeadlineExceeded, api.ServiceUnavailable, api.ResourceExhausted))


def is_failed_precondition(exc: BaseException) -> bool:
    """Spanner refused the call with FAILED_PRECONDITION."""
    from google.api_core import exceptions as api

    return isinstance(exc, api.FailedPrecondition)


def is_not_implemented(exc: BaseException) -> bool:
    """The endpoint does not implement the call (UNIMPLEMENTED, or HTTP 501: the emulator's
    answer to AddSplitPoints)."""
    code = getattr(exc, "code", None)
    return type(exc).__name__ == "MethodNotImplemented" or getattr(code, "value", code) == 501


class SplitKey(Protocol):
    """One split point: on ``table`` (or its ``index`` when not None), at ``key``."""

    @property
    def table(self) -> str: ...
    @property
    def index(self) -> str | None: ...
    @property
    def key(self) -> tuple[Any, ...]: ...


def _field_bytes(size: int) -> int:
    """Bytes a length-delimited protobuf field of ``size`` bytes takes: its tag (one byte
    for the field numbers used here), its length as a varint, itself."""
    return 1 + max(1, -(-size.bit_length() // 7)) + size


def split_point_requests(
    database: Any,
    points: Sequence[SplitKey],
    *,
    expire_at: dt.datetime,
    initiator: str,
    per_request: int,
    byte_limit: int,
) -> list[Any]:
    """``AddSplitPoints`` requests for ``points``, in order, each with at most
    ``per_request`` keys and at most ``byte_limit`` bytes as serialised, counted from the
    request as sent: its database and initiator, each key's parts and each table and
    index group (names and expire time). A point alone over the limit is a request of its
    own, for Spanner to refuse with its own message."""
    from google.cloud.spanner_admin_database_v1.types import AddSplitPointsRequest, SplitPoints
    from google.protobuf import struct_pb2, timestamp_pb2

    expire_time = timestamp_pb2.Timestamp()
    expire_time.FromDatetime(expire_at)
    fixed = AddSplitPointsRequest.pb(
        AddSplitPointsRequest(database=database.name, initiator=initiator)
    ).ByteSize()
    bodies: list[list[Any]] = []
    groups: dict[tuple[str, str | None], list[Any]] = {}
    sizes: dict[tuple[str, str | None], int] = {}  # each group's serialised bytes
    bases: dict[tuple[str, str | None], int] = {}  # a group with no keys, by table and index
    count = used = 0

    def flush() -> None:
        bodies.append(
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
    return [
        AddSplitPointsRequest(database=database.name, split_points=body, initiator=initiator)
        for body in bodies
    ]


def send_split_points(database: Any, request: Any, deadline: Deadline) -> None:
    """Send one request of :func:`split_point_requests` within ``deadline`` (the client's
    default is an hour, retried for another)."""
    admin_api(database).add_split_points(
        request=request, timeout=deadline.call_timeout(), retry=None
    )
