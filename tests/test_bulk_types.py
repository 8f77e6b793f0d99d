"""bulk_load stores every value exactly as the ORM would: types, ids, shards."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import (
    HashedPrimaryKeyMixin,
    UTCDateTime,
    UUIDPrimaryKeyMixin,
    bulk_load,
    hashed_id_of,
    id_filter,
)

UTC = dt.timezone.utc


class Color(enum.Enum):
    red = "r"
    blue = "b"


class Lower(sa.TypeDecorator[str]):
    """A type with its own bind step: what it stores is not what it is given."""

    impl = sa.String(20)
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: sa.Dialect) -> str | None:
        return value.lower() if value is not None else None


def typed_table(with_array: bool = False) -> sa.Table:
    extra = [sa.Column("arr", sa.ARRAY(sa.String(10)))] if with_array else []
    return sa.Table(
        "Typed",
        sa.MetaData(),
        sa.Column("id", sa.String(10), primary_key=True),
        sa.Column("u", sa.Uuid),
        sa.Column("b", sa.LargeBinary),
        sa.Column("j", sa.JSON),
        sa.Column("n", sa.Numeric),
        sa.Column("f", sa.Float),
        sa.Column("d", sa.Date),
        sa.Column("ok", sa.Boolean),
        sa.Column("ts", UTCDateTime),
        sa.Column("e", sa.Enum(Color)),
        sa.Column("low", Lower),
        *extra,
    )


def sample(i: int) -> dict[str, Any]:
    return {
        "u": uuid.UUID(int=i + 1),
        "b": [b"\x00\xff\x10", b"xyz!"][i % 2],  # b"xyz!" is valid UTF-8: must still be BYTES
        "j": {"k": [i, "x"], "nested": {"n": None}},
        "n": decimal.Decimal("12.50") + i,
        "f": 2.5 + i,
        "d": dt.date(2024, 1, 2),
        "ok": i % 2 == 0,
        "ts": dt.datetime(2024, 1, 1, 12, 30, 1, 250000, tzinfo=UTC),
        "e": Color.blue,
        "low": "MiXeD",
    }


def test_values_round_trip_and_match_orm_lookups(engine: sa.Engine) -> None:
    t = typed_table()
    t.metadata.create_all(engine)
    rows = [{"id": f"r{i}", **sample(i)} for i in range(20)]
    report = bulk_load(engine, t, rows, workers=2)
    assert report.complete
    with engine.connect() as conn:
        got = {r.id: r._asdict() for r in conn.execute(sa.select(t))}
        # looked up the way the ORM binds: found only if stored in the ORM's form
        by_uuid = conn.execute(sa.select(t.c.id).where(t.c.u == uuid.UUID(int=4))).scalar()
        by_low = conn.execute(sa.select(t.c.id).where(t.c.low == "MIXED")).scalars().all()
        by_enum = conn.execute(sa.select(sa.func.count()).where(t.c.e == Color.blue)).scalar()
    assert by_uuid == "r3" and len(by_low) == 20 and by_enum == 20
    for r in rows:
        want = {**r, "low": "mixed"}
        assert got[r["id"]] == want


@pytest.mark.emulator
def test_stored_exactly_as_an_orm_insert_stores_it(spanner_emulator: Any) -> None:
    db = spanner_emulator.create_database()
    engine = spanner_emulator.engine(db)
    t = typed_table(with_array=True)
    t.metadata.create_all(engine)
    for i in range(2):
        row = {**sample(i), "arr": ["x", "y"]}
        with engine.begin() as conn:
            conn.execute(t.insert(), [{"id": f"orm{i}", **row}])
        assert bulk_load(engine, t, [{"id": f"bulk{i}", **row}]).complete
        database = spanner_emulator.database(db)  # a bare Database: no engine, same values
        assert bulk_load(database, t, [{"id": f"db{i}", **row}]).complete
    with spanner_emulator.database(db).snapshot() as snap:  # raw values, no SQLAlchemy
        raw = {r[0]: r[1:] for r in snap.execute_sql("SELECT * FROM Typed")}
    engine.dispose()
    assert raw["bulk0"] == raw["orm0"] == raw["db0"] and raw["bulk1"] == raw["orm1"] == raw["db1"]
    assert raw["bulk0"] != raw["bulk1"]


class Base(DeclarativeBase):
    pass


class Doc(UUIDPrimaryKeyMixin, Base):
    __tablename__ = "Docs"
    title: Mapped[str] = mapped_column(sa.String(50))


_next = iter(range(1000, 10**6))


class Order(HashedPrimaryKeyMixin, Base):
    __tablename__ = "Orders"
    __hash_buckets__ = 16
    __id_default__ = staticmethod(lambda: next(_next))
    total: Mapped[int] = mapped_column(sa.Integer)


def test_ids_and_hashed_ids_are_filled_as_the_orm_fills_them(engine: sa.Engine) -> None:
    Base.metadata.create_all(engine)
    bulk_load(engine, Doc, [{"title": f"t{i}"} for i in range(50)])
    given = [{"id": 7, "total": 1}, {"id": 8, "total": 2}]
    bulk_load(engine, Order, given + [{"total": 3}, {"total": 4}])
    with Session(engine) as s:
        docs = s.scalars(sa.select(Doc)).all()
        assert len({d.id for d in docs}) == 50
        assert all(str(uuid.UUID(d.id)) == d.id for d in docs)  # UUID4 text, 36 chars
        orders = s.scalars(sa.select(Order).order_by(Order.total)).all()
        assert [o.id for o in orders][:2] == [7, 8] and all(o.id >= 1000 for o in orders[2:])
        assert all(o.hashed_id == hashed_id_of(Order, o.id) for o in orders)
        assert s.scalars(sa.select(Order).where(id_filter(Order, 8))).one().total == 2
