"""merged() and page() through a Session, as SQLAlchemy users write statements (issue 21).

Items 1-4 and 8 each have a test here that failed before: loader and execution options,
several entities, the database's order (Enum, NOCASE), cursors across processes, and a
compiled-cache hit on every page. Then a hypothesis oracle: generated ORM statements
(one or several entities, extra columns, aliased entities, single-table inheritance,
joinedload/selectinload/contains_eager, joins, DISTINCT, OFFSET, nullable ordering
columns, ties, an Enum and a NOCASE ordering column) must give, through ``merged`` (under
every plan of the cost rule, forced) and every page, the rows the unsharded statement
gives through the same Session.
"""

from __future__ import annotations

import datetime as dt
import enum
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plans import PLANS, forced
from sqlalchemy import event
from sqlalchemy.engine.default import CACHE_HIT
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    aliased,
    contains_eager,
    joinedload,
    mapped_column,
    relationship,
    selectinload,
)

from sharded_orm import MergeStats, ShardedIndex, UTCDateTime, merged, page, shard_column
from sharded_orm import sharded_select as sharded_select_
from sharded_orm.read import cursors, pagination
from sharded_orm.read.order import order_columns

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


class Colour(enum.Enum):
    """Names sort zebra < ... differently from the values: the database orders names."""

    zebra = 1
    apple = 2
    mango = 3


class OrmBase(DeclarativeBase):
    pass


class Person(OrmBase):
    __tablename__ = "orm_person"
    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    label: Mapped[str] = mapped_column(sa.String(8))


class Note(OrmBase):
    __tablename__ = "orm_note"
    item_id: Mapped[int] = mapped_column(sa.ForeignKey("orm_item.id"), primary_key=True)
    n: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)


class Item(OrmBase):
    __tablename__ = "orm_item"
    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(sa.String(8))
    ts: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    colour: Mapped[Colour] = mapped_column(sa.Enum(Colour, native_enum=False, length=8))
    name: Mapped[str] = mapped_column(
        sa.String(8).with_variant(sa.String(8, collation="NOCASE"), "sqlite")
    )
    owner_id: Mapped[int | None] = mapped_column(sa.ForeignKey("orm_person.id"), nullable=True)
    s: Mapped[int] = shard_column("id", count=8)
    owner: Mapped[Person | None] = relationship(lazy="raise")
    notes: Mapped[list[Note]] = relationship(lazy="raise", order_by="Note.n")
    __mapper_args__ = {"polymorphic_on": "kind", "polymorphic_identity": "item"}
    __table_args__ = (
        ShardedIndex("orm_item_by_ts", sa.desc("ts"), shard="s"),
        ShardedIndex("orm_item_by_colour", "colour", shard="s"),
        ShardedIndex("orm_item_by_name", "name", shard="s"),
    )


class Special(Item):  # single-table inheritance
    __mapper_args__ = {"polymorphic_identity": "special"}


NAMES = ["apple", "Apple", "b", "B", "ab", "Zed", "zed"]


Row = tuple[int, int | None, int, int, int | None, int]


def fill(conn: sa.Connection, rows: list[Row]) -> None:
    for table in reversed(OrmBase.metadata.sorted_tables):
        conn.execute(sa.delete(table).where(sa.true()))
    conn.execute(Person.__table__.insert(), [{"id": i, "label": f"p{i % 2}"} for i in range(3)])
    items, notes = [], []
    for i, (kind, ts, colour, name, owner, n_notes) in enumerate(rows):
        items.append(
            {
                "id": i,
                "kind": ["item", "special"][kind],
                "ts": None if ts is None else T0 + dt.timedelta(seconds=ts),
                "colour": list(Colour)[colour],
                "name": NAMES[name],
                "owner_id": owner,
            }
        )
        notes += [{"item_id": i, "n": j} for j in range(n_notes)]
    if items:
        conn.execute(Item.__table__.insert(), items)
    if notes:
        conn.execute(Note.__table__.insert(), notes)


def fixed_rows(count: int = 40) -> list[Row]:
    return [
        (i % 3 == 0, None if i % 7 == 0 else i % 9, i % 3, i % len(NAMES), i % 4 or None, i % 3)
        for i in range(count)
    ]  # type: ignore[misc]


@pytest.fixture()
def session() -> Iterator[Session]:
    eng = sa.create_engine("sqlite://")
    OrmBase.metadata.create_all(eng)
    with eng.begin() as conn:
        fill(conn, fixed_rows())
    with Session(eng) as s:
        yield s
    eng.dispose()


