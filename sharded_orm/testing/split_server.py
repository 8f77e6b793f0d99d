"""An in-process gRPC server that answers ``DatabaseAdmin.AddSplitPoints`` (the emulator
answers 501), for tests of split points: the request as sent, a silent server, a reset.

:func:`split_server` takes the servicer's handler, ``handler(request, context)`` (the
``AddSplitPointsRequest`` received and grpc's servicer context): it records the request,
sleeps, aborts with ``context.abort(code, text)``, and returns an
``AddSplitPointsResponse`` (None: an empty one). The server also serves google-cloud-spanner's
mock Spanner service, so an engine on it connects.

grpc and google-cloud-spanner are imported when a server is started, never at import.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["SplitServer", "split_server"]

#: The project, instance and database the server's client and engine name (any will do:
#: the server answers every name).
PROJECT, INSTANCE, DATABASE = "p", "i", "d"
_ADMIN_SERVICE = "google.spanner.admin.database.v1.DatabaseAdmin"


@dataclass(frozen=True)
class SplitServer:
    """A started split server: its ``target`` (``127.0.0.1:PORT``), a google-cloud-spanner
    ``client`` on it, the client's ``database`` handle, and a SQLAlchemy ``engine`` whose
    connections use that client."""

    target: str
    client: Any
    database: Any
    engine: Any


@contextmanager
def split_server(handler: Callable[[Any, Any], Any], *, workers: int = 8) -> Iterator[SplitServer]:
    """A server on a free port whose ``AddSplitPoints`` is ``handler`` (see the module),
    served by ``workers`` threads; the engine is disposed of and the server stopped on
    exit."""
    from concurrent import futures

    import google.cloud.spanner_v1.testing.spanner_pb2_grpc as spanner_grpc
    import grpc
    import sqlalchemy as sa
    from google.cloud.spanner_admin_database_v1.types import (
        AddSplitPointsRequest,
        AddSplitPointsResponse,
    )
    from google.cloud.spanner_v1.testing.mock_spanner import SpannerServicer

    def answer(request: Any, context: Any) -> Any:
        reply = handler(request, context)
        return AddSplitPointsResponse() if reply is None else reply

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    mock = SpannerServicer()  # type: ignore[no-untyped-call]
    spanner_grpc.add_SpannerServicer_to_server(mock, server)  # type: ignore[no-untyped-call]
    method = grpc.unary_unary_rpc_method_handler(
        answer,
        request_deserializer=AddSplitPointsRequest.deserialize,
        response_serializer=AddSplitPointsResponse.serialize,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(_ADMIN_SERVICE, {"AddSplitPoints": method}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    engine: Any = None
    try:
        target = f"127.0.0.1:{port}"
        client = _client(target)
        engine = sa.create_engine(
            f"spanner+spanner:///projects/{PROJECT}/instances/{INSTANCE}/databases/{DATABASE}",
            connect_args={"client": client},
        )
        database = client.instance(INSTANCE).database(DATABASE)
        yield SplitServer(target, client, database, engine)
    finally:
        if engine is not None:
            engine.dispose()
        server.stop(0)


def _client(target: str) -> Any:
    """A google-cloud-spanner client on ``target``, made with ``SPANNER_EMULATOR_HOST``
    unset (the client reads it once, when made: set, it would talk to the emulator)."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import spanner

    saved = os.environ.pop("SPANNER_EMULATOR_HOST", None)
    try:
        return spanner.Client(
            project=PROJECT,
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options=ClientOptions(api_endpoint=target),
            disable_builtin_metrics=True,
        )
    finally:
        if saved is not None:
            os.environ["SPANNER_EMULATOR_HOST"] = saved
