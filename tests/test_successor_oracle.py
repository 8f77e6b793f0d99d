"""The dual-write oracle: generated writes through every path, with a successor declared,
then ``op.verify_tables`` (``compare_tables``) finds both tables equal row for
row and ``verify`` finds every shard of the successor right.

Paths: ORM add/flush, change and delete of objects (a key change too on SQLite), ORM bulk
insert and bulk UPDATE by primary key, Core insert single, executemany and multi-row
VALUES, Core update/delete by WHERE, by IN and executemany, upserts (SQLite: OR IGNORE,
DO NOTHING, DO UPDATE; Spanner: insert_or_ignore, insert_or_update), key-changing UPDATEs
(SQLite; Spanner refuses to update a key column), SQL defaults (``Noted``, ``Token``).
Two successors: ``MirrorNotes16``, whose key follows from the old key, and ``MirrorLogs16``, whose
key is a shard of columns an UPDATE changes without touching the old key. Writes that
collide on a key fail and roll back, as they would in an application. On Spanner through
both engines: the sync one, and the async one (``spanner+spanner_async``: the same body on
``AsyncEngine.sync_engine`` in SQLAlchemy's greenlet, ``run_through``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session
from successor_models import assert_mirrored, logs, notes

from sharded_orm.testing.async_engines import run_through

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
Note, Note16, NOTES = notes()
Log, Log16, LOGS = logs()
KEY = ["ShardId", "Timestamp", "EventId"]
#: how SQLite and Spanner say a write collided with a row at the same key (batch DML on
#: Spanner reports it as an OperationalError)
COLLISIONS = ("UNIQUE constraint failed", "previously existing row", "previously inserted row")

ids = st.sampled_from([f"e{i}" for i in range(4)])
tss = st.sampled_from([T0 + dt.timedelta(seconds=i) for i in range(3)])
kinds = st.sampled_from(["a", "b", "c"])
note = st.fixed_dictionaries({"Timestamp": tss, "EventId": ids, "Kind": kinds})
notes_ = st.lists(note, min_size=1, max_size=3)
lids = st.sampled_from([f"l{i}" for i in range(4)])
companies = st.sampled_from(["c1", "c2"])
log = st.fixed_dictionaries({"Id": lids, "CompanyId": companies, "Ts": tss, "Body": kinds})
logs_ = st.lists(log, min_size=1, max_size=3)
pairs = st.lists(st.tuples(ids, kinds), min_size=1, max_size=3)
some_ids = st.lists(ids, min_size=1, max_size=3)
ANY = {
    "orm_add": notes_,
    "orm_kind": st.tuples(ids, kinds),
    "orm_delete": ids,
    "orm_bulk_insert": notes_,
    "orm_bulk_update": pairs,
    "core_insert": notes_,
    "core_token": note,
    "multi_values": st.lists(note, min_size=2, max_size=3),
    "update_kind": st.tuples(kinds, kinds),
    "update_in": st.tuples(some_ids, kinds),
    "update_many": pairs,
    "delete_kind": kinds,
    "delete_many": some_ids,
    "upsert_ignore": notes_,
    "upsert_update": notes_,
    "log_insert": logs_,
    "log_move": st.tuples(lids, companies, tss),
    "log_body": st.tuples(companies, kinds),
    "log_orm_move": st.tuples(lids, tss),
    "log_delete": st.lists(lids, min_size=1, max_size=2),
    "log_upsert": logs_,
}
SQLITE_ONLY = {
    "orm_move": st.tuples(ids, ids, tss),
    "update_key": st.tuples(ids, ids),
    "update_ts": st.tuples(ids, tss),
    "upsert_nothing": notes_,
}


def _ops(names: dict[str, Any]) -> Any:
    return st.lists(
        st.one_of(*[st.tuples(st.just(n), s) for n, s in names.items()]), min_size=1, max_size=7
    )


def _keys(c: Any, ids_: list[str]) -> list[dict[str, Any]]:
    t = Note.__table__
    got = c.execute(sa.select(t.c.ShardId, t.c.Timestamp, t.c.EventId).where(t.c.EventId.in_(ids_)))
    return [dict(r._mapping) for r in got]


def _upsert(engine: sa.Engine, table: sa.Table, rows: list[Any], how: str) -> None:
    spanner = engine.dialect.name != "sqlite"
    with engine.begin() as c:
        if spanner:
            from google.cloud.sqlalchemy_spanner.dml import insert_or_ignore, insert_or_update

            c.execute((insert_or_ignore if how == "ignore" else insert_or_update)(table), rows)
            return
        ins = sqlite.insert(table)
        if how == "ignore":
            stmt: Any = ins.prefix_with("OR IGNORE")
        elif how == "nothing":
            stmt = ins.on_conflict_do_nothing(index_elements=list(table.primary_key.columns))
        else:
            cols = [k for k in rows[0] if not table.c[k].primary_key]
            stmt = ins.on_conflict_do_update(
                index_elements=list(table.primary_key.columns),
                set_={k: ins.excluded[k] for k in cols},
            )
        c.execute(stmt, rows)


def run(engine: sa.Engine, op: str, arg: Any) -> None:  # noqa: C901 (one branch a path)
    t, lt = Note.__table__, Log.__table__
    if op in ("orm_add", "orm_bulk_insert"):
        with Session(engine) as s, s.begin():
            if op == "orm_add":
                s.add_all(
                    Note(timestamp=r["Timestamp"], event_id=r["EventId"], kind=r["Kind"])
                    for r in arg
                )
            else:
                s.execute(
                    sa.insert(Note),
                    [
                        {"timestamp": r["Timestamp"], "event_id": r["EventId"], "kind": r["Kind"]}
                        for r in arg
                    ],
                )
    elif op in ("orm_kind", "orm_delete", "orm_move"):
        with Session(engine) as s, s.begin():
            obj = s.scalars(
                sa.select(Note).where(Note.event_id == (arg if op == "orm_delete" else arg[0]))
            ).first()
            if obj is None:
                return
            if op == "orm_kind":
                obj.kind = arg[1]
            elif op == "orm_delete":
                s.delete(obj)
            else:
                obj.event_id, obj.timestamp = arg[1], arg[2]
    elif op == "orm_bulk_update":
        with Session(engine) as s, s.begin():
            found = {k["EventId"]: k for k in _keys(s.connection(), [i for i, _ in arg])}
            rows = [
                {
                    "shard_id": found[i]["ShardId"],
                    "timestamp": found[i]["Timestamp"],
                    "event_id": i,
                    "kind": k,
                }
                for i, k in dict(arg).items()
                if i in found
            ]
            if rows:
                s.execute(sa.update(Note), rows)
    elif op == "log_orm_move":
        with Session(engine) as s, s.begin():
            obj = s.get(Log, arg[0])
            if obj is not None:
                obj.ts = arg[1]
    elif op.startswith("upsert"):
        _upsert(engine, t, arg, op.split("_")[1])
    elif op == "log_upsert":
        _upsert(engine, lt, arg, "update")
    else:
        with engine.begin() as c:
            _core(c, op, arg, t, lt)


def _core(c: Any, op: str, arg: Any, t: sa.Table, lt: sa.Table) -> None:
    if op == "core_insert":
        c.execute(sa.insert(t), arg)
    elif op == "core_token":  # a value given where the default would be SQL
        c.execute(sa.insert(t).values(**arg, Token="given", Noted=sa.func.now()))
    elif op == "multi_values":
        c.execute(sa.insert(t).values(arg))
    elif op == "update_kind":
        c.execute(sa.update(t).where(t.c.Kind == arg[0]).values(Kind=arg[1]))
    elif op == "update_in":
        c.execute(sa.update(t).where(t.c.EventId.in_(arg[0])).values(Kind=arg[1]))
    elif op == "update_many":
        stmt = sa.update(t).where(t.c.EventId == sa.bindparam("id"))
        c.execute(stmt, [{"id": i, "Kind": k} for i, k in dict(arg).items()])
    elif op == "update_key":
        c.execute(sa.update(t).where(t.c.EventId == arg[0]).values(EventId=arg[1]))
    elif op == "update_ts":
        c.execute(sa.update(t).where(t.c.EventId == arg[0]).values(Timestamp=arg[1]))
    elif op == "delete_kind":
        c.execute(sa.delete(t).where(t.c.Kind == arg))
    elif op == "delete_many":
        c.execute(
            sa.delete(t).where(t.c.EventId == sa.bindparam("id")),
            [{"id": i} for i in dict.fromkeys(arg)],
        )
    elif op == "log_insert":
        c.execute(sa.insert(lt), arg)
    elif op == "log_move":
        c.execute(sa.update(lt).where(lt.c.Id == arg[0]).values(CompanyId=arg[1], Ts=arg[2]))
    elif op == "log_body":
        c.execute(sa.update(lt).where(lt.c.CompanyId == arg[0]).values(Body=arg[1]))
    elif op == "log_delete":
        c.execute(sa.delete(lt).where(lt.c.Id.in_(arg)))
    else:
        raise AssertionError(op)


def check(engine: sa.Engine, ops: list[tuple[str, Any]]) -> None:
    for op, arg in ops:
        try:
            run(engine, op, arg)
        except sa.exc.DBAPIError as exc:  # two writes to one key: the application's error
            if not any(w in str(exc) for w in COLLISIONS):
                raise
    assert_mirrored(engine, Note, Note16)
    assert_mirrored(engine, Log, Log16)


@settings(max_examples=150, deadline=None)
@given(_ops({**ANY, **SQLITE_ONLY}))
def test_every_write_path_leaves_both_tables_equal_on_sqlite(ops: list[tuple[str, Any]]) -> None:
    engine = sa.create_engine("sqlite://")
    NOTES.create_all(engine)
    LOGS.create_all(engine)
    check(engine, ops)
    engine.dispose()


def on_spanner(engine: sa.Engine, examples: int) -> None:
    NOTES.create_all(engine)
    LOGS.create_all(engine)

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_ops(ANY))
    def oracle(ops: list[tuple[str, Any]]) -> None:
        with engine.begin() as c:
            for table in (Note16.__table__, Note.__table__, Log16.__table__, Log.__table__):
                c.execute(sa.delete(table))
        check(engine, ops)

    oracle()


@pytest.mark.emulator
def test_every_write_path_leaves_both_tables_equal_on_spanner(spanner_engine: sa.Engine) -> None:
    on_spanner(spanner_engine, 15)


@pytest.mark.emulator
def test_both_tables_equal_through_the_async_engine(spanner_async_engine: Any) -> None:
    run_through(spanner_async_engine, on_spanner, 3)


# async variant; quick loop: test_both_tables_equal_through_the_async_engine
@pytest.mark.slow
@pytest.mark.emulator
def test_every_write_path_leaves_both_tables_equal_through_the_async_engine(
    spanner_async_engine: Any,
) -> None:
    run_through(spanner_async_engine, on_spanner, 15)
