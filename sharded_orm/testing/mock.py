"""The in-process Spanner mock server, for asserting exactly which requests are sent.

It executes nothing: register each query's result by its SQL text (``add_result``),
inject gRPC errors (``add_error``), and read the requests that arrived. Use the emulator
to check behaviour and this to count round trips and check SQL text.
"""

from __future__ import annotations

import os
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


class MockSpanner:
    """A started mock server plus helpers. Stop it with :meth:`stop`."""

    def __init__(
        self,
        project: str = "mock-project",
        instance_id: str = "mock-instance",
        database_id: str = "mock-db",
    ) -> None:
        # Without this the client starts a metrics exporter and the process hangs at exit.
        os.environ.setdefault("SPANNER_DISABLE_BUILTIN_METRICS", "true")
        from google.cloud.spanner_v1.testing.mock_spanner import start_mock_server

        self.server, self.spanner_svc, self.admin_svc, self.port = start_mock_server()
        self.project, self.instance_id, self.database_id = project, instance_id, database_id

    @property
    def url(self) -> str:
        """A SQLAlchemy URL that sqlalchemy-spanner routes to this server."""
        return (
            f"spanner+spanner://:AnonymousCredentials@localhost:{self.port}/projects/"
            f"{self.project}/instances/{self.instance_id}/databases/{self.database_id}"
        )

    def engine(self, **kwargs: Any) -> Any:
        import sqlalchemy as sa

        return sa.create_engine(self.url, **kwargs)

    def add_result(
        self, sql: str, columns: Sequence[tuple[str, str]] = (), rows: Sequence[Sequence[Any]] = ()
    ) -> None:
        """Answer ``sql`` with rows; ``columns`` are (name, type code) like ("c", "INT64").

        ``sql`` may be the text SQLAlchemy compiles (``str(stmt.compile(engine))``).
        """
        import google.cloud.spanner_v1.types.result_set as result_set
        import google.cloud.spanner_v1.types.type as spanner_type
        from google.protobuf import struct_pb2

        fields = [
            spanner_type.StructType.Field(
                name=name, type_=spanner_type.Type(code=getattr(spanner_type.TypeCode, code))
            )
            for name, code in columns
        ]
        metadata = result_set.ResultSetMetadata(row_type=spanner_type.StructType(fields=fields))
        values = [
            [
                struct_pb2.Value(null_value=0)
                if v is None
                else struct_pb2.Value(string_value=str(v))
                for v in row
            ]
            for row in rows
        ]
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

    def add_error(self, method: str, code: Any, message: str = "injected") -> None:
        """Fail the next call of a gRPC method (e.g. ``"Commit"``) with a status code."""
        from grpc_status.rpc_status import _Status

        self.spanner_svc.mock_spanner.add_error(method, _Status(code, message, ()))

    @property
    def requests(self) -> list[Any]:
        return list(self.spanner_svc.requests)

    def executed_sql(self) -> list[str]:
        """SQL text of every ExecuteSql / ExecuteStreamingSql / ExecuteBatchDml request."""
        out: list[str] = []
        for r in self.spanner_svc.requests:
            if hasattr(r, "statements"):
                out.extend(s.sql for s in r.statements)
            elif hasattr(r, "sql"):
                out.append(r.sql)
        return out

    def count(self, request_type: str) -> int:
        """How many requests of a type (e.g. ``"CommitRequest"``) arrived."""
        return sum(type(r).__name__ == request_type for r in self.spanner_svc.requests)

    def clear(self) -> None:
        self.spanner_svc.clear_requests()

    def stop(self) -> None:
        self.server.stop(0)
