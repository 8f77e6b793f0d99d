"""Reshard backfill three ways on the emulator, at several sizes (not a test).

LogEntries with ROWS rows written by "old code" (``EntryShardV2`` NULL), then filled by:

1. client walk: ``alembic_ext.backfill.backfill_shard(..., engine="client")`` (one walk
   of the key with a key cursor: per batch a read-write transaction that reads the next
   rows by KeyRange, hashes in Python and commits one UPDATE mutation), on a crc32
   column. Linear: its rows/s must stay flat (within 1.3x) from the smallest size to the
   largest (the ratio is printed);
2. Partitioned DML: ``sharded_orm.load.backfill_server.backfill_server_side`` on a
   farm_fingerprint column (one UPDATE inside Spanner, then one server-side count);
3. Beam ``Backfill`` on the DirectRunner (partitioned read, hash, update mutations in
   batches), on a crc32 column.

Each is checked with ``sharded_orm.verify`` (0 mismatched rows, every row findable).
RPCs: what each path sends, counted from its own reports (see the notes printed).

    python benchmarks/bench_backfill.py [--rows 20000 200000] [--batch-size 500] [--skip beam]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("SPANNER_DISABLE_BUILTIN_METRICS", "true")
sys.path.insert(0, str(Path(__file__).parent.parent))

from sharded_orm import verify  # noqa: E402
from sharded_orm.load.backfill_server import backfill_server_side  # noqa: E402
from sharded_orm.testing.emulator import Emulator, local_emulator  # noqa: E402
from tests.at_scale_models import (  # noqa: E402
    CrcBase,
    CrcLogEntry,
    FarmBase,
    FarmLogEntry,
    load_old_rows,
)


def fresh(emulator: Emulator, base: Any, model: Any, rows: int) -> tuple[Any, str]:
    database_id = emulator.create_database()
    engine = emulator.engine(database_id)
    base.metadata.create_all(engine)
    t = time.perf_counter()
    load_old_rows(engine, model, rows)
    print(f"  (loaded {rows:,} old rows in {time.perf_counter() - t:.1f} s)")
    return engine, database_id


def check(engine: Any, model: Any, rows: int) -> float:
    t = time.perf_counter()
    report = verify(engine, model, progress_mode="off")
    assert report.rows_checked == rows, report
    assert report.ok, report.mismatched
    return time.perf_counter() - t


def client_batches(emulator: Emulator, rows: int, batch_size: int) -> dict[str, Any]:
    from alembic_ext.backfill import backfill_shard

    engine, _ = fresh(emulator, CrcBase, CrcLogEntry, rows)
    t = time.perf_counter()
    result = backfill_shard(
        engine, "LogEntries", "EntryShardV2", sources=["CompanyId", "Timestamp"], count=16,
        algorithm="crc32", batch_size=batch_size, progress=False, engine="client",
    )  # fmt: skip
    seconds = time.perf_counter() - t
    assert result.rows == rows == result.verified, result
    # CreateSession, the last-key query; per batch BeginTransaction, StreamingRead, Commit
    rpcs = 2 + 3 * result.batches
    return {"seconds": seconds, "rpcs": rpcs, "verify": check(engine, CrcLogEntry, rows),
            "note": f"{result.batches} batches of {batch_size}, one walk"}  # fmt: skip


def partitioned_dml(emulator: Emulator, rows: int) -> dict[str, Any]:
    engine, _ = fresh(emulator, FarmBase, FarmLogEntry, rows)
    t = time.perf_counter()
    result = backfill_server_side(engine, FarmLogEntry, "EntryShardV2", progress_mode="off")
    seconds = time.perf_counter() - t
    assert result.rows_updated == rows and result.mismatched == 0, result
    # the NULL count, the key read for the ranges, one Partitioned DML per range
    # (BeginTransaction + ExecuteStreamingSql each), the closing mismatch count
    statements = result.rpcs - 3
    return {"seconds": seconds, "rpcs": result.rpcs + statements,
            "verify": check(engine, FarmLogEntry, rows),
            "note": f"{statements} UPDATE statements over key ranges + 2 counts"}  # fmt: skip


def beam_backfill(emulator: Emulator, rows: int) -> dict[str, Any]:
    import apache_beam as beam

    from sharded_orm.beam import Backfill, run

    engine, database_id = fresh(emulator, CrcBase, CrcLogEntry, rows)
    ids = {"project_id": emulator.project, "instance_id": emulator.instance_id,
           "database_id": database_id}  # fmt: skip
    p = beam.Pipeline()
    _ = p | Backfill(CrcLogEntry, "EntryShardV2", **ids)
    t = time.perf_counter()
    result = run(p, total=rows, description="beam backfill", counter="rows_backfilled",
                 progress_mode="off")  # fmt: skip
    seconds = time.perf_counter() - t
    commits = 0
    partitions = 0
    for c in result.metrics().query()["counters"]:
        name = c.key.metric.name
        value = c.committed if c.committed is not None else c.attempted
        if name == "SpannerBatches":
            commits += int(value or 0)
    # the partitioned read: BeginTransaction (batch snapshot) + PartitionQuery + one
    # ExecuteStreamingSql per partition (the emulator answers one partition)
    partitions = 1
    rpcs = commits + 2 + partitions
    return {"seconds": seconds, "rpcs": rpcs, "verify": check(engine, CrcLogEntry, rows),
            "note": f"{commits} commits of <= 500 rows + partitioned read"}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[20_000, 200_000])
    ap.add_argument("--batch-size", type=int, default=500, help="client walk's batch size")
    ap.add_argument("--skip", action="append", default=[], choices=("client", "pdml", "beam"))
    args = ap.parse_args()
    results: list[tuple[str, int, dict[str, Any]]] = []
    with local_emulator() as emulator:
        for rows in args.rows:
            if "client" not in args.skip:
                print(f"client walk (crc32), {rows:,} rows:")
                r = client_batches(emulator, rows, args.batch_size)
                results.append(("client walk (crc32)", rows, r))
            if "pdml" not in args.skip:
                print(f"Partitioned DML (farm_fingerprint), {rows:,} rows:")
                results.append(
                    ("Partitioned DML (farm_fingerprint)", rows, partitioned_dml(emulator, rows))
                )
            if "beam" not in args.skip:
                print(f"Beam Backfill, DirectRunner (crc32), {rows:,} rows:")
                results.append(
                    ("Beam Backfill, DirectRunner (crc32)", rows, beam_backfill(emulator, rows))
                )
    print("\nreshard backfill of LogEntries on the emulator (verify: 0 mismatches each)")
    print("| path | rows | seconds | rows/s | RPCs | verify (s) | notes |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, rows, r in results:
        print(
            f"| {name} | {rows:,} | {r['seconds']:.1f} | {rows / r['seconds']:,.0f} | "
            f"~{r['rpcs']:,} | {r['verify']:.1f} | {r['note']} |"
        )
    client = [(rows, rows / r["seconds"]) for name, rows, r in results if name.startswith("client")]
    if len(client) >= 2:
        (small, fast), (large, slow) = client[0], client[-1]
        print(
            f"\nclient walk rows/s, {small:,} -> {large:,} rows: {fast:,.0f} -> {slow:,.0f} "
            f"(ratio {fast / slow:.2f}; linear means <= 1.3)"
        )


if __name__ == "__main__":
    main()
