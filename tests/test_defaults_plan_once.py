"""The columns a write's Python defaults are evaluated for are planned once per shape of
row, not once per row (the team's rule: pay each cost once per statement or batch).

A Core ``insert(table)`` executemany into a ``TimestampShardedMixin`` table whose rows
omit the shard's source evaluates the source's default (and every other default
SQLAlchemy would run) ahead of SQLAlchemy, row by row. What it evaluates for a row
depends on the table and the keys the row gives, not on its values: that plan is made
once (``sharded_orm.write.sql.PREFETCH_PLANS`` counts it), while the defaults themselves
are still evaluated for every row, each seeing its own row and its own write's connection.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import TimestampShardedMixin, compute_shard, shard_column
from sharded_orm.write.sql import PREFETCH_PLANS

ROWS = 1000


def _models() -> tuple[type[Any], type[Any]]:
    """A fresh declarative base and its mixin model: a table no plan was made for yet."""

    class Base(DeclarativeBase):
        pass

    class Event(TimestampShardedMixin, Base):
        __tablename__ = "plan_once_events"
        payload: Mapped[str] = mapped_column(sa.String(40))

    return Base, Event


def _plans_of(table: Any) -> list[Any]:
    """The plans made for ``table``: one per (its column count, INSERT?, set of keys given)."""
    planned = PREFETCH_PLANS.keys()  # (a Memo: no iteration of its own)
    return [k for k in planned if k[0] is table]


def _lookups() -> int:
    s = PREFETCH_PLANS.stats()
    return s.hits + s.misses


def _made() -> int:
    return PREFETCH_PLANS.stats().misses


def _check_stored(conn: Any, table: Any, n: int) -> None:
    """Every row stored its own defaults, and its shard is the hash of its stored source."""
    got = conn.execute(sa.select(table.c.ShardId, table.c.Timestamp, table.c.EventId)).all()
    assert len(got) == n
    assert len({r.EventId for r in got}) == n  # evaluated per row, not once
    for shard, ts, _ in got:
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=dt.timezone.utc)
        assert shard == compute_shard([ts], 16)


def test_core_executemany_plans_once(engine: sa.Engine) -> None:
    base, event = _models()
    table = event.__table__
    base.metadata.create_all(engine)
    rows = [{"payload": f"p{i}"} for i in range(ROWS)]
    with engine.begin() as conn:
        before = _lookups()
        conn.execute(sa.insert(table), rows)
        looked_up = _lookups() - before
        # the same shape again, in a second statement: planned already
        conn.execute(sa.insert(table), [{"payload": "again"}])
    assert len(_plans_of(table)) == 1
    assert looked_up == 1  # once for the statement, not once per row (was 1,000)
    with engine.connect() as conn:
        _check_stored(conn, table, ROWS + 1)


def test_each_shape_of_row_planned_once(engine: sa.Engine) -> None:
    base, event = _models()
    table = event.__table__
    base.metadata.create_all(engine)
    omit_both = [{"payload": f"a{i}"} for i in range(ROWS // 2)]
    give_id = [{"payload": f"b{i}", "EventId": f"id-{i}"} for i in range(ROWS // 2)]
    with engine.begin() as conn:
        before = _lookups()
        conn.execute(sa.insert(table), omit_both)
        conn.execute(sa.insert(table), give_id)
        looked_up = _lookups() - before
    plans = _plans_of(table)
    assert len(plans) == 2
    assert {frozenset(k[3]) for k in plans} == {
        frozenset({"payload"}),
        frozenset({"payload", "EventId"}),
    }
    assert looked_up == 2
    with engine.connect() as conn:
        _check_stored(conn, table, ROWS)


def test_orm_flush_plans_once(engine: sa.Engine) -> None:
    base, event = _models()
    base.metadata.create_all(engine)
    with Session(engine) as s:
        s.add_all([event(payload=f"p{i}") for i in range(ROWS)])
        before, looked = _made(), _lookups()
        s.flush()
        made, looked = _made() - before, _lookups() - looked
        s.commit()
    assert len(_plans_of(event.__table__)) == 1
    # made once and looked up once for the flush (each was once per object)
    assert (made, looked) == (1, 1)
    with engine.connect() as conn:
        _check_stored(conn, event.__table__, ROWS)


def test_multi_values_plans_once() -> None:
    base, event = _models()
    table = event.__table__
    eng = sa.create_engine("sqlite://")
    base.metadata.create_all(eng)
    with eng.begin() as conn:
        before = _lookups()
        conn.execute(sa.insert(table).values([{"payload": f"p{i}"} for i in range(ROWS)]))
        looked_up = _lookups() - before
        _check_stored(conn, table, ROWS)
    assert len(_plans_of(table)) == 1
    assert looked_up == 1


def _tagged_table() -> tuple[sa.MetaData, sa.Table, list[tuple[str, Any, str]]]:
    """A shard whose source's default is context-sensitive: it reads its row's ``name``
    and the write's connection and execution options; what each call saw is recorded."""
    seen: list[tuple[str, Any, str]] = []

    def tag(ctx: Any) -> str:
        name, label = ctx.get_current_parameters()["name"], ctx.execution_options["label"]
        seen.append((name, ctx.connection, label))
        return f"{name}/{label}"

    md = sa.MetaData()
    table = sa.Table(
        "tagged",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(40)),
        sa.Column("tag", sa.String(80), default=tag),
        shard_column("tag", count=8, name="shard").column,
    )
    return md, table, seen


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    names=st.lists(st.text("abcxyz", min_size=1, max_size=6), min_size=1, max_size=40),
    split=st.integers(min_value=0, max_value=40),
)
def test_context_default_sees_its_row_and_write(names: list[str], split: int) -> None:
    """The plan is shared, the evaluation is not: each row's default sees that row, and
    the connection of the write it belongs to (two writes, two connections, one plan)."""
    md, table, seen = _tagged_table()
    eng = sa.create_engine("sqlite://")
    md.create_all(eng)
    rows = [{"id": i, "name": n} for i, n in enumerate(names)]
    first, second = rows[:split], rows[split:]
    with eng.connect() as a, eng.connect() as b:
        a.execution_options(label="a")
        b.execution_options(label="b")
        if first:
            a.execute(sa.insert(table), first)
            a.commit()
        if second:
            b.execute(sa.insert(table), second)
            b.commit()
        expected = [(r["name"], a, "a") for r in first] + [(r["name"], b, "b") for r in second]
        assert len(seen) == len(expected)
        for (name, conn, label), (want_name, want_conn, want_label) in zip(
            seen, expected, strict=True
        ):
            assert (name, label) == (want_name, want_label)
            assert conn is want_conn
        got = {r.id: r for r in a.execute(sa.select(table)).all()}
    assert len(_plans_of(table)) == 1
    for i, r in enumerate(rows):
        stored = got[r["id"]]
        label = "a" if i < len(first) else "b"
        assert stored.tag == f"{r['name']}/{label}"
        assert stored.shard == compute_shard([stored.tag], 8)


