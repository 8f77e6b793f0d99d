"""Cost of shard columns on the update paths, as users pay it (issue 33 items 6 and 7).

In-memory SQLite, a model with a shard over two sources, ``(tenant, ts) % 16``, against the
same model with no shard (``plain``). Each variant's timing covers only the work named:

* **flush, one source**: 2,000 loaded objects, ``obj.ts = ...`` on each, one ``flush``:
  the partial-source UPDATE (the shard's other source is not sent);
* **bulk by key, one source**: ``session.execute(update(Model), [{"id": .., "ts": ..}] *
  2,000)``, the ORM bulk UPDATE by primary key (``bulk_update_mappings`` takes the same
  path);
* **update() in a big session**: 200 ORM ``update(Model).where(id == k).values(note=..)``
  statements while the session holds 5,000 loaded objects (which ORM ``update()`` costs
  per object it does not match).

Each variant runs on its own new engine, once untimed (the application's first statement
of that shape compiles it; the ``first`` figures time that run alone) and then ``--repeat``
times timed: the cost an application pays on every later flush. CPU time of this process
(``time.process_time``), rounds interleaved (each round runs every variant once, in a
rotating order); each ratio is min / median / max over the per-round ratios, and the
statements each variant sends are counted. Targets: the partial-source UPDATE <= 1.2x
plain and at most plain's statements + 1 per 1,000 rows; update() in a big session within
1.10x plain.

    python benchmarks/bench_update.py [--rows 2000] [--rounds 9] [--repeat 3] [--case flush]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import statistics
import time
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import UTCDateTime, compute_shard, shard_column

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)


class Base(DeclarativeBase):
    pass


class Plain(Base):
    __tablename__ = "plain"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    tenant: Mapped[str] = mapped_column(sa.String(32))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    note: Mapped[str] = mapped_column(sa.String(32))
    shard: Mapped[int]


class Sharded(Base):
    __tablename__ = "sharded"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    tenant: Mapped[str] = mapped_column(sa.String(32))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    note: Mapped[str] = mapped_column(sa.String(32))
    shard: Mapped[int] = shard_column("tenant", "ts", count=16)


MODELS = {"plain": Plain, "sharded": Sharded}


def rows(n: int) -> list[dict[str, object]]:
    return [
        {
            "id": i,
            "tenant": f"t{i % 7}",
            "ts": T0 + dt.timedelta(seconds=i),
            "note": "n",
            "shard": compute_shard([f"t{i % 7}", T0 + dt.timedelta(seconds=i)], 16),
        }
        for i in range(n)
    ]


#: (the work, run once untimed and then timed; close; the statements counter)
Work = tuple[Callable[[], None], Callable[[], None], list[int]]
Setup = Callable[[], Work]


def engine_with(n: int, counter: list[int]) -> sa.Engine:
    eng = sa.create_engine("sqlite://")
    Base.metadata.create_all(eng)
    with eng.begin() as conn:
        for model in MODELS.values():
            conn.execute(model.__table__.insert(), rows(n))

    @event.listens_for(eng, "before_cursor_execute")
    def count(*args: object) -> None:
        counter[0] += 1

    return eng


def flush_one_source(model: type[Base], n: int) -> Setup:
    def setup() -> Work:
        counter = [0]
        eng = engine_with(n, counter)
        session = Session(eng)
        objs = session.scalars(sa.select(model)).all()
        later = dt.timedelta(days=1)

        def work() -> None:
            for o in objs:
                o.ts = o.ts + later  # type: ignore[attr-defined]
            counter[0] = 0
            session.flush()

        return work, lambda: (session.close(), eng.dispose()), counter

    return setup


def bulk_by_key(model: type[Base], n: int) -> Setup:
    def setup() -> Work:
        counter = [0]
        eng = engine_with(n, counter)
        session = Session(eng)
        params = [{"id": i, "ts": T0 + dt.timedelta(days=1, seconds=i)} for i in range(n)]

        def work() -> None:
            counter[0] = 0
            session.execute(sa.update(model), params)

        return work, lambda: (session.close(), eng.dispose()), counter

    return setup


def update_in_big_session(model: type[Base], n: int) -> Setup:
    def setup() -> Work:
        counter = [0]
        eng = engine_with(max(n, 5000), counter)
        session = Session(eng)
        held = session.scalars(sa.select(model)).all()  # the session holds 5,000 objects
        stmts = [
            sa.update(model).where(model.id == k).values(note=f"x{k}")  # type: ignore[attr-defined]
            for k in range(200)
        ]

        def work() -> None:
            counter[0] = 0
            for stmt in stmts:
                session.execute(stmt)

        def close() -> None:
            del held[:]
            session.close()
            eng.dispose()

        return work, close, counter

    return setup


def cpu_timed(setup: Setup, repeat: int) -> tuple[float, float, int]:
    """(CPU of the first run, CPU per run of the ``repeat`` later ones, statements of one)."""
    work, close, counter = setup()
    gc.collect()
    t = time.process_time()
    work()
    first = time.process_time() - t
    gc.collect()
    t = time.process_time()
    for _ in range(repeat):
        work()
    spent = (time.process_time() - t) / repeat
    statements = counter[0]
    close()
    return first, spent, statements


def spread(values: list[float], scale: float = 1.0) -> str:
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"{lo * scale:.2f} / {mid * scale:.2f} / {hi * scale:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs after the first")
    cases = {
        "flush": ("flush, one source", flush_one_source),
        "bulk": ("bulk by key, one source", bulk_by_key),
        "session": ("update() in a big session", update_in_big_session),
    }
    ap.add_argument("--case", choices=sorted(cases), action="append", help="default: all")
    args = ap.parse_args()
    chosen = {cases[c][0]: cases[c][1] for c in (args.case or list(cases))}
    variants = {
        (case, name): make(model, args.rows)
        for case, make in chosen.items()
        for name, model in MODELS.items()
    }
    keys = list(variants)
    times: dict[tuple[str, str], list[float]] = {k: [] for k in keys}
    firsts: dict[tuple[str, str], list[float]] = {k: [] for k in keys}
    statements: dict[tuple[str, str], int] = {}
    for r in range(args.rounds):
        order = keys[r % len(keys) :] + keys[: r % len(keys)]
        for key in order:
            first, spent, sent = cpu_timed(variants[key], args.repeat)
            firsts[key].append(first)
            times[key].append(spent)
            statements[key] = sent
    print(
        f"{args.rows} rows, SQLAlchemy {sa.__version__}, {args.rounds} interleaved rounds of "
        f"1 + {args.repeat} runs, CPU ms per run (min / median / max), statements sent"
    )
    for case in chosen:
        for name in MODELS:
            key = (case, name)
            cpu = spread(times[key], 1e3)
            print(f"  {case:<27} {name:<8} {cpu}  {statements[key]:>6} statements")
        for label, data in (("", times), (" (first)", firsts)):
            ratios = [
                s / p for s, p in zip(data[(case, "sharded")], data[(case, "plain")], strict=True)
            ]
            print(f"  {case:<27} sharded / plain{label}   {spread(ratios)}")


if __name__ == "__main__":
    main()
