"""Issue 41 leftovers where SQLite meets the library's writes (brief s41/H1).

A. An aware ``DateTime(timezone=True)`` shard source: SQLite stores the wall time and
   drops the offset. A value with an offset other than UTC is refused when written (the
   row would hold another instant than the one hashed; one path stored it so, silently),
   naming UTCDateTime; a stored value read back naive is refused as a stored value, naming
   UTCDateTime (not "attach a timezone", which is no advice for a value from the
   database). On the emulator the instant is stored, and every offset is exact.
B. A shard in the primary key, a child table whose foreign key references it, and a
   source change that moves the key: refused up front with one message on every backend
   (SQLite raised a raw IntegrityError; Spanner refused it as a key change).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import UTCDateTime, get_shard_column, shard_column
from sharded_orm.errors import ShardConfigError, ShardValueError
from sharded_orm.spanner import is_spanner

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 3, 1, 12, 30, 5, 123456)


def _models(ts_type: Any) -> tuple[Any, sa.MetaData]:
    class Base(DeclarativeBase):
        pass

    class Event(Base):
        __tablename__ = "sj_events"
        id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
        ts: Mapped[dt.datetime] = mapped_column(ts_type)
        b: Mapped[str] = mapped_column(sa.String(20))
        s: Mapped[int] = shard_column("ts", "b", count=8)

    return Event, Base.metadata


def _stored(engine: sa.Engine, model: Any) -> list[tuple[Any, ...]]:
    with engine.connect() as c:
        t = model.__table__
        return [tuple(r) for r in c.execute(sa.select(t.c.id, t.c.ts, t.c.b, t.c.s))]


#: every way a write gives the source its value (what each path does with an offset)
WRITES: dict[str, Callable[[sa.Engine, Any, dt.datetime], None]] = {}


def _write(name: str) -> Callable[[Any], Any]:
    def add(fn: Any) -> Any:
        WRITES[name] = fn
        return fn

    return add


@_write("core insert")
def _core_insert(e: sa.Engine, m: Any, v: dt.datetime) -> None:
    with e.begin() as c:
        c.execute(sa.insert(m), [{"id": 1, "ts": v, "b": "x"}])


@_write("core insert values")
def _core_values(e: sa.Engine, m: Any, v: dt.datetime) -> None:
    with e.begin() as c:
        c.execute(sa.insert(m).values(id=1, ts=v, b="x"))


@_write("orm add")
def _orm_add(e: sa.Engine, m: Any, v: dt.datetime) -> None:
    with Session(e) as s, s.begin():
        s.add(m(id=1, ts=v, b="x"))


@_write("bulk_insert_mappings")
def _bulk(e: sa.Engine, m: Any, v: dt.datetime) -> None:
    with Session(e) as s, s.begin():
        s.bulk_insert_mappings(m, [{"id": 1, "ts": v, "b": "x"}])


@_write("core update named bindparam")
def _update_named(e: sa.Engine, m: Any, v: dt.datetime) -> None:
    # the value a named bind carries cannot be re-sent in its UTC form: SQLite stored the
    # wall time of ``v`` while the shard hashed its UTC instant (silently wrong before)
    with e.begin() as c:
        c.execute(sa.insert(m), [{"id": 1, "ts": T0.replace(tzinfo=UTC), "b": "x"}])
    with e.begin() as c:
        c.execute(sa.update(m).where(m.id == 1).values(ts=sa.bindparam("when", v), b="y"))


@_write("orm change")
def _orm_change(e: sa.Engine, m: Any, v: dt.datetime) -> None:
    with Session(e) as s, s.begin():
        s.add(m(id=1, ts=T0.replace(tzinfo=UTC), b="x"))
    with Session(e) as s, s.begin():
        o = s.get(m, 1)
        o.ts, o.b = v, "y"


offsets = st.integers(min_value=-14 * 60, max_value=14 * 60).filter(lambda n: n != 0)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(minutes=offsets, path=st.sampled_from(sorted(WRITES)))
def test_sqlite_refuses_an_offset_it_would_drop(minutes: int, path: str) -> None:
    """Any offset other than UTC, by any write path: refused with the reason and the way
    out (UTCDateTime, or the value in UTC); nothing written by the refused statement."""
    model, md = _models(sa.DateTime(timezone=True))
    engine = sa.create_engine("sqlite://")
    md.create_all(engine)
    v = T0.replace(tzinfo=dt.timezone(dt.timedelta(minutes=minutes)))
    before: list[Any] = []
    with pytest.raises(ShardValueError) as err:
        try:
            WRITES[path](engine, model, v)
        finally:
            before = _stored(engine, model)
    text = str(err.value)
    assert "UTCDateTime" in text and "offset" in text and "astimezone" in text, text
    for _id, ts, _b, _s in before:  # only the UTC row written before the refused one
        assert ts == T0
    engine.dispose()


@pytest.mark.parametrize("path", sorted(WRITES))
def test_a_utc_value_is_exact_on_sqlite(path: str) -> None:
    """The value in UTC: stored as its wall time (what plain SQLAlchemy stores), and the
    stored shard is the hash of that instant."""
    model, md = _models(sa.DateTime(timezone=True))
    engine = sa.create_engine("sqlite://")
    md.create_all(engine)
    WRITES[path](engine, model, (T0 + dt.timedelta(hours=1)).replace(tzinfo=UTC))
    sc = get_shard_column(model, "s")
    for _id, ts, b, s in _stored(engine, model):
        assert ts.tzinfo is None
        assert s == sc.compute([ts.replace(tzinfo=UTC), b])
    engine.dispose()


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(minutes=offsets)
def test_utc_datetime_takes_every_offset_on_sqlite(minutes: int) -> None:
    """UTCDateTime stores every instant as UTC itself: no offset is refused."""
    model, md = _models(UTCDateTime())
    engine = sa.create_engine("sqlite://")
    md.create_all(engine)
    v = T0.replace(tzinfo=dt.timezone(dt.timedelta(minutes=minutes)))
    _core_insert(engine, model, v)
    with Session(engine) as s, s.begin():
        s.get(model, 1).b = "y"  # the stored-source read: aware, hashable
    sc = get_shard_column(model, "s")
    ((_id, ts, b, s),) = _stored(engine, model)
    assert ts == v and s == sc.compute([ts, b])
    engine.dispose()


READS_BACK = {
    "core update of the other source": lambda e, m: _exec(
        e, sa.update(m).where(m.id == 1).values(b="y")
    ),
    "orm change of the other source": lambda e, m: _orm_set_b(e, m),
    "bulk_update_mappings": lambda e, m: _bulk_update(e, m),
}


def _exec(e: sa.Engine, stmt: Any) -> None:
    with e.begin() as c:
        c.execute(stmt)


def _orm_set_b(e: sa.Engine, m: Any) -> None:
    with Session(e) as s, s.begin():
        s.get(m, 1).b = "y"


def _bulk_update(e: sa.Engine, m: Any) -> None:
    with Session(e) as s, s.begin():
        s.bulk_update_mappings(m, [{"id": 1, "b": "y"}])


@pytest.mark.parametrize("path", sorted(READS_BACK))
def test_a_naive_value_read_back_is_refused_as_a_stored_value(path: str) -> None:
    """The partial-source UPDATE reads the stored timestamp, naive on SQLite: refused as
    what the database returned (declare UTCDateTime), never "attach a timezone"."""
    model, md = _models(sa.DateTime(timezone=True))
    engine = sa.create_engine("sqlite://")
    md.create_all(engine)
    _core_insert(engine, model, T0.replace(tzinfo=UTC))
    before = _stored(engine, model)
    with pytest.raises(ShardValueError) as err:
        READS_BACK[path](engine, model)
    text = str(err.value)
    assert "read back from the database" in text, text
    assert "sharded_orm.UTCDateTime" in text and "attach a timezone" not in text, text
    assert _stored(engine, model) == before
    engine.dispose()


@pytest.mark.emulator
def test_the_emulator_stores_every_offset_exactly(spanner_engine: sa.Engine) -> None:
    """Spanner stores the instant: an offset is no reason to refuse there, and the
    partial-source UPDATE reads the timestamp back aware."""
    model, md = _models(sa.DateTime(timezone=True))
    md.create_all(spanner_engine)
    v = T0.replace(tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30)))
    _core_insert(spanner_engine, model, v)
    _orm_set_b(spanner_engine, model)
    sc = get_shard_column(model, "s")
    ((_id, ts, b, s),) = _stored(spanner_engine, model)
    assert ts == v and b == "y" and s == sc.compute([ts, b])


# ------------------------------------------------------------------ B: a key moved under a FK


def _keyed(ondelete: str | None, onupdate: str | None = None) -> tuple[Any, Any, sa.MetaData]:
    class Base(DeclarativeBase):
        pass

    class Parent(Base):
        __tablename__ = "sj_parent"
        s: Mapped[int] = shard_column("src", "b", count=8, primary_key=True, sort_order=-10)
        id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
        src: Mapped[str] = mapped_column(sa.String(20))
        b: Mapped[str] = mapped_column(sa.String(20))
        body: Mapped[str | None] = mapped_column(sa.String(20), nullable=True)

    class Child(Base):
        __tablename__ = "sj_child"
        p_s: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
        p_id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
        c: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
        __table_args__ = (
            sa.ForeignKeyConstraint(
                ["p_s", "p_id"],
                ["sj_parent.s", "sj_parent.id"],
                ondelete=ondelete,
                onupdate=onupdate,
            ),
        )

    return Parent, Child, Base.metadata


def _fk_engine() -> sa.Engine:
    engine = sa.create_engine("sqlite://")

    @sa.event.listens_for(engine, "connect")
    def _fk(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute("PRAGMA foreign_keys = ON")

    return engine


KEY_MOVES: dict[str, Callable[[sa.Engine, Any], None]] = {
    "orm flush": lambda e, m: _orm_keyed(e, m),
    "bulk_update_mappings": lambda e, m: _bulk_keyed(e, m),
    "core update setting every source": lambda e, m: _exec(
        e, sa.update(m).where(m.id == 1).values(src="v", b="y")
    ),
}


def _orm_keyed(e: sa.Engine, m: Any) -> None:
    with Session(e) as s, s.begin():
        o = s.scalars(sa.select(m).where(m.id == 1)).one()
        o.b = "y"


def _bulk_keyed(e: sa.Engine, m: Any) -> None:
    sc = get_shard_column(m, "s")
    with Session(e) as s, s.begin():
        s.bulk_update_mappings(m, [{"s": sc.compute(["v", "x"]), "id": 1, "b": "y"}])


def _seed(e: sa.Engine, parent: Any, child: Any) -> int:
    shard = get_shard_column(parent, "s").compute(["v", "x"])
    with e.begin() as c:
        c.execute(sa.insert(parent), [{"id": 1, "src": "v", "b": "x"}])
        c.execute(sa.insert(child), [{"p_s": shard, "p_id": 1, "c": n} for n in (0, 1)])
    return shard


@pytest.mark.parametrize("ondelete", [None, "CASCADE"])
@pytest.mark.parametrize("path", sorted(KEY_MOVES))
def test_a_key_move_under_a_foreign_key_is_refused_up_front(
    engine: sa.Engine, path: str, ondelete: str | None
) -> None:
    """The same refusal on SQLite (which raised ``FOREIGN KEY constraint failed``) and
    on the emulator, naming the referencing table, and nothing written."""
    if not is_spanner(engine.dialect):
        engine = _fk_engine()  # SQLite enforces the foreign key (PRAGMA foreign_keys)
    parent, child, md = _keyed(ondelete)
    md.create_all(engine)
    shard = _seed(engine, parent, child)
    with pytest.raises(ShardConfigError) as err:
        KEY_MOVES[path](engine, parent)
    text = str(err.value)
    assert text.startswith("this UPDATE changes "), text
    assert "moves the row's primary key" in text and "'sj_child'" in text, text
    assert "Delete the row" in text, text
    with engine.connect() as c:
        assert c.execute(sa.select(parent.s, parent.b)).all() == [(shard, "x")]
        assert c.execute(sa.select(sa.func.count()).select_from(child)).scalar() == 2


def test_a_key_move_is_taken_where_the_foreign_key_cascades_it() -> None:
    """``onupdate="CASCADE"``: SQLite moves the children with the key, so the library
    lets the UPDATE through (Spanner refuses every key change apart)."""
    engine = _fk_engine()
    parent, child, md = _keyed(None, onupdate="CASCADE")
    md.create_all(engine)
    _seed(engine, parent, child)
    _orm_keyed(engine, parent)
    new = get_shard_column(parent, "s").compute(["v", "y"])
    with engine.connect() as c:
        assert c.execute(sa.select(parent.s, parent.b)).all() == [(new, "y")]
        assert {r.p_s for r in c.execute(sa.select(child.p_s))} == {new}


def test_a_key_move_with_no_foreign_key_stays_allowed_on_sqlite() -> None:
    """No table references the key: SQLite moves it, as plain SQLAlchemy does."""
    engine = sa.create_engine("sqlite://")
    parent, child, md = _keyed(None)
    md.remove(child.__table__)
    parent.__table__.create(engine)
    with engine.begin() as c:
        c.execute(sa.insert(parent), [{"id": 1, "src": "v", "b": "x"}])
    _orm_keyed(engine, parent)
    with engine.connect() as c:
        got = c.execute(sa.select(parent.s, parent.b)).all()
    assert got == [(get_shard_column(parent, "s").compute(["v", "y"]), "y")]
