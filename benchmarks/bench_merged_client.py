"""merged()'s own client CPU against a server that answers at once (issue 33 item 9).

``bench_query.py`` times merged() on the emulator, where a fan-out over N branches keeps
the emulator busy for seconds (Spanner takes milliseconds) and the client spends CPU
while it waits. This benchmark takes the server's time out: it reads the newest k rows
of N shards on the emulator once, records every statement the one query and merged()
send with the rows the emulator gave, then replays both against the in-process mock
server (``sharded_orm.testing.mock``), which answers each statement from that record at
once. What is left is what the application's thread pays for a read: SQLAlchemy's
compile and result processing, the library's plan and merge, and the Spanner DB-API.

CPU time of the calling thread (``time.thread_time``: the mock server's threads are not
the client's), the best of 5 runs of 20 reads each, in interleaved rounds; ``x one`` is
min / median / max over the rounds of merged() / the one query. Targets: <= 1.5x at
N = 16 and <= 2x at N = 64, for k = 10, 100, 1000. Each replayed read is checked against
the emulator's answer.

    python benchmarks/bench_merged_client.py [--rows 10000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from bench_query import Base, load, model
from sqlalchemy import event

from sharded_orm import merged, sharded_select
from sharded_orm.testing.emulator import local_emulator
from sharded_orm.testing.mock import MockSpanner

SIZES = ((16, 10), (16, 100), (16, 1000), (64, 10), (64, 100), (64, 1000))
READS = 20  # reads per timed run


def reads(models: dict[int, Any]) -> dict[tuple[int, int], dict[str, Callable[[Any], Any]]]:
    """For each (N, k): the one query and merged(), each ``conn -> rows``."""
    out: dict[tuple[int, int], dict[str, Callable[[Any], Any]]] = {}
    for n, k in SIZES:
        m = models[n]
        t = m.__table__
        base = sharded_select(m, index=f"{t.name}_by_ts")
        one = base.order_by(t.c.ts.desc(), t.c.id).limit(k)
        ours = base.order_by(t.c.ts.desc())

        def one_query(conn: Any, stmt: Any = one) -> Any:
            return [tuple(r)[:2] for r in conn.execute(stmt)]

        def merged_read(conn: Any, stmt: Any = ours, k: int = k) -> Any:
            return [tuple(r)[:2] for r in merged(conn, stmt, k)]

        out[(n, k)] = {"one query": one_query, "merged()": merged_read}
    return out


Recorded = list[tuple[str, list[tuple[str, str]], list[tuple[Any, ...]]]]


def record(
    engine: sa.Engine, work: dict[Any, dict[str, Callable[[Any], Any]]]
) -> tuple[dict[Any, Recorded], dict[Any, Any]]:
    """For each (N, k): every statement its reads send on the emulator, with the rows it
    gave (a statement's text is the same for every k: its LIMIT is a parameter); and each
    read's answer."""
    sent: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, params: Any, *rest: Any) -> None:
        sent.append((statement, params))

    answers: dict[Any, Any] = {}
    recorded: dict[Any, Recorded] = {}
    with engine.connect() as conn:
        for key, fns in work.items():
            sent.clear()
            event.listen(engine, "before_cursor_execute", capture)
            for name, fn in fns.items():
                answers[(key, name)] = fn(conn)
            event.remove(engine, "before_cursor_execute", capture)
            assert answers[(key, "merged()")] == answers[(key, "one query")], key
            results: Recorded = []
            for statement, params in dict(sent).items():
                given = tuple(params) if isinstance(params, list) else params
                cursor = conn.exec_driver_sql(statement, given).cursor
                rows = [tuple(r) for r in cursor.fetchall()]
                columns = [(d[0], _code(d[1])) for d in cursor.description]
                results.append((statement, columns, rows))
            recorded[key] = results
    return recorded, answers


def _code(type_code: Any) -> str:
    name = getattr(type_code, "name", None) or str(type_code)
    return name.split(".")[-1].upper()


def cpu(fn: Callable[[Any], Any], conn: Any) -> float:
    best = float("inf")
    for _ in range(5):
        gc.collect()
        start = time.thread_time()
        for _ in range(READS):
            fn(conn)
        best = min(best, time.thread_time() - start)
    return best * 1000 / READS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    os.environ.setdefault("SPANNER_DISABLE_BUILTIN_METRICS", "true")
    models = {n: model(n, f"client{n}") for n in (16, 64)}
    work = reads(models)
    with local_emulator() as emulator:
        db_id = emulator.create_database()
        engine = emulator.engine(db_id)
        Base.metadata.create_all(engine, tables=[m.__table__ for m in models.values()])
        for m in models.values():
            load(emulator.database(db_id), m, args.rows, False)
        results, answers = record(engine, work)
        engine.dispose()
    mock = MockSpanner()
    try:
        replay = mock.engine()
        print(
            f"{args.rows} rows per table, recorded on the emulator and replayed from the mock "
            f"server; {args.rounds} interleaved rounds, the calling thread's CPU, best of 5 "
            f"runs of {READS} reads"
        )
        print(
            f"{'N':>3} {'k':>5}  {'one query ms':>13}{'merged() ms':>13}{'x one min/med/max':>22}"
        )
        with replay.connect() as conn:
            for (n, k), fns in work.items():
                for statement, columns, rows in results[(n, k)]:
                    mock.add_result(statement, columns, rows)
                for name, fn in fns.items():  # warm, and the replay gives the same answer
                    assert fn(conn) == answers[((n, k), "one query")], (n, k, name)
                one: list[float] = []
                ours: list[float] = []
                for i in range(args.rounds):
                    pair = [("one", fns["one query"]), ("ours", fns["merged()"])]
                    for which, fn in pair if i % 2 else pair[::-1]:
                        (one if which == "one" else ours).append(cpu(fn, conn))
                ratios = [o / b for o, b in zip(ours, one, strict=True)]
                spread = f"{min(ratios):.2f} / {statistics.median(ratios):.2f} / {max(ratios):.2f}"
                print(f"{n:>3} {k:>5}  {min(one):>13.2f}{min(ours):>13.2f}{spread:>22}", flush=True)
        replay.dispose()
    finally:
        mock.server.stop(0)


if __name__ == "__main__":
    main()
