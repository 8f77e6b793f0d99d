"""The seeds' LogEntries in the middle of a reshard, and raw loaders, for the at-scale tests
and benchmarks (server-side backfill, verify, Beam).

``FarmLogEntry``: LogEntries with its crc32 ``EntryShardId`` and a new, still NULL,
farm_fingerprint ``EntryShardV2`` (count 16): the server-side backfill's case.
``CrcLogEntry``: the same with a new crc32 ``EntryShardV2``: the Beam ``Backfill``'s case.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import ShardedIndex, UTCDateTime, shard_column

BASE_TS = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
COLUMNS = ("CompanyId", "UserId", "Timestamp", "LogEntry", "EntryShardId")


class FarmBase(DeclarativeBase):
    pass


class CrcBase(DeclarativeBase):
    pass


class FarmLogEntry(FarmBase):
    __tablename__ = "LogEntries"
    company_id: Mapped[str] = mapped_column("CompanyId", sa.String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column("UserId", sa.String(64), primary_key=True)
    ts: Mapped[dt.datetime] = mapped_column("Timestamp", UTCDateTime, primary_key=True)
    entry: Mapped[str | None] = mapped_column("LogEntry", sa.String(1024))
    entry_shard_id: Mapped[int] = shard_column("company_id", "ts", count=10, name="EntryShardId")
    entry_shard_v2: Mapped[int | None] = shard_column(
        "company_id", "ts", count=16, algorithm="farm_fingerprint", name="EntryShardV2",
        nullable=True,
    )  # fmt: skip
    __table_args__ = (
        ShardedIndex("LogEntriesByCompany", "CompanyId", sa.desc("Timestamp"),
                     shard="EntryShardId", storing=["LogEntry"]),
    )  # fmt: skip


class CrcLogEntry(CrcBase):
    __tablename__ = "LogEntries"
    company_id: Mapped[str] = mapped_column("CompanyId", sa.String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column("UserId", sa.String(64), primary_key=True)
    ts: Mapped[dt.datetime] = mapped_column("Timestamp", UTCDateTime, primary_key=True)
    entry: Mapped[str | None] = mapped_column("LogEntry", sa.String(1024))
    entry_shard_id: Mapped[int] = shard_column("company_id", "ts", count=10, name="EntryShardId")
    entry_shard_v2: Mapped[int | None] = shard_column(
        "company_id", "ts", count=16, algorithm="crc32", name="EntryShardV2", nullable=True
    )
    __table_args__ = (
        ShardedIndex("LogEntriesByCompany", "CompanyId", sa.desc("Timestamp"),
                     shard="EntryShardId", storing=["LogEntry"]),
    )  # fmt: skip


def rows(n: int, start: int = 0) -> Iterator[dict[str, Any]]:
    """``n`` distinct LogEntries rows (no shard columns): 50 companies, 997 users."""
    for i in range(start, start + n):
        yield {
            "company_id": f"company-{i % 50:02d}",
            "user_id": f"user-{i % 997:03d}",
            "ts": BASE_TS + dt.timedelta(seconds=i),
            "entry": f"entry {i}",
        }


def load_old_rows(engine: Any, model: Any, n: int, batch: int = 4000) -> None:
    """Write ``n`` rows as the old code did: ``EntryShardId`` set, ``EntryShardV2`` NULL.

    Straight through the mutation API, so no write-path hook fills the new column.
    """
    from sharded_orm import get_shard_column
    from sharded_orm.spanner.mutations import database_of

    old = get_shard_column(model, "EntryShardId")
    database = database_of(engine)
    pending: list[list[Any]] = []

    def flush() -> None:
        with database.batch() as b:
            b.insert("LogEntries", columns=COLUMNS, values=pending)
        pending.clear()

    for r in rows(n):
        shard = old.compute([r["company_id"], r["ts"]])
        pending.append([r["company_id"], r["user_id"], r["ts"], r["entry"], shard])
        if len(pending) >= batch:
            flush()
    if pending:
        flush()
