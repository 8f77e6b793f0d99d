"""Naive datetimes as shard sources (issue 31 item 5): refused by default, with the error
naming the opt-in; with it (per shard column, or once for a Base), hashed as the UTC
instant Spanner stores.

An app on the stock dialect writes ``datetime.utcnow()`` into a plain ``DateTime``:
Spanner stores it as UTC and reads it back aware; SQLite stores the wall time and reads
it back naive. Either way a row read back must hash to the shard it was written with,
through every write path and the reads. Before: ``ShardValueError: ... a naive datetime
is no instant``, with no way in.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import (
    ShardConfigError,
    ShardedIndex,
    ShardTypeError,
    ShardValueError,
    compute_shard,
    get_shard_column,
    merged,
    page,
    set_naive_datetimes,
    shard_column,
    sharded_select,
)

UTC = dt.timezone.utc
N = 8
T0 = dt.datetime(2024, 6, 1, 8, 30, 0, 123456)  # naive: as utcnow() gives


def model(how: str) -> Any:
    """A model whose shard hashes a naive ``DateTime``; ``how``: "column" (the keyword),
    "base" (set_naive_datetimes before the model), "after" (after it), "none"."""

    class Base(DeclarativeBase):
        pass

    if how == "base":
        set_naive_datetimes(Base, "utc")
    own = {"naive_datetimes": "utc"} if how == "column" else {}

    class Visit(Base):
        __tablename__ = "naive_visits"
        id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
        page: Mapped[str] = mapped_column(sa.String(50))
        at: Mapped[dt.datetime] = mapped_column(sa.DateTime)  # naive, as apps declare it
        shard: Mapped[int] = shard_column("page", "at", count=N, name="VisitShard", **own)
        __table_args__ = (
            ShardedIndex("naive_visits_by_page", "page", sa.desc("at"), shard="VisitShard"),
            ShardedIndex("naive_visits_newest", sa.desc("at"), shard="VisitShard"),
        )

    if how == "after":
        set_naive_datetimes(Base.registry, "utc")
    return Visit


def expected(page_: str, at: dt.datetime) -> int:
    return compute_shard((page_, at if at.tzinfo else at.replace(tzinfo=UTC)), N)


def rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "id": str(uuid.UUID(int=i)),
            "page": f"/p{i % 5}",
            "at": T0 + dt.timedelta(minutes=i, microseconds=i),
        }
        for i in range(start, start + n)
    ]


def write_every_way(engine: sa.Engine, visit: Any) -> list[dict[str, Any]]:
    """Ten rows through each write path, naive datetimes (two aware, not in UTC)."""
    table = visit.__table__
    written: list[dict[str, Any]] = []

    def take(n: int) -> list[dict[str, Any]]:
        batch = rows(n, len(written))
        written.extend(batch)
        return batch

    with Session(engine) as s:
        objs = [visit(**r) for r in take(10)]
        s.add_all(objs)
        s.flush()
        assert all(o.at.tzinfo is None for o in objs)  # still naive on the object
        s.execute(sa.insert(visit), take(10))
        s.bulk_insert_mappings(visit, take(10))  # type: ignore[arg-type]
        s.bulk_save_objects([visit(**r) for r in take(10)])
        s.commit()
    with engine.begin() as c:
        c.execute(table.insert(), take(10))  # executemany
        c.execute(table.insert().values(**take(1)[0]))  # single
        c.execute(table.insert().values(take(3)))  # multi-VALUES
        aware = take(2)  # aware, another zone: hashed as their instant, written as UTC
        for r in aware:
            r["at"] = r["at"].replace(tzinfo=dt.timezone(dt.timedelta(hours=-5)))
        c.execute(table.insert(), aware)
    return written


@pytest.mark.parametrize("how", ["column", "base", "after"])
def test_naive_sources_round_trip_on_every_path(engine: sa.Engine, how: str) -> None:
    visit = model(how)
    visit.metadata.create_all(engine)
    written = write_every_way(engine, visit)
    sc = get_shard_column(visit)
    with Session(engine) as s:
        back = s.scalars(sa.select(visit)).all()
        assert len(back) == len(written) == 56
        by_id = {r["id"]: r for r in written}
        for v in back:  # aware on Spanner, naive on SQLite: the shard it was written with
            assert v.shard == expected(v.page, v.at) == sc.compute([v.page, v.at])
            given_at = by_id[v.id]["at"]
            assert v.shard == expected(v.page, given_at)
        # a point lookup by the naive value reads one shard and finds the row
        r = written[3]
        stmt = sharded_select(visit, index="naive_visits_by_page").where(
            visit.page == r["page"], visit.at == r["at"]
        )
        compiled = stmt.compile(engine)
        assert "BETWEEN" not in str(compiled)
        assert compiled.params["VisitShard_1"] == expected(r["page"], r["at"])
        assert [v.id for v in s.scalars(stmt)] == [r["id"]]
        # newest first, merged and paged, equal the unsharded query
        newest = sharded_select(visit, index="naive_visits_newest").order_by(
            visit.at.desc(), visit.id
        )
        plain = s.scalars(sa.select(visit.id).order_by(visit.at.desc(), visit.id)).all()
        assert [v.id for v in merged(s, newest, 20)] == plain[:20]
        seen: list[str] = []
        cursor = None
        while True:
            p = page(s, newest, 15, cursor)
            seen.extend(v.id for v in p.rows)
            if p.next_cursor is None:
                break
            cursor = p.next_cursor
        assert seen == plain
        # an update of the source by a naive value moves the row to its new shard
        v = s.get(visit, written[0]["id"])
        assert v is not None
        v.at = T0 - dt.timedelta(days=3)
        s.commit()
        assert v.shard == expected(v.page, T0 - dt.timedelta(days=3))
        s.execute(sa.update(visit).where(visit.id == written[1]["id"]).values(at=T0))
        s.commit()
        moved = s.get(visit, written[1]["id"])
        assert moved is not None and moved.shard == expected(moved.page, T0)


def test_refused_by_default_with_the_way_in(engine: sa.Engine) -> None:
    visit = model("none")
    visit.metadata.create_all(engine)
    with Session(engine) as s, pytest.raises(ShardValueError) as err:
        s.add(visit(**rows(1)[0]))
        s.flush()
    message = str(err.value)
    assert "naive datetime is no instant" in message
    assert 'naive_datetimes="utc"' in message and "set_naive_datetimes(Base" in message
    with engine.begin() as c, pytest.raises(ShardValueError, match="naive_datetimes"):
        c.execute(visit.__table__.insert(), rows(2))


def test_a_column_says_otherwise_than_its_base() -> None:
    class Base(DeclarativeBase):
        pass

    set_naive_datetimes(Base, "utc")

    class Refusing(Base):
        __tablename__ = "refusing"
        id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
        at: Mapped[dt.datetime] = mapped_column(sa.DateTime)
        shard: Mapped[int] = shard_column("at", count=N, naive_datetimes="refuse")

    with pytest.raises(ShardValueError, match="naive"):
        get_shard_column(Refusing).compute([T0])
    assert get_shard_column(Refusing).compute([T0.replace(tzinfo=UTC)]) == compute_shard(
        (T0.replace(tzinfo=UTC),), N
    )


@pytest.mark.parametrize("bad", ["UTC", "local", True, 1, ""])
def test_only_the_listed_policies(bad: Any) -> None:
    with pytest.raises(ShardConfigError, match="naive_datetimes must be one of 'utc', 'refuse'"):
        shard_column("at", count=N, naive_datetimes=bad)
    with pytest.raises(ShardConfigError, match="naive_datetimes must be one of"):
        set_naive_datetimes(sa.MetaData(), bad)
    with pytest.raises(ShardTypeError, match="set_naive_datetimes takes"):
        set_naive_datetimes(object(), "utc")


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=12),
    st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30)),
    st.integers(min_value=-14 * 60, max_value=14 * 60),
)
def test_a_naive_value_hashes_as_its_utc_instant(page_: str, at: dt.datetime, minutes: int) -> None:
    sc = get_shard_column(_VISIT)
    assert sc.compute([page_, at]) == compute_shard((page_, at.replace(tzinfo=UTC)), N)
    zone = dt.timezone(dt.timedelta(minutes=minutes))
    try:
        local = at.replace(tzinfo=UTC).astimezone(zone)
    except OverflowError:
        return
    assert sc.compute([page_, local]) == sc.compute([page_, at])  # same instant, same shard


_VISIT = model("column")
