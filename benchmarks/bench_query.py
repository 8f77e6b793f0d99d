"""Newest k rows across N shards, on the Spanner emulator (issue 5's benchmark; not a test).

Loads ROWS events (through the mutation API, shards computed client-side) into a table
per shard count, then reads the newest k for each strategy:

- one query: the shard predicate, ORDER BY ... LIMIT k (the server sorts everything);
- per-shard LIMIT k: one UNION ALL of N branches, each LIMIT k, merged on the client;
- merged(): sharded-orm's merge (an even share per shard, then only the shards still in
  contention, bounded by the k-th row in hand; at most three statements).

Prints rows transferred / k, statements sent and wall time. Every strategy's rows are
checked against the one-query answer.

    python benchmarks/bench_query.py [--rows 100000]
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

from sharded_orm import ShardedIndex, UTCDateTime, merged, shard_column, sharded_select
from sharded_orm.read.merge import MergeStats
from sharded_orm.read.plan import expand
from sharded_orm.testing.emulator import local_emulator

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)


class Base(DeclarativeBase):
    pass


def model(n: int) -> Any:
    return type(
        f"Events{n}",
        (Base,),
        {
            "__tablename__": f"events_{n}",
            "__annotations__": {"id": Mapped[int], "ts": Mapped[dt.datetime], "s": Mapped[int]},
            "id": mapped_column(sa.BigInteger, primary_key=True, autoincrement=False),
            "ts": mapped_column(UTCDateTime),
            "s": shard_column("id", count=n),
            "__table_args__": (ShardedIndex(f"events_{n}_by_ts", sa.desc("ts"), shard="s"),),
        },
    )


def load(database: Any, m: Any, rows: int) -> None:
    rng = random.Random(7)
    sc = m.__table__.c.s
    from sharded_orm import get_shard_column

    shard = get_shard_column(m, "s")  # computed client-side: the mutation API skips hooks
    batch_rows = []
    for i in range(rows):
        ts = T0 + dt.timedelta(microseconds=rng.randrange(10**12))
        batch_rows.append((i, ts, shard.compute([i])))
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
    ap.add_argument("--rows", type=int, default=100_000)
    args = ap.parse_args()
    print(f"{args.rows} rows per table, Spanner emulator")
    print(f"{'N':>4} {'k':>5}  {'strategy':<22}{'rows/k':>8}{'statements':>12}{'ms':>9}")
    with local_emulator() as emulator:
        db_id = emulator.create_database()
        engine = emulator.engine(db_id)
        models = {n: model(n) for n in (16, 64)}
        Base.metadata.create_all(engine)
        counter = count_statements(engine)
        for n, m in models.items():
            t0 = time.perf_counter()
            load(emulator.database(db_id), m, args.rows)
            print(f"(loaded N={n} in {time.perf_counter() - t0:.1f} s)")
            t = m.__table__
            order = [t.c.ts.desc(), t.c.id]
            for k in sorted({10, n, 100, 1000}):
                base = sharded_select(m, index=f"events_{n}_by_ts")
                with engine.connect() as conn:
                    # one query with the shard predicate
                    counter[0] = 0
                    start = time.perf_counter()
                    truth = [tuple(r) for r in conn.execute(base.order_by(*order).limit(k))]
                    ms = (time.perf_counter() - start) * 1000
                    report(n, k, "one query", len(truth), counter[0], ms)
                    # per-shard LIMIT k + merge (each branch hinted and pinned to its shard)
                    counter[0] = 0
                    start = time.perf_counter()
                    branches = [
                        sa.select(
                            expand(base, engine.dialect, shard=s)
                            .order_by(*order)
                            .limit(k)
                            .subquery()
                        )
                        for s in range(n)
                    ]
                    rows = [tuple(r) for r in conn.execute(sa.union_all(*branches))]
                    top = heapq.nsmallest(k, rows, key=lambda r: (-r[1].timestamp(), r[0]))
                    ms = (time.perf_counter() - start) * 1000
                    assert [r[:2] for r in top] == [r[:2] for r in truth]
                    report(n, k, "per-shard LIMIT k", len(rows), counter[0], ms)
                    # sharded-orm's merge
                    counter[0] = 0
                    stats = MergeStats()
                    start = time.perf_counter()
                    got = merged(conn, base.order_by(t.c.ts.desc()), k, stats=stats)
                    ms = (time.perf_counter() - start) * 1000
                    assert [tuple(r) for r in got] == truth
                    report(n, k, "merged()", stats.rows_transferred, counter[0], ms)
        engine.dispose()


def report(n: int, k: int, name: str, rows: int, statements: int, ms: float) -> None:
    print(f"{n:>4} {k:>5}  {name:<22}{rows / k:>8.2f}{statements:>12}{ms:>9.1f}")


if __name__ == "__main__":
    main()
