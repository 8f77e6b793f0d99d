"""What a key reshard's dual write costs, three ways, on the emulator (issue 32 R2; not a test).

``Events`` (8 shards) has a successor ``Events16`` (16 shards) for the window between
the expand and the contract. Each way keeps ``Events16`` equal to what ``Events`` holds:

* **library**: ``declare_successor(Event, Event16)``: the engine hook mirrors each
  statement inside its transaction (``sharded_orm.write.successor``: the rows the
  statement wrote, read back by key, then one upsert into the successor);
* **then_return**: the statement itself carries ``THEN RETURN *`` (Spanner's RETURNING)
  and its rows go to the successor in one upsert: one read fewer, but the user's own
  statement is rewritten and its result taken (a prototype written here, not shipped);
* **change_stream**: ``CREATE CHANGE STREAM ... (value_capture_type = 'NEW_ROW')`` on
  ``Events``; writers write ``Events`` only, and a copier reads the stream's records
  since its last pass (the root query, then each child partition) and applies them to
  ``Events16`` in one mutation commit, as Vitess copies from the binlog (a prototype:
  one pass after each round of writes; the lag it adds is at least its poll interval);

against **none** (``Events`` alone). Writes: Core ``insert`` of 1 row and of 100 rows
(executemany), ``update`` of 1 row by key and of 100 rows by ``IN``, each its own
transaction. Figures per transaction: statements sent (ExecuteSql / ExecuteBatchDml,
the commit not counted), median wall time, and CPU (this process plus the emulator's,
both counted, as the machine is shared); for ``change_stream`` the copier's share of
each is given apart (``+ copier``). Rounds interleaved, the order rotating; the median
of the rounds is printed.

    python benchmarks/bench_successor.py [--rounds 5] [--txns 20]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("SPANNER_DISABLE_BUILTIN_METRICS", "true")
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

import sqlalchemy as sa  # noqa: E402
from google.cloud.sqlalchemy_spanner.dml import insert_or_update  # noqa: E402
from reshard_models import events  # noqa: E402

from sharded_orm import compute_shard  # noqa: E402
from sharded_orm.testing.emulator import Emulator, local_emulator  # noqa: E402

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 1, tzinfo=UTC)
WAYS = ("none", "library", "then_return", "change_stream")
OPS = ("insert 1", "insert 100", "update 1", "update 100")


def cpu_seconds(emulator: Emulator) -> float:
    with open(f"/proc/{emulator.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return time.process_time() + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Copier:
    """The change-stream copier: every record since its last pass into ``Events16``."""

    def __init__(self, database: Any, stream: str) -> None:
        self.database, self.stream = database, stream
        self.since = dt.datetime.now(UTC)
        self.statements = 0

    def _read(self, start: Any, end: Any, token: str | None) -> list[Any]:
        from google.cloud.spanner_v1 import param_types

        sql = (
            f"SELECT ChangeRecord FROM READ_{self.stream}(start_timestamp => @s, "
            "end_timestamp => @e, partition_token => @p, heartbeat_milliseconds => 10000)"
        )
        types = {"s": param_types.TIMESTAMP, "e": param_types.TIMESTAMP, "p": param_types.STRING}
        self.statements += 1
        with self.database.snapshot() as snap:
            rows = snap.execute_sql(
                sql, params={"s": start, "e": end, "p": token}, param_types=types
            )
            return [rec for row in rows for rec in row[0]]

    def run(self) -> int:
        end = dt.datetime.now(UTC)
        children = [
            (cp[0], part[0])
            for rec in self._read(self.since, end, None)
            for part in rec[2]
            for cp in part[2]
        ]
        changes: list[tuple[Any, str, dict[str, Any]]] = []
        for token, _ in children:
            for rec in self._read(self.since, end, token):
                for data in rec[0]:
                    ts, mod_type = data[0], data[7]
                    for keys, new, _old in data[6]:
                        changes.append((ts, mod_type, {**keys, **new}))
        changes.sort(key=lambda c: c[0])
        self.since = end
        if not changes:
            return 0
        with self.database.batch() as batch:
            self.statements += 1
            for _, mod_type, row in changes:
                when = dt.datetime.fromisoformat(row["Timestamp"].replace("Z", "+00:00"))
                key = [compute_shard((when,), 16), when, row["EventId"]]
                if mod_type == "DELETE":
                    from google.cloud.spanner_v1 import KeySet

                    batch.delete("Events16", KeySet(keys=[key]))  # type: ignore[no-untyped-call]
                else:
                    batch.insert_or_update(
                        "Events16",
                        ["ShardId", "Timestamp", "EventId", "Kind"],
                        [key + [row["Kind"]]],
                    )
        return len(changes)


class Bench:
    def __init__(self, emulator: Emulator) -> None:
        self.emulator = emulator
        self.db = emulator.create_database()
        plain, mirrored = events("both"), events("expand")
        self.engine = emulator.engine(self.db)
        plain.create_all(self.engine)
        database = emulator.database(self.db)
        database.update_ddl(
            [
                "CREATE CHANGE STREAM EventsStream FOR Events "
                "OPTIONS (value_capture_type = 'NEW_ROW')"
            ]
        ).result(120)
        self.old = plain.tables["Events"]
        self.new = plain.tables["Events16"]
        self.mirrored = mirrored.tables["Events"]  # its successor is declared
        self.copier = Copier(database, "EventsStream")
        self.sent = 0
        sa.event.listen(self.engine, "before_cursor_execute", self._count)
        self.n = 0

    def _count(self, *args: Any) -> None:
        self.sent += 1

    def rows(self, k: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(k):
            self.n += 1
            ts = T0 + dt.timedelta(microseconds=self.n)
            out.append({"Timestamp": ts, "EventId": f"e{self.n}", "Kind": "a"})
        return out

    def _upsert(self, conn: Any, got: list[Any]) -> None:
        conn.execute(
            insert_or_update(self.new),
            [{"Timestamp": r.Timestamp, "EventId": r.EventId, "Kind": r.Kind} for r in got],
        )

    def txn(self, way: str, op: str, keys: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One transaction of ``op`` written ``way``; returns the keys it wrote."""
        t = self.mirrored if way == "library" else self.old
        many = 100 if op.endswith("100") else 1
        with self.engine.begin() as conn:
            if op.startswith("insert"):
                rows = self.rows(many)
                if way == "then_return":
                    got = conn.execute(sa.insert(t).returning(*t.c), rows).all()
                    self._upsert(conn, got)
                else:
                    conn.execute(sa.insert(t), rows)
                return rows
            kind = f"k{self.n}"
            self.n += 1
            ids = [k["EventId"] for k in keys[-many:]]
            if many == 1:
                k = keys[-1]
                where = [
                    t.c.Timestamp == k["Timestamp"],
                    t.c.EventId == k["EventId"],
                    t.c.ShardId == compute_shard((k["Timestamp"],), 8),
                ]
            else:
                where = [t.c.EventId.in_(ids)]
            stmt = sa.update(t).where(*where).values(Kind=kind)
            if way == "then_return":
                self._upsert(conn, conn.execute(stmt.returning(*t.c)).all())
            else:
                conn.execute(stmt)
            return []


