"""Import order never changes what an engine does (issue 31, item 3).

An engine made before ``import sharded_orm`` (a ``db.py`` imported before ``models.py``),
or on the stock dialect an app registered itself (upstream's samples do), has
sqlalchemy-spanner's own dialect class. It gets what needs no dialect class (a descending
key part rendered DESC, Spanner's index clauses) and is refused, with the library's own
error naming the fix, wherever sharded-orm's behaviour needs our dialect: a sharded
table's DDL, writes and sharded reads (``sharded_orm/spanner/stock.py``). Import order
matters only once per process, so each order runs in a subprocess of its own.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from google.cloud.sqlalchemy_spanner import sqlalchemy_spanner as stock
from sqlalchemy.schema import CreateIndex, CreateTable

from sharded_orm import UnsupportedOnDialectError, compute_shard, sharded_select
from sharded_orm.spanner.dialect import SpannerDialect

sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_order_models import Event, LastAccess  # noqa: E402

HERE = Path(__file__).resolve().parent
T0 = dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc)
FIX = "Import sharded_orm before create_engine"
STOCK_MODULE = "google.cloud.sqlalchemy_spanner.sqlalchemy_spanner"

#: how the process gets its engine: before the library, on a stock dialect the app
#: registered itself, or after the library (the order that always worked)
ORDERS = {
    "engine_first": "engine = sa.create_engine(URL)\nimport sharded_orm\n",
    "app_registers_stock": (
        "import sharded_orm\n"
        "from sqlalchemy.dialects import registry\n"
        f"registry.register('spanner', {STOCK_MODULE!r}, 'SpannerDialect')\n"
        "engine = sa.create_engine(URL.replace('spanner+spanner:', 'spanner:'))\n"
    ),
    "library_first": "import sharded_orm\nengine = sa.create_engine(URL)\n",
}


def run(order: str, body: str, url: str, host: str | None = None) -> dict[str, Any]:
    """Run ``body`` after the ``order``'s prelude in a fresh process; its printed JSON."""
    code = "import json, sqlalchemy as sa\n" + ORDERS[order] + textwrap.dedent(body)
    env = {**os.environ, "URL": url, "PYTHONPATH": str(HERE)}
    if host is not None:
        env["SPANNER_EMULATOR_HOST"] = host
    code = f"import os\nURL = os.environ['URL']\n{code}"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# --------------------------------------------------------------------- offline, in-process


def test_a_stock_dialect_renders_a_descending_key_as_ours_does() -> None:
    create = CreateTable(LastAccess.__table__)
    theirs = str(create.compile(dialect=stock.SpannerDialect()))
    assert "PRIMARY KEY (user_id, last_access DESC)" in theirs
    assert theirs == str(create.compile(dialect=SpannerDialect()))


def test_a_stock_dialect_renders_an_index_given_spanner_keywords() -> None:
    """Once our keywords are declared, the stock compiler iterated ``storing=None``."""
    (index,) = LastAccess.__table__.indexes
    theirs = str(CreateIndex(index).compile(dialect=stock.SpannerDialect()))
    assert theirs == "CREATE NULL_FILTERED INDEX last_access_by_code ON last_access (code)"


def test_a_stock_dialect_compiles_plain_statements_as_stock() -> None:
    t = sa.Table("plain", sa.MetaData(), sa.Column("id", sa.BigInteger, primary_key=True))
    dialect = stock.SpannerDialect()
    assert str(CreateTable(t).compile(dialect=dialect)).strip().endswith("PRIMARY KEY (id)")
    assert str(t.insert().compile(dialect=dialect)) == "INSERT INTO plain (id) VALUES (:id)"


@pytest.mark.parametrize(
    "what",
    ["create table", "create index", "insert", "update", "sharded read", "pinned read"],
)
def test_a_stock_dialect_refuses_what_needs_ours(what: str) -> None:
    table = Event.__table__
    statement = {
        "create table": CreateTable(table),
        "create index": CreateIndex(next(iter(table.indexes))),
        "insert": table.insert().values(id=1, ts=T0),
        "update": table.update().values(ts=T0),
        "sharded read": sharded_select(Event, index="events_by_ts"),
        "pinned read": sharded_select(Event, index="events_by_ts").where(Event.ts == T0),
    }[what]
    with pytest.raises(UnsupportedOnDialectError, match=FIX):
        statement.compile(dialect=stock.SpannerDialect())
    statement.compile(dialect=SpannerDialect())  # ours: compiles


# --------------------------------------------------------------------------- on the emulator

DESC_BODY = """
from import_order_models import DescBase
DescBase.metadata.create_all(engine)
with engine.connect() as conn:
    key = conn.execute(sa.text(
        "SELECT column_name, column_ordering FROM information_schema.index_columns "
        "WHERE table_name = 'last_access' AND index_name = 'PRIMARY_KEY' "
        "ORDER BY ordinal_position")).all()
    nf = conn.execute(sa.text(
        "SELECT is_null_filtered FROM information_schema.indexes "
        "WHERE index_name = 'last_access_by_code'")).scalar_one()
print(json.dumps({"dialect": type(engine.dialect).__module__, "key": [list(r) for r in key],
                  "null_filtered": nf}))
"""


