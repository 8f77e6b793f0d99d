"""An app's Alembic impl defined after our dialect loaded still gets our operations (issue 45).

The dialect registers a light class for ``spanner+spanner`` and loads nothing of
alembic_ext (an engine pays for no migrations). Our operations (``op.backfill_shard``
and the others) used to be registered only when our full impl was built, or at dialect
load in an Alembic command or with an app's impl already defined. An app that defines
its own impl (as sqlalchemy-spanner's README shows) after the dialect loaded, and runs a
migration context outside an Alembic command, then got a bare ``AttributeError:
'Operations' object has no attribute 'backfill_shard'``. Alembic's
``Operations.register_operation`` is global (a method set on the ``Operations`` class,
whatever impl runs), so the dialect now registers each operation's name cheaply, and its
first call loads alembic_ext's operation, which refuses on the app's impl saying why and
what to do (``alembic_ext/impl_guard.py``). Import order matters, so each case runs in a
clean subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

#: every operation alembic_ext registers, and a call of it
CALLS = {
    "backfill_shard": "op.backfill_shard('t', 's', sources=['a'], count=4)",
    "alter_index_storing": "op.alter_index_storing('ix', 't', add=['a'])",
    "copy_table_rows": "op.copy_table_rows('t', 'u')",
    "retire_table": "op.retire_table('t', successor='u')",
    "verify_tables": "op.verify_tables('t', 'u')",
}
FAKE_URL = "spanner+spanner:///projects/p/instances/i/databases/d"
REASON = "needs sharded-orm's Alembic impl (alembic_ext.SpannerImpl)"
WHAT_TO_DO = "Make it a subclass of ours"

#: the dialect loads (an engine), then the app defines its impl, outside any command
PROLOGUE = """
import io, json, os, sys, sqlalchemy as sa
import sharded_orm
engine = sa.create_engine(os.environ["URL"])
from alembic.ddl.impl import DefaultImpl
class SpannerImpl(DefaultImpl):
    __dialect__ = "spanner+spanner"
from alembic.migration import MigrationContext
from alembic.operations import Operations
"""

CALL_EACH = """
out = {"runs": type(ctx.impl).__module__ + "." + type(ctx.impl).__qualname__,
       "alembic_ext_loaded": "alembic_ext.ops" in sys.modules}
for name, text in CALLS.items():
    try:
        eval(text)
        out[name] = "ok"
    except Exception as e:
        out[name] = type(e).__module__ + "." + type(e).__name__ + ": " + str(e)
"""

OFFLINE = (
    PROLOGUE
    + """
buf = io.StringIO()
ctx = MigrationContext.configure(
    dialect_name="spanner+spanner", opts={"as_sql": True, "output_buffer": buf}
)
op = Operations(ctx)
"""
    + CALL_EACH
    + """
# through alembic.op, as a migration script calls it
from alembic import op as proxy
with Operations.context(ctx):
    try:
        proxy.backfill_shard("t", "s", sources=["a"], count=4)
        out["alembic.op"] = "ok"
    except Exception as e:
        out["alembic.op"] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
"""
)

ONLINE = (
    PROLOGUE
    + """
with engine.connect() as conn:
    ctx = MigrationContext.configure(conn)
    op = Operations(ctx)
"""
    + "\n".join("    " + line for line in CALL_EACH.strip().splitlines())
    + "\nprint(json.dumps(out))\n"
)


def run(code: str, url: str = FAKE_URL, host: str | None = None) -> dict[str, Any]:
    env = {**os.environ, "URL": url}
    if host is not None:
        env["SPANNER_EMULATOR_HOST"] = host
    program = f"CALLS = {CALLS!r}\n" + code
    out = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def assert_refused_saying_what_to_do(got: dict[str, Any]) -> None:
    assert got["runs"] == "__main__.SpannerImpl"  # the app's impl is honoured
    for name in CALLS:
        assert got[name].startswith(f"alembic_ext.errors.MigrationError: op.{name} "), got[name]
        assert REASON in got[name] and "__main__.SpannerImpl" in got[name]
        assert WHAT_TO_DO in got[name]


def test_offline_every_operation_refuses_with_our_error_not_attribute_error() -> None:
    got = run(OFFLINE)
    assert_refused_saying_what_to_do(got)
    assert got["alembic.op"].startswith("MigrationError: op.backfill_shard "), got["alembic.op"]


@pytest.mark.emulator
def test_online_every_operation_refuses_with_our_error_not_attribute_error(
    spanner_emulator: Any,
) -> None:
    url = spanner_emulator.url(spanner_emulator.create_database())
    got = run(ONLINE, url, spanner_emulator.host)
    assert_refused_saying_what_to_do(got)


NAMES = """
import json, inspect, sys, sqlalchemy as sa
import sharded_orm
sa.create_engine("spanner+spanner:///projects/p/instances/i/databases/d")
from alembic.operations import Operations
out = {"loaded_by_engine": sorted(m for m in sys.modules if m.startswith("alembic_ext."))}
before = set(dir(Operations))
import alembic_ext.ops  # registers the real operations
out["new_names"] = sorted(set(dir(Operations)) - before)
out["signatures"] = {n: str(inspect.signature(getattr(Operations, n))) for n in CALLS}
print(json.dumps(out))
"""


def test_the_dialect_stands_in_for_every_operation_and_loads_none() -> None:
    """No operation of alembic_ext is missing from the names the dialect registers, the
    engine loads no alembic_ext module for them, and loading alembic_ext puts the real
    operations (their own signatures) in their place."""
    got = run(NAMES)
    # (Alembic's entry point: the plugin, and the stand-ins the dialect shares)
    assert got["loaded_by_engine"] == ["alembic_ext.plugin", "alembic_ext.stand_ins"]
    assert got["new_names"] == []
    assert got["signatures"]["backfill_shard"].startswith("(self, table_name: 'str'")
    assert got["signatures"]["retire_table"].startswith("(self, table: 'str'")
