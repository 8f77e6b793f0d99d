"""``import alembic_ext`` gives migrations ``op.backfill_shard`` and our other ops (issue 45).

docs/migrations.md and alembic_ext's docstring say ``import alembic_ext`` does what the
Spanner dialect does, which registers our operations on Alembic's ``Operations``. It did
not: the package ``__init__`` loads its names lazily, so on SQLite (no Spanner dialect
loaded) ``op.backfill_shard`` was ``AttributeError: 'Operations' object has no attribute
'backfill_shard'`` unless ``alembic_ext.ops`` was imported by name. Now the package
registers the same stand-ins the dialect does (``alembic_ext.register_operations``): each
loads ``alembic_ext.ops`` on its first call. With the package installed, Alembic imports
``alembic_ext`` itself while its own import is half done (the ``alembic.plugins`` entry
point), so both orders are run: ``import alembic_ext`` first, and ``import alembic`` first
(as in env.py). Import order matters, so each case runs in a clean subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from sharded_orm.hashing import compute_shard

#: the operations alembic_ext registers (alembic_ext.stand_ins.OPERATIONS, written out)
NAMES = (
    "backfill_shard",
    "alter_index_storing",
    "copy_table_rows",
    "retire_table",
    "verify_tables",
)
#: source values of the small table: ASCII, non-ASCII, empty, long
SOURCES = ["alice", "Zoë", "", "b" * 300, "日本語", "x y"]
COUNT = 7

SCRIPT = """
import json, os, sys
{imports}
import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations

out = {{
    "registered": [n for n in json.loads(os.environ["NAMES"]) if hasattr(Operations, n)],
    "library_before_call": sorted(
        m for m in sys.modules if m.split(".")[0] == "sharded_orm" or m == "alembic_ext.ops"
    ),
    "heavy_before_call": sorted(
        m for m in sys.modules if m.startswith(("google.cloud.spanner", "grpc", "apache_beam"))
    ),
}}
engine = sa.create_engine("sqlite://")
sources = json.loads(os.environ["SOURCES"])
with engine.begin() as conn:
    conn.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, shard INTEGER)")
    conn.execute(
        sa.text("INSERT INTO t (id, name) VALUES (:id, :name)"),
        [{{"id": i, "name": s}} for i, s in enumerate(sources)],
    )
with engine.connect() as conn:
    op = Operations(MigrationContext.configure(conn))
    try:
        op.backfill_shard("t", "shard", sources=["name"], count=int(os.environ["COUNT"]))
        out["call"] = "ok"
    except Exception as e:
        out["call"] = type(e).__module__ + "." + type(e).__name__ + ": " + str(e)
    conn.commit()
with engine.connect() as conn:
    out["rows"] = [list(r) for r in conn.exec_driver_sql("SELECT id, shard FROM t ORDER BY id")]
out["heavy_after_call"] = sorted(
    m for m in sys.modules if m.startswith(("google.cloud.spanner", "grpc", "apache_beam"))
)
print(json.dumps(out))
"""


def run(imports: str) -> Any:
    env = {
        **os.environ,
        "NAMES": json.dumps(NAMES),
        "SOURCES": json.dumps(SOURCES),
        "COUNT": str(COUNT),
        "SPANNER_DISABLE_BUILTIN_METRICS": "true",
    }
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(imports=imports)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "imports",
    [
        pytest.param("import alembic_ext", id="alembic_ext_first"),
        # env.py's order: Alembic is imported first and loads alembic_ext itself, half done
        pytest.param("import alembic\nimport alembic_ext", id="alembic_first"),
    ],
)
def test_import_alembic_ext_registers_the_operations_and_backfill_runs_on_sqlite(
    imports: str,
) -> None:
    got = run(imports)
    assert got["registered"] == list(NAMES)
    # registering loads nothing of the library, nor a Spanner client, until the first call
    assert got["library_before_call"] == []
    assert got["heavy_before_call"] == []
    assert got["call"] == "ok"
    assert got["rows"] == [[i, compute_shard([s], COUNT)] for i, s in enumerate(SOURCES)]
    assert got["heavy_after_call"] == []