# a subprocess per import order; quick loop: test_on_sqlite_an_engine_made_first_gets_the_library,
# test_a_stock_dialect_renders_a_descending_key_as_ours_does
@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.parametrize("order", list(ORDERS))
def test_a_descending_key_is_created_descending_in_any_order(
    spanner_emulator: Any, order: str
) -> None:
    url = spanner_emulator.url(spanner_emulator.create_database())
    got = run(order, DESC_BODY, url, spanner_emulator.host)
    stock_class = order != "library_first"
    assert (got["dialect"] == STOCK_MODULE) is stock_class
    assert got["key"] == [["user_id", "ASC"], ["last_access", "DESC"]]
    assert got["null_filtered"] is True


SHARDED_BODY = """
import datetime as dt
from sqlalchemy.orm import Session
from sharded_orm import merged, sharded_select
from import_order_models import Event, ShardBase

T0 = dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc)
table = Event.__table__
out = {"dialect": type(engine.dialect).__module__}

def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except Exception as e:
        out[name] = type(e).__name__ + ": " + str(e)

def tables():
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = ''"
        )).scalars().all()

attempt("create_all", lambda: ShardBase.metadata.create_all(engine))
out["tables_after_create_all"] = tables()
if "events" not in out["tables_after_create_all"]:  # made by an engine of ours
    made = sa.create_engine(URL)
    ShardBase.metadata.create_all(made)
    made.dispose()

def core_insert():
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"id": 1, "ts": T0}])

def core_update():
    with engine.begin() as conn:
        conn.execute(table.update().where(table.c.id == 1).values(ts=T0))

def orm_insert():
    with Session(engine) as s:
        s.add(Event(id=2, ts=T0))
        s.commit()

def sharded_read():
    with Session(engine) as s:
        s.scalars(sharded_select(Event, index="events_by_ts")).all()

def merged_read():
    with Session(engine) as s:
        merged(s, sharded_select(Event, index="events_by_ts").order_by(Event.ts), limit=5)

def plain_read():
    with engine.connect() as conn:
        conn.execute(sa.select(table)).all()

for name, fn in [("core_insert", core_insert), ("core_update", core_update),
                 ("orm_insert", orm_insert), ("sharded_read", sharded_read),
                 ("merged_read", merged_read), ("plain_read", plain_read)]:
    attempt(name, fn)
with engine.connect() as conn:
    out["rows"] = [list(r) for r in conn.execute(sa.select(table.c.id, table.c.shard)).all()]
print(json.dumps(out))
"""

REFUSED_STEPS = ["create_all", "core_insert", "core_update", "orm_insert", "sharded_read"]


# a subprocess per import order; quick loop: test_on_sqlite_an_engine_made_first_gets_the_library,
# test_a_stock_dialect_refuses_what_needs_ours
@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.parametrize("order", list(ORDERS))
def test_a_sharded_table_on_a_stock_engine_is_refused_before_anything_is_sent(
    spanner_emulator: Any, order: str
) -> None:
    url = spanner_emulator.url(spanner_emulator.create_database())
    got = run(order, SHARDED_BODY, url, spanner_emulator.host)
    assert got["plain_read"] == "ok"  # a plain SELECT needs nothing of the library
    if order == "library_first":
        assert all(got[step] == "ok" for step in [*REFUSED_STEPS, "merged_read"]), got
        assert sorted(got["rows"]) == [[1, compute_shard([T0], 4)], [2, compute_shard([T0], 4)]]
        return
    assert got["dialect"] == STOCK_MODULE
    for step in [*REFUSED_STEPS, "merged_read"]:
        assert got[step].startswith("UnsupportedOnDialectError: "), (step, got[step])
        assert FIX in got[step]
    assert got["tables_after_create_all"] == []  # refused before the first CREATE TABLE
    assert got["rows"] == []  # and no write reached the database


# --------------------------------------------------------------------------- SQLite

SQLITE_BODY = """
import datetime as dt
from sqlalchemy.orm import Session
from import_order_models import Event, ShardBase
from sharded_orm import compute_shard
T0 = dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc)
ShardBase.metadata.create_all(engine)
with engine.begin() as conn:  # a Core write: the engine was watched at create_all
    conn.execute(Event.__table__.insert(), [{"id": 1, "ts": T0}])
with Session(engine) as s:
    s.add(Event(id=2, ts=T0))
    s.commit()
    shards = [e.shard for e in s.scalars(sa.select(Event).order_by(Event.id))]
print(json.dumps({"ok": shards == [compute_shard([T0], 4)] * 2}))
"""


@pytest.mark.parametrize("order", ["engine_first", "library_first"])
def test_on_sqlite_an_engine_made_first_gets_the_library(tmp_path: Path, order: str) -> None:
    """Not Spanner: no dialect class of ours is involved, the engine is watched at its
    first contact with a sharded table whatever the order."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    assert run(order, SQLITE_BODY, url) == {"ok": True}
