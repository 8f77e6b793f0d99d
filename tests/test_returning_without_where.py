"""UPDATE and DELETE with no WHERE clause and a RETURNING clause, on Spanner.

Spanner requires a WHERE clause on UPDATE and DELETE, so the Spanner DB-API appends
``WHERE 1=1`` to any UPDATE or DELETE in which ``sqlparse`` finds none. It appends it at
the end of the text, after sqlalchemy-spanner's ``THEN RETURN ...``, which Spanner refuses
as a syntax error: ``update(t).values(v=1).returning(t.c.id)`` failed, in Core and in the
ORM (``synchronize_session="fetch"`` adds a RETURNING of its own). Our compiler renders
``WHERE true`` for such a statement, so the driver appends nothing (docs/upstream.md, D12).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any, cast

import pytest
import sqlalchemy as sa
from google.cloud.spanner_dbapi import parse_utils
from google.cloud.sqlalchemy_spanner import sqlalchemy_spanner as stock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm.schema.mixins import TimestampShardedMixin
from sharded_orm.spanner.dialect import SpannerDialect


class Base(DeclarativeBase):
    pass


class Item(Base):
    __tablename__ = "rww_items"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    v: Mapped[int]


class Reading(TimestampShardedMixin, Base):
    __tablename__ = "rww_readings"
    __shard_count__ = 4
    note: Mapped[str] = mapped_column(sa.String(40))


items = cast(sa.Table, Item.__table__)
readings = cast(sa.Table, Reading.__table__)


@pytest.fixture
def db(engine: sa.Engine) -> Iterator[sa.Engine]:
    """The conftest's ``engine`` (SQLite, then the emulator) with this module's tables."""
    Base.metadata.create_all(engine)
    yield engine


def _fill(engine: sa.Engine, values: list[int]) -> None:
    with engine.begin() as conn:
        conn.execute(sa.delete(items).where(items.c.id >= 0))
        if values:
            conn.execute(items.insert(), [{"id": i, "v": v} for i, v in enumerate(values)])


def _stored(engine: sa.Engine) -> dict[int, int]:
    with engine.connect() as conn:
        return {r.id: r.v for r in conn.execute(sa.select(items.c.id, items.c.v))}


# -- what the driver makes of what we compile (no server) ------------------------------

_T = sa.Table(
    "t",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("v", sa.Integer),
    sa.Column("s", sa.String(20)),
)
_U = sa.Table("u", sa.MetaData(), sa.Column("id", sa.Integer), sa.Column("w", sa.Integer))

SET_VALUES = [
    sa.literal(1),
    _T.c.v + 1,
    sa.literal("WHERE 1=1"),
    sa.case((_T.c.v > 3, 1), else_=0),
    sa.select(sa.func.max(_U.c.w)).where(_U.c.id > 0).scalar_subquery(),
    sa.func.coalesce(_T.c.v, 0),
]
WHERES = [
    None,
    _T.c.id == 1,
    _T.c.id.in_([1, 2]),
    sa.exists(sa.select(_U.c.id).where(_U.c.id == _T.c.id)),
    sa.or_(_T.c.s == "x", _T.c.s.is_(None)),
    sa.true(),
]
RETURNING = [(), (_T.c.id,), (_T.c.id, _T.c.v)]


def _sent(stmt: Any) -> tuple[str, str]:
    """The text our dialect compiles for ``stmt`` and the SQL the DB-API sends for it."""
    compiled = stmt.compile(
        dialect=SpannerDialect(paramstyle="format"), compile_kwargs={"render_postcompile": True}
    )
    text = str(compiled)
    args = [1] * (text.count("%s") - text.count("%%s"))
    parsed = parse_utils.classify_statement(text, args)
    return text, parsed.statement.sql


@settings(max_examples=150, deadline=None)
@given(
    delete=st.booleans(),
    value=st.sampled_from(SET_VALUES),
    where=st.sampled_from(WHERES),
    returning=st.sampled_from(RETURNING),
)
def test_the_dbapi_appends_nothing_to_our_updates_and_deletes(
    delete: bool, value: Any, where: Any, returning: tuple[Any, ...]
) -> None:
    stmt: Any = sa.delete(_T) if delete else sa.update(_T).values(v=value)
    if where is not None:
        stmt = stmt.where(where)
    if returning:
        stmt = stmt.returning(*returning)
    text, sent = _sent(stmt)
    assert " WHERE " in text and "1=1" not in sent
    if returning:
        assert sent.rstrip().split("THEN RETURN")[-1].strip().startswith(returning[0].name)


def test_a_statement_with_a_where_is_compiled_as_before() -> None:
    stmt = sa.update(_T).values(v=1).where(_T.c.id == 2).returning(_T.c.id)
    ours = str(stmt.compile(dialect=SpannerDialect()))
    assert ours == str(stmt.compile(dialect=stock.SpannerDialect()))
    assert ours == "UPDATE t SET v=:v WHERE t.id = :id_1 THEN RETURN id"


def test_upstream_dbapi_appends_where_after_then_return() -> None:
    """Trips when upstream changes: the DB-API still appends ``WHERE 1=1`` at the end of
    an UPDATE/DELETE with no WHERE, after ``THEN RETURN``, and sqlalchemy-spanner still
    compiles such a statement with no WHERE. When either stops, drop
    ``ShardedSpannerSQLCompiler.visit_update``/``visit_delete``'s ``WHERE true`` (D12)."""
    for sql in ("UPDATE t SET v = %s THEN RETURN id", "DELETE FROM t THEN RETURN id"):
        args = [1] if "%s" in sql else None
        sent = parse_utils.classify_statement(sql, args).statement.sql
        assert sent.endswith("THEN RETURN id WHERE 1=1"), sent
    for stmt in (sa.update(_T).values(v=1).returning(_T.c.id), sa.delete(_T).returning(_T.c.id)):
        assert " WHERE " not in str(stmt.compile(dialect=stock.SpannerDialect()))


