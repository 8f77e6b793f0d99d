"""Cost of shard columns on the insert hot path (issues 2 and 16; a benchmark, not a test).

50,000 rows on in-memory SQLite, through the ORM unit of work (add_all + flush) and
through Core executemany, for a model with two shard columns and for the same model
without them. Prints each path's time, the ratio sharded / plain (ORM target <= 1.10),
and the extra cost per row and shard column against the seeds' hand-written one-liner
``zlib.crc32(...) % N`` over the same values (target <= 1.25x).

    python benchmarks/bench_insert.py [--rows 50000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import time
import zlib
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import UTCDateTime, shard_column

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


def make_rows(n: int, with_shards: bool) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for i in range(n):
        r: dict[str, object] = {
            "id": i,
            "company_id": f"company-{i % 7}",
            "user_id": f"user-{i % 997}",
            "ts": T0 + dt.timedelta(microseconds=37 * i),
        }
        if with_shards:  # the plain model stores the same number of columns
            r["entry_shard_id"] = 0
            r["user_shard_id"] = 0
        rows.append(r)
    return rows


def timed(fn: Callable[[], None]) -> float:
    gc.collect()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def orm_flush(model: type[Base], rows: list[dict[str, object]]) -> float:
    eng = sa.create_engine("sqlite://")
    Base.metadata.create_all(eng)
    with Session(eng) as s:
        objs = [model(**r) for r in rows]

        def work() -> None:
            s.add_all(objs)
            s.flush()

        t = timed(work)
        s.rollback()
    eng.dispose()
    return t


def core_executemany(model: type[Base], rows: list[dict[str, object]]) -> float:
    eng = sa.create_engine("sqlite://")
    Base.metadata.create_all(eng)
    table = model.__table__
    with eng.begin() as conn:
        t = timed(lambda: conn.execute(table.insert(), rows).close())
    eng.dispose()
    return t


def seed_one_liners(rows: list[dict[str, object]]) -> float:
    """The seeds' hand-written shard code over the same values, both columns, per row."""
    crc32 = zlib.crc32

    def work() -> None:
        for r in rows:
            company, user, ts = r["company_id"], r["user_id"], r["ts"]
            crc32((company + ts.isoformat()).encode()) % 10  # type: ignore[operator, attr-defined]
            crc32(user.encode()) % 16  # type: ignore[attr-defined]

    return timed(work)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    plain_rows = make_rows(args.rows, with_shards=True)
    sharded_rows = make_rows(args.rows, with_shards=False)
    n, ncols = args.rows, 2
    print(
        f"{n} rows, 2 shard columns, SQLAlchemy {sa.__version__}, best of {args.repeat} (interleaved)"
    )
    best: dict[str, float] = {}
    for _ in range(args.repeat):  # interleaved, so a busy machine hurts both sides alike
        for key, fn in (
            ("orm plain", lambda: orm_flush(Plain, plain_rows)),
            ("orm sharded", lambda: orm_flush(Sharded, sharded_rows)),
            ("core plain", lambda: core_executemany(Plain, plain_rows)),
            ("core sharded", lambda: core_executemany(Sharded, sharded_rows)),
            ("seed", lambda: seed_one_liners(sharded_rows)),
        ):
            t = fn()
            best[key] = min(best.get(key, t), t)
    seed_per_col = best["seed"] / n / ncols
    print(
        f"{'path':<18}{'plain s':>10}{'sharded s':>12}{'ratio':>8}{'overhead/row/col vs seed':>28}"
    )
    for name, key in (("ORM flush", "orm"), ("Core executemany", "core")):
        plain, sharded = best[f"{key} plain"], best[f"{key} sharded"]
        per_col = (sharded - plain) / n / ncols
        print(
            f"{name:<18}{plain:>10.3f}{sharded:>12.3f}{sharded / plain:>8.2f}"
            f"{per_col * 1e6:>13.2f} us = {per_col / seed_per_col:.2f}x seed"
        )
    print(
        f"seed one-liner: {seed_per_col * 1e6:.2f} us per row per column "
        "(zlib.crc32(...) % N, hand-written)"
    )
    print("targets: ORM flush ratio <= 1.10; Core overhead per row per column <= 1.25x seed")


if __name__ == "__main__":
    main()
