"""An app's own Alembic ``SpannerImpl`` is honoured, never silently replaced (issue 31, item 3).

sqlalchemy-spanner's README tells apps to define ``class SpannerImpl(DefaultImpl):
__dialect__ = "spanner+spanner"`` in env.py. Alembic keeps the impl defined last, and our
dialect defines ours when it loads, so which one ran depended on import order. Now the
app's impl runs in either order (ours does not register over one defined before it), and
what of ours needs our impl refuses on it, saying why (``alembic_ext/impl_guard.py``); a
subclass of ours gets everything. Each order runs in a subprocess of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

APP_IMPL = (
    "from alembic.ddl.impl import DefaultImpl\n"
    "class SpannerImpl(DefaultImpl):\n"
    "    __dialect__ = 'spanner+spanner'\n"
)
ENGINE = "import sharded_orm\nengine = sa.create_engine(URL)\n"
ORDERS = {
    "app_impl_first": APP_IMPL + ENGINE,
    "app_impl_after_the_dialect": ENGINE + APP_IMPL,
    "app_impl_subclasses_ours": (
        "import sharded_orm\n"
        "from alembic_ext import SpannerImpl as ShardedSpannerImpl\n"
        "class SpannerImpl(ShardedSpannerImpl):\n"
        "    __dialect__ = 'spanner+spanner'\n" + "engine = sa.create_engine(URL)\n"
    ),
    "no_app_impl": ENGINE,
}
#: the impl each order runs, and whether our features work on it
EXPECTED = {
    "app_impl_first": ("__main__.SpannerImpl", False),
    "app_impl_after_the_dialect": ("__main__.SpannerImpl", False),
    "app_impl_subclasses_ours": ("__main__.SpannerImpl", True),
    "no_app_impl": ("alembic_ext.impl.SpannerImpl", True),
}
#: what Alembic finds where it differs from what it runs: the class our dialect registers,
#: which builds alembic_ext.impl.SpannerImpl (an engine loads none of alembic_ext, issue 45)
REGISTERED = {"no_app_impl": "sharded_orm.spanner.alembic_impl.SpannerImpl"}
REASON = "needs sharded-orm's Alembic impl (alembic_ext.SpannerImpl)"
FAKE_URL = "spanner+spanner:///projects/p/instances/i/databases/d"


def run(order: str, body: str, url: str = FAKE_URL, host: str | None = None) -> dict[str, Any]:
    code = (
        "import os, json, sqlalchemy as sa\nURL = os.environ['URL']\n"
        + ORDERS[order]
        + textwrap.dedent(body)
    )
    env = {**os.environ, "URL": url}
    if host is not None:
        env["SPANNER_EMULATOR_HOST"] = host
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


OFFLINE = """
import io
from alembic.ddl.impl import DefaultImpl
from alembic.migration import MigrationContext
from alembic.operations import Operations

registered = DefaultImpl.get_by_dialect(engine.dialect)
buf = io.StringIO()
ctx = MigrationContext.configure(
    dialect_name="spanner+spanner", opts={"as_sql": True, "output_buffer": buf}
)
op = Operations(ctx)
out = {"registered": registered.__module__ + "." + registered.__qualname__,
       "runs": type(ctx.impl).__module__ + "." + type(ctx.impl).__qualname__}
op.create_table("plain", sa.Column("id", sa.BigInteger, primary_key=True))
out["plain_op"] = "plain (" in buf.getvalue()
for name, call in [
    ("backfill_shard", lambda: op.backfill_shard("t", "s", sources=["a"], count=4)),
    ("alter_index_storing", lambda: op.alter_index_storing("ix", "t", add=["a"])),
]:
    try:
        call()
        out[name] = "ok"
    except Exception as e:
        out[name] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
"""


# 4 import orders, each a migration; quick loop:
# test_our_autogenerate_plugin_says_why_it_cannot_run_on_the_apps_impl
@pytest.mark.slow
@pytest.mark.parametrize("order", list(ORDERS))
def test_the_apps_impl_runs_and_our_operations_say_why_they_cannot(order: str) -> None:
    got = run(order, OFFLINE)
    impl, ours_work = EXPECTED[order]
    assert got["registered"] == REGISTERED.get(order, impl)
    assert got["runs"] == impl
    assert got["plain_op"] is True  # the app's migrations run as they did
    for name in ("backfill_shard", "alter_index_storing"):
        if ours_work:
            assert got[name] == "ok", got[name]
        else:
            assert got[name].startswith("MigrationError: op."), got[name]
            assert REASON in got[name] and "__main__.SpannerImpl" in got[name]


AUTOGENERATE = """
import datetime as dt
from alembic.autogenerate import produce_migrations
from alembic.migration import MigrationContext
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sharded_orm import UTCDateTime, shard_column

class Base(DeclarativeBase):
    pass

class Event(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    shard: Mapped[int] = shard_column("ts", count=4)

plugins = ["alembic.autogenerate.*", "sharded_orm.*"]
with engine.connect() as conn:
    ctx = MigrationContext.configure(
        conn, opts={"target_metadata": Base.metadata, "autogenerate_plugins": plugins}
    )
    out = {"runs": type(ctx.impl).__module__}
    try:
        ops = produce_migrations(ctx, Base.metadata).upgrade_ops.ops
        out["autogenerate"] = [type(o).__name__ for o in ops]
    except Exception as e:
        out["autogenerate"] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
"""


#: the orders the autogenerate test runs: the app's impl defined before and after our
#: dialect loads; our own impl, in a subprocess of its own (seconds), is slow; quick loop:
#: test_adopt_autogenerate.py::test_autogenerate_over_create_all_is_empty (our autogenerate
#: on our impl, on the emulator)
AUTOGENERATE_ORDERS = [
    "app_impl_first",
    "app_impl_after_the_dialect",
    pytest.param("no_app_impl", marks=pytest.mark.slow),
]


@pytest.mark.emulator
@pytest.mark.parametrize("order", AUTOGENERATE_ORDERS)
def test_our_autogenerate_plugin_says_why_it_cannot_run_on_the_apps_impl(
    spanner_emulator: Any, order: str
) -> None:
    url = spanner_emulator.url(spanner_emulator.create_database())
    got = run(order, AUTOGENERATE, url, spanner_emulator.host)
    if EXPECTED[order][1]:
        assert got["autogenerate"] == ["CreateTableOp"]
    else:
        assert got["runs"] == "__main__"
        assert got["autogenerate"].startswith("MigrationError: sharded-orm's autogenerate")
        assert REASON in got["autogenerate"]
