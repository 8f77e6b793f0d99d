"""The seeds' hotspot claims, replayed with ``sharded_orm.simulate`` (and linted).

Run ``python examples/hotspots.py`` for the figures in ``docs/hotspots.md``;
``--heatmaps DIR`` also writes the PNGs; ``--scale 0.1`` runs a tenth of the traffic;
``--doctor`` also runs ``sharded_orm.doctor`` on the split statistics each schema is
expected to produce (``hot_split_rows()``), as it would on production's.

Scenarios (each a naive schema and the seeds' fixes, as declarative models):

1. LogEntries indexed by (CompanyId, Timestamp), company B writing 3x the others; the
   fix leads the index with EntryShardId = crc32(CompanyId, Timestamp) % 10.
2. One company with 100x the entries: the same index with 1, 10, 30 and 100 shards.
3. Users keyed by (LastAccessTimestamp, UserId); fixed by swapping the key parts
   (UserId, LastAccessTimestamp DESC), or by a leading ShardId.
4. Events keyed well, but with an index on Timestamp alone; fixed by a sharded index.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import ShardedIndex, UTCDateTime, key_column, shard_column
from sharded_orm.tools.doctor import doctor
from sharded_orm.tools.lint import lint
from sharded_orm.tools.simulate import Comparison, Instance, Workload, simulate


class Naive(DeclarativeBase):
    """The seeds' schemas before their fixes."""


class Fixed(DeclarativeBase):
    """The seeds' fixes."""


# --- 1 and 2: LogEntries (seed "Sharding of timestamp-ordered data in Cloud Spanner") ---


