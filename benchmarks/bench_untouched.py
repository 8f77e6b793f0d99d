"""What sharded-orm costs an application where it has nothing to do (issue 22, item 0).

One engine and tables the library has nothing to do with: a cached Core select, a Core
insert, a Core update, ``text("select 1")``, ORM ``session.execute`` of a select and of an
``update()`` statement, and an ORM flush of a plain model, each
timed (CPU time, the best of 5 runs) in a child process, once as the application alone and once with
``sharded_orm`` imported and a sharded model declared, flushed and queried on another
engine of the same process. Rounds alternate the two, and the ratio of each round
(library / alone) is reported as min / median / max. Target: median <= 1.02.

    python benchmarks/bench_untouched.py [--rounds 7] [--ops 3000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import datetime as dt, gc, json, sys, time
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

ops, with_lib = int(sys.argv[1]), sys.argv[2] == "1"
if with_lib:
    import sharded_orm

    class SBase(DeclarativeBase):
        pass

    class Event(SBase):
        __tablename__ = "events"
        id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
        company_id: Mapped[str] = mapped_column(sa.String(20))
        ts: Mapped[dt.datetime] = mapped_column(sa.DateTime(timezone=True))
        shard_id: Mapped[int] = sharded_orm.shard_column("company_id", "ts", count=10)

    other = sa.create_engine("sqlite://")
    SBase.metadata.create_all(other)
    with Session(other) as s:
        s.add(Event(id=1, company_id="a", ts=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)))
        s.commit()
        s.scalars(sa.select(Event)).all()


class Base(DeclarativeBase):
    pass


class Item(Base):
    __tablename__ = "items"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(20))
    qty: Mapped[int]


engine = sa.create_engine("sqlite://")
Base.metadata.create_all(engine)
t = Item.__table__
sel = sa.select(t).where(t.c.id == sa.bindparam("i"))
ins = t.insert()
upd = t.update().where(t.c.id == sa.bindparam("i")).values(qty=sa.bindparam("q"))
txt = sa.text("select 1")
out = {}
with engine.begin() as conn:
    conn.execute(ins, [{"name": "x", "qty": i} for i in range(100)])


def timed(name, fn):
    fn(50)  # warm: statement caches, first-run costs
    best = None
    for _ in range(5):  # the best of 5: the least disturbed by other processes
        gc.collect()
        start = time.process_time()
        fn(ops)
        took = time.process_time() - start
        best = took if best is None else min(best, took)
    out[name] = best


def selects(n):
    with engine.connect() as conn:
        for i in range(n):
            conn.execute(sel, {"i": i % 100 + 1}).all()


def inserts(n):
    with engine.begin() as conn:
        for i in range(n):
            conn.execute(ins, {"name": "y", "qty": i})


def updates(n):
    with engine.begin() as conn:
        for i in range(n):
            conn.execute(upd, {"i": i % 100 + 1, "q": i})


def texts(n):
    with engine.connect() as conn:
        for _ in range(n):
            conn.execute(txt).scalar()


orm_sel = sa.select(Item).where(Item.id == sa.bindparam("i"))
orm_upd = sa.update(Item).where(Item.id == sa.bindparam("i")).values(qty=sa.bindparam("q"))


def orm_selects(n):
    with Session(engine) as s:
        for i in range(n):
            s.execute(orm_sel, {"i": i % 100 + 1}).scalars().all()


def orm_updates(n):
    with Session(engine) as s:
        for i in range(n):
            s.execute(orm_upd, {"i": i % 100 + 1, "q": i})
        s.rollback()


def flushes(n):
    with Session(engine) as s:
        for i in range(n // 10):
            s.add_all([Item(name="z", qty=j) for j in range(10)])
            s.flush()
        s.rollback()


for name, fn in [("cached select", selects), ("insert", inserts), ("update", updates),
                 ("text()", texts), ("ORM select", orm_selects), ("ORM update()", orm_updates),
                 ("ORM flush", flushes)]:
    timed(name, fn)
print(json.dumps(out))
"""


def run(ops: int, with_lib: bool) -> dict[str, float]:
    got = subprocess.run(
        [sys.executable, "-c", CHILD, str(ops), "1" if with_lib else "0"],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(got.stdout)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ops", type=int, default=3000)
    args = parser.parse_args()
    ratios: dict[str, list[float]] = {}
    alone: dict[str, list[float]] = {}
    for r in range(args.rounds):
        first_lib = r % 2 == 1  # alternate which goes first
        a = run(args.ops, first_lib)
        b = run(args.ops, not first_lib)
        plain, lib = (b, a) if first_lib else (a, b)
        for k in plain:
            ratios.setdefault(k, []).append(lib[k] / plain[k])
            alone.setdefault(k, []).append(plain[k])
    print(f"{args.rounds} interleaved rounds, {args.ops} statements each, CPU time")
    print(f"{'statement':<15}{'alone (us/op)':>15}{'min':>8}{'median':>8}{'max':>8}")
    for k, rs in ratios.items():
        us = statistics.median(alone[k]) / args.ops * 1e6
        print(f"{k:<15}{us:>15.1f}{min(rs):>8.3f}{statistics.median(rs):>8.3f}{max(rs):>8.3f}")


if __name__ == "__main__":
    main()