def test_statement_values_keep_their_own_plan() -> None:
    """``.values()`` keys count as given: a statement giving the source in ``.values()``
    evaluates no default for it, whatever shape its rows have."""
    md, table, seen = _tagged_table()
    eng = sa.create_engine("sqlite://")
    md.create_all(eng)
    with eng.connect() as conn:
        conn.execution_options(label="c")
        conn.execute(sa.insert(table).values(tag="fixed"), [{"id": 1, "name": "x"}])
        conn.execute(sa.insert(table), [{"id": 2, "name": "y"}])
        conn.commit()
        got = {r.id: r for r in conn.execute(sa.select(table)).all()}
    assert [s[0] for s in seen] == ["y"]
    assert got[1].tag == "fixed" and got[1].shard == compute_shard(["fixed"], 8)
    assert got[2].tag == "y/c" and got[2].shard == compute_shard(["y/c"], 8)


@pytest.mark.slow
def test_plans_once_for_many_rows_on_sqlite() -> None:
    """20,000 rows (the size the cost was profiled at): still one plan lookup."""
    base, event = _models()
    eng = sa.create_engine("sqlite://")
    base.metadata.create_all(eng)
    with eng.begin() as conn:
        before = _lookups()
        conn.execute(sa.insert(event.__table__), [{"payload": str(i)} for i in range(20_000)])
        assert _lookups() - before == 1
        _check_stored(conn, event.__table__, 20_000)
