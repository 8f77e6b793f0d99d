"""The gateway: every raw Spanner call lives in sharded_orm/spanner/ (issue 45).

* an architecture rule, read from the source (AST): outside ``sharded_orm/spanner/`` no
  module imports google-cloud-spanner or google-api-core, and none calls the client's
  raw methods (``Database.snapshot``, ``run_in_transaction``, ``update_ddl``,
  ``generate_query_batches``, the admin and Spanner stubs, ...), save the modules in
  :data:`ALLOWED`, each with its reason; an entry that no longer needs its place fails too,
  so the list only shrinks;
* the calls moved into the gateway keep a deadline: verify's partitioning under
  ``DEFAULTS["partition_query"]`` (no number of its own) and each ``AddSplitPoints`` of
  ``presplit`` under its ``timeout`` (the client's own default is an hour, retried).
"""

from __future__ import annotations

import ast
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from seed_models import Event

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sharded_orm", "alembic_ext")
#: the gateway: the one package that talks to google-cloud-spanner
GATEWAY = "sharded_orm/spanner/"
#: modules of the client libraries (and ``from google.cloud import spanner``)
CLIENT_MODULES = ("google.cloud.spanner", "google.api_core")
#: google-cloud-spanner's raw calls: methods of Database, Snapshot, BatchSnapshot, the
#: DB-API and the generated stubs, with names no module of ours uses for its own
RAW_METHODS = frozenset(
    {
        "snapshot",
        "batch_snapshot",
        "run_in_transaction",
        "execute_partitioned_dml",
        "update_ddl",
        "generate_query_batches",
        "generate_read_batches",
        "process_query_batch",
        "process_read_batch",
        "add_split_points",
        "update_database_ddl",
        "get_operation",
        "execute_sql",
        "execute_update",
        "batch_update",
        "execute_streaming_sql",
        "streaming_read",
        "create_session",
        "delete_session",
        "begin_transaction",
        "mutation_groups",
        "batch_write",
    }
)
#: attributes that hand out a raw client object: the generated stubs
RAW_ATTRIBUTES = frozenset({"spanner_api", "database_admin_api"})
#: called with no arguments these are the client's (``Database.batch()``, ``Client.instance(id)``
#: takes one): ours take arguments (``StoredRows.batch(keys)``), so only a call counts
RAW_CALLS = frozenset({"instance", "database"})

#: Modules outside the gateway that still import or call the client, and why.
ALLOWED = {
    # the test kit, not the library at run time: it makes and drops the emulator's
    # instances and databases, and builds the client's mock server and wire messages
    "sharded_orm/testing/emulator.py": "test kit: creates and drops emulator databases",
    "sharded_orm/testing/mock.py": "test kit: the client's in-process mock server",
    "sharded_orm/testing/faults.py": "test kit: the client's wire messages, to inject faults",
    "sharded_orm/testing/split_server.py": "test kit: an AddSplitPoints server and its client",
    # a value, no call: the schema layer sits below the gateway and cannot import it
    "sharded_orm/schema/value_codec.py": "decodes into the client's DatetimeWithNanoseconds",
    # not moved yet (issue 45, the next steps): each makes its own raw calls under a
    # Deadline already; moving them is mechanical but touches modules other work owns
    "sharded_orm/beam/spanner_io.py": "pending: Beam's own client, snapshot and partitions",
}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _client_import(node: ast.AST) -> str | None:
    """The client module ``node`` imports at run time, or None."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
        names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    else:
        return None
    return next((n for n in names if n.startswith(CLIENT_MODULES)), None)


def _raw_use(node: ast.AST) -> str | None:
    """The raw client call (or stub) ``node`` makes, or None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        name = node.func.attr
        if name in RAW_METHODS or name in RAW_CALLS:
            return f".{name}()"
        if name == "batch" and not node.args and not node.keywords:
            return ".batch()"
    if isinstance(node, ast.Attribute) and node.attr in RAW_ATTRIBUTES:
        return f".{node.attr}"
    return None