class NaiveLogEntry(Naive):
    __tablename__ = "LogEntries"
    company_id: Mapped[str] = mapped_column("CompanyId", sa.String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column("UserId", sa.String(64), primary_key=True)
    ts: Mapped[dt.datetime] = key_column("Timestamp", UTCDateTime, descending=True)
    entry: Mapped[str | None] = mapped_column("LogEntry", sa.String(1024))
    __table_args__ = (sa.Index("LogEntriesByCompany", "CompanyId", "Timestamp"),)


def sharded_log_entry(shards: int, base: type[DeclarativeBase] | None = None) -> type[Any]:
    """LogEntries with ``EntryShardId = crc32(CompanyId, Timestamp) % shards`` leading the index."""

    class Base(DeclarativeBase):
        pass

    class LogEntry(base or Base):  # type: ignore[misc]
        __tablename__ = "LogEntries"
        company_id: Mapped[str] = mapped_column("CompanyId", sa.String(64), primary_key=True)
        user_id: Mapped[str] = mapped_column("UserId", sa.String(64), primary_key=True)
        ts: Mapped[dt.datetime] = key_column("Timestamp", UTCDateTime, descending=True)
        entry: Mapped[str | None] = mapped_column("LogEntry", sa.String(1024))
        entry_shard_id: Mapped[int] = shard_column(
            "company_id", "ts", count=shards, name="EntryShardId"
        )
        __table_args__ = (
            ShardedIndex(
                "LogEntriesByCompany", "CompanyId", sa.desc("Timestamp"), shard="EntryShardId"
            ),
        )

    LogEntry.__name__ = LogEntry.__qualname__ = f"LogEntry{shards}"
    return LogEntry


LogEntry = sharded_log_entry(10, Fixed)


# --- 3: Users (seed "Schema design best practices", #1 and #3) ---


class NaiveUser(Naive):
    __tablename__ = "Users"
    last_access: Mapped[dt.datetime] = mapped_column(
        "LastAccessTimestamp", UTCDateTime, primary_key=True
    )
    user_id: Mapped[int] = mapped_column(
        "UserId", sa.BigInteger, primary_key=True, autoincrement=False
    )


class SwappedUser(Fixed):
    """Possible fix #1, with best practice #3 (newest first)."""

    __tablename__ = "Users"
    user_id: Mapped[int] = key_column("UserId", sa.BigInteger, autoincrement=False)
    last_access: Mapped[dt.datetime] = key_column(
        "LastAccessTimestamp", UTCDateTime, descending=True
    )


class ShardedUser(Fixed):
    """Possible fix #2: ShardId = hash(key parts) % N leads the key."""

    __tablename__ = "ShardedUsers"
    last_access: Mapped[dt.datetime] = mapped_column("LastAccessTimestamp", UTCDateTime)
    user_id: Mapped[int] = mapped_column("UserId", sa.BigInteger)
    shard_id: Mapped[int] = shard_column("last_access", "user_id", count=16, name="ShardId")
    __table_args__ = (
        sa.PrimaryKeyConstraint("ShardId", "LastAccessTimestamp", "UserId"),
        # the seed's fix #2 keeps LastAccessTimestamp ascending; reads fan out per shard
        {"info": {"sharded_orm.lint.ignore": ["SO104"]}},
    )


# --- 4: Events with a timestamp index (seed "What DBAs need to know about Cloud Spanner") ---


class NaiveEvent(Naive):
    __tablename__ = "Events"
    user_id: Mapped[str] = mapped_column("UserId", sa.String(36), primary_key=True)
    ts: Mapped[dt.datetime] = key_column("Timestamp", UTCDateTime, descending=True)
    __table_args__ = (sa.Index("EventsByTimestamp", sa.desc("Timestamp")),)


class Event(Fixed):
    __tablename__ = "Events"
    user_id: Mapped[str] = mapped_column("UserId", sa.String(36), primary_key=True)
    ts: Mapped[dt.datetime] = key_column("Timestamp", UTCDateTime, descending=True)
    shard: Mapped[int] = shard_column("ts", count=100, name="TimestampShardId")
    __table_args__ = (ShardedIndex("EventsByTimestamp", "Timestamp", shard="TimestampShardId"),)


# --- the scenarios ---------------------------------------------------------------------


def scenarios(scale: float = 1.0) -> dict[str, tuple[dict[str, Any], Workload, Instance]]:
    """Name -> (schemas, workload, instance). ``scale`` multiplies the traffic's duration."""
    return {
        "company_3x": (
            {"naive index": NaiveLogEntry, "EntryShardId (10)": LogEntry},
            Workload(
                rows_per_second=6000,
                duration=300 * scale,
                tenants=3,
                tenant_weights=(1, 3, 1),
                users_per_tenant=1000,
            ),
            Instance(nodes=6),
        ),
        "company_100x": (
            {f"{n} shard{'s' if n > 1 else ''}": sharded_log_entry(n) for n in (1, 10, 30, 100)},
            Workload(
                rows_per_second=30000,
                duration=60 * scale,
                tenants=11,
                tenant_weights=(100,) + (1,) * 10,
                users_per_tenant=2000,
            ),
            Instance(nodes=30, tick=5),
        ),
        "timestamp_key": (
            {"timestamp first": NaiveUser, "swapped": SwappedUser, "ShardId first": ShardedUser},
            Workload(rows_per_second=5000, duration=300 * scale, users_per_tenant=1_000_000),
            Instance(nodes=4),
        ),
        "timestamp_index": (
            {"index on Timestamp": NaiveEvent, "sharded index": Event},
            Workload(rows_per_second=5000, duration=300 * scale, users_per_tenant=100_000),
            Instance(nodes=4),
        ),
    }


def run(name: str, scale: float = 1.0, heatmap: str | Path | None = None) -> Comparison:
    schemas, workload, instance = scenarios(scale)[name]
    return simulate(schemas, workload, instance, heatmap=heatmap)


def doctor_figure(path: str | Path, scale: float = 1.0) -> Path:
    """docs/img/doctor_timestamp_key.png: ``doctor`` on the split statistics the simulator
    predicts for the timestamp-first Users over 15 minutes (drawn as "simulated")."""
    workload = Workload(rows_per_second=5000, duration=900 * scale, users_per_tenant=1_000_000)
    result = simulate({"timestamp first": NaiveUser}, workload, Instance(nodes=4)).results[0]
    return Path(doctor(result.hot_split_rows(), [NaiveUser]).heatmap(path))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the traffic")
    parser.add_argument("--heatmaps", default=None, help="directory for the PNG heatmaps")
    parser.add_argument("--only", default=None, help="one scenario by name")
    parser.add_argument(
        "--doctor", action="store_true", help="diagnose the split statistics each schema predicts"
    )
    args = parser.parse_args(argv)
    naive = lint(Naive)
    print(f"lint, naive schemas: {len(naive)} findings")
    for f in naive:
        print(f"  {f.severity} {f.rule} {f.table}: {f.target}")
    print(f"lint, fixed schemas: {len(lint(Fixed))} findings")
    if args.heatmaps:
        Path(args.heatmaps).mkdir(parents=True, exist_ok=True)
    for name in scenarios(args.scale):
        if args.only and name != args.only:
            continue
        png = Path(args.heatmaps) / f"hotspots_{name}.png" if args.heatmaps else None
        comparison = run(name, args.scale, png)
        print(f"\n== {name}")
        print(comparison.summary(heat=png is None))
        if png:
            print(f"heatmap: {png}")
        if args.doctor:
            schemas = scenarios(args.scale)[name][0]
            for r in comparison.results:
                rows = r.hot_split_rows()
                report = doctor(rows, [schemas[r.name]]).table() if rows else "no hot splits"
                print(f"\ndoctor, {r.name}:\n{report}")
    if args.heatmaps and not args.only:
        png = doctor_figure(Path(args.heatmaps) / "doctor_timestamp_key.png", args.scale)
        print(f"heatmap: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
