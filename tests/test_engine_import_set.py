"""What the first Spanner engine loads beyond sqlalchemy-spanner's own engine (issue 45).

``import sharded_orm`` then ``create_engine("spanner+spanner:///...")`` may load stock's
modules (a stock engine made in a clean interpreter) and the modules named in
:data:`ALLOWED`, each with the reason it is needed before the engine's first statement.
Anything else (a client module stock does not load, Alembic beyond stock's, telemetry
exporters, the read layer, our DB-API connection before the first connect) fails here
by name: load it where it is first used, or add it to :data:`ALLOWED` with its reason.
Module sets, not timings: ``benchmarks/bench_engine_import.py`` has the CPU figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import sqlalchemy as sa

URL = "spanner+spanner:///projects/p/instances/i/databases/d"

#: reason -> modules (beyond a stock engine's) loaded by ``import sharded_orm`` and the
#: first engine; each module under exactly one reason
_REASONS: dict[str, tuple[str, ...]] = {
    # ``import sharded_orm`` installs its mapper hooks on ``sqlalchemy.orm.Mapper``
    # (write.orm_events, write.session_events), so the ORM loads with it (any sharded
    # model is an ORM model); ``sqlalchemy.orm`` itself loads these two
    "the ORM, for the mapper hooks": (
        "sqlalchemy.orm",
        "sqlalchemy.future",
        "sqlalchemy.future.engine",
        "sqlalchemy.sql._orm_types",
    ),
    # the package and what its registrations need: errors, checks, limits, hashing
    "the package and its foundations": (
        "sharded_orm",
        "sharded_orm.checks",
        "sharded_orm.errors",
        "sharded_orm.hashing",
        "sharded_orm.limits",
        "sharded_orm.memo",
        "sharded_orm.retry",
    ),
    # shard columns, keys and indexes: the ORM hooks and the DDL compilers read them
    "the schema layer (shard columns, keys, the table registry)": (
        "sharded_orm.schema",
        "sharded_orm.schema.coerce",
        "sharded_orm.schema.columns",
        "sharded_orm.schema.declare",
        "sharded_orm.schema.indexes",
        "sharded_orm.schema.interleave",
        "sharded_orm.schema.keys",
        "sharded_orm.schema.naive",
        "sharded_orm.schema.pieces",
        "sharded_orm.schema.registry",
        "sharded_orm.schema.source_errors",
        "sharded_orm.schema.timestamps",
        "sharded_orm.schema.types",
    ),
    # every Spanner engine is watched from create_engine (SpannerDialect.engine_created
    # -> write.engine_hook.watch): the write checks are attached before any statement
    "the write checks attached to every Spanner engine": (
        "sharded_orm.write",
        "sharded_orm.write.begin",
        "sharded_orm.write.engine_hook",
        "sharded_orm.write.fastpath",
        "sharded_orm.write.key_moves",
        "sharded_orm.write.mirror_io",
        "sharded_orm.write.mirror_keys",
        "sharded_orm.write.mirror_rules",
        "sharded_orm.write.offsets",
        "sharded_orm.write.orm_events",
        "sharded_orm.write.row_errors",
        "sharded_orm.write.rows",
        "sharded_orm.write.session_events",
        "sharded_orm.write.sql",
        "sharded_orm.write.statements",
        "sharded_orm.write.stock_writes",
        "sharded_orm.write.stored",
        "sharded_orm.write.successor",
        "sharded_orm.write.successor_plan",
        "sharded_orm.write.targets",
        "sharded_orm.write.trust",
    ),
    # our own telemetry (no exporter, no OpenTelemetry): spans and clock-skew counters
    # the write hook and the statement deadlines record into
    "sharded_orm's span and skew recorders": (
        "sharded_orm.telemetry",
        "sharded_orm.telemetry.api",
        "sharded_orm.telemetry.conventions",
        "sharded_orm.telemetry.skew",
        "sharded_orm.telemetry.spans",
    ),
    # the dialect class and what its class body and __init__ name: the compilers, the
    # bound reflection (a base class), the per-statement deadline cursor, the commit
    # timeout's check, the small class Alembic finds by dialect name, the stock-engine
    # guard; our DB-API connection (.connection, .statements) loads at the first connect
    "the dialect and what its class needs": (
        "sharded_orm.spanner",
        "sharded_orm.spanner.alembic_impl",
        "sharded_orm.spanner.commits",
        "sharded_orm.spanner.ddl",
        "sharded_orm.spanner.deadlines",
        "sharded_orm.spanner.dialect",
        "sharded_orm.spanner.expressions",
        "sharded_orm.spanner.reflection",
        "sharded_orm.spanner.stock",
    ),
    # each engine's client Database noted at every new connection (a pool ``connect``
    # event), so id pools and load tools reach it without a checkout (issue 46)
    "the client Database noted per engine": ("sharded_orm.spanner.databases",),
}
#: module -> why the first engine may load it beyond a stock engine
ALLOWED: dict[str, str] = {m: why for why, mods in _REASONS.items() for m in mods}
#: packages allowed whole (module -> reason above): the ORM's submodules
ALLOWED_PACKAGES = ("sqlalchemy.orm",)
#: loaded at the first connect, never by ``create_engine``
FIRST_CONNECT = ("sharded_orm.spanner.connection", "sharded_orm.spanner.statements")


def _modules(code: str) -> set[str]:
    env = {**os.environ, "SPANNER_DISABLE_BUILTIN_METRICS": "true"}
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


STOCK_ENGINE = (
    "import sqlalchemy as sa\n"
    f"engine = sa.create_engine({URL!r})\n"
    "assert type(engine.dialect).__module__.startswith('google.cloud.sqlalchemy_spanner')"
)
OUR_ENGINE = (
    "import sqlalchemy as sa, sharded_orm\n"
    f"engine = sa.create_engine({URL!r})\n"
    "assert type(engine.dialect).__module__ == 'sharded_orm.spanner.dialect'"
)


def _allowed(module: str) -> bool:
    return module in ALLOWED or any(module.startswith(f"{p}.") for p in ALLOWED_PACKAGES)


@pytest.fixture(scope="module")
def loaded() -> tuple[set[str], set[str]]:
    """(stock engine's modules, ours beyond them), each in a clean interpreter."""
    stock = _modules(STOCK_ENGINE)
    return stock, _modules(OUR_ENGINE) - stock


def test_the_first_engine_loads_stocks_modules_and_the_allowlist_only(
    loaded: tuple[set[str], set[str]],
) -> None:
    _, extra = loaded
    unexpected = sorted(m for m in extra if not _allowed(m))
    assert not unexpected, (
        f"create_engine on our dialect loads {len(unexpected)} module(s) a stock engine "
        f"does not, not in ALLOWED: {unexpected}; load them where first used, or add "
        "each to ALLOWED with its reason"
    )


def test_the_allowlist_names_only_modules_the_first_engine_loads(
    loaded: tuple[set[str], set[str]],
) -> None:
    """An entry for a module no longer loaded (or loaded by stock too) is stale."""
    _, extra = loaded
    stale = sorted(set(ALLOWED) - extra)
    assert not stale, f"no longer loaded beyond a stock engine, delete from ALLOWED: {stale}"


def test_our_dbapi_connection_loads_at_the_first_connect_not_before(
    loaded: tuple[set[str], set[str]],
) -> None:
    _, extra = loaded
    assert not extra & set(FIRST_CONNECT), sorted(extra & set(FIRST_CONNECT))
    assert not set(FIRST_CONNECT) & set(ALLOWED)


def test_the_allowlist_sees_a_regression() -> None:
    """A module the first engine should not load (here, the read layer's planner, pulled
    in after the engine is made) is reported by name."""
    stock = _modules(STOCK_ENGINE)
    extra = _modules(f"{OUR_ENGINE}\nimport sharded_orm.read.plan") - stock
    assert "sharded_orm.read.plan" in {m for m in extra if not _allowed(m)}


@pytest.mark.emulator
def test_the_first_connect_gets_our_connection_and_deadline_cursor(spanner_engine: Any) -> None:
    """The connection module, now loaded at the first connect: the engine's DB-API
    connection is still ours, each cursor ours with the statement's deadline, and a
    statement under a timeout runs."""
    from sharded_orm.spanner.connection import ShardedConnection, ShardedCursor

    with spanner_engine.connect() as conn:
        conn = conn.execution_options(timeout=30)
        assert conn.execute(sa.text("SELECT 1")).scalar() == 1
        driver = conn.connection.driver_connection
        assert isinstance(driver, ShardedConnection)
        cursor = conn.connection.cursor()
        assert isinstance(cursor, ShardedCursor)
        result = conn.exec_driver_sql("SELECT 2")
        assert isinstance(result.cursor, ShardedCursor)
        assert result.cursor.deadline_seconds == 30
        assert result.scalar() == 2
