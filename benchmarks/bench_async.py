"""Per-statement overhead of the async engine against the sync one, on the emulator.

Process CPU per statement (``time.process_time``: every thread of the process, the
worker's included) of a point SELECT, interleaved rounds sync/async so drift hits both.
Run: ``python benchmarks/bench_async.py [rounds] [statements]``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

import sharded_orm  # noqa: F401  (registers the dialects)
from sharded_orm.testing.emulator import local_emulator


def main(rounds: int = 5, statements: int = 200) -> None:
    with local_emulator() as em:
        db = em.create_database()
        sync_engine = em.engine(db)
        url = em.url(db).replace("spanner+spanner:", "spanner+spanner_async:", 1)
        async_engine = create_async_engine(url, connect_args={"client": em.client})
        stmt = sa.text("SELECT 1")
        loop = asyncio.new_event_loop()

        def sync_round() -> float:
            with sync_engine.connect() as c:
                c.execute(stmt).all()  # warm
                t = time.process_time()
                for _ in range(statements):
                    c.execute(stmt).all()
                return (time.process_time() - t) / statements

        async def async_round() -> float:
            async with async_engine.connect() as c:
                (await c.execute(stmt)).all()
                t = time.process_time()
                for _ in range(statements):
                    (await c.execute(stmt)).all()
                return (time.process_time() - t) / statements

        sync_cpu, async_cpu = [], []
        for _ in range(rounds):
            sync_cpu.append(sync_round())
            async_cpu.append(loop.run_until_complete(async_round()))
        loop.run_until_complete(async_engine.dispose())
        loop.close()
        sync_engine.dispose()
        s, a = statistics.median(sync_cpu), statistics.median(async_cpu)
        print(f"sync : {s * 1e6:8.0f} us CPU/statement (median of {rounds} rounds)")
        print(f"async: {a * 1e6:8.0f} us CPU/statement; overhead {(a - s) * 1e6:+.0f} us")


if __name__ == "__main__":
    main(*(int(x) for x in sys.argv[1:3]))