def measure(bench: Bench, way: str, op: str, txns: int, keys: list[dict[str, Any]]) -> Any:
    walls: list[float] = []
    sent0, cpu0 = bench.sent, cpu_seconds(bench.emulator)
    for _ in range(txns):
        start = time.perf_counter()
        keys += bench.txn(way, op, keys)
        walls.append(time.perf_counter() - start)
    cpu = cpu_seconds(bench.emulator) - cpu0
    stmts = (bench.sent - sent0) / txns
    copier: tuple[float, float, float] | None = None
    if way == "change_stream":
        s0, c0, w0 = bench.copier.statements, cpu_seconds(bench.emulator), time.perf_counter()
        bench.copier.run()
        copier = (
            (bench.copier.statements - s0) / txns,
            (time.perf_counter() - w0) / txns,
            (cpu_seconds(bench.emulator) - c0) / txns,
        )
    else:
        bench.copier.since = dt.datetime.now(UTC)  # other ways' records are not its job
    return stmts, statistics.median(walls), cpu / txns, copier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--txns", type=int, default=20, help="transactions per op per round")
    args = parser.parse_args()
    with local_emulator() as emulator:
        bench = Bench(emulator)
        keys: list[dict[str, Any]] = []
        bench.txn("none", "insert 100", keys)
        keys += bench.rows(0)
        with bench.engine.begin() as conn:  # seed rows for the updates to find
            seed = bench.rows(200)
            conn.execute(sa.insert(bench.mirrored), seed)
        keys += seed
        results: dict[tuple[str, str], list[Any]] = {}
        for r in range(args.rounds):
            order = WAYS[r % len(WAYS) :] + WAYS[: r % len(WAYS)]
            for op in OPS:
                for way in order:
                    txns = args.txns if op.endswith(" 1") else max(2, args.txns // 4)
                    results.setdefault((way, op), []).append(measure(bench, way, op, txns, keys))
        print(f"{'op':<11} {'way':<14} {'stmts':>6} {'wall ms':>8} {'cpu ms':>8}   copier")
        for op in OPS:
            for way in WAYS:
                got = results[(way, op)]
                stmts = statistics.median(g[0] for g in got)
                wall = statistics.median(g[1] for g in got) * 1000
                cpu = statistics.median(g[2] for g in got) * 1000
                extra = ""
                if got[0][3] is not None:
                    cs = statistics.median(g[3][0] for g in got)
                    cw = statistics.median(g[3][1] for g in got) * 1000
                    cc = statistics.median(g[3][2] for g in got) * 1000
                    extra = f"+ {cs:.2f} stmts, {cw:.2f} ms wall, {cc:.2f} ms cpu a write"
                print(f"{op:<11} {way:<14} {stmts:>6.2f} {wall:>8.2f} {cpu:>8.2f}   {extra}")


if __name__ == "__main__":
    main()
