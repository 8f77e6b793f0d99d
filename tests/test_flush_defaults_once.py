"""An ORM flush pays the plan of its Python defaults once per shape, not once per object
(the team's rule: pay each cost once per statement or batch).

``before_insert`` evaluates (and stores) the defaults of a new object's shard sources
ahead of SQLAlchemy, and ``before_update`` a source's Python ``onupdate``; what is
evaluated for an object depends on its table, the kind of write and the keys it gives,
not on its values. That state is built once per (table, kind, keys given) in a flush
and dropped when the flush ends (``sharded_orm.write.sql.PREFETCH_PLANS`` counts the
lookups of the plan: one per shape per flush, where it was one per object), while each
object's defaults are still evaluated for it, seeing its own row and connection.
"""

from __future__ import annotations

import datetime as dt
import gc
import itertools
import weakref
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import TimestampShardedMixin, compute_shard, shard_column
from sharded_orm.write.sql import PREFETCH_PLANS

OBJECTS = 1000


def _lookups() -> int:
    s = PREFETCH_PLANS.stats()
    return s.hits + s.misses


def _utc(ts: dt.datetime) -> dt.datetime:
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=dt.timezone.utc)


def _event_model(name: str) -> tuple[type[Any], type[Any]]:
    """A fresh mixin model: its shard's source (``timestamp``) and ``event_id`` have
    Python defaults."""

    class Base(DeclarativeBase):
        pass

    class Event(TimestampShardedMixin, Base):
        __tablename__ = name
        payload: Mapped[str] = mapped_column(sa.String(40))

    return Base, Event


def _revised_model(name: str) -> tuple[type[Any], type[Any], list[str]]:
    """A mixin model with a second shard, whose source ``rev`` has a Python default and
    onupdate: each call gives a new value (so each object's own evaluation shows), and
    records what the UPDATE's context showed it (the object's key and payload)."""
    counter = itertools.count()
    seen: list[str] = []

    def next_rev(ctx: Any) -> str:
        params = ctx.get_current_parameters()
        seen.append(str(params.get("payload")))
        return f"r{next(counter)}"

    class Base(DeclarativeBase):
        pass

    class Revised(TimestampShardedMixin, Base):
        __tablename__ = name
        payload: Mapped[str] = mapped_column(sa.String(40))
        rev: Mapped[str] = mapped_column(sa.String(20), default=next_rev, onupdate=next_rev)
        rev_shard: Mapped[int] = shard_column("rev", count=8)

    return Base, Revised, seen


def _check_events(engine: sa.Engine, model: Any, n: int) -> None:
    """Every row stored its own defaults, and its shard is the hash of its stored source."""
    with engine.connect() as conn:
        got = conn.execute(sa.select(model.shard_id, model.timestamp, model.event_id)).all()
    assert len(got) == n
    assert len({r[2] for r in got}) == n  # an id per object, not one per flush
    for shard, ts, _ in got:
        assert shard == compute_shard([_utc(ts)], model.__shard_count__)


def test_flush_of_new_objects_plans_once(engine: sa.Engine) -> None:
    base, event = _event_model("flush_once_events")
    base.metadata.create_all(engine)
    with Session(engine) as s:
        s.add_all([event(payload=f"p{i}") for i in range(OBJECTS)])
        before = _lookups()
        s.flush()
        looked_up = _lookups() - before
        s.commit()
    assert looked_up == 1  # one shape of object (was one lookup per object: 1,000)
    _check_events(engine, event, OBJECTS)


def test_each_shape_planned_once_per_flush(engine: sa.Engine) -> None:
    """Objects that give ``event_id`` and objects that do not: two shapes, two lookups;
    a second flush in the same transaction plans for itself again (nothing kept past the
    flush), still once per shape."""
    base, event = _event_model("flush_once_shapes")
    base.metadata.create_all(engine)
    half = OBJECTS // 2
    with Session(engine) as s:
        s.add_all([event(payload=f"a{i}") for i in range(half)])
        s.add_all([event(payload=f"b{i}", event_id=f"given-{i}") for i in range(half)])
        before = _lookups()
        s.flush()
        first = _lookups() - before
        s.add_all([event(payload=f"c{i}") for i in range(10)])
        before = _lookups()
        s.flush()
        second = _lookups() - before
        s.commit()
    assert (first, second) == (2, 1)
    _check_events(engine, event, OBJECTS + 10)
    with engine.connect() as conn:
        given = conn.execute(
            sa.select(sa.func.count()).where(event.event_id.like("given-%"))
        ).scalar()
    assert given == half


