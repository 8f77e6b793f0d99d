"""merged() and page() where the order's values are not what they seem: keys an outer
join makes NULL, DISTINCT rows of a join, an Enum stored by value, time and interval
columns, and FETCH FIRST. Each was a wrong answer or a false error (found attacking the
read path): pages that skipped rows or repeated the first page for ever, a false
``ShardReadError``, a false ``CursorError``, a FETCH silently dropped.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

import pytest
import sqlalchemy as sa
from plans import PLANS, forced, walk
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import ShardConfigError, ShardedIndex, merged, page, shard_column, sharded_select


class B(DeclarativeBase):
    pass


class Color(enum.Enum):
    RED = "c-red"
    GREEN = "b-green"
    BLUE = "a-blue"


class Ev(B):
    __tablename__ = "edge_ev"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    ts: Mapped[int] = mapped_column(sa.BigInteger)
    color: Mapped[Color] = mapped_column(
        sa.Enum(Color, values_callable=lambda e: [m.value for m in e], native_enum=False)
    )
    s: Mapped[int] = shard_column("id", count=4)
    __table_args__ = (
        ShardedIndex("edge_ev_by_ts", "ts", shard="s"),
        ShardedIndex("edge_ev_by_color", "color", shard="s"),
    )


class Note(B):
    __tablename__ = "edge_note"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    ev_id: Mapped[int] = mapped_column(sa.BigInteger)


class Tag(B):
    __tablename__ = "edge_tag"
    ev_id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    tag: Mapped[str] = mapped_column(sa.String(8), primary_key=True)


@pytest.fixture
def db(engine: sa.Engine) -> sa.Engine:
    """Events 0-11 (every third one RED, GREEN, BLUE); notes on events 0 and 5; tags
    a, b, c on even events, none on odd ones."""
    B.metadata.create_all(engine)
    colors = list(Color)
    with engine.begin() as c:
        c.execute(
            Ev.__table__.insert(),
            [{"id": i, "ts": i // 2, "color": colors[i % 3]} for i in range(12)],
        )
        c.execute(Note.__table__.insert(), [{"id": 1, "ev_id": 0}, {"id": 2, "ev_id": 5}])
        c.execute(
            Tag.__table__.insert(),
            [{"ev_id": i, "tag": t} for i in range(0, 12, 2) for t in "abc"],
        )
    return engine


def agrees(conn: Any, stmt: Any, truth: list[tuple[Any, ...]]) -> None:
    """Every plan of the cost rule: merged() at several k and page walks of 1, 2 and 5."""
    for plan in PLANS:
        with forced(plan):
            for k in (1, 3, 7, len(truth), len(truth) + 2):
                assert [tuple(r) for r in merged(conn, stmt, k)] == truth[:k], (plan, k)
            for size in (1, 2, 5):
                assert [tuple(r) for r in walk(conn, stmt, size)] == truth, (plan, size)


def test_keys_an_outer_join_makes_null(db: sa.Engine) -> None:
    """Odd events have no tag and most no note: their joined keys are NULL, which sorts
    first, though the columns are declared NOT NULL."""
    stmt = (
        sharded_select(Ev, index="edge_ev_by_ts")
        .outerjoin(Note, Note.ev_id == Ev.id)
        .outerjoin(Tag, Tag.ev_id == Ev.id)
        .with_only_columns(Ev.id, Note.id, Tag.tag)
    )
    plain = (
        sa.select(Ev.id, Note.id, Tag.tag)
        .outerjoin(Note, Note.ev_id == Ev.id)
        .outerjoin(Tag, Tag.ev_id == Ev.id)
        .order_by(Ev.ts, Ev.id, Note.id, Tag.ev_id, Tag.tag)
    )
    with db.connect() as conn:
        truth = [tuple(r) for r in conn.execute(plain)]
        assert (1, None, None) in truth and (0, 1, "c") in truth
        agrees(conn, stmt, truth)


def test_distinct_rows_of_a_join(db: sa.Engine) -> None:
    """DISTINCT over a joined table's column: each event is three rows (its tags), told
    apart by the tag, which the order now takes."""
    stmt = (
        sharded_select(Ev, index="edge_ev_by_ts")
        .join(Tag, Tag.ev_id == Ev.id)
        .with_only_columns(Ev.id, Ev.ts, Tag.tag)
        .distinct()
    )
    plain = (
        sa.select(Ev.id, Ev.ts, Tag.tag)
        .join(Tag, Tag.ev_id == Ev.id)
        .distinct()
        .order_by(Ev.ts, Ev.id, Tag.tag)
    )
    with db.connect() as conn:
        truth = [tuple(r) for r in conn.execute(plain)]
        assert len(truth) == 18
        agrees(conn, stmt, truth)


def test_distinct_over_an_expression_of_a_joined_table_is_refused(db: sa.Engine) -> None:
    stmt = (
        sharded_select(Ev, index="edge_ev_by_ts")
        .join(Tag, Tag.ev_id == Ev.id)
        .with_only_columns(Ev.id, Ev.ts, sa.func.lower(Tag.tag))
        .distinct()
    )
    with db.connect() as conn, pytest.raises(ShardConfigError, match="Select the joined table"):
        merged(conn, stmt, 5)


def test_an_enum_stored_by_value(db: sa.Engine) -> None:
    """Ordered by the stored value ('a-blue' < 'b-green' < 'c-red'), members through a
    Session; a page's cursor binds the member again, not its name."""
    stmt = sharded_select(Ev, index="edge_ev_by_color").with_only_columns(Ev.id, Ev.color)
    with db.connect() as conn:
        truth = [tuple(r) for r in conn.execute(stmt.order_by(Ev.color, Ev.id))]
        assert [c for _, c in truth[:4]] == [Color.BLUE] * 4
        agrees(conn, stmt, truth)
    with Session(db) as session:
        entities = walk(session, sharded_select(Ev, index="edge_ev_by_color"), 2)
        assert [(e.id, e.color) for e in entities] == truth


