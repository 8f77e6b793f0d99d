"""The in-process Spanner mock server, for asserting exactly which requests are sent.

It executes nothing: register each query's result by its SQL text (``add_result``),
inject gRPC errors (``add_error``), and read the requests that arrived. Use the emulator
to check behaviour and this to count round trips and check SQL text.

google-cloud-spanner (and grpc) are imported when a server is started, never at import.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Sequence
from typing import Any


def _as_sent(sql: str) -> str:
    """SQL as the Spanner DB-API sends it, from SQLAlchemy's compiled text: lines trimmed,
    ``%s`` placeholders numbered ``@a0, @a1, ...``."""
    parts = "\n".join(line.rstrip() for line in sql.strip().splitlines()).split("%s")
    out = parts[0]
    for i, part in enumerate(parts[1:]):
        out += f"@a{i}{part}"
    return out.replace("%%", "%")


def _value(v: Any, code: str) -> Any:
    """One cell as the protobuf ``Value`` Spanner sends for a column of type ``code``."""
    from google.protobuf import struct_pb2

    if v is None:
        return struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)
    if code == "BOOL":
        return struct_pb2.Value(bool_value=bool(v))
    if code in ("FLOAT64", "FLOAT32") and not isinstance(v, str):
        return struct_pb2.Value(number_value=float(v))
    if code == "BYTES" and isinstance(v, bytes):
        return struct_pb2.Value(string_value=base64.b64encode(v).decode())
    if code == "TIMESTAMP" and isinstance(v, dt.datetime):
        text = v.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")
        return struct_pb2.Value(string_value=text)
    if isinstance(v, dt.date):
        return struct_pb2.Value(string_value=v.isoformat())
    return struct_pb2.Value(string_value=str(v))


def _status_code(code: Any) -> Any:
    import grpc

    return getattr(grpc.StatusCode, code.upper()) if isinstance(code, str) else code


class MockSpanner:
    """A started mock server plus helpers. Stop it with :meth:`stop`.

    ``spanner_svc`` and ``admin_svc`` are google-cloud-spanner's servicers (their
    ``.mock_spanner``, ``.requests`` and ``.clear_requests()`` stay available).
    """

    def __init__(
        self,
        project: str = "mock-project",
        instance_id: str = "mock-instance",
        database_id: str = "mock-db",
    ) -> None:
        from google.cloud.spanner_v1.testing.mock_spanner import start_mock_server

        self.server, self.spanner_svc, self.admin_svc, self.port = start_mock_server()
        self.project, self.instance_id, self.database_id = project, instance_id, database_id
        self._client: Any = None

    @property
    def url(self) -> str:
        """A SQLAlchemy URL that sqlalchemy-spanner routes to this server.

        An engine made from it builds its own client: set
        ``SPANNER_DISABLE_BUILTIN_METRICS=true`` (the ``mock_spanner`` fixture does) or the
        process waits ~30 s at exit for a metrics exporter. :meth:`engine` needs neither.
        """
        return (
            f"spanner+spanner://:AnonymousCredentials@localhost:{self.port}/projects/"
            f"{self.project}/instances/{self.instance_id}/databases/{self.database_id}"
        )

    @property
    def client(self) -> Any:
        """A google-cloud-spanner ``Client`` on this server (no metrics export)."""
        if self._client is None:
            from google.api_core.client_options import ClientOptions
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import spanner

            self._client = spanner.Client(
                project=self.project,
                credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                client_options=ClientOptions(api_endpoint=f"localhost:{self.port}"),
                disable_builtin_metrics=True,
            )
        return self._client

    def engine(self, **kwargs: Any) -> Any:
        """A SQLAlchemy engine whose connections talk to this server."""
        import sqlalchemy as sa

        connect_args = dict(kwargs.pop("connect_args", {}))
        connect_args.setdefault("client", self.client)
        return sa.create_engine(self.url, connect_args=connect_args, **kwargs)

    def add_result(
        self,
        sql: str,
        columns: Sequence[tuple[str, str]] | Any = (),
        rows: Sequence[Sequence[Any]] = (),
    ) -> None:
        """Answer ``sql`` with rows; ``columns`` are (name, type code) like ("c", "INT64").

        ``sql`` may be the text SQLAlchemy compiles (``str(stmt.compile(engine))``): it is
        turned into the text the DB-API sends. Instead of columns and rows, a ready
        ``google.cloud.spanner_v1.ResultSet`` may be given.
        """
        import google.cloud.spanner_v1.types.result_set as result_set

        if isinstance(columns, result_set.ResultSet):
            self.spanner_svc.mock_spanner.add_result(_as_sent(sql), columns)
            return
        import google.cloud.spanner_v1.types.type as spanner_type

        codes = [code.upper() for _, code in columns]
        fields = [
            spanner_type.StructType.Field(
                name=name, type_=spanner_type.Type(code=getattr(spanner_type.TypeCode, code))
            )
            for (name, _), code in zip(columns, codes, strict=True)
        ]
        metadata = result_set.ResultSetMetadata(row_type=spanner_type.StructType(fields=fields))
        for row in rows:
            if len(row) != len(codes):
                raise ValueError(f"row {row!r} has {len(row)} values for {len(codes)} columns")
        values = [[_value(v, code) for v, code in zip(row, codes, strict=True)] for row in rows]
        self.spanner_svc.mock_spanner.add_result(
            _as_sent(sql), result_set.ResultSet(metadata=metadata, rows=values)
        )

    def add_update_count(self, sql: str, count: int) -> None:
        """Answer a DML statement with an affected-row count."""
        import google.cloud.spanner_v1.types.result_set as result_set

        self.spanner_svc.mock_spanner.add_result(
            _as_sent(sql),
            result_set.ResultSet(stats=result_set.ResultSetStats(row_count_exact=count)),
        )

    def add_error(self, method: str, code: Any, message: str = "injected", times: int = 1) -> None:
        """Fail the next ``times`` calls of a gRPC method with a status code.

        ``method`` is the RPC name (``"Commit"``, ``"ExecuteStreamingSql"`` for queries,
        ``"ExecuteSql"``, ``"ExecuteBatchDml"``, ``"BatchCreateSessions"``); ``code`` a
        ``grpc.StatusCode`` or its name (``"ABORTED"``). The client retries some errors
        once by itself (a failed inline begin is retried with ``BeginTransaction``;
        ABORTED commits replay the transaction): use ``times`` to outlast that.
        """
        from grpc_status.rpc_status import _Status

        for _ in range(times):
            self.spanner_svc.mock_spanner.add_error(
                method, _Status(_status_code(code), message, ())
            )

    @property
    def requests(self) -> list[Any]:
        """Every request the Spanner service received, in order."""
        return list(self.spanner_svc.requests)

    def executed_sql(self) -> list[str]:
        """SQL text of every ExecuteSql / ExecuteStreamingSql / ExecuteBatchDml request."""
        out: list[str] = []
        for r in self.spanner_svc.requests:
            kind = type(r).__name__
            if kind == "ExecuteBatchDmlRequest":
                out.extend(s.sql for s in r.statements)
            elif kind == "ExecuteSqlRequest":
                out.append(r.sql)
        return out

    def commits(self) -> list[Any]:
        """The CommitRequests that arrived (``.mutations`` holds what a commit wrote)."""
        return [r for r in self.spanner_svc.requests if type(r).__name__ == "CommitRequest"]

    def ddl_statements(self) -> list[str]:
        """DDL sent through UpdateDatabaseDdl (the mock accepts any, valid or not)."""
        return [s for r in self.admin_svc.requests for s in getattr(r, "statements", ())]

    def count(self, request_type: str) -> int:
        """How many requests of a type (e.g. ``"CommitRequest"``) arrived."""
        return sum(type(r).__name__ == request_type for r in self.spanner_svc.requests)

    def clear(self) -> None:
        """Forget the requests received so far (results and errors stay registered)."""
        self.spanner_svc.clear_requests()
        self.admin_svc.clear_requests()

    def stop(self) -> None:
        self.server.stop(0)