def test_flush_of_changed_objects_plans_onupdate_once(engine: sa.Engine) -> None:
    base, revised, seen = _revised_model("flush_once_revised")
    base.metadata.create_all(engine)
    with Session(engine) as s:
        s.add_all([revised(payload=f"p{i}") for i in range(OBJECTS)])
        s.commit()
        objs = s.scalars(sa.select(revised)).all()
        old = {o.event_id: o.rev for o in objs}
        seen.clear()
        for o in objs:
            o.payload = o.payload.upper()
        before = _lookups()
        s.flush()
        looked_up = _lookups() - before
        held = {o.event_id: (o.rev, o.rev_shard) for o in objs}
        s.commit()
    assert looked_up == 1  # one shape of change (was one lookup per object: 1,000)
    # evaluated once per object, each seeing its own row's new payload
    assert sorted(seen) == sorted(f"P{i}" for i in range(OBJECTS))
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(revised.event_id.label("eid"), revised.rev, revised.rev_shard)
        ).all()
    assert len(rows) == OBJECTS
    assert len({r.rev for r in rows}) == OBJECTS
    for r in rows:
        assert r.rev != old[r.eid]  # the onupdate ran for it
        assert r.rev_shard == compute_shard([r.rev], 8)
        assert held[r.eid] == (r.rev, r.rev_shard)  # the object holds what the row holds


def test_a_flush_keeps_no_connection(engine: sa.Engine) -> None:
    """The state a flush builds holds its connection only while the flush runs: once the
    session's transaction ends (committed, or rolled back after a failed flush), the
    session still open, its connection is left to be collected."""
    base, event = _event_model("flush_once_held")
    base.metadata.create_all(engine)
    at = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    with Session(engine) as s:
        conn = weakref.ref(s.connection())
        s.add_all([event(payload=f"p{i}") for i in range(10)])
        s.flush()
        s.add(event(payload="once", event_id="same", timestamp=at))
        s.commit()
        gc.collect()
        assert conn() is None
        conn = weakref.ref(s.connection())
        s.add(event(payload="again", event_id="same", timestamp=at))
        with pytest.raises(sa.exc.DBAPIError):
            s.flush()
        s.rollback()
        gc.collect()
        assert conn() is None
    _check_events(engine, event, 11)


def _tagged_model() -> tuple[type[Any], type[Any], list[tuple[str, Any, str]]]:
    """A shard whose source's default reads its row's ``name``, the write's connection
    and its execution options; what each call saw is recorded."""
    seen: list[tuple[str, Any, str]] = []

    def make_tag(ctx: Any) -> str:
        name, label = ctx.get_current_parameters()["name"], ctx.execution_options["label"]
        seen.append((name, ctx.connection, label))
        return f"{name}/{label}"

    class Base(DeclarativeBase):
        pass

    class Tagged(Base):
        __tablename__ = "flush_once_tagged"
        id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
        name: Mapped[str] = mapped_column(sa.String(40))
        tag: Mapped[str] = mapped_column(sa.String(80), default=make_tag)
        shard: Mapped[int] = shard_column("tag", count=8, primary_key=True)

    return Base, Tagged, seen


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    names=st.lists(st.text("abcxyz", min_size=1, max_size=6), min_size=1, max_size=30),
    split=st.integers(min_value=0, max_value=30),
)
def test_each_object_sees_its_row_and_its_flush(names: list[str], split: int) -> None:
    """The plan is shared within a flush, the evaluation is not: each object's default
    sees its own row, and the connection and options of its own session's flush."""
    base, tagged, seen = _tagged_model()
    eng = sa.create_engine("sqlite://")
    base.metadata.create_all(eng)
    first, second = list(enumerate(names))[:split], list(enumerate(names))[split:]
    expected: list[tuple[str, Any, str]] = []
    for label, part in (("a", first), ("b", second)):
        if not part:
            continue
        with Session(eng.execution_options(label=label)) as s:
            conn = s.connection()
            s.add_all([tagged(id=i, name=n) for i, n in part])
            s.flush()
            expected += [(n, conn, label) for _, n in part]
            s.commit()
    assert [(n, lbl) for n, _, lbl in seen] == [(n, lbl) for n, _, lbl in expected]
    assert all(c is want for (_, c, _), (_, want, _) in zip(seen, expected, strict=True))
    with eng.connect() as conn:
        got = {r.id: r for r in conn.execute(sa.select(tagged.__table__)).all()}
    for i, n in enumerate(names):
        label = "a" if i < len(first) else "b"
        assert got[i].tag == f"{n}/{label}"
        assert got[i].shard == compute_shard([got[i].tag], 8)
    eng.dispose()
