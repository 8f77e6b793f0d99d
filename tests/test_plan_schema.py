"""The planner knows the schema (issue 21, item 5): indexes inherited from a parent's
table, NULL_FILTERED indexes used only where the statement excludes NULL (and refused
otherwise), and ``flag == True`` pinning a point lookup like a bound ``True``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import (
    ShardConfigError,
    ShardedIndex,
    UTCDateTime,
    compute_shard,
    shard_column,
    sharded_select,
)
from sharded_orm.read.criteria import nulls_excluded
from sharded_orm.read.plan import EMULATOR_NULL_FILTER_HINT
from sharded_orm.spanner.dialect import SpannerDialect

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


class Base(DeclarativeBase):
    pass


class Parent(Base):
    __tablename__ = "PlanParents"
    id: Mapped[int] = mapped_column("Id", sa.BigInteger, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column("Kind", sa.String(20))
    ts: Mapped[dt.datetime | None] = mapped_column("Ts", UTCDateTime, nullable=True)
    rank: Mapped[int | None] = mapped_column("Rank", sa.BigInteger, nullable=True)
    shard: Mapped[int] = shard_column("id", count=4, name="ShardId")
    __mapper_args__ = {"polymorphic_on": "kind", "polymorphic_identity": "parent"}
    __table_args__ = (
        ShardedIndex("PByTs", sa.desc("Ts"), shard="ShardId"),
        ShardedIndex("PByTsNF", sa.desc("Ts"), "Rank", shard="ShardId", null_filtered=True),
    )


class Child(Parent):
    __tablename__ = "PlanChildren"
    id: Mapped[int] = mapped_column(
        "Id", sa.BigInteger, sa.ForeignKey("PlanParents.Id"), primary_key=True
    )
    extra: Mapped[str | None] = mapped_column("Extra", sa.String(20))
    __mapper_args__ = {"polymorphic_identity": "child"}


class Flagged(Base):
    __tablename__ = "PlanFlagged"
    id: Mapped[int] = mapped_column("Id", sa.BigInteger, primary_key=True, autoincrement=False)
    flag: Mapped[bool] = mapped_column("Flag", sa.Boolean)
    shard: Mapped[int] = shard_column("flag", count=8, name="ShardId")
    __table_args__ = (ShardedIndex("FlaggedByFlag", "Flag", shard="ShardId"),)


def rows() -> list[Any]:
    out: list[Any] = []
    for i in range(40):
        cls = Child if i % 2 else Parent
        kw = {"extra": f"x{i}"} if cls is Child else {}
        ts = None if i % 5 == 0 else T0 + dt.timedelta(minutes=i)
        out.append(cls(id=i, ts=ts, rank=None if i % 7 == 0 else i, **kw))
    out += [Flagged(id=i, flag=i % 3 == 0) for i in range(30)]
    return out


def spanner_sql(stmt: Any) -> str:
    return " ".join(str(stmt.compile(dialect=SpannerDialect())).split())


# ----------------------------------------------------------------------------- inheritance


def test_an_index_of_the_parent_table_serves_the_subclass() -> None:
    sql = spanner_sql(sharded_select(Child, index="PByTs"))
    assert "FROM `PlanParents` @{FORCE_INDEX=PByTs} JOIN `PlanChildren`" in sql
    assert "`PlanParents`.`ShardId` BETWEEN" in sql


def test_an_index_nowhere_in_the_hierarchy_names_every_table() -> None:
    with pytest.raises(ShardConfigError, match=r"'PlanChildren' or 'PlanParents' has no index "
                       r"named 'Nope' \(indexes: PByTs, PByTsNF\)"):  # fmt: skip
        sharded_select(Child, index="Nope")


def test_the_subclass_reads_through_the_parent_key_and_index_on_sqlite() -> None:
    engine = sa.create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        session.add_all(rows())
        session.commit()
        for stmt, plain in [
            (sharded_select(Child, index="PByTs"), sa.select(Child)),
            (
                sharded_select(Child, index="PByTs").where(Child.id == 7),
                sa.select(Child).where(Child.id == 7),
            ),
        ]:
            got = session.execute(stmt.order_by(Child.id)).scalars().all()
            want = session.execute(plain.order_by(Child.id)).scalars().all()
            assert got == want and len(want) >= 1
            assert all(isinstance(c, Child) for c in got)
    point = sharded_select(Child, index="PByTs").where(Child.id == 7).point_shard
    assert point == compute_shard([7], 4)


# ----------------------------------------------------------------------------- NULL_FILTERED


def test_a_null_filtered_index_is_refused_where_nulls_are_not_excluded() -> None:
    stmt = sharded_select(Parent, index="PByTsNF").where(Parent.ts > T0)  # Rank may be NULL
    with pytest.raises(
        ShardConfigError,
        match=r"index 'PByTsNF' is NULL_FILTERED: it holds no row whose 'Rank' is NULL, so "
        r"it cannot answer a statement that does not exclude those rows",
    ):
        spanner_sql(stmt)
    with pytest.raises(ShardConfigError, match="NULL_FILTERED"):  # the same on any database
        str(stmt.compile(dialect=sa.create_engine("sqlite://").dialect))
    or_one_side = sa.or_(Parent.rank > 3, Parent.id == 1)  # a row with NULL Rank may match
    with pytest.raises(ShardConfigError, match="'Rank' is NULL"):
        spanner_sql(stmt.where(or_one_side))
    with pytest.raises(ShardConfigError, match="'Rank' is NULL"):
        spanner_sql(stmt.where(Parent.rank.is_(None)))


@pytest.mark.parametrize(
    "criteria",
    [
        lambda: [Parent.ts.is_not(None), Parent.rank.is_not(None)],
        lambda: [Parent.ts > T0, Parent.rank.in_([3, 4, 8])],
        lambda: [sa.or_(Parent.ts < T0, Parent.ts >= T0), Parent.rank.between(1, 9)],
        lambda: [Parent.ts != T0, Parent.rank != 3],
    ],
)
def test_a_null_filtered_index_is_used_where_nulls_are_excluded(criteria: Any) -> None:
    sql = spanner_sql(sharded_select(Parent, index="PByTsNF").where(*criteria()))
    assert f"@{{FORCE_INDEX=PByTsNF, {EMULATOR_NULL_FILTER_HINT}}}" in sql


def test_which_criteria_exclude_nulls() -> None:
    ts, rank = Parent.__table__.c.Ts, Parent.__table__.c.Rank
    assert nulls_excluded(sa.and_(Parent.ts > T0, Parent.rank == 1)) == {ts, rank}
    assert nulls_excluded(sa.or_(Parent.ts > T0, Parent.rank == 1)) == set()
    assert nulls_excluded(sa.or_(Parent.ts > T0, Parent.ts.is_(None))) == set()
    assert nulls_excluded(sa.not_(Parent.ts > T0)) == {ts}  # NOT (ts > x) is ts <= x
    assert nulls_excluded(Parent.ts.is_(None)) == set()
    # an empty NOT IN list (given at execution) is true for NULL too
    assert nulls_excluded(Parent.rank.not_in(sa.bindparam("r", expanding=True))) == set()
    assert nulls_excluded(sa.func.coalesce(Parent.rank, 0) == 0) == set()


# ----------------------------------------------------------------------------- booleans


@pytest.mark.parametrize(
    ("criterion", "value"),
    [
        (lambda: Flagged.flag == True, True),  # noqa: E712
        (lambda: Flagged.flag == sa.true(), True),
        (lambda: Flagged.flag.is_(True), True),
        (lambda: Flagged.flag, True),
        (lambda: Flagged.flag == False, False),  # noqa: E712
        (lambda: ~Flagged.flag, False),
        (lambda: Flagged.flag == sa.false(), False),
    ],
)
def test_a_boolean_constant_pins_a_point_lookup(criterion: Any, value: bool) -> None:
    stmt = sharded_select(Flagged, index="FlaggedByFlag").where(criterion())
    bound = sharded_select(Flagged, index="FlaggedByFlag").where(Flagged.flag == sa.literal(value))
    assert stmt.point_shard == bound.point_shard == compute_shard([value], 8)
    engine = sa.create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        session.add_all(rows())
        session.commit()
        got = session.execute(stmt.order_by(Flagged.id)).scalars().all()
        want = session.execute(sa.select(Flagged).where(criterion()).order_by(Flagged.id))
        assert got == want.scalars().all() and got


def test_is_not_false_reads_every_shard() -> None:
    # NULL is not FALSE: rows with NULL would be missed by a point lookup on TRUE
    stmt = sharded_select(Flagged, index="FlaggedByFlag").where(Flagged.flag.is_not(False))
    assert stmt.point_shard is None


# ----------------------------------------------------------------------------- emulator


@pytest.mark.emulator
def test_inheritance_null_filtered_and_booleans_on_the_emulator(spanner_engine: sa.Engine) -> None:
    Base.metadata.create_all(spanner_engine)
    with Session(spanner_engine) as session:
        session.add_all(rows())
        session.commit()
    with Session(spanner_engine) as session:

        def same(stmt: Any, plain: Any, key: Any) -> None:
            got = session.execute(stmt.order_by(key)).scalars().all()
            want = session.execute(plain.order_by(key)).scalars().all()
            assert got == want and got

        same(sharded_select(Child, index="PByTs"), sa.select(Child), Child.id)
        same(
            sharded_select(Child, index="PByTs").where(Child.ts > T0 + dt.timedelta(minutes=9)),
            sa.select(Child).where(Child.ts > T0 + dt.timedelta(minutes=9)),
            Child.id,
        )
        nf = [Parent.ts.is_not(None), Parent.rank > 2]
        same(sharded_select(Parent, index="PByTsNF").where(*nf), sa.select(Parent).where(*nf),
             Parent.id)  # fmt: skip
        same(sharded_select(Child, index="PByTsNF").where(*nf), sa.select(Child).where(*nf),
             Child.id)  # fmt: skip
        with pytest.raises(ShardConfigError, match="NULL_FILTERED"):
            session.execute(sharded_select(Parent, index="PByTsNF").where(Parent.rank > 2))
        flag = sharded_select(Flagged, index="FlaggedByFlag").where(Flagged.flag == True)  # noqa: E712
        assert flag.point_shard == compute_shard([True], 8)
        same(flag, sa.select(Flagged).where(Flagged.flag), Flagged.id)


@pytest.mark.emulator
def test_a_refused_read_says_spanners_reason(spanner_engine: sa.Engine) -> None:
    """Not a bare ``ProgrammingError []``: the emulator's reason is in the message."""
    Base.metadata.create_all(spanner_engine, tables=[Flagged.__table__])
    with spanner_engine.connect() as conn:
        conn.execute(sa.text("DROP INDEX FlaggedByFlag"))
    stmt = sharded_select(Flagged, index="FlaggedByFlag").where(Flagged.flag)
    with Session(spanner_engine) as session, pytest.raises(sa.exc.ProgrammingError) as info:
        session.execute(stmt).all()
    assert "FlaggedByFlag" in str(info.value.orig) and str(info.value.orig) != "[]"
    assert "[]" not in str(info.value).splitlines()[0]
