"""Each of merged()'s and page()'s plans in the case it is made for, against the others
(issue 45: the read planner keeps only the plans that pay). Not a test.

The plans (``sharded_orm.read.stats.PLANS``): ``point`` (the WHERE pins one shard),
``one statement`` (every shard's first K rows, merged by the database), ``probe`` (every
shard's first ~3K/N rows, exact unless a shard gave them all; ``probe, then two rounds``
is its fallback when one did), ``two rounds`` (a key-only bound round, then the rows up to
its bound), ``page bound`` (a later page, bounded by a key an earlier page's round found)
and, on Spanner only, ``two rounds in one statement``. For each case the cost rule's own
choice and the alternatives, forced (as ``tests/plans.py`` forces them), run on SQLite
over the same rows: statements sent, index entries the branches may read
(``MergeStats.server_rows_read``, an upper bound), rows sent back (full rows and sort-key
rows), and the process CPU of a read (best of interleaved rounds). ``*`` marks the
alternative best on the most of statements, server rows and CPU (a tie: the least CPU).

    python benchmarks/bench_plans.py [--rows 20000] [--rounds 5]

``--scaling`` prints merged()'s and page()'s CPU at k = 100 for N = 16, 64, 256 instead
(SQLite, and the Spanner compile path: the statements compiled for the Spanner dialect,
not sent).
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any
from unittest import mock

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import (
    MergeStats,
    ShardedIndex,
    get_shard_column,
    merged,
    page,
    shard_column,
    sharded_select,
)
from sharded_orm.read import branches, pagination


class Base(DeclarativeBase):
    pass


@cache
def model(shards: int, skewed: bool = False) -> Any:
    name = f"plans_{shards}{'_hot' if skewed else ''}"
    return type(
        name,
        (Base,),
        {
            "__tablename__": name,
            "__annotations__": {"id": Mapped[int], "ts": Mapped[int]},
            "id": mapped_column(sa.BigInteger, primary_key=True, autoincrement=False),
            "ts": mapped_column(sa.BigInteger),
            "s": shard_column("id", count=shards),
            "__table_args__": (ShardedIndex(f"{name}_by_ts", sa.desc("ts"), shard="s"),),
        },
    )


def load(engine: sa.Engine, m: Any, rows: int, skewed: bool) -> None:
    """Uniform timestamps; ``skewed``: shard 0 holds the newest rows."""
    rng, shard = random.Random(7), get_shard_column(m, "s")
    data = []
    for i in range(rows):
        s = shard.compute([i])
        ts = rng.randrange(10**9) + (10**9 if skewed and s == 0 else 0)
        data.append({"id": i, "ts": ts, "s": s})
    m.__table__.create(engine)
    with engine.begin() as conn:
        conn.execute(m.__table__.insert(), data)


#: (SINGLE_STATEMENT_READS, PROBE_SHARE, PAGES_AHEAD) that force each plan
FORCED = {
    "rule": (branches.SINGLE_STATEMENT_READS, branches.PROBE_SHARE, pagination.PAGES_AHEAD),
    "one statement": (10**12, 10**9, pagination.PAGES_AHEAD),
    "two rounds": (0, 10**9, pagination.PAGES_AHEAD),
    "probe": (0, 1, pagination.PAGES_AHEAD),
    "no page bound": (branches.SINGLE_STATEMENT_READS, branches.PROBE_SHARE, 0),
}


@contextmanager
def forced(plan: str) -> Iterator[None]:
    reads, share, ahead = FORCED[plan]
    with (
        mock.patch.object(branches, "SINGLE_STATEMENT_READS", reads),
        mock.patch.object(branches, "PROBE_SHARE", share),
        mock.patch.object(pagination, "PAGES_AHEAD", ahead),
    ):
        yield


Read = Callable[[Any], tuple[list[Any], MergeStats]]


def merged_read(stmt: Any, k: int) -> Read:
    def run(conn: Any) -> tuple[list[Any], MergeStats]:
        stats = MergeStats()
        return [tuple(r) for r in merged(conn, stmt, k, stats=stats)], stats

    return run


def page_walk(stmt: Any, size: int, pages: int) -> Read:
    """The first ``pages`` pages; the stats summed over them (plan: the last page's)."""

    def run(conn: Any) -> tuple[list[Any], MergeStats]:
        out, total, cursor = [], MergeStats(), None
        plans = []
        for _ in range(pages):
            p = page(conn, stmt, size, cursor)
            out += [tuple(r) for r in p.rows]
            plans.append(p.stats.plan)
            for f in ("statements", "rows_transferred", "key_rows_transferred"):
                setattr(total, f, getattr(total, f) + getattr(p.stats, f))
            total.server_rows_read += p.stats.server_rows_read
            cursor = p.next_cursor
        total.plan = max(set(plans), key=plans.count)  # the plan most pages took
        return out, total

    return run


def cases(engine: sa.Engine, rows: int) -> list[tuple[str, list[tuple[str, str, Read]]]]:
    """(case, [(alternative, forced plan, read)]): the first alternative is the plan the
    case is made for."""
    m16, m64, hot = model(16), model(64), model(16, skewed=True)
    for m, skewed in ((m16, False), (m64, False), (hot, True)):
        load(engine, m, rows, skewed)

    def newest(m: Any) -> Any:
        return sharded_select(m, index=f"{m.__tablename__}_by_ts").order_by(m.ts.desc())

    one_id = newest(m16).where(m16.id == 12345)
    every = newest(m16).where(m16.id + 0 == 12345)  # the same rows, no shard pinned
    return [
        (
            "point: WHERE id = x, N=16",
            [
                ("point", "rule", merged_read(one_id, 10)),
                ("every shard, one statement", "one statement", merged_read(every, 10)),
                ("every shard, two rounds", "two rounds", merged_read(every, 10)),
            ],
        ),
        (
            "small N*k: N=16, k=10",
            [
                ("one statement", "rule", merged_read(newest(m16), 10)),
                ("two rounds", "two rounds", merged_read(newest(m16), 10)),
            ],
        ),
        (
            "k >= 6N: N=16, k=500",
            [
                ("probe", "rule", merged_read(newest(m16), 500)),
                ("one statement", "one statement", merged_read(newest(m16), 500)),
                ("two rounds", "two rounds", merged_read(newest(m16), 500)),
            ],
        ),
        (
            "k < 6N, N*k large: N=64, k=100",
            [
                ("two rounds", "rule", merged_read(newest(m64), 100)),
                ("one statement", "one statement", merged_read(newest(m64), 100)),
                ("probe", "probe", merged_read(newest(m64), 100)),
            ],
        ),
        (
            "hot shard, k >= 6N: N=16, k=500",
            [
                ("probe, then two rounds", "rule", merged_read(newest(hot), 500)),
                ("one statement", "one statement", merged_read(newest(hot), 500)),
                ("two rounds", "two rounds", merged_read(newest(hot), 500)),
            ],
        ),
        (
            "page walk: N=64, 8 pages of 50",
            [
                ("page bound", "rule", page_walk(newest(m64), 50, 8)),
                ("a bound round per page", "no page bound", page_walk(newest(m64), 50, 8)),
                ("one statement per page", "one statement", page_walk(newest(m64), 50, 8)),
            ],
        ),
    ]


def cpu_ms(fn: Read, conn: Any, reads: int) -> float:
    gc.collect()
    start = time.process_time()
    for _ in range(reads):
        fn(conn)
    return (time.process_time() - start) * 1000 / reads


def winner(figures: list[MergeStats], cpu: list[float]) -> int:
    """The alternative best on the most of statements, server rows and CPU (a tie: the
    least CPU)."""
    axes = [
        [f.statements for f in figures],
        [f.server_rows_read for f in figures],
        cpu,
    ]
    wins = [sum(axis[i] == min(axis) for axis in axes) for i in range(len(figures))]
    return min(range(len(figures)), key=lambda i: (-wins[i], cpu[i]))


def plan_table(rows: int, rounds: int) -> None:
    engine = sa.create_engine("sqlite://")
    work = cases(engine, rows)
    print(
        f"SQLite, {rows} rows per table; process CPU per read, best of {rounds} "
        "interleaved rounds; server rows = MergeStats.server_rows_read (an upper bound)"
    )
    head = f"{'case / alternative':<44}{'plan taken':<24}{'stmts':>6}{'server rows':>12}"
    print(f"{head}{'rows back':>10}{'key rows':>9}{'CPU ms':>9}")
    with engine.connect() as conn:
        for case, alternatives in work:
            print(case)
            answers, figures, best = [], [], []
            for _, plan, fn in alternatives:  # warm: shapes built, compiled forms cached
                with forced(plan):
                    got, stats = fn(conn)
                answers.append(got)
                figures.append(stats)
                best.append(float("inf"))
            assert all(a == answers[0] for a in answers), case  # the same rows every way
            for r in range(rounds):
                order = list(range(len(alternatives)))
                for i in order if r % 2 else order[::-1]:
                    with forced(alternatives[i][1]):
                        best[i] = min(best[i], cpu_ms(alternatives[i][2], conn, 5))
            won = winner(figures, best)
            for i, ((name, _, _), stats) in enumerate(zip(alternatives, figures, strict=True)):
                mark = "*" if i == won else " "
                print(
                    f"  {mark} {name:<40}{stats.plan:<24}{stats.statements:>6}"
                    f"{stats.server_rows_read:>12}{stats.rows_transferred:>10}"
                    f"{stats.key_rows_transferred:>9}{best[i]:>9.2f}",
                    flush=True,
                )
    engine.dispose()


def scaling(rounds: int) -> None:
    """merged() and page() CPU at k = 100 for N = 16, 64, 256: SQLite (sent), and the
    Spanner dialect's compile of the same reads' statements (recorded, not sent)."""
    engine = sa.create_engine("sqlite://")
    models = {n: model(n) for n in (16, 64, 256)}
    for m in models.values():
        load(engine, m, 10_000, False)
    print(f"k = 100, 10000 rows per table; process CPU ms per read, best of {rounds}")
    print(f"{'N':>4}{'plan':>14}{'merged() ms':>13}{'page() ms':>11}{'built 2nd':>11}")
    with engine.connect() as conn:
        for n, m in models.items():
            stmt = sharded_select(m, index=f"plans_{n}_by_ts").order_by(m.ts.desc())
            merged_fn, page_fn = merged_read(stmt, 100), page_walk(stmt, 100, 1)
            merged_fn(conn)
            page_fn(conn)
            _, again = merged_fn(conn)
            times = {"merged": float("inf"), "page": float("inf")}
            for r in range(rounds):
                pair = [("merged", merged_fn), ("page", page_fn)]
                for name, fn in pair if r % 2 else pair[::-1]:
                    times[name] = min(times[name], cpu_ms(fn, conn, 5))
            print(
                f"{n:>4}{again.plan:>14}{times['merged']:>13.2f}{times['page']:>11.2f}"
                f"{again.shapes_built:>11}",
                flush=True,
            )
    engine.dispose()
    spanner_scaling(rounds)


def spanner_scaling(rounds: int) -> None:
    """The Spanner path's client CPU without a server: merged() over a mock server that
    answers every statement with no rows (so each read is its first round and the rows
    statement), the statements built, compiled for Spanner and sent through the DB-API."""
    import os

    from sharded_orm.testing.mock import MockSpanner

    os.environ.setdefault("SPANNER_DISABLE_BUILTIN_METRICS", "true")
    mock_server = MockSpanner()
    try:
        engine = mock_server.engine()
        print("Spanner dialect (mock server, empty answers): merged() CPU ms per read")
        print(f"{'N':>4}{'merged() ms':>13}{'built 2nd':>11}")
        with engine.connect() as conn:
            for n in (16, 64, 256):
                m = model(n)
                stmt = sharded_select(m, index=f"plans_{n}_by_ts").order_by(m.ts.desc())
                fn = merged_read(stmt, 100)
                answer = answering(mock_server, stmt)
                sa.event.listen(engine, "before_cursor_execute", answer)
                try:
                    fn(conn)
                    _, again = fn(conn)
                    best = min(cpu_ms(fn, conn, 5) for _ in range(rounds))
                finally:
                    sa.event.remove(engine, "before_cursor_execute", answer)
                print(f"{n:>4}{best:>13.2f}{again.shapes_built:>11}", flush=True)
        engine.dispose()
    finally:
        mock_server.server.stop(0)


def answering(mock_server: Any, stmt: Any) -> Callable[..., None]:
    """A ``before_cursor_execute`` listener that has the mock server answer each new
    statement with no rows."""
    answered: set[str] = set()
    labels = [c.name for c in stmt.selected_columns]

    def answer(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if statement not in answered:
            answered.add(statement)
            mock_server.add_result(statement, [(x, "INT64") for x in labels], [])

    return answer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scaling", action="store_true")
    args = ap.parse_args()
    if args.scaling:
        scaling(args.rounds)
    else:
        plan_table(args.rows, args.rounds)


if __name__ == "__main__":
    main()
