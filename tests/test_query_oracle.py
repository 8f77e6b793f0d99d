"""merged() and page() against an oracle: the unsharded ``ORDER BY ... ts DESC, id``.

Random rows (few distinct timestamps, so many ties across shards; some NULL), shard
counts, tenants pinned or not, time ranges, limits and page sizes; on SQLite and, with
fewer and smaller examples, on the Spanner emulator. Also: rows inserted between pages.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import MergeStats, ShardedIndex, UTCDateTime, merged, page, shard_column
from sharded_orm import sharded_select as sharded_select_

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


class OracleBase(DeclarativeBase):
    pass


def _event_model(n: int) -> Any:
    return type(
        f"Ev{n}",
        (OracleBase,),
        {
            "__tablename__": f"ev{n}",
            "__annotations__": {
                "id": Mapped[int],
                "tenant": Mapped[int],
                "ts": Mapped[dt.datetime | None],
                "s": Mapped[int],
            },
            "id": mapped_column(sa.BigInteger, primary_key=True, autoincrement=False),
            "tenant": mapped_column(sa.BigInteger),
            "ts": mapped_column(UTCDateTime, nullable=True),
            "s": shard_column("id", count=n),
            "__table_args__": (
                ShardedIndex(f"ev{n}_by_tenant_ts", "tenant", sa.desc("ts"), shard="s"),
            ),
        },
    )


MODELS = {n: _event_model(n) for n in (1, 3, 8)}


def rows_strategy(max_rows: int) -> Any:
    # (tenant, seconds or None): few distinct values, so many ties across shards
    return st.lists(st.tuples(st.integers(0, 2), st.none() | st.integers(0, 12)), max_size=max_rows)


def examples(max_rows: int, max_limit: int, min_page: int) -> Any:
    return st.fixed_dictionaries(
        {
            "n": st.sampled_from(sorted(MODELS)),
            "rows": rows_strategy(max_rows),
            "tenant": st.none() | st.integers(0, 2),  # None: every tenant
            "range": st.none() | st.tuples(st.integers(-1, 12), st.integers(0, 14)),
            "order": st.booleans(),  # spell out the ORDER BY the index serves, or not
            "limit": st.integers(1, max_limit),
            "page": st.integers(min_page, 9),
        }
    )


def make_query(ex: dict[str, Any]) -> tuple[Any, Any]:
    """(sharded statement, oracle statement) for one example."""
    m = MODELS[ex["n"]]
    t = m.__table__
    conds = []
    if ex["tenant"] is not None:
        conds.append(t.c.tenant == ex["tenant"])
    if ex["range"] is not None:
        lo = T0 + dt.timedelta(seconds=ex["range"][0])
        conds += [t.c.ts >= lo, t.c.ts < lo + dt.timedelta(seconds=ex["range"][1])]
    stmt = sharded_select_(m, index=f"ev{ex['n']}_by_tenant_ts").where(*conds)
    order = [t.c.ts.desc(), t.c.id]
    if ex["tenant"] is None:
        order.insert(0, t.c.tenant)  # not pinned: the index orders by tenant first
    if ex["order"]:
        stmt = stmt.order_by(*order[:-1])
    return stmt, sa.select(t).where(*conds).order_by(*order)


def reset(conn: sa.Connection, ex: dict[str, Any]) -> None:
    for m in MODELS.values():
        conn.execute(sa.delete(m.__table__).where(sa.true()))
    rows = [
        {"id": i, "tenant": tenant, "ts": None if s is None else T0 + dt.timedelta(seconds=s)}
        for i, (tenant, s) in enumerate(ex["rows"])
    ]
    if rows:
        conn.execute(MODELS[ex["n"]].__table__.insert(), rows)


def all_pages(conn: Any, stmt: Any, size: int, bound: int) -> list[Any]:
    out: list[Any] = []
    cursor = None
    for _ in range(bound):
        p = page(conn, stmt, size, cursor)
        assert len(p.rows) <= size and p.stats.statements <= 3
        out.extend(p.rows)
        cursor = p.next_cursor
        if cursor is None:
            return out
        assert len(p.rows) == size
    raise AssertionError("pagination did not end")


def check_against_oracle(conn: sa.Connection, ex: dict[str, Any]) -> None:
    reset(conn, ex)
    stmt, oracle_stmt = make_query(ex)
    oracle = [tuple(r) for r in conn.execute(oracle_stmt)]
    stats = MergeStats()
    got = [tuple(r) for r in merged(conn, stmt, ex["limit"], stats=stats)]
    assert got == oracle[: ex["limit"]]
    assert stats.statements <= 3
    assert [tuple(r) for r in all_pages(conn, stmt, ex["page"], len(oracle) + 2)] == oracle


# ----------------------------------------------------------------------------- SQLite


@pytest.fixture(scope="module")
def sqlite_engine() -> Iterator[sa.Engine]:
    eng = sa.create_engine("sqlite://")
    OracleBase.metadata.create_all(eng)
    yield eng
    eng.dispose()


FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@settings(max_examples=200, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=examples(max_rows=40, max_limit=45, min_page=1))
def test_oracle_on_sqlite(sqlite_engine: sa.Engine, ex: dict[str, Any]) -> None:
    with sqlite_engine.begin() as conn:
        check_against_oracle(conn, ex)


@settings(max_examples=30, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=examples(max_rows=25, max_limit=30, min_page=1))
def test_entities_through_a_session(sqlite_engine: sa.Engine, ex: dict[str, Any]) -> None:
    with Session(sqlite_engine) as session:
        reset(session.connection(), ex)
        stmt, oracle_stmt = make_query(ex)
        oracle = [r.id for r in session.execute(oracle_stmt)]
        got = merged(session, stmt, ex["limit"])
        assert all(isinstance(e, MODELS[ex["n"]]) for e in got)
        assert [e.id for e in got] == oracle[: ex["limit"]]
        assert [e.id for e in all_pages(session, stmt, ex["page"], len(oracle) + 2)] == oracle
        session.rollback()


# ----------------------------------------------------------------------------- inserts


inserts = st.fixed_dictionaries(
    {
        "n": st.sampled_from(sorted(MODELS)),
        "rows": rows_strategy(30),
        "tenant": st.none() | st.integers(0, 2),
        "range": st.none(),
        "order": st.just(False),
        "page": st.integers(1, 6),
        # rows inserted after each page (tenant, seconds or None)
        "later": st.lists(rows_strategy(4), max_size=8),
    }
)


def check_inserts_between_pages(conn: sa.Connection, ex: dict[str, Any]) -> None:
    """No row is skipped or repeated; a row inserted between pages shows up exactly when
    it sorts after the cursor in force when it was inserted."""
    reset(conn, ex)
    stmt, oracle_stmt = make_query(ex)
    t = MODELS[ex["n"]].__table__
    expected = {r.id for r in conn.execute(oracle_stmt)}  # every row there at the start
    seen: list[Any] = []
    cursor = None
    next_id = len(ex["rows"])
    for round_ in range(len(ex["rows"]) + len(ex["later"]) * 4 + 2):
        p = page(conn, stmt, ex["page"], cursor)
        seen.extend(p.rows)
        cursor = p.next_cursor
        if cursor is None:
            break
        if round_ < len(ex["later"]):
            new = [
                {
                    "id": next_id + j,
                    "tenant": tn,
                    "ts": None if s is None else T0 + dt.timedelta(seconds=s),
                }
                for j, (tn, s) in enumerate(ex["later"][round_])
            ]
            next_id += len(new)
            if new:
                conn.execute(t.insert(), new)
            # where the new rows sort: after the last row read, or before it
            ordered = [r.id for r in conn.execute(oracle_stmt)]
            last = ordered.index(p.rows[-1].id)
            expected |= {r["id"] for r in new if r["id"] in ordered[last + 1 :]}
    ids = [r.id for r in seen]
    assert len(ids) == len(set(ids)), "a row was repeated"
    assert set(ids) == expected, "a row was skipped, or one behind the cursor appeared"
    final = [r.id for r in conn.execute(oracle_stmt)]
    assert ids == [i for i in final if i in expected], "pages are out of order"


@settings(max_examples=100, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=inserts)
def test_inserts_between_pages_on_sqlite(sqlite_engine: sa.Engine, ex: dict[str, Any]) -> None:
    with sqlite_engine.begin() as conn:
        check_inserts_between_pages(conn, ex)


# ----------------------------------------------------------------------------- emulator


def with_tables(engine: sa.Engine) -> sa.Engine:
    if not sa.inspect(engine).has_table("ev1"):  # once per test: hypothesis reuses the fixture
        OracleBase.metadata.create_all(engine)
    return engine


@pytest.mark.emulator
@settings(max_examples=25, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=examples(max_rows=20, max_limit=24, min_page=2))
def test_oracle_on_the_emulator(spanner_engine: sa.Engine, ex: dict[str, Any]) -> None:
    with with_tables(spanner_engine).begin() as conn:
        check_against_oracle(conn, ex)


@pytest.mark.emulator
@settings(max_examples=10, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=inserts.map(lambda ex: {**ex, "rows": ex["rows"][:16], "page": max(2, ex["page"])}))
def test_inserts_between_pages_on_the_emulator(
    spanner_engine: sa.Engine, ex: dict[str, Any]
) -> None:
    with with_tables(spanner_engine).begin() as conn:
        check_inserts_between_pages(conn, ex)
