"""Key reshard, the expand's dual write (``declare_successor``): every library write path
to the old table reaches the new one in the same transaction, its shard computed by the
new table's spec; tables without a successor are untouched."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa
from reshard_models import events
from sqlalchemy.orm import DeclarativeBase, Session

from sharded_orm import (
    ShardConfigError,
    TimestampShardedMixin,
    bulk_load,
    compute_shard,
    declare_successor,
)
from sharded_orm.write.successor import successor_of

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


metadata = events("both")  # Events and the successor declared below, Events16
Event, Event16 = metadata.info["models"]["Event"], metadata.info["models"]["Event16"]


class Base(DeclarativeBase):
    pass


class Plain(TimestampShardedMixin, Base):
    __tablename__ = "Plain"
    __shard_count__ = 8


declare_successor(Event, Event16)


def _rows(conn: Any, table: Any) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    got = conn.execute(sa.select(table.c.EventId, table.c.ShardId, table.c.Timestamp, table.c.Kind))
    return {
        r.EventId: (r.ShardId, r.Timestamp.replace(tzinfo=dt.timezone.utc), r.Kind) for r in got
    }


def _same(engine: sa.Engine) -> dict[Any, Any]:
    """Both tables hold the same rows, each with its own table's shard."""
    with engine.connect() as c:
        old, new = _rows(c, Event.__table__), _rows(c, Event16.__table__)
    assert old.keys() == new.keys()
    for k, (s8, ts, kind) in old.items():
        assert s8 == compute_shard((ts,), 8)
        assert new[k] == (compute_shard((ts,), 16), ts, kind)
    return old


@pytest.fixture
def engine() -> Any:
    engine = sa.create_engine("sqlite://")
    metadata.create_all(engine)
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


def test_successor_is_declared_on_the_old_table_only() -> None:
    assert successor_of(Event.__table__) is Event16.__table__
    assert successor_of(Event16.__table__) is None and successor_of(Plain.__table__) is None


def test_orm_add_update_delete_reach_both_tables(engine: sa.Engine) -> None:
    with Session(engine) as s, s.begin():
        s.add_all([Event(timestamp=T0 + dt.timedelta(seconds=i), kind="a") for i in range(5)])
    assert len(_same(engine)) == 5
    with Session(engine) as s, s.begin():
        first, second, *_ = s.scalars(sa.select(Event).order_by(Event.event_id)).all()
        first.kind = "changed"
        s.delete(second)
    rows = _same(engine)
    assert len(rows) == 4 and sorted(k for _, _, k in rows.values()) == ["a", "a", "a", "changed"]


def test_core_insert_update_delete_reach_both_tables(engine: sa.Engine) -> None:
    t = Event.__table__
    with engine.begin() as c:
        c.execute(
            sa.insert(t),
            [{"Timestamp": T0 + dt.timedelta(minutes=i), "Kind": "k"} for i in range(6)],
        )
        c.execute(sa.insert(t).values(Timestamp=T0, EventId="one", Kind="v"))
    assert len(_same(engine)) == 7
    with engine.begin() as c:
        c.execute(
            sa.update(t).where(t.c.Timestamp >= T0 + dt.timedelta(minutes=3)).values(Kind="u")
        )
        c.execute(sa.delete(t).where(t.c.EventId == "one"))
    rows = _same(engine)
    assert len(rows) == 6 and sorted(k for _, _, k in rows.values()) == ["k"] * 3 + ["u"] * 3


def test_orm_bulk_statements_reach_both_tables(engine: sa.Engine) -> None:
    with Session(engine) as s, s.begin():
        s.execute(
            sa.insert(Event),
            [{"timestamp": T0, "event_id": f"e{i}", "kind": "b"} for i in range(4)],
        )
        s.execute(sa.update(Event).where(Event.event_id == "e1").values(kind="c"))
        s.execute(sa.delete(Event).where(Event.event_id == "e2"))
    rows = _same(engine)
    assert sorted(rows) == ["e0", "e1", "e3"] and rows["e1"][2] == "c"


def test_a_rolled_back_write_leaves_neither_table_changed(engine: sa.Engine) -> None:
    with pytest.raises(RuntimeError), engine.begin() as c:
        c.execute(sa.insert(Event.__table__), [{"Timestamp": T0, "Kind": "x"}])
        raise RuntimeError
    assert _same(engine) == {}


def test_bulk_load_writes_both_tables(engine: sa.Engine) -> None:
    rows = [{"timestamp": T0 + dt.timedelta(seconds=i), "kind": "l"} for i in range(50)]
    bulk_load(engine, Event, rows, progress=False)
    assert len(_same(engine)) == 50