def newest() -> Any:
    return sharded_select_(Item, index="orm_item_by_ts").order_by(Item.ts.desc())


def unsharded(stmt: Any, sharded: Any) -> Any:
    """``stmt`` (a plain select) ordered by the merge's total order of ``sharded``."""
    terms = [c.desc() if d else c.asc() for c, d in order_columns(sharded)]
    return stmt.order_by(None).order_by(*terms)


# ----------------------------------------------------------------------------- items 1-4, 8


def test_item1_loader_and_execution_options(session: Session) -> None:
    """joinedload's alias used to be taken for a user join (a cross join per branch), and
    the outer select dropped the options: ids repeated, options without effect."""
    stmt = newest().options(joinedload(Item.owner))
    truth = session.scalars(unsharded(sa.select(Item).options(joinedload(Item.owner)), stmt))
    want = [i.id for i in truth][:8]
    session.expunge_all()
    got = merged(session, stmt, 8)
    assert [i.id for i in got] == want
    assert all("owner" in i.__dict__ for i in got)  # loaded eagerly (lazy="raise" otherwise)
    got = merged(session, newest().options(selectinload(Item.notes)), 8)
    assert [len(i.notes) for i in got] == [i.id % 3 for i in got]
    # populate_existing: a changed attribute is overwritten by the database's value
    got[0].name = "changed"
    with session.no_autoflush:
        again = merged(session, newest().execution_options(populate_existing=True), 1)
    assert again[0] is got[0] and again[0].name != "changed"


def test_item2_several_entities_and_columns_in_their_places(session: Session) -> None:
    stmt = newest().join(Item.owner).add_columns(Person)
    plain = unsharded(sa.select(Item).join(Item.owner).add_columns(Person), stmt)
    truth = session.execute(plain.limit(4)).all()
    got = merged(session, stmt, 4)
    assert got == truth
    assert [(type(a), type(b)) for a, b in got] == [(Item, Person)] * 4
    stmt = newest().join(Item.owner).add_columns(Person.label)
    got = merged(session, stmt, 4)
    assert [(type(a), b) for a, b in got] == [(Item, p.label) for _, p in truth]


def test_pages_keep_several_entities_labels_and_aliases_in_their_places(
    session: Session,
) -> None:
    """A page adds the sort key's columns after the user's and drops them again by
    position (``Result.columns``): entities, an aliased entity, labelled columns (one
    named like a label of ours) and a plain column keep their places on every page."""
    boss = aliased(Person, name="boss")
    extras = (
        Person,
        boss,
        Item.ts.label("so_k0"),
        (Item.id * 10).label("tenfold"),
        Person.label,
    )
    stmt = newest().join(Item.owner).join(boss, boss.id == Item.owner_id).add_columns(*extras)
    plain = sa.select(Item).join(Item.owner).join(boss, boss.id == Item.owner_id)
    truth = session.execute(unsharded(plain.add_columns(*extras), stmt)).all()
    assert len(truth) > 6
    for size in (1, 4, 7):
        pages, cursor = [], None
        while True:
            p = page(session, stmt, size, cursor)
            assert all(len(row) == 1 + len(extras) for row in p.rows)
            pages += p.rows
            if (cursor := p.next_cursor) is None:
                break
        assert pages == truth, size
        item, person, boss_row, ts, tenfold, label = pages[0]
        assert (type(item), type(person), type(boss_row)) == (Item, Person, Person)
        assert (ts, tenfold, label) == (item.ts, item.id * 10, person.label)


def test_item3_the_database_orders_enum_and_nocase_columns(session: Session) -> None:
    by_colour = sharded_select_(Item, index="orm_item_by_colour")
    truth = session.scalars(unsharded(sa.select(Item), by_colour)).all()
    assert [i.colour for i in truth][:3] == [Colour.apple] * 3  # by name, not value
    assert merged(session, by_colour, 20) == truth[:20]  # a plain enum.Enum raised TypeError
    by_name = sharded_select_(Item, index="orm_item_by_name")
    truth = session.scalars(unsharded(sa.select(Item), by_name)).all()
    pages, cursor = [], None
    while True:
        p = page(session, by_name, 3, cursor)
        pages += p.rows
        if (cursor := p.next_cursor) is None:
            break
    assert pages == truth  # was: rows repeated and skipped


