"""bulk_load against session.add_all + commit (issue 8's benchmark; not a test).

1. Wall time: ROWS LogEntries into the Spanner emulator, each way, verified complete.
2. Round trips: the same load against the in-process mock server, counting requests by
   type (the mock executes nothing, so this counts exactly what each path sends).
3. Write order: the key ranges each worker touched, in order.
4. Memory (issue 33): the peak RSS of a fresh interpreter above its own baseline (after
   imports and a warm-up load) loading 100,000 and 1,000,000 small rows from a generator
   into SQLite, with the load's CPU time; interleaved rounds, min/median/max.

    python benchmarks/bench_bulk.py [--rows 100000] [--orm-batch 1000]
    python benchmarks/bench_bulk.py --memory-only [--rounds 3]
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("SPANNER_DISABLE_BUILTIN_METRICS", "true")
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

import sqlalchemy as sa  # noqa: E402
from seed_models import LogEntry, Sharded  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from sharded_orm import bulk_load  # noqa: E402
from sharded_orm.testing.emulator import local_emulator  # noqa: E402
from sharded_orm.testing.mock import MockSpanner  # noqa: E402

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)


def entries(n: int) -> list[dict[str, Any]]:
    return [
        {
            "company_id": f"c{i % 7}",
            "user_id": f"u{i:07d}",
            "ts": T0 + dt.timedelta(seconds=i),
            "entry": f"entry {i}",
        }
        for i in range(n)
    ]


def orm_load(engine: sa.Engine, rows: list[dict[str, Any]], batch: int) -> None:
    for start in range(0, len(rows), batch):
        with Session(engine) as s:
            s.add_all(LogEntry(**r) for r in rows[start : start + batch])
            s.commit()


def count(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(sa.select(sa.func.count()).select_from(LogEntry.__table__)).scalar()
        )


def requests_by_type(mock: MockSpanner) -> dict[str, int]:
    return dict(collections.Counter(type(r).__name__ for r in mock.requests))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--orm-batch", type=int, default=200)
    ap.add_argument(
        "--orm-rows", type=int, default=10_000, help="rows for the ORM's emulator timing"
    )
    ap.add_argument("--memory-only", action="store_true", help="only the memory figures")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the memory figures")
    args = ap.parse_args()
    if args.memory_only:
        memory(args.rounds)
        sys.exit(0)
    rows = entries(args.rows)
    print(f"{args.rows} LogEntries; ORM commits every {args.orm_batch} rows")
    orm_rows = rows[: args.orm_rows]

    with local_emulator() as emulator:
        e1 = emulator.engine(emulator.create_database())
        e2 = emulator.engine(emulator.create_database())
        Sharded.metadata.create_all(e1)
        Sharded.metadata.create_all(e2)
        t = time.perf_counter()
        report = bulk_load(e1, LogEntry, rows, workers=4, batch_bytes=2_000_000)
        bulk_s = time.perf_counter() - t
        assert count(e1) == args.rows
        t = time.perf_counter()
        orm_load(e2, orm_rows, args.orm_batch)
        orm_s = time.perf_counter() - t
        assert count(e2) == len(orm_rows)
    print("\nwall time on the emulator (row counts verified)")
    print(
        f"  bulk_load, {args.rows} rows:       {bulk_s:7.1f} s  "
        f"({args.rows / bulk_s:,.0f} rows/s; {report.commits} commits, {report.retries} retries)"
    )
    print(
        f"  session.add_all, {len(orm_rows)} rows: {orm_s:7.1f} s  "
        f"({len(orm_rows) / orm_s:,.0f} rows/s)"
    )

    mock = MockSpanner()
    engine = mock.engine()
    bulk_load(_mock_database(engine), LogEntry, rows, workers=4, batch_bytes=2_000_000)
    bulk_requests = requests_by_type(mock)
    mock.clear()
    insert_sql = _orm_insert_sql(engine)
    mock.add_update_count(insert_sql, 1)
    orm_load(engine, rows, args.orm_batch)
    orm_requests = requests_by_type(mock)
    print("\nrequests sent (mock server)")
    for name, reqs in (("bulk_load", bulk_requests), ("session.add_all", orm_requests)):
        total = sum(reqs.values())
        print(f"  {name:<18} {total:7d}  {reqs}")
    ratio = sum(orm_requests.values()) / max(1, sum(bulk_requests.values()))
    print(f"  ORM / bulk_load round trips: {ratio:.1f}x  (target >= 5x)")
    engine.dispose()
    mock.stop()

    print("\nwrite order: key ranges per worker, in commit order (first 12)")
    for w, ranges in sorted(report.write_order.items()):
        print(f"  worker {w}: {ranges[:12]}{' ...' if len(ranges) > 12 else ''}")
    memory(args.rounds)


MEMORY_SIZES = (100_000, 1_000_000)
PROBE = textwrap.dedent(
    """
    import sys, time
    import sqlalchemy as sa
    from sharded_orm import bulk_load

    url, n = sys.argv[1], int(sys.argv[2])
    md = sa.MetaData()
    t = sa.Table("Small", md,
                 sa.Column("Id", sa.BigInteger, primary_key=True, autoincrement=False),
                 sa.Column("V", sa.String(20)))
    engine = sa.create_engine(url)
    md.create_all(engine)
    def status(field):  # MiB; this process's own (ru_maxrss would count its parent's)
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith(field + ":")) / 1024
    def reset_peak():  # Linux >= 4.0: VmHWM restarts from the current RSS
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    rows = lambda lo, hi: ({"Id": i, "V": f"v{i}"} for i in range(lo, hi))
    bulk_load(engine, t, rows(-2000, 0), progress=False)
    base, cpu = status("VmRSS"), time.process_time()
    reset_peak()
    assert bulk_load(engine, t, rows(0, n), progress=False).rows_written == n
    print(status("VmHWM") - base, base, time.process_time() - cpu)
    """
)


def memory(rounds: int) -> None:
    """Peak RSS above the interpreter's baseline, and CPU s, of bulk_load from a
    generator into SQLite (a file: the rows are not in this process's memory)."""
    figures: dict[int, list[tuple[float, float, float]]] = {n: [] for n in MEMORY_SIZES}
    for _ in range(rounds):  # interleaved: each round loads every size once
        for n in MEMORY_SIZES:
            with tempfile.TemporaryDirectory() as d:
                out = subprocess.run(
                    [sys.executable, "-c", PROBE, f"sqlite:///{d}/load.db", str(n)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
            delta, base, cpu = map(float, out.stdout.split())
            figures[n].append((delta, base, cpu))

    def spread(values: list[float]) -> str:
        return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"

    print(f"\nbulk_load memory, small rows from a generator into SQLite ({rounds} rounds)")
    print(f"  {'rows':>9}  {'peak RSS above baseline, MiB':>30}  {'baseline MiB':>13}  "
          f"{'CPU s (min / median / max)':>27}")  # fmt: skip
    for n, rows in figures.items():
        print(
            f"  {n:>9,}  {spread([r[0] for r in rows]):>30}  "
            f"{statistics.median(r[1] for r in rows):>13.1f}  {spread([r[2] for r in rows]):>27}"
        )


def _mock_database(engine: sa.Engine) -> Any:
    raw: Any = engine.raw_connection()
    try:
        return raw.driver_connection.database
    finally:
        raw.close()


def _orm_insert_sql(engine: sa.Engine) -> str:
    t = LogEntry.__table__
    stmt = t.insert().values({c.key: sa.bindparam(c.key) for c in t.columns})
    return str(stmt.compile(engine))


BEAM_ROWS = 50_000
BEAM_BAD = 10


def beam_path(total: int = BEAM_ROWS) -> None:
    """The load through ``sharded_orm.beam.WriteSharded`` on the DirectRunner (issue 14):
    ``total`` input rows of which ``BEAM_BAD`` are bad and must come out as dead letters."""
    try:
        import apache_beam as beam
    except ImportError:
        print("\nBeam path skipped: pip install 'sharded-orm[beam]'")
        return
    from sharded_orm import verify
    from sharded_orm.beam import WriteSharded, counters, run

    inputs: list[Any] = entries(total - BEAM_BAD)
    for i in range(BEAM_BAD):  # a missing key part, or a naive timestamp
        bad = dict(inputs[i * 1000], user_id=f"bad{i}")
        bad.update({"user_id": None} if i % 2 else {"ts": bad["ts"].replace(tzinfo=None)})
        inputs.insert(i * 4999, bad)
    with local_emulator() as emulator:
        database_id = emulator.create_database()
        engine = emulator.engine(database_id)
        Sharded.metadata.create_all(engine)
        p = beam.Pipeline()
        _ = p | beam.Create(inputs) | WriteSharded(
            LogEntry, project_id=emulator.project, instance_id=emulator.instance_id,
            database_id=database_id,
        )  # fmt: skip
        t = time.perf_counter()
        result = run(p, total=len(inputs), description="WriteSharded", progress_mode="off")
        seconds = time.perf_counter() - t
        found = count(engine)
        report = verify(engine, LogEntry, progress_mode="off")
        engine.dispose()
    c = counters(result)
    commits = sum(
        int(x.committed or 0)
        for x in result.metrics().query()["counters"]
        if x.key.metric.name == "SpannerBatches"
    )
    print(f"\nWriteSharded on the DirectRunner, {len(inputs)} rows ({BEAM_BAD} bad):")
    print(
        f"  {seconds:7.1f} s  ({len(inputs) / seconds:,.0f} rows/s; {commits} commits); "
        f"{found} rows in the table, {c.get('dead_letters', 0)} dead letters; "
        f"verify: {report.rows_checked} rows, mismatched {report.mismatched}"
    )
    assert found == total - BEAM_BAD and c.get("dead_letters") == BEAM_BAD and report.ok


if __name__ == "__main__":
    main()
    beam_path()
