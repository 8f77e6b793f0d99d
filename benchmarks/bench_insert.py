"""Cost of shard columns on the insert hot path (issue 2's benchmark; not a test).

50,000 rows on in-memory SQLite, through the ORM unit of work (add_all + flush) and
through Core executemany, for a model with two shard columns and for the same model
without them. Prints each path's time and the ratio sharded / plain (target <= 1.10).

    python benchmarks/bench_insert.py [--rows 50000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import time
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    plain_rows = make_rows(args.rows, with_shards=True)
    sharded_rows = make_rows(args.rows, with_shards=False)
    print(f"{args.rows} rows, SQLAlchemy {sa.__version__}, best of {args.repeat}")
    print(f"{'path':<18}{'plain s':>10}{'sharded s':>12}{'ratio':>8}")
    for name, path in (("ORM flush", orm_flush), ("Core executemany", core_executemany)):
        plain = min(path(Plain, plain_rows) for _ in range(args.repeat))
        sharded = min(path(Sharded, sharded_rows) for _ in range(args.repeat))
        print(f"{name:<18}{plain:>10.3f}{sharded:>12.3f}{sharded / plain:>8.2f}")


if __name__ == "__main__":
    main()
