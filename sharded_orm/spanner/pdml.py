"""Partitioned DML and single-use queries with *our* timeout on every RPC (the server-side
backfill's calls: :mod:`sharded_orm.load.backfill_server`).

``Database.execute_partitioned_dml`` sends no timeout (its streamed statement waits up to
the client's default hour on a silent server) and retries ABORTED itself; a backfill must
end within its deadline. So each call here is BeginTransaction (partitioned DML) and one
ExecuteStreamingSql, each with the time left and ``retry=None``:
:mod:`sharded_orm.retry` decides about retries (Partitioned DML statements here are
idempotent: they only touch rows whose shard is NULL or wrong).

Also the wire encoding of key values (``list_value``), shared with the client backfill.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from contextlib import suppress
from decimal import Decimal
from typing import Any

from sharded_orm.errors import ShardConfigError
from sharded_orm.retry import Deadline

__all__ = ["SpannerCalls", "list_value", "param_type", "wire_value"]


class SpannerCalls:
    """One session; statements and queries each bounded by the ``timeout`` given (seconds,
    or the caller's :class:`~sharded_orm.retry.Deadline`, which every RPC of the call
    shares)."""

    def __init__(self, database: Any) -> None:
        self.database = database
        self.api: Any = database.spanner_api
        self.metadata = [
            ("google-cloud-resource-prefix", database.name),
            ("x-goog-spanner-route-to-leader", "true"),
        ]
        self.session: str | None = None

    def _session(self, deadline: Deadline) -> str:
        if self.session is None:
            from google.cloud.spanner_v1 import CreateSessionRequest

            made = self.api.create_session(
                request=CreateSessionRequest(database=self.database.name),
                metadata=self.metadata, timeout=deadline.call_timeout(), retry=None,
            )  # fmt: skip
            self.session = str(made.name)
        return self.session

    def _stream(self, deadline: Deadline, **request: Any) -> Any:
        from google.cloud.spanner_v1 import ExecuteSqlRequest
        from google.cloud.spanner_v1.streamed import StreamedResultSet

        try:
            req = ExecuteSqlRequest(session=self._session(deadline), **request)
            stream = self.api.execute_streaming_sql(
                request=req, metadata=self.metadata, timeout=deadline.call_timeout(), retry=None
            )
            result = StreamedResultSet(stream)
            rows = [list(r) for r in result]
        except Exception:
            self.session = None  # a lost session, a dead server: start afresh
            raise
        return rows, result

    def query(
        self, sql: str, timeout: float | Deadline, params: dict[str, Any] | None = None
    ) -> list[list[Any]]:
        """The rows of a strong single-use read-only query."""
        from google.cloud.spanner_v1 import TransactionOptions, TransactionSelector

        strong = TransactionOptions(read_only=TransactionOptions.ReadOnly(strong=True))
        rows: list[list[Any]]
        rows, _ = self._stream(
            _deadline(timeout), sql=sql,
            transaction=TransactionSelector(single_use=strong), **_params(params),
        )  # fmt: skip
        return rows

    def partitioned_update(
        self, sql: str, timeout: float | Deadline, params: dict[str, Any] | None = None
    ) -> int:
        """One Partitioned DML statement; Spanner's lower bound of the rows it changed."""
        from google.cloud.spanner_v1 import (
            BeginTransactionRequest,
            TransactionOptions,
            TransactionSelector,
        )

        deadline = _deadline(timeout)
        options = TransactionOptions(partitioned_dml=TransactionOptions.PartitionedDml())
        try:
            txn = self.api.begin_transaction(
                request=BeginTransactionRequest(session=self._session(deadline), options=options),
                metadata=self.metadata, timeout=deadline.call_timeout(), retry=None,
            )  # fmt: skip
        except Exception:
            self.session = None
            raise
        _, result = self._stream(
            deadline, sql=sql, transaction=TransactionSelector(id=txn.id), **_params(params)
        )
        return int(result.stats.row_count_lower_bound)

    def close(self) -> None:
        """Delete the session (best effort, bounded: a dead server keeps it; it expires)."""
        name, self.session = self.session, None
        if name is not None:
            with suppress(Exception):
                self.api.delete_session(name=name, metadata=self.metadata, timeout=2.0, retry=None)


def _deadline(timeout: float | Deadline) -> Deadline:
    """The caller's deadline, or one ``timeout`` seconds from now."""
    return timeout if isinstance(timeout, Deadline) else Deadline.after(timeout)


def _params(params: dict[str, Any] | None) -> dict[str, Any]:
    if not params:
        return {}
    from google.protobuf import struct_pb2

    return {
        "params": struct_pb2.Struct(fields={k: wire_value(v) for k, v in params.items()}),
        "param_types": {k: param_type(v) for k, v in params.items()},
    }


def param_type(value: Any) -> Any:
    """The Spanner type of a key value read back from Spanner."""
    from google.cloud.spanner_v1 import param_types as pt

    for py, code in ((bool, pt.BOOL), (int, pt.INT64), (float, pt.FLOAT64), (str, pt.STRING),
                     (bytes, pt.BYTES), (dt.datetime, pt.TIMESTAMP), (dt.date, pt.DATE),
                     (Decimal, pt.NUMERIC)):  # fmt: skip
        if isinstance(value, py):
            return code
    raise ShardConfigError(f"cannot bind a key value of type {type(value).__name__}")


def list_value(values: Sequence[Any]) -> Any:
    """Key or row values as Spanner's wire ``ListValue`` (the Read API and mutations)."""
    from google.protobuf import struct_pb2

    return struct_pb2.ListValue(values=[wire_value(v) for v in values])


def wire_value(v: Any) -> Any:
    """One value as Spanner's wire ``Value`` (INT64 as a string, TIMESTAMP in RFC 3339)."""
    from google.protobuf import struct_pb2

    if v is None:
        return struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)
    if isinstance(v, bool):
        return struct_pb2.Value(bool_value=v)
    if isinstance(v, int):
        return struct_pb2.Value(string_value=str(v))
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return struct_pb2.Value(
                string_value=str(v).replace("inf", "Infinity").replace("nan", "NaN")
            )
        return struct_pb2.Value(number_value=v)
    if isinstance(v, bytes):  # the client hands BYTES back base64-encoded, as the wire wants
        return struct_pb2.Value(string_value=v.decode("ascii"))
    if isinstance(v, dt.datetime):
        rfc3339 = getattr(v, "rfc3339", None)  # DatetimeWithNanoseconds keeps its nanoseconds
        if callable(rfc3339):
            return struct_pb2.Value(string_value=str(rfc3339()))
        u = v.astimezone(dt.timezone.utc) if v.tzinfo else v
        return struct_pb2.Value(string_value=u.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
    if isinstance(v, dt.date):
        return struct_pb2.Value(string_value=v.isoformat())
    return struct_pb2.Value(string_value=str(v))  # STRING, NUMERIC (Decimal), JSON text
