"""merged() and page() under the backend's limits on one statement (``read/limits.py``).

- SQLite refuses a compound SELECT of more than 500 terms (``SQLITE_LIMIT_COMPOUND_SELECT``)
  and a merge sends one ``UNION ALL`` term per shard: above 500 shards (the library
  accepts 65,536) every read was a raw ``OperationalError``. The branches are nested in
  groups under the connection's limit: a hypothesis oracle lowers it (``setlimit``) to
  reach many levels with few shards, and a slow test reads 600 shards at the default.
- Spanner accepts 950 parameters in a statement, and the bound round inside the rows
  statement repeats the WHERE clause: an ``IN`` of 480 values passed it although the
  statement itself and ``page()`` ran it (a ``ProgrammingError`` whose advice was about
  inserts). The bound round now runs inside only when twice the parameters fit; a read
  that cannot fit is refused with advice for a read.
- Spanner's ``GENERATE_ARRAY`` makes at most 16,000 elements: the correlated branches
  of more shards failed ("Cannot generate arrays with more than 16000 elements").
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plans import PLANS, forced, walk
from sqlalchemy import event
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import (
    MergeStats,
    ShardConfigError,
    ShardedIndex,
    merged,
    page,
    shard_column,
    sharded_select,
)
from sharded_orm import limits as spanner_limits
from sharded_orm.read import limits
from sharded_orm.read.fanout import shard_numbers


class B(DeclarativeBase):
    pass


def _model(n: int) -> Any:
    return type(
        f"Lim{n}",
        (B,),
        {
            "__tablename__": f"lim{n}",
            "__annotations__": {"id": Mapped[int], "ts": Mapped[int], "s": Mapped[int]},
            "id": mapped_column(sa.BigInteger, primary_key=True, autoincrement=False),
            "ts": mapped_column(sa.BigInteger),
            "s": shard_column("id", count=n),
            "__table_args__": (ShardedIndex(f"lim{n}_by_ts", sa.desc("ts"), shard="s"),),
        },
    )


MODELS = {n: _model(n) for n in (8, 16, 600)}


def fill(conn: Any, n: int, rows: int) -> None:
    t = MODELS[n].__table__
    conn.execute(sa.delete(t).where(sa.true()))
    if rows:
        conn.execute(t.insert(), [{"id": i, "ts": (i * 7) % 23} for i in range(rows)])


def newest(n: int, ids: list[int] | None = None) -> Any:
    m = MODELS[n]
    stmt = sharded_select(m, index=f"lim{n}_by_ts")
    return stmt if ids is None else stmt.where(m.id.in_(ids))


def truth(conn: Any, n: int, ids: list[int] | None = None) -> list[int]:
    m = MODELS[n]
    q = sa.select(m.id).order_by(m.ts.desc(), m.id)
    return [r.id for r in conn.execute(q if ids is None else q.where(m.id.in_(ids)))]


def lower_limit(conn: sa.Connection, monkeypatch: pytest.MonkeyPatch, which: str, to: int) -> None:
    """The connection's SQLite limit lowered (or, before Python 3.11, the default the
    library assumes)."""
    raw = conn.connection.driver_connection
    if hasattr(raw, "setlimit"):
        raw.setlimit(getattr(sqlite3, which), to)
    else:
        default = {"SQLITE_LIMIT_COMPOUND_SELECT": "SQLITE_COMPOUND_SELECT"}.get(
            which, "SQLITE_VARIABLES"
        )
        monkeypatch.setattr(limits, default, to)


class Sent:
    """The statements sent through an engine, and their parameters."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine, self.params = engine, list[int]()

    def __enter__(self) -> Sent:
        event.listen(self.engine, "before_cursor_execute", self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, sql: str, params: Any, *rest: Any) -> None:
        self.params.append(len(params) if params else 0)


@pytest.fixture
def sqlite_engine() -> Iterator[sa.Engine]:
    eng = sa.create_engine("sqlite://")
    B.metadata.create_all(eng, tables=[MODELS[8].__table__])
    yield eng
    eng.dispose()


LIMITS = {
    "compound": st.integers(2, 9),
    "variables": st.sampled_from([40, 120, 400, 32766]),
    "rows": st.integers(0, 40),
    "ids": st.none() | st.lists(st.integers(0, 45), max_size=12),
    "k": st.integers(1, 30),
    "size": st.integers(1, 9),
}


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(**LIMITS)
def test_unions_nested_under_the_compound_limit_and_parameters_refused_over_theirs(
    sqlite_engine: sa.Engine,
    monkeypatch: pytest.MonkeyPatch,
    compound: int,
    variables: int,
    rows: int,
    ids: list[int] | None,
    k: int,
    size: int,
) -> None:
    under_the_limits(sqlite_engine, monkeypatch, compound, variables, rows, ids, k, size)


# the oracle's wide variant (many drawn limits, every plan each); quick loop:
# test_unions_nested_under_the_compound_limit_and_parameters_refused_over_theirs
@pytest.mark.slow
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(**LIMITS)
def test_unions_nested_under_the_compound_limit_and_parameters_refused_over_theirs_wide(
    sqlite_engine: sa.Engine,
    monkeypatch: pytest.MonkeyPatch,
    compound: int,
    variables: int,
    rows: int,
    ids: list[int] | None,
    k: int,
    size: int,
) -> None:
    under_the_limits(sqlite_engine, monkeypatch, compound, variables, rows, ids, k, size)


