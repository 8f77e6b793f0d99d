"""What a key reshard's dual write cannot mirror is refused before anything is written,
saying what to do instead (``sharded_orm.write.mirror_rules``): each statement below
raises and leaves both tables as they were; what cannot be refused (a raw DB-API cursor)
is caught by ``compare_tables``, as ``op.verify_tables`` and the contract run it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from successor_models import assert_mirrored, logs, notes

from sharded_orm import ShardConfigError, bulk_load
from sharded_orm.load.copy import compare_tables

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
Note, Note16, NOTES = notes()
Log, Log16, LOGS = logs()
t = Note.__table__
other = sa.Table("Other", sa.MetaData(), sa.Column("EventId", sa.String(36), primary_key=True),
                 sa.Column("Kind", sa.String(40)))  # fmt: skip
KEY = ["ShardId", "Timestamp", "EventId"]

Write = Callable[[sa.Connection], Any]
ANYWHERE: list[tuple[str, Write, str]] = [
    ("insert from select", lambda c: c.execute(sa.insert(t).from_select(
        ["Timestamp", "EventId"], sa.select(sa.literal(T0), other.c.EventId))), "FROM SELECT"),
    ("key to SQL in an insert", lambda c: c.execute(sa.insert(t).values(
        Timestamp=T0, EventId=sa.func.lower("X"))), "key column 'EventId' to SQL"),
    ("multi-row VALUES without keys", lambda c: c.execute(sa.insert(t).values(
        [{"Timestamp": T0}, {"Timestamp": T0}])), "multi-row VALUES"),
    ("key to SQL in an update", lambda c: c.execute(sa.update(t).values(
        EventId=sa.func.lower(t.c.EventId))), "key column 'EventId' to SQL"),
    ("update from another table", lambda c: c.execute(sa.update(t).where(
        t.c.EventId == other.c.EventId).values(Kind="x")), "names 'Other'"),
    ("update set from another table", lambda c: c.execute(sa.update(t).values(
        Kind=other.c.Kind)), "UPDATE ... FROM"),
    ("delete with a subquery", lambda c: c.execute(sa.delete(t).where(
        t.c.EventId.in_(sa.select(other.c.EventId)))), "subquery"),
    ("delete with exists", lambda c: c.execute(sa.delete(t).where(
        sa.exists().where(other.c.EventId == t.c.EventId))), "subquery"),
    ("delete joined", lambda c: c.execute(sa.delete(t).where(
        t.c.EventId == other.c.EventId)), "names 'Other'"),
    ("where random()", lambda c: c.execute(sa.delete(t).where(
        sa.func.random() > 0)), "calls random()"),
    ("where now()", lambda c: c.execute(sa.update(t).where(
        t.c.Noted < sa.func.now()).values(Kind="x")), "calls now()"),
    ("text insert", lambda c: c.execute(sa.text(
        'INSERT INTO "MirrorNotes" ("ShardId", "EventId") VALUES (1, 3)')), "raw SQL"),
    ("text update", lambda c: c.execute(sa.text(
        "UPDATE MirrorNotes SET Kind = 'x'")), "raw SQL"),
    ("driver sql delete", lambda c: c.exec_driver_sql(
        "DELETE FROM `MirrorNotes` WHERE 1 = 1"), "raw SQL"),
    ("autocommit", lambda c: c.execution_options(isolation_level="AUTOCOMMIT").execute(
        sa.update(t).values(Kind="x")), "AUTOCOMMIT"),
]  # fmt: skip
SQLITE: list[tuple[str, Write, str]] = [
    ("or replace", lambda c: c.execute(sa.insert(t).prefix_with("OR REPLACE"), [
        {"Timestamp": T0, "EventId": "a", "Kind": "x"}]), "OR REPLACE"),
    ("upsert on another target", lambda c: c.execute(sqlite.insert(t).on_conflict_do_update(
        index_elements=["Kind"], set_={"Noted": None}), [{"Timestamp": T0, "EventId": "z"}]),
        "conflict target is not the primary key"),
    ("upsert setting a key column", lambda c: c.execute(sqlite.insert(t).on_conflict_do_update(
        index_elements=KEY, set_={"EventId": "b"}), [{"Timestamp": T0, "EventId": "a"}]),
        "sets a key column"),
]  # fmt: skip


def _seeded(engine: sa.Engine) -> sa.Engine:
    NOTES.create_all(engine)
    with engine.begin() as c:
        c.execute(sa.insert(t), [{"Timestamp": T0, "EventId": e, "Kind": e} for e in "ab"])
    return engine


@pytest.fixture(scope="module")
def lite() -> Any:
    engine = _seeded(sa.create_engine("sqlite://"))
    other.create(engine)
    yield engine
    engine.dispose()


@pytest.mark.parametrize(("write", "match"), [pytest.param(w, m, id=i) for i, w, m in
                                              ANYWHERE + SQLITE])  # fmt: skip
def test_refused_on_sqlite_with_nothing_written(lite: sa.Engine, write: Write, match: str) -> None:
    with pytest.raises(ShardConfigError, match=match), lite.connect() as c:
        write(c)
        c.commit()
    assert assert_mirrored(lite, Note, Note16) == 2


def test_bulk_load_that_cannot_be_mirrored_is_refused(lite: sa.Engine) -> None:
    with pytest.raises(ShardConfigError, match="INSERT OR REPLACE"):
        bulk_load(lite, Note, [{"timestamp": T0, "event_id": "a"}], mode="insert_or_update")
    row = {"timestamp": T0, "event_id": "new", "noted": T0, "token": "t"}
    bulk_load(lite, Note, [row], progress=False)
    assert assert_mirrored(lite, Note, Note16) == 3
    with lite.begin() as c:
        c.execute(sa.delete(t).where(t.c.EventId == "new"))


def test_a_raw_db_api_write_is_not_seen_and_verify_tables_finds_it(lite: sa.Engine) -> None:
    with lite.begin() as c:
        cursor = c.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        cursor.execute('UPDATE "MirrorNotes" SET "Kind" = \'raw\' WHERE "EventId" = \'a\'')
    assert compare_tables(lite, Note, Note16)["different"] == 1
    with lite.begin() as c:
        c.execute(sa.update(t).where(t.c.EventId == "a").values(Kind="a"))
    assert assert_mirrored(lite, Note, Note16) == 2


@pytest.mark.emulator
def test_refused_on_spanner_with_nothing_written(spanner_engine: sa.Engine) -> None:
    from google.cloud.spanner_dbapi.parsed_statement import AutocommitDmlMode

    engine = _seeded(spanner_engine)
    LOGS.create_all(engine)
    other.create(engine)
    for name, write, match in ANYWHERE:
        with pytest.raises(ShardConfigError, match=match), engine.connect() as c:
            write(c)
            c.commit()
        assert assert_mirrored(engine, Note, Note16) == 2, name
    with engine.connect() as c:
        c = c.execution_options(isolation_level="AUTOCOMMIT")
        c.connection.dbapi_connection.set_autocommit_dml_mode(  # type: ignore[union-attr]
            AutocommitDmlMode.PARTITIONED_NON_ATOMIC
        )
        with pytest.raises(ShardConfigError, match="Partitioned DML"):
            c.execute(sa.update(t).where(t.c.EventId == "a").values(Kind="pdml"))
        c.connection.dbapi_connection.set_autocommit_dml_mode(  # type: ignore[union-attr]
            AutocommitDmlMode.TRANSACTIONAL
        )
    with engine.connect() as c:
        c.exec_driver_sql("START BATCH DML")
        with pytest.raises(ShardConfigError, match="batch DML"):
            c.execute(sa.insert(t), [{"Timestamp": T0, "EventId": "batched"}])
        c.exec_driver_sql("ABORT BATCH")
        c.rollback()
    with pytest.raises(ShardConfigError, match="PENDING_COMMIT_TIMESTAMP"), engine.begin() as c:
        c.execute(sa.update(t).values(Noted=sa.func.PENDING_COMMIT_TIMESTAMP()))
    with pytest.raises(ShardConfigError, match="depends on columns"):
        bulk_load(engine, Log, [{"id": "l", "company_id": "c", "ts": T0}], mode="insert_or_update")
    assert assert_mirrored(engine, Note, Note16) == 2
    assert assert_mirrored(engine, Log, Log16) == 0


def test_raw_sql_is_refused_only_where_the_successor_exists() -> None:
    """Raw SQL names a table by name alone: in a database without the successor, a table
    of that name is another table, and its raw writes go through."""
    engine = sa.create_engine("sqlite://")
    t.to_metadata(sa.MetaData()).create(engine)
    with engine.begin() as c:
        c.execute(sa.text("INSERT INTO MirrorNotes (ShardId, Timestamp, EventId) VALUES (1, 2, 3)"))
        assert c.execute(sa.text("SELECT COUNT(*) FROM MirrorNotes")).scalar() == 1