# -- Core -------------------------------------------------------------------------------


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(values=st.lists(st.integers(-1000, 1000), max_size=4), new=st.integers(-1000, 1000))
def test_core_update_without_where_returning(db: sa.Engine, values: list[int], new: int) -> None:
    _fill(db, values)
    with db.begin() as conn:
        rows = conn.execute(sa.update(items).values(v=new).returning(items.c.id, items.c.v))
        got = sorted(tuple(r) for r in rows)
    assert got == [(i, new) for i in range(len(values))]
    assert _stored(db) == {i: new for i in range(len(values))}


def test_core_update_without_where_nor_returning(db: sa.Engine) -> None:
    _fill(db, [1, 2, 3])
    with db.begin() as conn:
        assert conn.execute(sa.update(items).values(v=items.c.v * 10)).rowcount == 3
    assert _stored(db) == {0: 10, 1: 20, 2: 30}


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(values=st.lists(st.integers(-1000, 1000), max_size=4))
def test_core_delete_without_where_returning(db: sa.Engine, values: list[int]) -> None:
    _fill(db, values)
    with db.begin() as conn:
        got = sorted(
            tuple(r) for r in conn.execute(sa.delete(items).returning(items.c.id, items.c.v))
        )
    assert got == sorted(enumerate(values))
    assert _stored(db) == {}


def test_core_delete_without_where_nor_returning(db: sa.Engine) -> None:
    _fill(db, [1, 2])
    with db.begin() as conn:
        assert conn.execute(sa.delete(items)).rowcount == 2
    assert _stored(db) == {}


# -- ORM --------------------------------------------------------------------------------

SYNCS: list[Any] = ["auto", "evaluate", "fetch", False]


@pytest.mark.parametrize("sync", SYNCS)
def test_orm_update_without_where_returning(db: sa.Engine, sync: Any) -> None:
    _fill(db, [1, 2, 3])
    with Session(db) as session:
        held = session.scalars(sa.select(Item).order_by(Item.id)).all()
        rows = session.execute(
            sa.update(Item).values(v=7).returning(Item.id, Item.v),
            execution_options={"synchronize_session": sync},
        ).all()
        assert sorted(tuple(r) for r in rows) == [(0, 7), (1, 7), (2, 7)]
        if sync is not False:  # the objects the session holds were brought up to date
            assert [o.v for o in held] == [7, 7, 7]
        session.commit()
    assert _stored(db) == {0: 7, 1: 7, 2: 7}


@pytest.mark.parametrize("sync", SYNCS)
def test_orm_update_without_where_or_returning(db: sa.Engine, sync: Any) -> None:
    """``synchronize_session="fetch"`` adds a RETURNING of its own where the dialect
    supports one (Spanner and SQLite do)."""
    _fill(db, [1, 2])
    with Session(db) as session:
        held = session.scalars(sa.select(Item).order_by(Item.id)).all()
        result = session.execute(
            sa.update(Item).values(v=Item.v + 100),
            execution_options={"synchronize_session": sync},
        )
        assert result.rowcount == 2  # type: ignore[attr-defined]
        if sync is not False:
            assert [o.v for o in held] == [101, 102]
        session.commit()
    assert _stored(db) == {0: 101, 1: 102}


