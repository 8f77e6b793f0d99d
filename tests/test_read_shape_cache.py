"""merged() and page() build each statement shape once per (statement, shard count,
plan) and reuse it with each read's own values (``sharded_orm.read.branches.SHAPES``):
a repeated read builds nothing (``MergeStats.shapes_built``), and every read returns
the rows of its own values, never those of the read that built the shape."""

from __future__ import annotations

import random
from functools import cache
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plans import forced
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import (
    MergeStats,
    ShardedIndex,
    get_shard_column,
    merged,
    page,
    shard_column,
    sharded_select,
)

ROWS = 240


class Base(DeclarativeBase):
    pass


@cache
def model(shards: int) -> Any:
    """A table of ``shards`` shards: events of a kind, newest first (``ts`` may tie)."""
    name = f"shape_cache_{shards}"
    return type(
        name.title().replace("_", ""),
        (Base,),
        {
            "__tablename__": name,
            "__annotations__": {"id": Mapped[int], "kind": Mapped[int], "ts": Mapped[int]},
            "id": mapped_column(sa.BigInteger, primary_key=True, autoincrement=False),
            "kind": mapped_column(sa.Integer),
            "ts": mapped_column(sa.BigInteger),
            "s": shard_column("id", count=shards),
            "__table_args__": (ShardedIndex(f"{name}_by_ts", sa.desc("ts"), shard="s"),),
        },
    )


def rows_of(shards: int) -> list[dict[str, int]]:
    rng, shard = random.Random(shards), get_shard_column(model(shards), "s")
    return [
        {"id": i, "kind": rng.randrange(3), "ts": rng.randrange(60), "s": shard.compute([i])}
        for i in range(ROWS)
    ]


def loaded(engine: sa.Engine, shards: int) -> list[dict[str, int]]:
    table = model(shards).__table__
    rows = rows_of(shards)
    if not sa.inspect(engine).has_table(table.name):
        table.create(engine)
        with engine.begin() as conn:
            conn.execute(table.insert(), rows)
    return rows


def expected(rows: list[dict[str, int]], kind: int, since: int, k: int) -> list[int]:
    """The unsharded answer: ids of ``kind`` with ``ts > since``, newest first, by id."""
    chosen = [r for r in rows if r["kind"] == kind and r["ts"] > since]
    return [r["id"] for r in sorted(chosen, key=lambda r: (-r["ts"], r["id"]))][:k]


def statement(shards: int, kind: int, since: int) -> Any:
    m = model(shards)
    return (
        sharded_select(m, index=f"shape_cache_{shards}_by_ts")
        .where(m.kind == kind, m.ts > since)
        .order_by(m.ts.desc())
    )


def read(conn: Any, shards: int, kind: int, since: int, k: int) -> tuple[list[int], MergeStats]:
    stats = MergeStats()
    got = merged(conn, statement(shards, kind, since), k, stats=stats)
    return [e.id for e in got], stats


@pytest.fixture(scope="module")
def sqlite() -> Any:
    engine = sa.create_engine("sqlite://")
    yield engine
    engine.dispose()


@pytest.mark.parametrize("plan", ["rule", "two rounds", "probe"])
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    first=st.tuples(st.integers(0, 2), st.integers(-1, 59), st.integers(1, 40)),
    second=st.tuples(st.integers(0, 2), st.integers(-1, 59), st.integers(1, 40)),
)
def test_a_reused_shape_reads_with_this_reads_values(
    sqlite: sa.Engine, plan: str, first: tuple[int, int, int], second: tuple[int, int, int]
) -> None:
    rows = loaded(sqlite, 8)
    with forced(plan), Session(sqlite) as session:
        for kind, since, k in (first, second, first):
            got, _ = read(session, 8, kind, since, k)
            assert got == expected(rows, kind, since, k)


@pytest.mark.parametrize("plan", ["rule", "two rounds", "probe"])
def test_a_repeated_read_builds_no_statement(sqlite: sa.Engine, plan: str) -> None:
    rows = loaded(sqlite, 16)
    values = [(i % 3, 5 * i, 30 + i) for i in range(6)]
    built = []
    with forced(plan), Session(sqlite) as session:
        for kind, since, k in values + values[3:] + values[:3]:
            got, stats = read(session, 16, kind, since, k)
            assert got == expected(rows, kind, since, k)
            built.append(stats.shapes_built)
    # the first pass builds the shapes its plans take (a plan may first appear on any
    # read); the second, the same reads in another order, builds none
    assert built[6:] == [0] * 6, built


def test_a_page_walk_builds_its_shapes_once(sqlite: sa.Engine) -> None:
    rows = loaded(sqlite, 16)
    m = model(16)
    stmt = sharded_select(m, index="shape_cache_16_by_ts").order_by(m.ts.desc())
    want = [r["id"] for r in sorted(rows, key=lambda r: (-r["ts"], r["id"]))]
    for _ in range(2):
        got, built, cursor = [], [], None
        with Session(sqlite) as session:
            while True:
                p = page(session, stmt, 25, cursor)
                got += [e.id for e in p.rows]
                built.append(p.stats.shapes_built)
                if p.next_cursor is None:
                    break
                cursor = p.next_cursor
        assert got == want
    assert built == [0] * len(built), built  # the second walk: every shape reused


@pytest.mark.slow
def test_every_shard_count_up_to_64_on_sqlite(sqlite: sa.Engine) -> None:
    with sqlite.connect() as conn:
        for shards in range(1, 65):
            rows = loaded(sqlite, shards)
            for kind, since, k in ((0, -1, 50), (1, 20, 7), (2, 40, 120), (0, 10, 3)):
                got = [r.id for r in merged(conn, statement(shards, kind, since), k)]
                assert got == expected(rows, kind, since, k), (shards, kind, since, k)


@pytest.mark.parametrize("plan", ["rule", "two rounds", "probe"])
def test_four_shards_each_reads_own_values(engine: sa.Engine, plan: str) -> None:
    rows = loaded(engine, 4)
    values = [(0, -1, 50), (1, 20, 7), (2, 40, 120), (0, 10, 3)]
    built = []
    with forced(plan), engine.connect() as conn:
        for kind, since, k in values + values[::-1]:
            got, stats = read(conn, 4, kind, since, k)
            assert got == expected(rows, kind, since, k), (kind, since, k)
            built.append(stats.shapes_built)
    assert built[4:] == [0] * 4, built
