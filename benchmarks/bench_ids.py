"""Pooled sequences: round trips per 10,000 ids, and ids per second from a warm pool.

Round trips are counted on the in-process mock Spanner server (it executes nothing and
answers the sequence query with a registered block). Target: at most 101 requests that
fetch values per 10,000 ids at pool size 100, i.e. one per block. Ids per second are
measured in-process, from a pool that already holds the values (no I/O).

    python benchmarks/bench_ids.py
"""

from __future__ import annotations

import os
import time
from collections import Counter

os.environ.setdefault("SPANNER_DISABLE_BUILTIN_METRICS", "true")
os.environ.pop("SPANNER_EMULATOR_HOST", None)  # the client would prefer it to the mock

import sqlalchemy as sa  # noqa: E402

from sharded_orm import SpannerSequence, TableSequence, bit_reverse  # noqa: E402
from sharded_orm.testing.mock import MockSpanner  # noqa: E402

IDS = 10_000
POOL = 100
WARM = 100_000  # the largest block (MAX_BLOCK_SIZE)


def round_trips() -> None:
    mock = MockSpanner()
    engine = mock.engine()
    mock.add_result(
        "SELECT GET_NEXT_SEQUENCE_VALUE(SEQUENCE `ids`) FROM UNNEST(GENERATE_ARRAY(1, LEAST(@n, "
        "9223372036854775807 - COALESCE(GET_INTERNAL_SEQUENCE_STATE(SEQUENCE `ids`), 0))))",
        [("v", "INT64")],
        [[bit_reverse(i)] for i in range(1, POOL + 1)],
    )
    seq = SpannerSequence(engine, "ids", block_size=POOL)
    with engine.connect():  # open the session pool first: not per-id work
        pass
    mock.clear()
    start = time.perf_counter()
    for _ in range(IDS):
        seq.next_id()
    elapsed = time.perf_counter() - start
    kinds = Counter(type(r).__name__ for r in mock.requests)
    queries = kinds["ExecuteSqlRequest"]
    print(f"SpannerSequence: {IDS:,} ids at pool size {POOL} (mock Spanner server)")
    print(f"  reservations (blocks):        {seq.reservations}")
    verdict = "met" if queries <= 101 else "MISSED"
    print(f"  sequence queries (ExecuteSql): {queries}   target <= 101: {verdict}")
    for kind, n in sorted(kinds.items()):
        if kind != "ExecuteSqlRequest":
            print(f"  {kind + ':':<30}{n}")
    print(f"  all RPCs:                     {sum(kinds.values())}")
    print(f"  wall time:                    {elapsed:.2f} s (mock server, loopback gRPC)")
    print(
        "  (GET_NEXT_SEQUENCE_VALUE runs only in a read-write transaction: each block is\n"
        "   one query, beginning it inline, and one Commit, sent with the client's retries off)"
    )
    mock.clear()
    mock.add_error("Commit", "ABORTED", "aborted by the benchmark", times=3)
    seq._pool.clear()
    seq.next_id()
    kinds = Counter(type(r).__name__ for r in mock.requests)
    print(
        f"  one reservation through 3 ABORTED commits: {kinds['CommitRequest']} Commits, "
        f"{kinds['ExecuteSqlRequest']} queries (no replay inside the client)"
    )
    seq.close()
    engine.dispose()
    mock.stop()


def warm_pool() -> None:
    engine = sa.create_engine("sqlite://")
    seq = TableSequence(engine, "bench", block_size=WARM)
    seq.create_table()
    seq.next_id()  # one reservation fills the pool
    draw = seq.next_id
    start = time.perf_counter()
    for _ in range(WARM - 1):
        draw()
    rate = (WARM - 1) / (time.perf_counter() - start)
    print(f"warm pool: {WARM:,} next_id() calls, one thread: {rate:,.0f} ids/second")
    engine.dispose()


if __name__ == "__main__":
    round_trips()
    warm_pool()