def test_fetch_first_is_refused(db: sa.Engine) -> None:
    stmt = sharded_select(Ev, index="edge_ev_by_ts").fetch(3)
    with db.connect() as conn:
        for read in (lambda: merged(conn, stmt, 3), lambda: page(conn, stmt, 3)):
            with pytest.raises(ShardConfigError, match=r"use \.limit\(n\)"):
                read()


class SqliteOnly(DeclarativeBase):
    pass


class Shift(SqliteOnly):
    """Time and interval ordering columns (SQLite; Spanner has neither type)."""

    __tablename__ = "edge_shift"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    starts: Mapped[dt.time] = mapped_column(sa.Time)
    lasts: Mapped[dt.timedelta] = mapped_column(sa.Interval)
    s: Mapped[int] = shard_column("id", count=3)
    __table_args__ = (
        ShardedIndex("edge_shift_by_start", "starts", shard="s"),
        ShardedIndex("edge_shift_by_length", "lasts", shard="s"),
    )


@pytest.mark.parametrize("index", ["edge_shift_by_start", "edge_shift_by_length"])
def test_time_and_interval_columns_page(index: str) -> None:
    engine = sa.create_engine("sqlite://")
    Shift.__table__.create(engine)
    with engine.begin() as c:
        c.execute(
            Shift.__table__.insert(),
            [
                {
                    "id": i,
                    "starts": dt.time(i % 4, 30, 0, 250),
                    "lasts": dt.timedelta(days=i % 2, minutes=i % 5, microseconds=7),
                }
                for i in range(10)
            ],
        )
    col = Shift.starts if index.endswith("start") else Shift.lasts
    stmt = sharded_select(Shift, index=index).with_only_columns(Shift.id)
    with engine.connect() as conn:
        truth = [tuple(r) for r in conn.execute(sa.select(Shift.id).order_by(col, Shift.id))]
        assert [tuple(r) for r in walk(conn, stmt, 3)] == truth
