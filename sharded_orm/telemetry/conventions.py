"""The OpenTelemetry database conventions' attributes of one operation: which system
(``db.system.name``), which database (``db.namespace``, on Spanner ``instance|database``),
which server (``server.address``/``server.port``, on Spanner the endpoint the client
connects to), read from the bind's dialect and URL, never from a row or a parameter."""

from __future__ import annotations

import os
from typing import Any

_SYSTEMS = {
    "spanner": "gcp.spanner",
    "sqlite": "sqlite",
    "postgresql": "postgresql",
    "mysql": "mysql",
    "mariadb": "mariadb",
    "mssql": "microsoft.sql_server",
    "oracle": "oracle.db",
    "cockroachdb": "cockroachdb",
}


def dialect_and_url(bind: Any) -> tuple[Any, Any]:
    """The dialect and URL behind a Connection, Engine or Session (async ones too)."""
    for attr in ("sync_session", "sync_connection", "sync_engine"):
        bind = getattr(bind, attr, None) or bind
    if hasattr(bind, "get_bind") and not hasattr(bind, "dialect"):
        try:
            bind = bind.get_bind()
        except Exception:  # a Session bound per mapper, none given: no database attributes
            return None, None
    engine = getattr(bind, "engine", bind)
    return getattr(bind, "dialect", None), getattr(engine, "url", None)


def _namespace(system: str, url: Any) -> str | None:
    database = getattr(url, "database", None)
    if not database:
        return None
    if system == "gcp.spanner":
        # projects/P/instances/I/databases/D -> I|D (most general first, '|' between)
        parts = str(database).split("/")
        named = dict(zip(parts[::2], parts[1::2], strict=False))
        found = [named[k] for k in ("instances", "databases") if k in named]
        return "|".join(found) or None
    return str(database)


def _spanner_endpoint() -> tuple[str, int | None]:
    """Where the Spanner client connects when the URL names no host: the emulator's
    ``SPANNER_EMULATOR_HOST`` (host:port) if set, else Google's endpoint."""
    emulator = os.environ.get("SPANNER_EMULATOR_HOST")
    if emulator:
        host, _, port = emulator.rpartition(":")
        if host and port.isdigit():
            return host.strip("[]"), int(port)  # an IPv6 address without its brackets
        return emulator, None
    return "spanner.googleapis.com", 443


def database_attributes(bind: Any, operation: str, table: str | None) -> dict[str, Any]:
    """The conventions' attributes of an operation on ``table`` through ``bind``."""
    attrs: dict[str, Any] = {"db.operation.name": operation}
    dialect, url = dialect_and_url(bind)
    name = str(getattr(dialect, "name", "") or "")
    if dialect is not None:
        system = _SYSTEMS.get(name.split("+")[0], "other_sql")
        attrs["db.system.name"] = system
        namespace = _namespace(system, url)
        if namespace:
            attrs["db.namespace"] = namespace
        host, port = getattr(url, "host", None), getattr(url, "port", None)
        if not host and system == "gcp.spanner":  # the endpoint the Spanner client uses
            host, port = _spanner_endpoint()
        if host:
            attrs["server.address"] = str(host)
            if port:
                attrs["server.port"] = int(port)
    if table:
        attrs["db.collection.name"] = table
    return attrs