# a subprocess; quick loop: test_item1_loader_and_execution_options
@pytest.mark.slow
def test_item4_a_cursor_from_another_process_is_accepted(
    session: Session, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The fingerprint hashed repr() of a set, which follows PYTHONHASHSEED."""
    secret = "a secret shared by every process!"
    owners = {"p0", "p1", "x", "yy", "zzz", "wwww"}
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_merge_orm import Item, Person, pagination, newest
        pagination.set_cursor_secret({secret!r})
        stmt = newest().join(Item.owner).where(Person.label.in_({owners!r}))
        print(pagination.encode_cursor(stmt, [None, 3], 3))
        """
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    cursor = out.stdout.strip().splitlines()[-1]
    monkeypatch.setattr(cursors, "_secrets", cursors._secrets)  # restored afterwards
    pagination.set_cursor_secret(secret)
    for seed in ("0", "999"):
        check = (
            f"{script.rsplit('print', 1)[0]}print(pagination.decode_cursor_state(stmt, {cursor!r}))"
        )
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", check], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "([None, 3], 3)"
    stmt = newest().join(Item.owner).where(Person.label.in_(owners))
    assert pagination.decode_cursor_state(stmt, cursor) == ([None, 3], 3)


def test_item8_two_statements_and_a_compiled_cache_hit_on_every_later_page(
    session: Session,
) -> None:
    stmt = newest()
    cursor, pages = None, 0
    statements: list[int] = []
    cached: list[int] = []
    conn = session.connection()

    @event.listens_for(conn.engine, "after_cursor_execute")
    def _cache(
        conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: Any
    ) -> None:
        cached.append(context.cache_hit)

    while True:
        before = len(cached)
        p = page(session, stmt, 4, cursor)
        statements.append(p.stats.statements)
        if pages >= 1:  # the first page compiles; every later one hits, cursor or not
            assert cached[before:] and all(h == CACHE_HIT for h in cached[before:]), pages
        pages += 1
        if (cursor := p.next_cursor) is None:
            break
    assert max(statements) <= 2 and pages == 10
    assert all(p_rows <= 5 for p_rows in [page(session, stmt, 4).stats.rows_transferred])


# ----------------------------------------------------------------------------- oracle


def rows_strategy(max_rows: int) -> Any:
    # (kind, seconds or None, colour, name, owner or None, notes): few values, many ties
    return st.lists(
        st.tuples(
            st.integers(0, 1),
            st.none() | st.integers(0, 6),
            st.integers(0, 2),
            st.integers(0, len(NAMES) - 1),
            st.none() | st.integers(0, 2),
            st.integers(0, 2),
        ),
        max_size=max_rows,
    )


def examples(max_rows: int, max_limit: int) -> Any:
    return st.fixed_dictionaries(
        {
            "rows": rows_strategy(max_rows),
            "entity": st.sampled_from(["item", "special"]),
            "index": st.sampled_from(["ts", "colour", "name"]),
            "shape": st.sampled_from(["one", "person", "label", "aliased", "columns"]),
            "loader": st.sampled_from([None, "joined", "selectin", "contains_eager"]),
            "distinct": st.booleans(),
            "offset": st.sampled_from([0, 0, 1, 3]),
            "limit": st.integers(1, max_limit),
            "page": st.integers(2, 7),
        }
    )


def make(ex: dict[str, Any]) -> tuple[Any, Any] | None:
    """(sharded statement, the same statement unsharded); None where the combination is
    not one a user can write (contains_eager needs the join; DISTINCT with extra rows)."""
    entity = Special if ex["entity"] == "special" else Item
    stmt = sharded_select_(entity, index=f"orm_item_by_{ex['index']}")
    plain = sa.select(entity)
    other = aliased(Person) if ex["shape"] == "aliased" else Person
    joined = ex["shape"] in ("person", "label", "aliased") or ex["loader"] == "contains_eager"
    if joined:
        stmt = stmt.join(other, entity.owner.of_type(other))
        plain = plain.join(other, entity.owner.of_type(other))
    if ex["shape"] in ("person", "aliased"):
        stmt, plain = stmt.add_columns(other), plain.add_columns(other)
    elif ex["shape"] == "label":
        stmt, plain = stmt.add_columns(other.label), plain.add_columns(other.label)
    elif ex["shape"] == "columns":
        cols = [entity.name, entity.id, entity.ts, entity.colour]  # every index's columns
        stmt = stmt.with_only_columns(*cols, maintain_column_froms=True)
        plain = plain.with_only_columns(*cols, maintain_column_froms=True)
    if ex["shape"] != "columns":
        opt = {
            None: None,
            "joined": joinedload(entity.notes),
            "selectin": selectinload(entity.notes),
            "contains_eager": contains_eager(entity.owner.of_type(other)),
        }[ex["loader"]]
        if opt is not None:
            stmt, plain = stmt.options(opt), plain.options(opt)
    if ex["distinct"]:
        if ex["shape"] == "columns":
            stmt, plain = stmt.distinct(), plain.distinct()
        else:
            return None
    return stmt, unsharded(plain, stmt)


def _value(p: Any) -> Any:
    if isinstance(p, Item):  # type, key, and what was loaded with it
        notes = len(p.__dict__["notes"]) if "notes" in p.__dict__ else None
        return (type(p).__name__, p.id, notes, "owner" in p.__dict__)
    if isinstance(p, Person):
        return ("Person", p.id)
    return p


def result_of(rows: list[Any]) -> list[Any]:
    """Rows compared by value: entities by type, key and loaded state."""
    return [tuple(_value(p) for p in (row if isinstance(row, sa.Row) else (row,))) for row in rows]


def check(session: Session, ex: dict[str, Any]) -> None:
    made = make(ex)
    if made is None:
        return
    stmt, plain = made
    fill(session.connection(), ex["rows"])
    session.expunge_all()
    truth = session.execute(plain)
    truth = truth.unique() if ex["loader"] == "joined" else truth
    rows = truth.scalars().all() if ex["shape"] == "one" else truth.all()
    oracle = result_of(rows)[ex["offset"] :]
    session.expunge_all()
    stmt = stmt.offset(ex["offset"]) if ex["offset"] else stmt
    for plan in PLANS:  # (on Spanner, two rounds are one statement)
        stats = MergeStats()
        with forced(plan):
            got = merged(session, stmt, ex["limit"], stats=stats)
        assert result_of(got) == oracle[: ex["limit"]], plan
        # (a probe that meets a skewed shard sends its rows, then the answer's)
        most = 2 * ex["limit"] if plan == "probe" else ex["limit"]
        assert stats.statements <= 2 and stats.rows_transferred <= most
        session.expunge_all()
    seen: list[Any] = []
    cursor = None
    for _ in range(len(oracle) + 2):
        p = page(session, stmt, ex["page"], cursor)
        assert p.stats.statements <= 2 and p.stats.rows_transferred <= ex["page"] + 1
        seen += result_of(p.rows)
        if (cursor := p.next_cursor) is None:
            break
    assert seen == oracle


@pytest.fixture(scope="module")
def sqlite_engine() -> Iterator[sa.Engine]:
    eng = sa.create_engine("sqlite://")
    OrmBase.metadata.create_all(eng)
    yield eng
    eng.dispose()


FIXTURE_OK = [HealthCheck.function_scoped_fixture]


# 200 drawn examples; quick loop: test_orm_oracle_on_the_emulator
@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=examples(max_rows=30, max_limit=25))
def test_orm_oracle_on_sqlite(sqlite_engine: sa.Engine, ex: dict[str, Any]) -> None:
    with Session(sqlite_engine) as session:
        check(session, ex)
        session.rollback()


