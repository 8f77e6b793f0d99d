"""The dual write mirrors what the old table holds, not the statement (issue 32 R2): an
UPDATE that moves a row's key, upserts that kept or changed a row, SQL defaults, a
second successor, a unique index of the successor, a statement that fails; after each,
``compare_tables`` (what ``op.verify_tables`` runs) finds both tables equal row for row
and ``verify`` finds every shard right. On SQLite and the emulator where it applies."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session
from successor_models import assert_mirrored, logs, notes, serial, unique

from sharded_orm import ShardConfigError, declare_successor
from sharded_orm.errors import SuccessorWriteError
from sharded_orm.write.successor import successor_of

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
HOUR = dt.timedelta(hours=1)
Note, Note16, NOTES = notes()
Log, Log16, LOGS = logs()
Tag, Tag16, TAGS = unique()
Serial, Serial16, SERIALS = serial()


@pytest.fixture
def db(engine: sa.Engine) -> sa.Engine:
    for md in (NOTES, LOGS, TAGS, SERIALS):
        md.create_all(engine)
    return engine


def _kinds(engine: sa.Engine, model: Any) -> dict[str, Any]:
    t = model.__table__
    with engine.connect() as c:
        return dict(c.execute(sa.select(t.c.EventId, t.c.Kind)).all())  # type: ignore[arg-type]


def test_an_update_that_changes_the_key_moves_the_successor_row() -> None:
    """Spanner refuses to update a key column; SQLite does it, the mirror follows."""
    engine = sa.create_engine("sqlite://")
    NOTES.create_all(engine)
    t = Note.__table__
    with engine.begin() as c:
        c.execute(sa.insert(t), [{"Timestamp": T0, "EventId": e, "Kind": e} for e in "abcd"])
    with engine.begin() as c:
        c.execute(sa.update(t).where(t.c.EventId == "a").values(EventId="a2"))
        c.execute(sa.update(t).where(t.c.EventId == "b").values(Timestamp=T0 + HOUR))
        c.execute(  # executemany, each set its own new key
            sa.update(t).where(t.c.EventId == sa.bindparam("old")),
            [{"old": "c", "EventId": "c2"}, {"old": "d", "EventId": "d2"}],
        )
    with Session(engine) as s, s.begin():
        n = s.scalars(sa.select(Note).where(Note.event_id == "a2")).one()
        n.event_id, n.timestamp = "a3", T0 + 2 * HOUR
    assert assert_mirrored(engine, Note, Note16) == 4
    assert sorted(_kinds(engine, Note16)) == ["a3", "b", "c2", "d2"]


@pytest.mark.emulator
def test_spanner_refuses_an_update_of_a_key_column_and_both_tables_stay(
    spanner_engine: sa.Engine,
) -> None:
    NOTES.create_all(spanner_engine)
    t = Note.__table__
    with spanner_engine.begin() as c:
        c.execute(sa.insert(t), [{"Timestamp": T0, "EventId": "a", "Kind": "a"}])
    with pytest.raises(sa.exc.DatabaseError), spanner_engine.begin() as c:
        c.execute(sa.update(t).where(t.c.EventId == "a").values(EventId="a2"))
    assert assert_mirrored(spanner_engine, Note, Note16) == 1


def test_an_update_of_a_new_key_source_moves_the_successor_row(db: sa.Engine) -> None:
    """MirrorLogs16's key holds a shard of (CompanyId, Ts), columns outside MirrorLogs' key."""
    t = Log.__table__
    with db.begin() as c:
        c.execute(
            sa.insert(t),
            [{"Id": f"l{i}", "CompanyId": "c", "Ts": T0, "Body": "b"} for i in range(4)],
        )
    with db.begin() as c:
        c.execute(sa.update(t).where(t.c.Id == "l0").values(Ts=T0 + HOUR))
        c.execute(
            sa.update(t)
            .where(t.c.Body == "b", t.c.Id.in_(["l1", "l2"]))
            .values(CompanyId="d", Ts=T0)
        )
    with Session(db) as s, s.begin():
        s.get(Log, "l3").ts = T0 + 3 * HOUR  # type: ignore[union-attr]
        s.delete(s.get(Log, "l2"))
    assert assert_mirrored(db, Log, Log16) == 3


def test_sql_defaults_are_copied_not_evaluated_again(db: sa.Engine) -> None:
    with Session(db) as s, s.begin():
        s.add_all([Note(timestamp=T0, event_id=f"o{i}", kind="orm") for i in range(3)])
    with db.begin() as c:
        c.execute(
            sa.insert(Note.__table__), [{"Timestamp": T0, "EventId": f"c{i}"} for i in range(3)]
        )
    assert assert_mirrored(db, Note, Note16) == 6
    with db.connect() as c:
        tokens = c.execute(sa.select(Note16.__table__.c.Token)).scalars().all()
    assert len(set(tokens)) == 6 and None not in tokens
    with db.begin() as c:  # any value but the key may be SQL: it is read back too
        c.execute(
            sa.insert(Note.__table__).values(Timestamp=T0, EventId="v", Kind=sa.func.upper("x"))
        )
    assert assert_mirrored(db, Note, Note16) == 7


def test_sqlite_upserts_mirror_the_stored_row() -> None:
    engine = sa.create_engine("sqlite://")
    NOTES.create_all(engine)
    t = Note.__table__
    row = {"Timestamp": T0, "EventId": "u", "Kind": "kept"}
    key = ["ShardId", "Timestamp", "EventId"]
    with engine.begin() as c:
        c.execute(sa.insert(t), [row, {**row, "EventId": "w", "Kind": "w"}])
    sent = {**row, "Kind": "sent"}
    with engine.begin() as c:
        c.execute(sa.insert(t).prefix_with("OR IGNORE"), [sent, {**sent, "EventId": "n1"}])
        c.execute(sqlite.insert(t).on_conflict_do_nothing(), [sent])
        c.execute(sqlite.insert(t).on_conflict_do_nothing(index_elements=key), [sent])
    assert _kinds(engine, Note16)["u"] == "kept"
    with engine.begin() as c:
        ins = sqlite.insert(t)
        c.execute(
            ins.on_conflict_do_update(
                index_elements=key, set_={"Kind": sa.func.upper(ins.excluded.Kind)}
            ),
            [{**row, "EventId": "w", "Kind": "new"}],
        )
    assert _kinds(engine, Note16) == {"u": "kept", "w": "NEW", "n1": "sent"}
    assert assert_mirrored(engine, Note, Note16) == 3


@pytest.mark.emulator
def test_spanner_upserts_mirror_the_stored_row(spanner_engine: sa.Engine) -> None:
    from google.cloud.sqlalchemy_spanner.dml import insert_or_ignore, insert_or_update

    engine = spanner_engine
    NOTES.create_all(engine)
    t = Note.__table__
    row = {"Timestamp": T0, "EventId": "u", "Kind": "kept"}
    with engine.begin() as c:
        c.execute(sa.insert(t), [row])
    with engine.begin() as c:  # an ignored insert overwrote the successor's row
        c.execute(insert_or_ignore(t), [{**row, "Kind": "sent"}, {**row, "EventId": "n"}])
    assert _kinds(engine, Note16) == {"u": "kept", "n": "kept"}
    with engine.begin() as c:  # columns not sent keep their values
        c.execute(insert_or_update(t), [{"Timestamp": T0, "EventId": "u", "Kind": "upd"}])
    assert _kinds(engine, Note16) == {"u": "upd", "n": "kept"}
    assert assert_mirrored(engine, Note, Note16) == 2


def test_a_second_successor_is_refused_and_the_first_keeps_its_writes() -> None:
    Other, Other16, _ = notes(declare=False)
    with pytest.raises(ShardConfigError, match="already has the successor MirrorNotes16"):
        declare_successor(Note, Other16)
    with pytest.raises(ShardConfigError, match="already the successor of MirrorNotes"):
        declare_successor(Other, Note16)
    with pytest.raises(ShardConfigError, match="chain two key reshards"):
        declare_successor(Note16, Other16)
    declare_successor(Note, Note16)  # the same pair again: nothing changes
    assert successor_of(Note.__table__) is Note16.__table__
    engine = sa.create_engine("sqlite://")
    NOTES.create_all(engine)
    with Session(engine) as s, s.begin():
        s.add(Note(timestamp=T0, kind="k"))
    assert assert_mirrored(engine, Note, Note16) == 1


def test_a_unique_index_of_the_successor_fails_the_write_loudly(db: sa.Engine) -> None:
    t = Tag.__table__
    with db.begin() as c:
        c.execute(sa.insert(t), [{"Timestamp": T0, "EventId": "first", "Kind": "same"}])
    with pytest.raises(sa.exc.DatabaseError), db.begin() as c:
        c.execute(sa.insert(t), [{"Timestamp": T0, "EventId": "second", "Kind": "same"}])
    assert _kinds(db, Tag) == _kinds(db, Tag16) == {"first": "same"}
    with pytest.raises(sa.exc.DatabaseError), Session(db) as s, s.begin():
        s.add(Tag(timestamp=T0 + HOUR, event_id="third", kind="same"))
    assert assert_mirrored(db, Tag, Tag16) == 1


def test_a_transaction_whose_mirror_failed_cannot_commit() -> None:
    engine = sa.create_engine("sqlite://")
    TAGS.create_all(engine)
    t = Tag.__table__
    with engine.begin() as c:
        c.execute(sa.insert(t), [{"Timestamp": T0, "EventId": "first", "Kind": "same"}])
    with pytest.raises(SuccessorWriteError, match="roll it back"), engine.begin() as c:
        with pytest.raises(sa.exc.IntegrityError):
            c.execute(sa.insert(t), [{"Timestamp": T0, "EventId": "second", "Kind": "same"}])
        c.execute(sa.insert(t), [{"Timestamp": T0, "EventId": "third", "Kind": "other"}])
    with engine.begin() as c:  # a savepoint that undoes the failed write lets it commit
        sp = c.begin_nested()
        with pytest.raises(sa.exc.IntegrityError):
            c.execute(sa.insert(t), [{"Timestamp": T0, "EventId": "second", "Kind": "same"}])
        sp.rollback()
        c.execute(sa.insert(t), [{"Timestamp": T0, "EventId": "fourth", "Kind": "other"}])
    conn = engine.connect()  # closed without a rollback: the pool's reset forgets it
    with pytest.raises(sa.exc.IntegrityError):
        conn.execute(sa.insert(t), [{"Timestamp": T0, "EventId": "fifth", "Kind": "same"}])
    conn.close()
    with engine.begin() as c:  # the same DB-API connection (SQLite in memory)
        c.execute(sa.insert(t), [{"Timestamp": T0, "EventId": "sixth", "Kind": "six"}])
    assert sorted(_kinds(engine, Tag16)) == ["first", "fourth", "sixth"]
    assert assert_mirrored(engine, Tag, Tag16) == 3


def test_a_statement_that_fails_changes_neither_table() -> None:
    """The old code deleted the successor's rows before the DELETE ran: a DELETE refused
    by a foreign key, caught and committed, lost them from the successor."""
    engine = sa.create_engine("sqlite://")
    sa.event.listen(engine, "connect", lambda dbapi, _: dbapi.execute("PRAGMA foreign_keys=ON"))
    NOTES.create_all(engine)
    refs = sa.Table(
        "NoteRefs",
        NOTES,
        sa.Column("Id", sa.Integer, primary_key=True),
        sa.Column("ShardId", sa.Integer),
        sa.Column("Timestamp", sa.String),
        sa.Column("EventId", sa.String),
        sa.ForeignKeyConstraint(
            ["ShardId", "Timestamp", "EventId"],
            ["MirrorNotes.ShardId", "MirrorNotes.Timestamp", "MirrorNotes.EventId"],
        ),
    )
    refs.create(engine)
    NOTES.remove(refs)
    t = Note.__table__
    with engine.begin() as c:
        c.execute(sa.insert(t), [{"Timestamp": T0, "EventId": "kept"}])
        c.exec_driver_sql(
            'INSERT INTO "NoteRefs" SELECT 1, "ShardId", "Timestamp", "EventId" FROM "MirrorNotes"'
        )
    with engine.begin() as c, pytest.raises(sa.exc.IntegrityError):
        c.execute(sa.delete(t).where(t.c.EventId == "kept"))
    assert assert_mirrored(engine, Note, Note16) == 1


def test_a_key_the_database_makes_is_read_back_where_sqlalchemy_reports_it(
    db: sa.Engine,
) -> None:
    with Session(db) as s, s.begin():
        s.add(Serial(body="one"))
    with Session(db) as s, s.begin():  # the ORM's return_defaults(): keys reported
        s.add_all([Serial(body="a"), Serial(body="b")])
    assert assert_mirrored(db, Serial, Serial16) == 3
    with pytest.raises(ShardConfigError, match="does not report it"), db.begin() as c:
        c.execute(sa.insert(Serial.__table__), [{"Body": "x"}, {"Body": "y"}])
    assert assert_mirrored(db, Serial, Serial16) == 3