def findings(source: str, name: str = "<source>") -> list[str]:
    """Every client import and raw call in ``source`` (imports under ``TYPE_CHECKING``
    are annotations and do not count)."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            module = _client_import(child)
            if module is not None:
                found.append(f"{name}:{getattr(child, 'lineno', 0)} imports {module}")
            use = _raw_use(child)
            if use is not None:
                found.append(f"{name}:{getattr(child, 'lineno', 0)} calls {use}")
            visit(child)

    visit(ast.parse(source, name))
    return found


def _outside_the_gateway() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(GATEWAY):
                continue
            found = findings(path.read_text(encoding="utf-8"), rel)
            if found:
                out[rel] = found
    return out


def test_raw_spanner_calls_live_only_in_the_gateway() -> None:
    found = _outside_the_gateway()
    refused = [f for rel, fs in found.items() if rel not in ALLOWED for f in fs]
    assert not refused, (
        "google-cloud-spanner reached outside sharded_orm/spanner/ (the gateway): "
        f"{refused}; add a small typed function taking a sharded_orm.retry.Deadline to a "
        "module of sharded_orm/spanner/ and call it (docs/upstream.md, 'The gateway')"
    )


def test_every_allowed_module_still_needs_its_place() -> None:
    found = _outside_the_gateway()
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"these modules no longer reach the client: drop them from ALLOWED: {stale}"
    assert all(reason.strip() for reason in ALLOWED.values())


@pytest.mark.parametrize(
    "source",
    [
        "from google.cloud import spanner",
        "import google.cloud.spanner_v1.streamed",
        "from google.api_core import exceptions as api",
        "def f(db):\n    from google.cloud.spanner_admin_database_v1.types import X",
        "def f(db):\n    with db.snapshot() as s:\n        return s",
        "def f(db, w):\n    return db.run_in_transaction(w, timeout_secs=0)",
        "def f(db):\n    return db.update_ddl(['CREATE TABLE t']).result()",
        "def f(s):\n    return s.generate_query_batches('SELECT 1', timeout=1)",
        "def f(db):\n    return db.batch()",
        "def f(db):\n    return db._instance._client.database_admin_api",
        "def f(db):\n    return db.spanner_api.create_session(request=1)",
        "def f(c):\n    return c.instance('i').database('d')",
        "def f(t):\n    return t.execute_update('DELETE FROM t WHERE k = @v', params={})",
    ],
)
def test_the_rule_sees_each_kind_of_raw_use(source: str) -> None:
    assert findings(source)


@pytest.mark.parametrize(
    "source",
    [
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from google.api_core import x",
        "def f(rows, keys):\n    return rows.batch(keys)",
        "def f(snapshots, db, at):\n    return snapshots.snapshot_at(db, at)",
        "def f(f):\n    return f.database",
        "import google.protobuf",
    ],
)
def test_the_rule_leaves_our_own_names_alone(source: str) -> None:
    assert not findings(source)


class _Snapshot:
    """A batch snapshot noting the timeouts it is given."""

    def __init__(self) -> None:
        self.timeouts: list[tuple[str, float]] = []

    def generate_query_batches(self, sql: str, *, timeout: float) -> Any:
        self.timeouts.append(("partitions", timeout))
        return iter([1, 2])

    def process_query_batch(self, batch: Any, *, timeout: float) -> Any:
        self.timeouts.append(("rows", timeout))
        return iter([[batch]])


def test_verify_partitioning_is_bounded_by_the_named_default() -> None:
    from sharded_orm.load.verify import scan_partitions
    from sharded_orm.retry import DEFAULTS

    snap = _Snapshot()
    n, _ = scan_partitions(snap, "SELECT 1", lambda rows: (len(list(rows)), [0]), 2, 900.0)
    assert n == 2
    plan = [t for kind, t in snap.timeouts if kind == "partitions"]
    streams = [t for kind, t in snap.timeouts if kind == "rows"]
    assert len(plan) == 1 and DEFAULTS["partition_query"] - 1 < plan[0]
    assert plan[0] <= DEFAULTS["partition_query"] < 900.0
    assert len(streams) == 2 and all(899.0 < t <= 900.0 for t in streams)
    # a partition_timeout below the default bounds the partitioning too
    snap = _Snapshot()
    scan_partitions(snap, "SELECT 1", lambda rows: (len(list(rows)), [0]), 2, 3.0)
    assert all(2.0 < t <= 3.0 for _, t in snap.timeouts)


class _SilentSplits:
    """An AddSplitPoints that answers after ``delay`` seconds (a silent server)."""

    def __init__(self, delay: float) -> None:
        self.delay, self.calls = delay, 0

    def add_split_points(self, request: Any, context: Any) -> Any:
        from google.cloud.spanner_admin_database_v1.types import AddSplitPointsResponse

        self.calls += 1
        time.sleep(self.delay)
        return AddSplitPointsResponse()


@pytest.fixture
def silent_splits() -> Iterator[tuple[sa.Engine, _SilentSplits]]:
    """A Spanner engine on an in-process gRPC server whose AddSplitPoints stays silent."""
    from sharded_orm.testing.split_server import split_server

    silent = _SilentSplits(delay=30.0)
    with split_server(silent.add_split_points) as server:
        yield server.engine, silent


def test_presplit_on_a_silent_server_ends_within_its_timeout(
    silent_splits: tuple[sa.Engine, _SilentSplits],
) -> None:
    from sharded_orm.errors import ShardingError
    from sharded_orm.load.presplit import presplit

    engine, silent = silent_splits
    start = time.monotonic()
    with pytest.raises(ShardingError) as caught:
        presplit(engine, Event, timeout=1.5)
    took = time.monotonic() - start
    assert took < 4.0, f"presplit waited {took:.1f} s on a silent server (timeout 1.5 s)"
    message = str(caught.value)
    assert "did not answer AddSplitPoints request 1 of 1 within 1.5 s" in message
    assert "run presplit again" in message and "timeout=" in message
    assert silent.calls >= 1


def test_presplit_timeout_must_be_seconds() -> None:
    from sharded_orm.errors import ShardConfigError
    from sharded_orm.load.presplit import presplit

    engine = sa.create_engine("spanner+spanner:///projects/p/instances/i/databases/d")
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ShardConfigError, match="timeout must be a positive number"):
            presplit(engine, Event, timeout=bad)
