"""The seeds' activity log: LogEntries by company, sharded by EntryShardId.

A few companies write log entries; one (Acme) writes far more than the rest. Keyed by
(CompanyId, UserId, Timestamp) alone, Acme's entries would all land at the end of Acme's
key range; a secondary index on (CompanyId, Timestamp) would be a hotspot too. The fix in
the seeds is a shard column, EntryShardId = hash(CompanyId, Timestamp) % 10, leading the
index, and queries that fan out over the ten shards.

    python examples/activity_log.py            # the local emulator if found, else SQLite
    python examples/activity_log.py --sqlite   # force SQLite

It creates the schema, inserts entries, reads back Acme's newest entries across all
shards, and prints what it did.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import (
    MergeStats,
    ShardedIndex,
    UTCDateTime,
    compute_shard,
    get_shard_column,
    merged,
    page,
    shard_column,
    sharded_select,
)

UTC = dt.timezone.utc
SHARDS = 10


class Base(DeclarativeBase):
    pass


class LogEntry(Base):
    __tablename__ = "LogEntries"

    company_id: Mapped[str] = mapped_column("CompanyId", sa.String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column("UserId", sa.String(64), primary_key=True)
    ts: Mapped[dt.datetime] = mapped_column("Timestamp", UTCDateTime, primary_key=True)
    entry: Mapped[str] = mapped_column("LogEntry", sa.String(1024))
    entry_shard_id: Mapped[int] = shard_column(
        "company_id", "ts", count=SHARDS, name="EntryShardId"
    )

    __table_args__ = (
        ShardedIndex(
            "LogEntriesByCompany",
            "CompanyId",
            sa.desc("Timestamp"),
            shard="EntryShardId",
            storing=["LogEntry"],
        ),
    )


@contextmanager
def open_engine(force_sqlite: bool) -> Iterator[tuple[sa.Engine, str]]:
    """The local Spanner emulator when there is one, else in-memory SQLite."""
    if not force_sqlite:
        from sharded_orm.testing.emulator import EmulatorNotFound, local_emulator

        try:
            with local_emulator() as emulator:
                database = emulator.create_database()
                engine = emulator.engine(database)
                try:
                    yield engine, f"Spanner emulator at {emulator.host}, database {database}"
                finally:
                    engine.dispose()
                return
        except EmulatorNotFound as exc:
            print(f"(no Spanner emulator: {exc}; using SQLite)")
    engine = sa.create_engine("sqlite://")
    try:
        yield engine, "SQLite (in memory)"
    finally:
        engine.dispose()


def make_entries(rng: random.Random, start: dt.datetime) -> list[dict[str, object]]:
    weights = {"Acme": 70, "Globex": 15, "Initech": 10, "Umbrella": 5}
    rows = []
    for i in range(400):
        company = rng.choices(list(weights), weights=list(weights.values()))[0]
        rows.append(
            {
                "company_id": company,
                "user_id": f"user-{rng.randrange(25):02d}",
                "ts": start + dt.timedelta(milliseconds=250 * i + rng.randrange(250)),
                "entry": f"action {i}",
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sqlite", action="store_true", help="use SQLite even if an emulator exists")
    args = ap.parse_args(argv)
    rng = random.Random(42)
    start = dt.datetime(2018, 5, 1, 15, 0, tzinfo=UTC)

    with open_engine(args.sqlite) as (engine, where):
        print(f"database: {where}")
        Base.metadata.create_all(engine)
        print("created LogEntries and its index LogEntriesByCompany (EntryShardId first)")

        rows = make_entries(rng, start)
        with Session(engine) as session:
            session.add_all(LogEntry(**r) for r in rows[:100])  # the ORM unit of work
            session.commit()
            session.execute(sa.insert(LogEntry), rows[100:])  # ORM bulk insert
            session.commit()
        print(f"inserted {len(rows)} entries (100 through session.add, 300 in bulk)")

        t = LogEntry.__table__
        with engine.connect() as conn:
            by_company = sa.select(t.c.CompanyId, sa.func.count()).group_by(t.c.CompanyId)
            per_company = Counter(dict(conn.execute(by_company).all()))
            acme_shards = Counter(
                dict(
                    conn.execute(
                        sa.select(t.c.EntryShardId, sa.func.count())
                        .where(t.c.CompanyId == "Acme")
                        .group_by(t.c.EntryShardId)
                    ).all()
                )
            )
            # The seeds' query: one company, a time range, all shards, newest first,
            # merged across the shards in exact order while reading few rows.
            lo, hi = start + dt.timedelta(seconds=20), start + dt.timedelta(seconds=60)
            acme = (
                sharded_select(LogEntry, index="LogEntriesByCompany")
                .where(LogEntry.company_id == "Acme", LogEntry.ts > lo, LogEntry.ts < hi)
                .order_by(LogEntry.ts.desc())
            )
            stats = MergeStats()
            newest = merged(conn, acme, 5, stats=stats)
            pages, cursor = 0, None
            paged = 0
            while True:
                p = page(conn, acme, 25, cursor)
                pages, paged, cursor = pages + 1, paged + len(p.rows), p.next_cursor
                if cursor is None:
                    break
            stored = conn.execute(sa.select(t.c.CompanyId, t.c.Timestamp, t.c.EntryShardId)).all()

        print("entries per company:", dict(sorted(per_company.items())))
        print("Acme's entries per EntryShardId:", dict(sorted(acme_shards.items())))
        print(
            "Acme's 5 newest entries between +20 s and +60 s (all shards, newest first; "
            f"{stats.rows_transferred} rows read in {stats.statements} statements):"
        )
        for row in newest:
            when = row.Timestamp.isoformat()
            print(f"  {when}  {row.UserId}  shard {row.EntryShardId}  {row.LogEntry}")
        print(f"paged through Acme's {paged} entries in that range: {pages} pages of up to 25")
        sc = get_shard_column(LogEntry, "entry_shard_id")
        wrong = [r for r in stored if r[2] != compute_shard((r[0], r[1]), sc.count)]
        print(
            f"checked {len(stored)} rows: {len(wrong)} with a shard that disagrees with its sources"
        )
        return 1 if wrong or len(stored) != len(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
