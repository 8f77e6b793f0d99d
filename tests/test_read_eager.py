"""Eager loading in sharded reads (issue 40): the mapper's own ``lazy=`` and ``innerjoin``.

The branches and the bound round of ``merged()``/``page()`` load nothing eagerly, whether
the eager load is an option on the statement or the mapper's ``relationship(lazy=...)``;
eager loading happens in the rows statement alone. An eager load that filters (an inner
join: ``joinedload(rel, innerjoin=True)`` or ``relationship(lazy="joined",
innerjoin=True)``) is carried into the branches as the filter it is, or refused with the
join to write where SQLAlchemy itself would filter after the LIMIT.

Each mapping configuration maps the same tables (one ``DeclarativeBase`` per
configuration, ``__table__`` shared), so the emulator creates them once per database.
The oracle is the unsharded statement (``select(Ev)`` with the same options, ordered by
the merge's order) through the same Session.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plans import PLANS, forced, walk
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    contains_eager,
    joinedload,
    lazyload,
    mapped_column,
    raiseload,
    relationship,
    selectinload,
    subqueryload,
)

from sharded_orm import ShardedIndex, merged, shard_column, sharded_select
from sharded_orm.errors import ShardConfigError

#: lazy="noload" is a strategy SQLAlchemy 2.1 still documents (deprecated): tested as one
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload``:DeprecationWarning")

# ----------------------------------------------------------------------------- tables


class Rows(DeclarativeBase):
    pass


class OrgRow(Rows):
    __tablename__ = "eg_org"
    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)


class OwnerRow(Rows):
    __tablename__ = "eg_owner"
    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    org_id: Mapped[int | None] = mapped_column(sa.ForeignKey("eg_org.id"), nullable=True)


class EvRow(Rows):
    __tablename__ = "eg_ev"
    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    ts: Mapped[int] = mapped_column(sa.BigInteger)
    owner_id: Mapped[int | None] = mapped_column(sa.ForeignKey("eg_owner.id"), nullable=True)
    s: Mapped[int] = shard_column("id", count=4)
    __table_args__ = (ShardedIndex("eg_ev_by_ts", sa.desc("ts"), shard="s"),)


class TagRow(Rows):
    __tablename__ = "eg_tag"
    ev_id: Mapped[int] = mapped_column(sa.ForeignKey("eg_ev.id"), primary_key=True)
    n: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)


class KindRow(Rows):
    """Joined inheritance: ``SubRow`` rows carry a second owner, eagerly loaded."""

    __tablename__ = "eg_kind"
    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(sa.String(8))
    ts: Mapped[int] = mapped_column(sa.BigInteger)
    s: Mapped[int] = shard_column("id", count=4)
    __table_args__ = (ShardedIndex("eg_kind_by_ts", sa.desc("ts"), shard="s"),)
    __mapper_args__ = {"polymorphic_on": "kind", "polymorphic_identity": "kind"}


class SubRow(KindRow):
    __tablename__ = "eg_sub"
    id: Mapped[int] = mapped_column(sa.ForeignKey("eg_kind.id"), primary_key=True)
    owner_id: Mapped[int | None] = mapped_column(sa.ForeignKey("eg_owner.id"), nullable=True)
    owner: Mapped[OwnerRow | None] = relationship(lazy="joined", innerjoin=True)
    __mapper_args__ = {"polymorphic_identity": "sub"}


EVENTS = 300
#: the newest NO_OWNER events have no owner; owner 4's org is missing
NO_OWNER = 100


def _insert(conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    """Multi-row INSERTs of 200 rows (under Spanner's 950 parameters with the shard): on
    the emulator a fill as an executemany of each row took 40 s, this takes 2 s."""
    for start in range(0, len(rows), 200):
        conn.execute(table.insert().values(rows[start : start + 200]))


def fill(conn: sa.Connection, events: int = EVENTS, no_owner: int = NO_OWNER) -> None:
    for table in reversed(Rows.metadata.sorted_tables):
        conn.execute(sa.delete(table).where(sa.true()))
    _insert(conn, OrgRow.__table__, [{"id": i} for i in range(4)])
    _insert(
        conn,
        OwnerRow.__table__,
        [{"id": i, "org_id": None if i == 4 else i % 4} for i in range(5)],
    )
    _insert(
        conn,
        EvRow.__table__,
        [
            {"id": i, "ts": i, "owner_id": None if i >= events - no_owner else i % 5}
            for i in range(events)
        ],
    )
    tags = [{"ev_id": i, "n": j} for i in range(events) for j in range(i % 3)]
    _insert(conn, TagRow.__table__, tags)
    kinds = range(60)
    _insert(
        conn,
        KindRow.__table__,
        [{"id": i, "kind": "sub" if i % 2 else "kind", "ts": i} for i in kinds],
    )
    _insert(
        conn,
        SubRow.__table__,
        [{"id": i, "owner_id": None if i % 7 == 0 else i % 5} for i in kinds if i % 2],
    )


# ----------------------------------------------------------------------------- mappings


@functools.cache
def mapping(
    owner: str = "select", inner: bool | str = False, tags: str = "select", org: str = "select"
) -> Any:
    """(Ev, Owner, Tag, Org) mapped over the tables with these mapper-level loader settings:
    ``Ev.owner`` (many-to-one, ``lazy=owner, innerjoin=inner``), ``Ev.tags`` (a collection,
    ``lazy=tags``), ``Owner.org`` (``lazy=org``, innerjoin)."""

    owner_lazy, tags_lazy, org_lazy = owner, tags, org

    class Base(DeclarativeBase):
        pass

    class Org(Base):
        __table__ = OrgRow.__table__

    class Owner(Base):
        __table__ = OwnerRow.__table__
        org = relationship(Org, lazy=org_lazy, innerjoin=True, viewonly=True)

    class Tag(Base):
        __table__ = TagRow.__table__

    class Ev(Base):
        __table__ = EvRow.__table__
        owner = relationship(Owner, lazy=owner_lazy, innerjoin=inner, viewonly=True)
        tags = relationship(Tag, lazy=tags_lazy, order_by=Tag.n, viewonly=True)

    sa.orm.configure_mappers()
    return Ev, Owner, Tag, Org


def newest(ev: Any, *options: Any) -> Any:
    stmt = sharded_select(ev, index="eg_ev_by_ts").order_by(ev.ts.desc())
    return stmt.options(*options) if options else stmt


def unsharded(session: Session, ev: Any, *options: Any) -> list[Any]:
    """The oracle: the same statement unsharded, in the merge's order."""
    stmt = sa.select(ev).order_by(ev.ts.desc(), ev.id)
    stmt = stmt.options(*options) if options else stmt
    session.expunge_all()
    got = state(session.scalars(stmt).unique().all())
    session.expunge_all()
    return got


def state(events: list[Any]) -> list[tuple[Any, ...]]:
    """Each event's key and what was loaded with it (owner id, its org, tag count)."""
    out = []
    for e in events:
        d = e.__dict__
        owner = d.get("owner", "-")
        owner_state = (
            "-" if owner == "-" else None if owner is None else (owner.id, "org" in owner.__dict__)
        )
        tags = d.get("tags", "-")
        out.append((e.id, owner_state, "-" if tags == "-" else len(tags)))
    return out


def check(session: Session, ev: Any, *options: Any, k: int = 10, size: int = 7) -> None:
    """merged() under every plan and a page walk give the unsharded rows."""
    truth = unsharded(session, ev, *options)
    for plan in PLANS:
        with forced(plan):
            got = state(merged(session, newest(ev, *options), k))
        assert got == truth[:k], plan
        session.expunge_all()
    walked = state(walk(session, newest(ev, *options), size, pages=len(truth) // size + 3))
    assert walked == truth
    session.expunge_all()


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("spanner", marks=pytest.mark.emulator)]
)
def filled(request: pytest.FixtureRequest) -> Iterator[sa.Engine]:
    """The rows, written once a module: every test here only reads (on the emulator a
    fill is a few multi-row INSERTs in one transaction, seconds)."""
    emulator, database = None, ""
    if request.param == "sqlite":
        eng = sa.create_engine("sqlite://")
    else:
        emulator = request.getfixturevalue("spanner_emulator")
        database = emulator.create_database()
        eng = emulator.engine(database)
    Rows.metadata.create_all(eng)
    with eng.begin() as conn:
        fill(conn)
    yield eng
    eng.dispose()
    if emulator is not None:
        emulator.drop_database(database)


@pytest.fixture()
def session(filled: sa.Engine) -> Iterator[Session]:
    with Session(filled) as s:
        yield s


# ----------------------------------------------------------------------------- class 1


# 5 loaders x 2 walks; quick loop: test_mapper_level_chain_and_options_over_it
@pytest.mark.slow
@pytest.mark.parametrize("lazy", ["joined", "subquery", "selectin", "immediate", "raise"])
def test_mapper_level_eager_load_of_a_many_to_one(session: Session, lazy: str) -> None:
    """relationship(lazy="joined") on the model used to put the eager alias's key in the
    merge's order, selected with no join condition (``no such column: owner_2.id``,
    each row once per owner)."""
    ev, *_ = mapping(owner=lazy)
    check(session, ev, k=10)
    check(session, ev, k=150, size=40)


# 5 loaders x every plan; quick loop: test_mapper_level_chain_and_options_over_it,
# test_eager_oracle_on_sqlite
@pytest.mark.slow
@pytest.mark.parametrize("lazy", ["joined", "subquery", "selectin", "noload", "dynamic"])
def test_mapper_level_eager_load_of_a_collection(session: Session, lazy: str) -> None:
    """A joined collection on the mapper gave one item for merged(k=10)."""
    ev, *_ = mapping(tags=lazy)
    check(session, ev, k=10)


def test_mapper_level_chain_and_options_over_it(session: Session) -> None:
    """Joined eager loads chained on the mapper (Ev.owner, then Owner.org with an inner
    join nested in the outer one: no row dropped), and options overriding the mapper."""
    ev, owner, tag, _ = mapping(owner="joined", tags="joined", org="joined")
    check(session, ev, k=12)
    check(session, ev, lazyload(ev.owner), k=12)
    check(session, ev, raiseload("*"), k=12)
    check(session, ev, selectinload(ev.tags), subqueryload(ev.owner), k=12)


def test_contains_eager_beside_a_mapper_level_joined_load(session: Session) -> None:
    ev, owner, *_ = mapping(owner="joined", tags="joined")
    stmt = newest(ev).join(ev.owner).options(contains_eager(ev.owner))
    plain = sa.select(ev).join(ev.owner).options(contains_eager(ev.owner))
    truth = state(session.scalars(plain.order_by(ev.ts.desc(), ev.id)).unique().all())
    session.expunge_all()
    assert state(merged(session, stmt, 10)) == truth[:10]
    session.expunge_all()
    assert state(walk(session, stmt, 30)) == truth


@pytest.mark.parametrize("outer", [False, True])
def test_a_joined_entitys_mapper_level_eager_load(session: Session, outer: bool) -> None:
    """select(Ev, Owner) joined, Owner.org lazy="joined" (inner) on the mapper: its alias
    joined the order too (``no such column: eg_org_2.id``). SQLAlchemy renders the inner
    join after an outer join to the owner, dropping the events with no owner: so do the
    branches."""
    ev, owner, _, _ = mapping(org="joined")
    on = ev.owner_id == owner.id
    stmt = newest(ev).join(owner, on, isouter=outer).add_columns(owner)
    plain = sa.select(ev).join(owner, on, isouter=outer).add_columns(owner)
    truth = [(e.id, o.id) for e, o in session.execute(plain.order_by(ev.ts.desc(), ev.id))]
    assert len(truth) == EVENTS - NO_OWNER - sum(i % 5 == 4 for i in range(EVENTS - NO_OWNER))
    session.expunge_all()
    assert [(e.id, o.id) for e, o in merged(session, stmt, 12)] == truth[:12]
    assert [(e.id, o.id) for e, o in walk(session, stmt, 40)] == truth


def test_a_subclass_mapper_level_inner_joined_load(session: Session) -> None:
    """Joined inheritance: the subclass's relationship(lazy="joined", innerjoin=True)."""
    stmt = sharded_select(SubRow, index="eg_kind_by_ts").order_by(SubRow.ts.desc())
    plain = sa.select(SubRow).order_by(SubRow.ts.desc(), SubRow.id)
    truth = [(e.id, e.owner.id) for e in session.scalars(plain)]
    assert len(truth) == 30 - 4  # odd ids, less 7, 21, 35, 49 (no owner)
    session.expunge_all()
    for plan in PLANS:
        with forced(plan):
            assert [(e.id, e.owner.id) for e in merged(session, stmt, 10)] == truth[:10], plan
    assert [(e.id, e.owner.id) for e in walk(session, stmt, 7)] == truth


# ----------------------------------------------------------------------------- class 2


@pytest.mark.parametrize("where", ["option", "mapper", "unnested"])
def test_an_inner_joined_eager_load_filters_in_every_branch(session: Session, where: str) -> None:
    """300 events whose newest 100 have no owner: each branch's LIMIT used to be filled
    with rows the rows statement then dropped (merged(k=10) == [], an empty first page
    that ended the walk)."""
    if where == "option":
        ev, *_ = mapping()
        options: tuple[Any, ...] = (joinedload(ev.owner, innerjoin=True),)
    else:
        ev, *_ = mapping(owner="joined", inner=True if where == "mapper" else "unnested")
        options = ()
    truth = unsharded(session, ev, *options)
    assert len(truth) == EVENTS - NO_OWNER and truth[0][0] == EVENTS - NO_OWNER - 1
    check(session, ev, *options, k=10, size=30)


def test_inner_joins_chained_from_the_root_filter_together(session: Session) -> None:
    """Ev.owner and Owner.org both inner (the mapper's org, an option's owner): an event
    whose owner has no org is dropped too; an outer owner with an inner org drops none."""
    ev, owner, _, _ = mapping(org="joined")
    check(session, ev, joinedload(ev.owner, innerjoin=True), k=25, size=40)
    check(session, ev, joinedload(ev.owner), k=25, size=40)
    ev2, *_ = mapping(owner="joined", inner=True, org="joined")
    check(session, ev2, k=25, size=40)


def test_an_inner_join_after_the_limit_is_refused_with_the_join_to_write(
    session: Session,
) -> None:
    """Beside a joined eager collection SQLAlchemy nests the rows under LIMIT and joins
    after it, so the inner join's rows depend on the LIMIT: refused, naming the fix."""
    ev, *_ = mapping(tags="joined")
    for stmt, fix in (
        (newest(ev, joinedload(ev.owner, innerjoin=True)), r"Write the join: \.join\(Ev\.owner\)"),
        (
            newest(mapping(owner="joined", inner=True, tags="joined")[0]),
            r"Write the join: \.join\(Ev\.owner\)",
        ),
        (
            newest(ev, joinedload(ev.tags, innerjoin=True)),
            r"Write the filter: \.where\(Ev\.tags\.any\(\)\), and load Ev\.tags with "
            r"selectinload\(Ev\.tags\)",
        ),
    ):
        with pytest.raises(ShardConfigError, match=fix):
            merged(session, stmt, 10)
    # DISTINCT nests the rows too where SQLAlchemy does so for any eager join (2.1); where
    # it does not (2.0 joins the many-to-one before the LIMIT), the read is exact
    ev3 = mapping(owner="joined", inner=True)[0]
    distinct = newest(ev3).distinct()
    try:
        got = merged(session, distinct, 10)
    except ShardConfigError as e:
        assert re.search(r"in a DISTINCT statement.*\.join\(Ev\.owner\)", str(e)), str(e)
    else:
        plain_distinct = sa.select(ev3).distinct().order_by(ev3.ts.desc(), ev3.id)
        got_state = state(got)
        session.expunge_all()
        assert got_state == state(session.scalars(plain_distinct).unique().all())[:10]
        session.expunge_all()
    # the fix it names gives the unsharded rows
    fixed = newest(ev).join(ev.owner).options(contains_eager(ev.owner))
    plain = sa.select(ev).join(ev.owner).options(contains_eager(ev.owner))
    truth = state(session.scalars(plain.order_by(ev.ts.desc(), ev.id)).unique().all())
    session.expunge_all()
    assert state(merged(session, fixed, 10)) == truth[:10]


# ----------------------------------------------------------------------------- oracle

OWNER_LAZY = ["select", "joined", "subquery", "selectin", "immediate", "raise", "noload"]
TAG_LAZY = ["select", "joined", "subquery", "selectin", "noload", "dynamic", "write_only"]


def _option(ev: Any, name: str, inner: bool) -> Any:
    return {
        "joinedload": lambda: joinedload(ev.owner, innerjoin=inner),
        "selectinload": lambda: selectinload(ev.owner),
        "subqueryload": lambda: subqueryload(ev.owner),
        "lazyload": lambda: lazyload(ev.owner),
        "raiseload": lambda: raiseload(ev.owner),
    }[name]()


@pytest.fixture(scope="module")
def sqlite_session() -> Iterator[Session]:
    eng = sa.create_engine("sqlite://")
    Rows.metadata.create_all(eng)
    with eng.begin() as conn:
        fill(conn, events=60, no_owner=20)
    with Session(eng) as s:
        yield s
    eng.dispose()


#: what the oracle draws: mapper settings x an option on the statement x k
DRAWS = {
    "owner": st.sampled_from(OWNER_LAZY),
    "tags": st.sampled_from(TAG_LAZY),
    "inner": st.sampled_from([False, True, "unnested"]),
    "org": st.sampled_from(["select", "joined"]),
    "option": st.sampled_from(
        [None, "joinedload", "selectinload", "subqueryload", "lazyload", "raiseload"]
    ),
    "option_inner": st.booleans(),
    "k": st.integers(1, 45),
}


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(**DRAWS)
def test_eager_oracle_on_sqlite(
    sqlite_session: Session,
    owner: str,
    tags: str,
    inner: bool | str,
    org: str,
    option: str | None,
    option_inner: bool,
    k: int,
) -> None:
    eager_oracle(sqlite_session, owner, tags, inner, org, option, option_inner, k)


# the oracle's wide variant (many drawn examples); quick loop: test_eager_oracle_on_sqlite
@pytest.mark.slow
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(**DRAWS)
def test_eager_oracle_on_sqlite_wide(
    sqlite_session: Session,
    owner: str,
    tags: str,
    inner: bool | str,
    org: str,
    option: str | None,
    option_inner: bool,
    k: int,
) -> None:
    eager_oracle(sqlite_session, owner, tags, inner, org, option, option_inner, k)


def eager_oracle(
    session: Session,
    owner: str,
    tags: str,
    inner: bool | str,
    org: str,
    option: str | None,
    option_inner: bool,
    k: int,
) -> None:
    """Drawn mapper settings x an option on the statement x k: the unsharded rows (and
    what was loaded with them) or a refusal that names the join to write."""
    ev, *_ = mapping(owner=owner, inner=inner, tags=tags, org=org)
    options = () if option is None else (_option(ev, option, option_inner),)
    try:
        check(session, ev, *options, k=k, size=max(k // 2, 1))
    except ShardConfigError as e:  # only an inner join SQLAlchemy applies after LIMIT
        assert "innerjoin=True" in str(e) and "Write the join" in str(e)
        assert tags == "joined"
