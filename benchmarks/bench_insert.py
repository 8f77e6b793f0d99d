"""Cost of shard columns on the insert path, as users pay it (issue 22 item 10; a benchmark).

Every ORM timing covers building the objects, ``add_all`` and ``flush``; every Core timing
covers ``conn.execute(table.insert(), rows)``, plus, for the hand-written variant, the
loop that computes the shards. 50,000 rows on in-memory SQLite, a model with two shard
columns (``(company_id, ts)`` % 10 and ``user_id`` % 16), against:

* **plain**: the same columns with no shard computed at all (the floor);
* **seed**: the seed article's hand-written code, ``zlib.crc32((company_id +
  ts.isoformat()).encode()) % 10`` and ``zlib.crc32(user_id.encode()) % 16``, computed by
  the application into a plain model (ORM) or into its row dicts (Core).

CPU time of this process (``time.process_time``), rounds interleaved (each round runs
every variant once, in a rotating order), and each ratio is given as min / median / max
over the per-round ratios. Targets: ORM sharded <= 1.10x plain and <= 1.10x seed; Core
sharded <= 1.10x seed.

    python benchmarks/bench_insert.py [--rows 50000] [--rounds 11]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import statistics
import time
import zlib
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import UTCDateTime, compute_shard, shard_column

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)


class Base(DeclarativeBase):
    pass


class Plain(Base):
    __tablename__ = "plain"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    company_id: Mapped[str] = mapped_column(sa.String(32))
    user_id: Mapped[str] = mapped_column(sa.String(32))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    entry_shard_id: Mapped[int]
    user_shard_id: Mapped[int]


class Sharded(Base):
    __tablename__ = "sharded"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    company_id: Mapped[str] = mapped_column(sa.String(32))
    user_id: Mapped[str] = mapped_column(sa.String(32))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    entry_shard_id: Mapped[int] = shard_column("company_id", "ts", count=10)
    user_shard_id: Mapped[int] = shard_column("user_id", count=16)


Rows = list[dict[str, object]]


def make_rows(n: int) -> Rows:
    return [
        {
            "id": i,
            "company_id": f"company-{i % 7}",
            "user_id": f"user-{i % 997}",
            "ts": T0 + dt.timedelta(microseconds=37 * i),
        }
        for i in range(n)
    ]


Setup = Callable[[], tuple[Callable[[], None], Callable[[], None]]]


def cpu_timed(setup: Setup) -> float:
    """CPU seconds of the work ``setup()`` returns (setup and cleanup are not timed)."""
    work, close = setup()
    gc.collect()
    t = time.process_time()
    work()
    spent = time.process_time() - t
    close()
    return spent


def fresh_engine() -> sa.Engine:
    eng = sa.create_engine("sqlite://")
    Base.metadata.create_all(eng)
    return eng


# --------------------------------------------------------------------------- ORM


def orm(make: Callable[[dict[str, object]], Base], rows: Rows) -> Setup:
    def setup() -> tuple[Callable[[], None], Callable[[], None]]:
        eng = fresh_engine()
        session = Session(eng)

        def work() -> None:
            session.add_all([make(r) for r in rows])
            session.flush()

        def close() -> None:
            session.close()
            eng.dispose()

        return work, close

    return setup


def plain_object(r: dict[str, object]) -> Base:
    return Plain(**r, entry_shard_id=0, user_shard_id=0)


def seed_object(r: dict[str, object]) -> Base:
    """The seed's hand-written code, in the application, before the plain model."""
    company, user, ts = r["company_id"], r["user_id"], r["ts"]
    return Plain(
        **r,
        entry_shard_id=zlib.crc32((company + ts.isoformat()).encode()) % 10,  # type: ignore[operator, attr-defined]
        user_shard_id=zlib.crc32(user.encode()) % 16,  # type: ignore[attr-defined]
    )


def sharded_object(r: dict[str, object]) -> Base:
    return Sharded(**r)


# --------------------------------------------------------------------------- Core


def core_seed(rows: Rows) -> Setup:
    def setup() -> tuple[Callable[[], None], Callable[[], None]]:
        eng = fresh_engine()
        conn = eng.connect()
        mine = [dict(r) for r in rows]  # the application's own dicts, filled in place

        def work() -> None:
            crc32 = zlib.crc32
            for r in mine:
                r["entry_shard_id"] = crc32((r["company_id"] + r["ts"].isoformat()).encode()) % 10  # type: ignore[operator, attr-defined]
                r["user_shard_id"] = crc32(r["user_id"].encode()) % 16  # type: ignore[attr-defined]
            conn.execute(Plain.__table__.insert(), mine).close()

        return work, lambda: (conn.close(), eng.dispose())

    return setup


def core_sharded(rows: Rows) -> Setup:
    def setup() -> tuple[Callable[[], None], Callable[[], None]]:
        eng = fresh_engine()
        conn = eng.connect()
        mine = [dict(r) for r in rows]

        def work() -> None:
            conn.execute(Sharded.__table__.insert(), mine).close()

        return work, lambda: (conn.close(), eng.dispose())

    return setup


def check_once(rows: Rows) -> None:
    """The sharded model stores what the seed's formula's owner would check: its shards."""
    eng = fresh_engine()
    with Session(eng) as s:
        s.add_all([Sharded(**r) for r in rows[:100]])
        s.commit()
        for o in s.scalars(sa.select(Sharded)):
            assert o.entry_shard_id == compute_shard([o.company_id, o.ts], 10)
            assert o.user_shard_id == compute_shard([o.user_id], 16)


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=11)
    args = ap.parse_args()
    rows = make_rows(args.rows)
    check_once(rows)
    variants = {
        "orm plain": orm(plain_object, rows),
        "orm seed": orm(seed_object, rows),
        "orm sharded": orm(sharded_object, rows),
        "core seed": core_seed(rows),
        "core sharded": core_sharded(rows),
    }
    names = list(variants)
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            times[name].append(cpu_timed(variants[name]))
    print(
        f"{args.rows} rows, 2 shard columns, SQLAlchemy {sa.__version__}, {args.rounds} "
        "interleaved rounds, CPU seconds (min / median / max)"
    )
    for name in names:
        print(f"  {name:<13} {spread(times[name])}")
    ratios = {
        "ORM sharded / plain": ("orm sharded", "orm plain"),
        "ORM sharded / seed": ("orm sharded", "orm seed"),
        "Core sharded / seed": ("core sharded", "core seed"),
    }
    print("per-round ratios (min / median / max), target <= 1.10:")
    for label, (a, b) in ratios.items():
        per_round = [x / y for x, y in zip(times[a], times[b], strict=True)]
        print(f"  {label:<20} {spread(per_round)}")


if __name__ == "__main__":
    main()
