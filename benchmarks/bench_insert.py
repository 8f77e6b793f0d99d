"""Cost of shard columns on the insert hot path (issues 2 and 16; a benchmark, not a test).

50,000 rows on in-memory SQLite, through the ORM unit of work (add_all + flush) and
through Core executemany, for a model with two shard columns and for the same model
without them. Prints each path's time, the ratio sharded / plain (ORM target <= 1.10),
and the extra cost per row and shard column against the seeds' hand-written one-liner
``zlib.crc32(...) % N`` over the same values (target <= 1.25x).

    python benchmarks/bench_insert.py [--rows 50000] [--repeat 15]
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

from sharded_orm import UTCDateTime, shard_column, shard_columns
from sharded_orm.write.rows import RowShards, fast_insert_rows

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


def hook_work(rows: list[dict[str, object]]) -> float:
    """What the engine hook does for a Core executemany of these rows: fill both shards."""
    shards = RowShards(shard_columns(Sharded), on_spanner=False)
    return timed(lambda: fast_insert_rows(shards, rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    plain_rows = make_rows(args.rows, with_shards=True)
    sharded_rows = make_rows(args.rows, with_shards=False)
    n, ncols = args.rows, 2
    print(f"{n} rows, {ncols} shard columns, SQLAlchemy {sa.__version__}, {args.repeat} rounds")
    # Each round times plain, sharded and the seed's one-liners back to back, and the
    # figures are medians of the per-round ratios: on a shared machine the load changes
    # between rounds, and a ratio of neighbours is steadier than a ratio of minima.
    orm_ratio, core_ratio, core_vs_seed, hook_vs_seed = [], [], [], []
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        t = {
            "orm plain": orm_flush(Plain, plain_rows),
            "orm sharded": orm_flush(Sharded, sharded_rows),
            "core plain": core_executemany(Plain, plain_rows),
            "seed": seed_one_liners(sharded_rows),
            "core sharded": core_executemany(Sharded, sharded_rows),
            "hook": hook_work(sharded_rows),
            "seed again": seed_one_liners(sharded_rows),
        }
        for k, v in t.items():
            best[k] = min(best.get(k, v), v)
        orm_ratio.append(t["orm sharded"] / t["orm plain"])
        core_ratio.append(t["core sharded"] / t["core plain"])
        core_vs_seed.append((t["core sharded"] - t["core plain"]) / t["seed"])
        hook_vs_seed.append(t["hook"] / t["seed again"])
    seed_us = best["seed"] / n / ncols * 1e6
    print(
        f"{'path':<18}{'plain s':>9}{'sharded s':>11}{'ratio':>7}{'best':>7}"
        "  per row and shard column"
    )
    for name, key, ratios in (
        ("ORM flush", "orm", orm_ratio),
        ("Core executemany", "core", core_ratio),
    ):
        plain, sharded = best[f"{key} plain"], best[f"{key} sharded"]
        extra = (sharded - plain) / n / ncols * 1e6
        line = (
            f"{name:<18}{plain:>9.3f}{sharded:>11.3f}{statistics.median(ratios):>7.2f}"
            f"{sharded / plain:>7.2f}"
        )
        if key == "core":
            line += (
                f"  {extra:.2f} us = {statistics.median(core_vs_seed):.2f}x the seed's one-liner"
            )
        else:
            line += f"  {extra:.2f} us"
        print(line)
    print(f"seed one-liner zlib.crc32(...) % N: {seed_us:.2f} us per row and column")
    hook_us = best["hook"] / n / ncols * 1e6
    print(
        f"the hook's own work for those rows: {hook_us:.2f} us per row and column = "
        f"{statistics.median(hook_vs_seed):.2f}x the seed's one-liner (timed side by side)"
    )
    print(
        "ratio: median of the per-round ratios; best: best sharded / best plain "
        "(seconds are each path's best round)"
    )
    print("targets: ORM flush <= 1.10x plain; Core extra per row and column <= 1.25x the seed's")
    print(
        f"per-round ratios: ORM {fmt(orm_ratio)}; Core vs seed {fmt(core_vs_seed)}; "
        f"hook vs seed {fmt(hook_vs_seed)}"
    )


def fmt(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    main()
