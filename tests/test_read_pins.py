"""Boolean pins (issue 40): a Boolean column fixed by the WHERE clause as SQLAlchemy
writes it is constant, so an index ``(shard, active, ts DESC)`` serves
``ORDER BY ts DESC`` for ``where(Ev.active == True)`` as for ``== literal(True)``.

Every form: ``== True``, ``.is_(True)``, ``== true()``, a bare ``Ev.active``, ``== False``,
``~Ev.active``, ``not_()``, ``.is_(False)``, ``== false()``. Forms that are not one value
(``.is_not(False)`` holds NULL and TRUE, an OR) are still refused. The oracle is the
unsharded statement through the same Session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plans import PLANS, forced, walk
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import ShardedIndex, merged, shard_column, sharded_select
from sharded_orm.errors import ShardConfigError


class PinBase(DeclarativeBase):
    pass


class Ev(PinBase):
    __tablename__ = "pin_ev"
    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    active: Mapped[bool] = mapped_column(sa.Boolean)
    live: Mapped[bool | None] = mapped_column(sa.Boolean, nullable=True)
    ts: Mapped[int] = mapped_column(sa.BigInteger)
    s: Mapped[int] = shard_column("id", count=4)
    __table_args__ = (
        ShardedIndex("pin_ev_by_active_ts", "active", sa.desc("ts"), shard="s"),
        ShardedIndex("pin_ev_by_live_active_ts", "live", "active", sa.desc("ts"), shard="s"),
    )


PINS: dict[str, Callable[[], Any]] = {
    "== True": lambda: Ev.active == True,  # noqa: E712
    ".is_(True)": lambda: Ev.active.is_(True),
    "== true()": lambda: Ev.active == sa.true(),
    "bare": lambda: Ev.active,
    "== False": lambda: Ev.active == False,  # noqa: E712
    "~": lambda: ~Ev.active,
    "not_()": lambda: sa.not_(Ev.active),
    ".is_(False)": lambda: Ev.active.is_(False),
    "== false()": lambda: Ev.active == sa.false(),
    "== literal(True)": lambda: Ev.active == sa.literal(True),
}

NOT_PINS: dict[str, Callable[[], Any]] = {
    ".is_not(False)": lambda: Ev.active.is_not(False),
    "or": lambda: sa.or_(Ev.active, Ev.ts < 5),
    "!= True": lambda: Ev.active != True,  # noqa: E712
    ".is_not(None)": lambda: Ev.active.is_not(None),
}


def fill(conn: sa.Connection, n: int = 120) -> None:
    conn.execute(sa.delete(Ev.__table__).where(sa.true()))
    conn.execute(
        Ev.__table__.insert(),
        [
            {
                "id": i,
                "active": i % 3 != 0,
                "live": None if i % 5 == 0 else i % 2 == 0,
                "ts": i % 17,
            }
            for i in range(n)
        ],
    )


@pytest.fixture()
def session(engine: sa.Engine) -> Iterator[Session]:
    PinBase.metadata.create_all(engine)
    with engine.begin() as conn:
        fill(conn)
    with Session(engine) as s:
        yield s


def check(session: Session, where: Any, index: str, k: int, size: int) -> None:
    stmt = sharded_select(Ev, index=index).where(where).order_by(Ev.ts.desc())
    truth = [
        e.id for e in session.scalars(sa.select(Ev).where(where).order_by(Ev.ts.desc(), Ev.id))
    ]
    assert truth
    for plan in PLANS:
        with forced(plan):
            assert [e.id for e in merged(session, stmt, k)] == truth[:k], plan
    assert [e.id for e in walk(session, stmt, size, pages=len(truth) // size + 3)] == truth


@pytest.mark.parametrize("form", list(PINS))
def test_a_boolean_pinned_as_sqlalchemy_writes_it(session: Session, form: str) -> None:
    """Each form used to be refused: 'ORDER BY cannot be served by pin_ev_by_active_ts'."""
    check(session, PINS[form](), "pin_ev_by_active_ts", 10, 13)


def test_two_pins_of_either_kind(session: Session) -> None:
    """A Boolean pinned with a bound value beside one pinned by a constant."""
    where = sa.and_(Ev.live == sa.literal(False), ~Ev.active)
    check(session, where, "pin_ev_by_live_active_ts", 7, 4)
    check(session, sa.and_(Ev.live.is_(True), Ev.active), "pin_ev_by_live_active_ts", 7, 4)


def test_a_column_pinned_to_null(session: Session) -> None:
    """``live IS NULL`` (``.is_(None)``, ``== None``) pins ``live`` as ``== value`` does."""
    check(session, sa.and_(Ev.live.is_(None), Ev.active), "pin_ev_by_live_active_ts", 5, 3)
    check(session, sa.and_(Ev.live == None, ~Ev.active), "pin_ev_by_live_active_ts", 5, 3)  # noqa: E711


@pytest.mark.parametrize("form", list(NOT_PINS))
def test_what_is_not_one_value_is_still_refused(session: Session, form: str) -> None:
    stmt = sharded_select(Ev, index="pin_ev_by_active_ts").where(NOT_PINS[form]())
    with pytest.raises(ShardConfigError, match="ORDER BY cannot be served by pin_ev_by_active_ts"):
        merged(session, stmt.order_by(Ev.ts.desc()), 5)


@pytest.fixture(scope="module")
def sqlite_session() -> Iterator[Session]:
    eng = sa.create_engine("sqlite://")
    PinBase.metadata.create_all(eng)
    with eng.begin() as conn:
        fill(conn, 60)
    with Session(eng) as s:
        yield s
    eng.dispose()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    forms=st.lists(st.sampled_from(list(PINS)), min_size=1, max_size=2),
    k=st.integers(1, 30),
    size=st.integers(1, 9),
)
def test_pins_oracle_on_sqlite(
    sqlite_session: Session, forms: list[str], k: int, size: int
) -> None:
    """Forms ANDed (contradictory ones give no rows: then the read gives none)."""
    where = sa.and_(*(PINS[f]() for f in forms))
    truth = [
        e.id
        for e in sqlite_session.scalars(sa.select(Ev).where(where).order_by(Ev.ts.desc(), Ev.id))
    ]
    stmt = sharded_select(Ev, index="pin_ev_by_active_ts").where(where).order_by(Ev.ts.desc())
    assert [e.id for e in merged(sqlite_session, stmt, k)] == truth[:k]
    assert [e.id for e in walk(sqlite_session, stmt, size, pages=len(truth) // size + 3)] == truth