def under_the_limits(
    sqlite_engine: sa.Engine,
    monkeypatch: pytest.MonkeyPatch,
    compound: int,
    variables: int,
    rows: int,
    ids: list[int] | None,
    k: int,
    size: int,
) -> None:
    """Every plan under the lowered limits: the unsharded answer, or refused saying so."""
    with sqlite_engine.connect() as conn:
        fill(conn, 8, rows)
        expected = truth(conn, 8, ids)
        lower_limit(conn, monkeypatch, "SQLITE_LIMIT_COMPOUND_SELECT", compound)
        lower_limit(conn, monkeypatch, "SQLITE_LIMIT_VARIABLE_NUMBER", variables)
        stmt = newest(8, ids)
        for plan in PLANS:
            with forced(plan), Sent(sqlite_engine) as sent:
                try:
                    got = [r.id for r in merged(conn, stmt, k)]
                    walked = [r.id for r in walk(conn, stmt, size)]
                except ShardConfigError as e:
                    assert "parameters" in str(e) and "split a long IN list" in str(e)
                    assert all(p <= variables for p in sent.params)
                    continue
                assert got == expected[:k] and walked == expected
                assert max(sent.params, default=0) <= variables


@pytest.mark.slow
def test_600_shards_on_sqlite() -> None:
    eng = sa.create_engine("sqlite://")
    B.metadata.create_all(eng, tables=[MODELS[600].__table__])
    with eng.connect() as conn:
        fill(conn, 600, 900)
        expected = truth(conn, 600)
        stats = MergeStats()
        assert [r.id for r in merged(conn, newest(600), 25, stats=stats)] == expected[:25]
        first = page(conn, newest(600), 10)
        second = page(conn, newest(600), 10, first.next_cursor)
        assert [r.id for r in first.rows + second.rows] == expected[:20]


def test_a_statement_over_sqlite_s_parameters_is_refused_before_it_runs(
    sqlite_engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sqlite_engine.connect() as conn:
        fill(conn, 8, 30)
        lower_limit(conn, monkeypatch, "SQLITE_LIMIT_VARIABLE_NUMBER", 100)
        stmt = newest(8, list(range(20)))  # 20 values in each of 8 branches
        with Sent(sqlite_engine) as sent:
            for read in (lambda: merged(conn, stmt, 5), lambda: page(conn, stmt, 5)):
                with pytest.raises(
                    ShardConfigError, match=r"160 parameters; sqlite accepts at most 100"
                ):
                    read()
        assert sent.params == []


# ----------------------------------------------------------------------------- Spanner


@pytest.fixture
def spanner(spanner_engine: sa.Engine) -> sa.Engine:
    B.metadata.create_all(spanner_engine, tables=[MODELS[16].__table__])
    with spanner_engine.begin() as conn:
        fill(conn, 16, 600)
    return spanner_engine


@pytest.mark.emulator
@pytest.mark.slow  # (a minute: the emulator reads an IN list of 480 slowly)
def test_an_in_list_of_480_values_under_every_plan(spanner: sa.Engine) -> None:
    ids = list(range(0, 960, 2))
    with spanner.connect() as conn, Sent(spanner) as sent:
        expected = truth(conn, 16, ids)
        for plan in PLANS:
            with forced(plan):
                assert [r.id for r in merged(conn, newest(16, ids), 40)] == expected[:40]
        first = page(conn, newest(16, ids), 150)
        second = page(conn, newest(16, ids), 150, first.next_cursor)
        assert [r.id for r in first.rows + second.rows] == expected
        assert max(sent.params) <= spanner_limits.SPANNER_PARAMETERS


# quick loop: test_a_statement_over_sqlite_s_parameters_is_refused_before_it_runs
@pytest.mark.slow
@pytest.mark.emulator
def test_a_read_over_spanner_s_parameters_says_what_to_do(spanner: sa.Engine) -> None:
    ids = list(range(0, 1890, 2))  # 945 values: the statement runs, a page's does not fit
    with spanner.connect() as conn:
        assert len(truth(conn, 16, ids)) == 300
        assert len(merged(conn, newest(16, ids), 10)) == 10
        with pytest.raises(ShardConfigError, match=r"Spanner accepts at most 950.*IN list"):
            page(conn, newest(16, ids), 10)
        many = newest(16, list(range(960)))
        with Sent(spanner) as sent, pytest.raises(ShardConfigError, match="960 parameters"):
            merged(conn, many, 10)
        assert sent.params == []


def test_more_shards_than_one_generated_array() -> None:
    assert shard_numbers(16000) == "UNNEST(GENERATE_ARRAY(0, 15999))"
    assert "GENERATE_ARRAY(0, 4)) AS so_h" in shard_numbers(65536)
    assert "so_h * 16000 + so_l < 65536" in shard_numbers(65536)


@pytest.mark.emulator
@pytest.mark.parametrize("count", [1, 16000, 16001, 65536])
def test_the_shard_numbers_on_the_emulator(spanner_engine: sa.Engine, count: int) -> None:
    """Every shard once, past 16,000 too (a merge of 16,001 shards, run by hand on the
    emulator, took 10 minutes there: the emulator runs each branch's subquery alone)."""
    with spanner_engine.connect() as conn:
        got = conn.exec_driver_sql(
            f"SELECT COUNT(*), COUNT(DISTINCT n), MIN(n), MAX(n) FROM {shard_numbers(count)} AS n"
        ).one()
    assert tuple(got) == (count, count, 0, count - 1)
