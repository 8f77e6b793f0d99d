"""Newest k rows across N shards, on the Spanner emulator (issue 5's benchmark; not a test).

Loads ROWS events (through the mutation API, shards computed client-side) into a table
per shard count, then reads the newest k for each strategy:

- one query: the shard predicate, ORDER BY ... LIMIT k (the server sorts everything);
- per-shard LIMIT k: one UNION ALL of N branches, each LIMIT k, merged on the client;
- merged(): sharded-orm's merge (a few rows per shard, then only the shards whose buffer
  ran out, bounded by the k-th row in hand; at most two statements);
- page(): the first pages of size k, each checked against the oracle (worst page shown).

Tables: N=16 and N=64 with uniform random timestamps, and N=16 skewed (every row of
shard 0 is newer than every other row). Prints rows transferred / k, statements sent and
wall time. Every strategy's rows are checked against the one-query answer.

    python benchmarks/bench_query.py [--rows 30000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import heapq
import random
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import ShardedIndex, UTCDateTime, merged, page, shard_column, sharded_select
from sharded_orm.read.merge import MergeStats
from sharded_orm.testing.emulator import local_emulator

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)


class Base(DeclarativeBase):
    pass


def model(n: int, name: str) -> Any:
    return type(
        name,
        (Base,),
        {
            "__tablename__": name,
            "__annotations__": {"id": Mapped[int], "ts": Mapped[dt.datetime], "s": Mapped[int]},
            "id": mapped_column(sa.BigInteger, primary_key=True, autoincrement=False),
            "ts": mapped_column(UTCDateTime),
            "s": shard_column("id", count=n),
            "__table_args__": (ShardedIndex(f"{name}_by_ts", sa.desc("ts"), shard="s"),),
        },
    )


def load(database: Any, m: Any, rows: int, skew: bool) -> None:
    rng = random.Random(7)
    sc = m.__table__.c.s
    from sharded_orm import get_shard_column

    shard = get_shard_column(m, "s")  # computed client-side: the mutation API skips hooks
    batch_rows = []
    for i in range(rows):
        s = shard.compute([i])
        ts = T0 + dt.timedelta(microseconds=rng.randrange(10**12))
        if skew and s == 0:
            ts += dt.timedelta(days=365)  # shard 0 holds the newest rows
        batch_rows.append((i, ts, s))
        if len(batch_rows) == 5000 or i == rows - 1:
            with database.batch() as batch:
                batch.insert(m.__tablename__, columns=("id", "ts", sc.name), values=batch_rows)
            batch_rows = []


def count_statements(engine: sa.Engine) -> list[int]:
    counter = [0]

    @event.listens_for(engine, "before_cursor_execute")
    def _count(*args: Any) -> None:
        counter[0] += 1

    return counter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=30_000)
    args = ap.parse_args()
    print(f"{args.rows} rows per table, Spanner emulator")
    print(
        f"{'table':<10}{'N':>4} {'k':>5}  {'strategy':<20}{'rows/k':>8}{'statements':>12}{'ms':>9}"
    )
    with local_emulator() as emulator:
        db_id = emulator.create_database()
        engine = emulator.engine(db_id)
        tables = [(16, "uniform16", False), (64, "uniform64", False), (16, "skewed16", True)]
        models = {name: (n, model(n, name), skew) for n, name, skew in tables}
        Base.metadata.create_all(engine)
        counter = count_statements(engine)
        for name, (n, m, skew) in models.items():
            t0 = time.perf_counter()
            load(emulator.database(db_id), m, args.rows, skew)
            print(f"(loaded {name} in {time.perf_counter() - t0:.1f} s)")
            t = m.__table__
            order = [t.c.ts.desc(), t.c.id]
            for k in sorted({10, n, 2 * n, 100, 1000}):
                base = sharded_select(m, index=f"{name}_by_ts")
                with engine.connect() as conn:
                    # one query with the shard predicate
                    counter[0] = 0
                    start = time.perf_counter()
                    truth = [tuple(r) for r in conn.execute(base.order_by(*order).limit(k))]
                    ms = (time.perf_counter() - start) * 1000
                    report(name, n, k, "one query", len(truth), counter[0], ms)
                    # per-shard LIMIT k + merge (each branch hinted and pinned to its shard)
                    counter[0] = 0
                    start = time.perf_counter()
                    branches = [
                        sa.select(base.for_shard(s).order_by(*order).limit(k).subquery())
                        for s in range(n)
                    ]
                    rows = [tuple(r) for r in conn.execute(sa.union_all(*branches))]
                    top = heapq.nsmallest(k, rows, key=lambda r: (-r[1].timestamp(), r[0]))
                    ms = (time.perf_counter() - start) * 1000
                    assert [r[:2] for r in top] == [r[:2] for r in truth]
                    report(name, n, k, "per-shard LIMIT k", len(rows), counter[0], ms)
                    # sharded-orm's merge
                    counter[0] = 0
                    stats = MergeStats()
                    start = time.perf_counter()
                    got = merged(conn, base.order_by(t.c.ts.desc()), k, stats=stats)
                    ms = (time.perf_counter() - start) * 1000
                    assert [tuple(r) for r in got] == truth
                    assert counter[0] <= 2 and (k < n or stats.rows_transferred <= 2 * k)
                    report(name, n, k, "merged()", stats.rows_transferred, counter[0], ms)
                    # page(): the first three pages of size k, worst page shown
                    expected = [tuple(r) for r in conn.execute(base.order_by(*order).limit(3 * k))]
                    cursor, seen, worst = None, [], (0, 0, 0.0)
                    for _ in range(3):
                        counter[0] = 0
                        start = time.perf_counter()
                        p = page(conn, base, k, cursor)
                        ms = (time.perf_counter() - start) * 1000
                        seen += [tuple(r) for r in p.rows]
                        cursor = p.next_cursor
                        worst = max(worst, (p.stats.rows_transferred, counter[0], ms))
                        assert counter[0] <= 2
                        assert k < n or p.stats.rows_transferred <= 2 * (k + 1)
                    assert seen == expected
                    report(name, n, k, "page() (worst of 3)", *worst)
        engine.dispose()


def report(table: str, n: int, k: int, name: str, rows: int, statements: int, ms: float) -> None:
    print(f"{table:<10}{n:>4} {k:>5}  {name:<20}{rows / k:>8.2f}{statements:>12}{ms:>9.1f}")


if __name__ == "__main__":
    main()