@pytest.mark.parametrize("sync", SYNCS)
@pytest.mark.parametrize("returning", [False, True])
def test_orm_delete_without_where(db: sa.Engine, sync: Any, returning: bool) -> None:
    _fill(db, [4, 5, 6])
    with Session(db) as session:
        held = session.scalars(sa.select(Item)).all()
        stmt: Any = sa.delete(Item)
        if returning:
            stmt = stmt.returning(Item.id)
        result = session.execute(stmt, execution_options={"synchronize_session": sync})
        if returning:
            assert sorted(result.scalars()) == [0, 1, 2]
        else:
            assert result.rowcount == 3  # type: ignore[attr-defined]
        if sync is not False:  # the session no longer holds the deleted objects
            assert not any(o in session for o in held)
        session.commit()
    assert _stored(db) == {}


# -- a sharded model: the library's write hooks meet it -----------------------------------


def _readings(engine: sa.Engine) -> list[tuple[str, int, str]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(readings.c.EventId, readings.c.ShardId, readings.c.note))
        return sorted((r.EventId, r.ShardId, r.note) for r in rows)


def _add_readings(engine: sa.Engine) -> list[tuple[str, int]]:
    start = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    with Session(engine) as session:
        objs = [
            Reading(event_id=f"e{i}", timestamp=start + dt.timedelta(hours=i), note="old")
            for i in range(3)
        ]
        session.add_all(objs)
        session.commit()
        return sorted((o.event_id, o.shard_id) for o in objs)


@pytest.mark.parametrize("sync", SYNCS)
def test_sharded_orm_update_without_where_returning(db: sa.Engine, sync: Any) -> None:
    keys = _add_readings(db)
    with Session(db) as session:
        rows = session.execute(
            sa.update(Reading).values(note="new").returning(Reading.event_id, Reading.note),
            execution_options={"synchronize_session": sync},
        ).all()
        assert sorted(tuple(r) for r in rows) == [(e, "new") for e, _ in keys]
        session.commit()
    assert _readings(db) == [(e, s, "new") for e, s in keys]


def test_sharded_core_update_and_delete_without_where_returning(db: sa.Engine) -> None:
    keys = _add_readings(db)
    with db.begin() as conn:
        rows = conn.execute(
            sa.update(readings).values(note="core").returning(readings.c.EventId)
        ).scalars()
        assert sorted(rows) == [e for e, _ in keys]
    assert _readings(db) == [(e, s, "core") for e, s in keys]
    with db.begin() as conn:
        gone = conn.execute(
            sa.delete(readings).returning(readings.c.EventId, readings.c.ShardId)
        ).all()
    assert sorted(tuple(r) for r in gone) == keys
    assert _readings(db) == []


@pytest.mark.parametrize("sync", SYNCS)
def test_sharded_orm_delete_without_where_returning(db: sa.Engine, sync: Any) -> None:
    keys = _add_readings(db)
    with Session(db) as session:
        rows = session.execute(
            sa.delete(Reading).returning(Reading.event_id, Reading.shard_id),
            execution_options={"synchronize_session": sync},
        ).all()
        assert sorted(tuple(r) for r in rows) == keys
        session.commit()
    assert _readings(db) == []


def test_async_engine_update_and_delete_without_where_returning(
    spanner_engine: sa.Engine, spanner_async_engine: Any
) -> None:
    """``spanner+spanner_async`` compiles with the same compiler."""
    import asyncio

    Base.metadata.create_all(spanner_engine)
    _fill(spanner_engine, [1, 2])

    async def body() -> tuple[list[Any], list[Any]]:
        async with spanner_async_engine.begin() as conn:
            changed = await conn.execute(sa.update(items).values(v=9).returning(items.c.id))
            ids = sorted(changed.scalars())
            gone = await conn.execute(sa.delete(items).returning(items.c.id, items.c.v))
            return ids, sorted(tuple(r) for r in gone)

    assert asyncio.run(body()) == ([0, 1], [(0, 9), (1, 9)])
    assert _stored(spanner_engine) == {}