@pytest.mark.emulator
@settings(max_examples=12, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=examples(max_rows=10, max_limit=8).filter(lambda ex: ex["index"] != "name"))
def test_orm_oracle_on_the_emulator(spanner_engine: sa.Engine, ex: dict[str, Any]) -> None:
    if not sa.inspect(spanner_engine).has_table("orm_item"):
        OrmBase.metadata.create_all(spanner_engine)
    with Session(spanner_engine) as session:
        check(session, ex)
        session.commit()


@pytest.mark.emulator
@pytest.mark.parametrize("limit", [1, 5])
def test_joined_eager_load_with_a_limit_on_the_emulator(
    spanner_engine: sa.Engine, limit: int
) -> None:
    """The ORM wraps a LIMITed statement with a joined eager load in a subquery and
    compiles parts of it on a default dialect: the correlated fan-out renders there too
    (found by the oracle: ``CompileError``)."""
    if not sa.inspect(spanner_engine).has_table("orm_item"):
        OrmBase.metadata.create_all(spanner_engine)
    with Session(spanner_engine) as session:
        for loader in ("joined", "selectin"):
            check(
                session,
                {
                    "rows": [
                        (
                            i % 3 == 0,
                            None if i % 7 == 0 else i % 9,
                            i % 3,
                            i % 7,
                            i % 3 or None,
                            i % 3,
                        )
                        for i in range(12)
                    ],
                    "entity": "item",
                    "index": "ts",
                    "shape": "one",
                    "loader": loader,
                    "distinct": False,
                    "offset": 0,
                    "limit": limit,
                    "page": 2,
                },
            )
        session.commit()
