"""Loader criteria (``with_loader_criteria``, the usual soft-delete or tenancy filter) apply
in every statement of a read: given on the statement, or added by a ``do_orm_execute``
listener, under every plan of the cost rule, through a Session and a Connection, on SQLite
and the emulator. Before, the bound round was built without the statement's options:
``page()``, and ``merged()`` when it took two statements, failed with a false
``ShardReadError`` ("the rows changed between statements") where nothing wrote.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from plans import PLANS, forced, walk
from sqlalchemy import event
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    ORMExecuteState,
    Session,
    mapped_column,
    with_loader_criteria,
)

from sharded_orm import ShardedIndex, merged, page, shard_column, sharded_select


class B(DeclarativeBase):
    pass


class Doc(B):
    __tablename__ = "crit_doc"
    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    tenant: Mapped[str] = mapped_column(sa.String(8))
    deleted: Mapped[bool] = mapped_column(sa.Boolean)
    ts: Mapped[int] = mapped_column(sa.BigInteger)
    s: Mapped[int] = shard_column("id", count=4)
    __table_args__ = (ShardedIndex("crit_doc_by_ts", sa.desc("ts"), shard="s"),)


def live() -> Any:
    return with_loader_criteria(Doc, Doc.deleted.is_(False))


def fill(engine: sa.Engine) -> list[int]:
    """120 documents of tenants a and b, every third one deleted; the live ones' ids,
    newest first."""
    B.metadata.create_all(engine)
    rows = [
        {"id": i, "tenant": "ab"[i % 2], "deleted": i % 3 == 0, "ts": i // 2} for i in range(120)
    ]
    with engine.begin() as conn:
        conn.execute(sa.delete(Doc.__table__).where(sa.true()))
        conn.execute(Doc.__table__.insert(), rows)
    alive = [r for r in rows if not r["deleted"]]
    return [r["id"] for r in sorted(alive, key=lambda r: (-r["ts"], r["id"]))]


@pytest.fixture
def db(engine: sa.Engine) -> Iterator[tuple[sa.Engine, list[int]]]:
    yield engine, fill(engine)


def newest() -> Any:
    return sharded_select(Doc, index="crit_doc_by_ts").order_by(Doc.ts.desc())


def check(conn: Any, stmt: Any, truth: list[int], ids: Any) -> None:
    for plan in PLANS:
        with forced(plan):
            for k in (1, 5, 17, 40):
                assert ids(merged(conn, stmt, k)) == truth[:k], (plan, k)
            for size in (7, 30):
                assert ids(walk(conn, stmt, size)) == truth, (plan, size)


def test_criteria_on_the_statement(db: tuple[sa.Engine, list[int]]) -> None:
    engine, truth = db
    stmt = newest().options(live())
    with Session(engine) as session:
        check(session, stmt, truth, lambda got: [d.id for d in got])
    with engine.connect() as conn:  # the ORM compiles the criteria on a Connection too
        check(conn, stmt, truth, lambda got: [r.id for r in got])


def test_criteria_added_in_do_orm_execute(db: tuple[sa.Engine, list[int]]) -> None:
    engine, truth = db
    with Session(engine) as session:

        @event.listens_for(session, "do_orm_execute")
        def soft_delete(state: ORMExecuteState) -> None:
            if state.is_select and not state.is_column_load and not state.is_relationship_load:
                state.statement = state.statement.options(live())

        check(session, newest(), truth, lambda got: [d.id for d in got])
        # a tenant's filter from the listener too
        tenant = "b"

        @event.listens_for(session, "do_orm_execute")
        def tenancy(state: ORMExecuteState) -> None:
            if state.is_select:
                state.statement = state.statement.options(
                    with_loader_criteria(
                        Doc, lambda cls: cls.tenant == tenant, track_closure_variables=True
                    )
                )

        b = [i for i in truth if i % 2 == 1]
        check(session, newest(), b, lambda got: [d.id for d in got])


def test_a_page_with_criteria_takes_one_statement_after_the_first(
    db: tuple[sa.Engine, list[int]],
) -> None:
    engine, truth = db
    stmt = newest().options(live())
    with Session(engine) as session, forced("two rounds"):
        first = page(session, stmt, 10)
        assert [d.id for d in first.rows] == truth[:10]
        second = page(session, stmt, 10, first.next_cursor)
        assert [d.id for d in second.rows] == truth[10:20]
        assert second.stats.statements == 1