def test_unmirrorable_writes_are_refused(engine: sa.Engine) -> None:
    t = Event.__table__
    with pytest.raises(ShardConfigError, match="FROM SELECT"), engine.begin() as c:
        c.execute(
            sa.insert(t).from_select(list(t.c), sa.select(*Plain.__table__.c, sa.literal("k")))
        )
    with pytest.raises(ShardConfigError, match="multi-row VALUES"), engine.begin() as c:
        c.execute(
            sa.insert(t).values([{"Timestamp": T0, "Kind": "m"}, {"Timestamp": T0, "Kind": "n"}])
        )
    assert _same(engine) == {}


def test_a_multi_row_values_list_with_its_keys_is_mirrored(engine: sa.Engine) -> None:
    t = Event.__table__
    with engine.begin() as c:
        c.execute(
            sa.insert(t).values(
                [
                    {"Timestamp": T0, "EventId": "a", "Kind": "m"},
                    {"Timestamp": T0, "EventId": "b", "Kind": "m"},
                ]
            )
        )
    assert sorted(_same(engine)) == ["a", "b"]


def test_a_successor_must_hold_the_old_columns_and_a_key_shard() -> None:
    with pytest.raises(ShardConfigError, match="no shard column in its primary key"):
        declare_successor(
            Event,
            sa.Table("X", sa.MetaData(), sa.Column("EventId", sa.String(36), primary_key=True)),
        )
    with pytest.raises(ShardConfigError, match="that Plain lacks"):
        declare_successor(Plain, Event16)


@pytest.mark.emulator
def test_every_write_path_reaches_both_tables_on_spanner(spanner_engine: sa.Engine) -> None:
    engine = spanner_engine
    metadata.create_all(engine)
    Base.metadata.create_all(engine)
    t = Event.__table__
    with Session(engine) as s, s.begin():  # ORM flush
        s.add_all([Event(timestamp=T0 + dt.timedelta(seconds=i), kind="a") for i in range(3)])
    with engine.begin() as c:  # Core
        c.execute(
            sa.insert(t), [{"Timestamp": T0, "EventId": f"c{i}", "Kind": "c"} for i in range(3)]
        )
    bulk_load(  # mutations, both tables in each commit
        engine, Event, [{"timestamp": T0, "event_id": f"b{i}", "kind": "b"} for i in range(40)],
        progress=False, workers=2,
    )  # fmt: skip
    assert len(_same(engine)) == 46
    with Session(engine) as s, s.begin():
        one = s.scalars(sa.select(Event).where(Event.kind == "a").limit(1)).one()
        one.kind = "orm-updated"
        s.delete(s.scalars(sa.select(Event).where(Event.event_id == "b0")).one())
    with engine.begin() as c:
        c.execute(sa.update(t).where(t.c.EventId == "c1").values(Kind="core-updated"))
        c.execute(
            sa.delete(t).where(t.c.Kind == "b", t.c.EventId.in_([f"b{i}" for i in range(2, 40)]))
        )
    rows = _same(engine)
    assert sorted(k for _, _, k in rows.values()).count("b") == 1
    assert len(rows) == 7 and {"orm-updated", "core-updated"} <= {k for _, _, k in rows.values()}


def test_orm_bulk_by_primary_key_and_merge_reach_both_tables(engine: sa.Engine) -> None:
    with Session(engine) as s, s.begin():
        s.add_all([Event(timestamp=T0, event_id=f"p{i}", kind="a") for i in range(3)])
    with Session(engine) as s, s.begin():
        objs = {e.event_id: e for e in s.scalars(sa.select(Event))}
        pk = {e: (o.shard_id, o.timestamp) for e, o in objs.items()}
    with Session(engine) as s, s.begin():
        s.execute(  # ORM bulk UPDATE by primary key
            sa.update(Event),
            [{"shard_id": pk["p0"][0], "timestamp": pk["p0"][1], "event_id": "p0", "kind": "b"}],
        )
        s.bulk_update_mappings(  # type: ignore[attr-defined]
            Event,
            [{"shard_id": pk["p1"][0], "timestamp": pk["p1"][1], "event_id": "p1", "kind": "c"}],
        )
        s.merge(Event(shard_id=pk["p2"][0], timestamp=pk["p2"][1], event_id="p2", kind="d"))
    rows = _same(engine)
    assert {k: v[2] for k, v in rows.items()} == {"p0": "b", "p1": "c", "p2": "d"}
