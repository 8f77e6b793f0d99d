"""Pooled sequences: round trips per 10,000 ids, and ids per second from a warm pool.

Round trips are counted on the in-process mock Spanner server (issue 4's benchmark; not
a test). Target: at most 101 requests that reserve values per 10,000 ids at pool 100.

    python benchmarks/bench_ids.py
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("SPANNER_DISABLE_BUILTIN_METRICS", "true")

from sharded_orm import SpannerSequence  # noqa: E402
from sharded_orm.testing.mock import MockSpanner  # noqa: E402

IDS = 10_000
POOL = 100


def main() -> None:
    mock = MockSpanner()
    engine = mock.engine()
    mock.add_result(
        "SELECT GET_NEXT_SEQUENCE_VALUE(SEQUENCE ids) FROM UNNEST(GENERATE_ARRAY(1, @a0))",
        [("v", "INT64")],
        [[i] for i in range(1, POOL + 1)],
    )
    seq = SpannerSequence(engine, "ids", block_size=POOL)
    mock.clear()
    start = time.perf_counter()
    for _ in range(IDS):
        seq.next_id()
    elapsed = time.perf_counter() - start
    reads = mock.count("ExecuteSqlRequest")
    commits = mock.count("CommitRequest")
    print(f"{IDS} ids at pool size {POOL} (mock Spanner server)")
    print(f"  reservations:            {seq.reservations}")
    print(f"  ExecuteSql requests:     {reads}   (one per block; target <= 101)")
    print(f"  Commit requests:         {commits}")
    print(f"  all requests:            {len(mock.requests)}")
    print(f"  wall time:               {elapsed:.2f} s")

    # warm pool: ids handed out locally, no I/O
    seq._pool.extend(range(1_000_000))
    start = time.perf_counter()
    for _ in range(1_000_000):
        seq.next_id()
    rate = 1_000_000 / (time.perf_counter() - start)
    print(f"  ids/second, warm pool:   {rate:,.0f}")
    engine.dispose()
    mock.stop()


if __name__ == "__main__":
    main()
