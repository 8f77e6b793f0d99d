"""The seeds' three scenarios, naive and sharded, as declarative models.

Shared by the schema tests, the docs and the linter tests.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import (
    ShardedIndex,
    TimestampShardedMixin,
    UTCDateTime,
    interleave_in,
    key_column,
    shard_column,
)
from sharded_orm.tools.lint import LINT_IGNORE


class Naive(DeclarativeBase):
    """Schemas as the seeds show them before the fix."""


class NaiveLogEntry(Naive):
    """LogEntries with an index on (CompanyId, Timestamp): the index is a hotspot."""

    __tablename__ = "LogEntries"
    company_id: Mapped[str] = mapped_column("CompanyId", sa.String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column("UserId", sa.String(64), primary_key=True)
    ts: Mapped[dt.datetime] = mapped_column("Timestamp", UTCDateTime, primary_key=True)
    entry: Mapped[str | None] = mapped_column("LogEntry", sa.String(1024))
    __table_args__ = (sa.Index("LogEntriesByCompany", "CompanyId", "Timestamp"),)


class NaiveUser(Naive):
    """Users keyed by (LastAccessTimestamp, UserId): every access writes the table's end."""

    __tablename__ = "Users"
    last_access: Mapped[dt.datetime] = mapped_column(
        "LastAccessTimestamp", UTCDateTime, primary_key=True
    )
    user_id: Mapped[int] = mapped_column(
        "UserId", sa.BigInteger, primary_key=True, autoincrement=False
    )


class NaiveEvent(Naive):
    """Events keyed by their timestamp."""

    __tablename__ = "Events"
    ts: Mapped[dt.datetime] = mapped_column("Timestamp", UTCDateTime, primary_key=True)
    event_id: Mapped[str] = mapped_column("EventId", sa.String(36), primary_key=True)
    payload: Mapped[str | None] = mapped_column("Payload", sa.String(1024))


class Sharded(DeclarativeBase):
    """The same scenarios, fixed the seeds' way with sharded-orm's constructs."""


class LogEntry(Sharded):
    """LogEntries with EntryShardId leading the company index, newest first, payload stored."""

    __tablename__ = "LogEntries"
    company_id: Mapped[str] = mapped_column("CompanyId", sa.String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column("UserId", sa.String(64), primary_key=True)
    ts: Mapped[dt.datetime] = mapped_column("Timestamp", UTCDateTime, primary_key=True)
    entry: Mapped[str | None] = mapped_column("LogEntry", sa.String(1024))
    entry_shard_id: Mapped[int] = shard_column("company_id", "ts", count=10, name="EntryShardId")
    __table_args__ = (
        ShardedIndex(
            "LogEntriesByCompany",
            "CompanyId",
            sa.desc("Timestamp"),
            shard="EntryShardId",
            storing=["LogEntry"],
        ),
        # the seeds keep this key ascending; reads go through the index, newest first
        {"info": {LINT_IGNORE: ["SO104"]}},
    )


class User(Sharded):
    """Users keyed by (UserId, LastAccessTimestamp DESC): best practice #3."""

    __tablename__ = "Users"
    user_id: Mapped[int] = key_column("UserId", sa.BigInteger, autoincrement=False)
    last_access: Mapped[dt.datetime] = key_column(
        "LastAccessTimestamp", UTCDateTime, descending=True
    )
    name: Mapped[str | None] = mapped_column("Name", sa.String(100))


class UserSession(Sharded):
    """Sessions interleaved in their user: the parent's key is the child's prefix."""

    __tablename__ = "UserSessions"
    user_id: Mapped[int] = key_column("UserId", sa.BigInteger, autoincrement=False)
    last_access: Mapped[dt.datetime] = key_column(
        "LastAccessTimestamp", UTCDateTime, descending=True
    )
    session_id: Mapped[str] = key_column("SessionId", sa.String(36))
    device: Mapped[str | None] = mapped_column("Device", sa.String(64))
    __table_args__ = (
        ShardedIndex("SessionsByDevice", "Device", shard="DeviceShard", null_filtered=True),
        interleave_in("Users", on_delete_cascade=True),
    )
    device_shard: Mapped[int] = shard_column("user_id", count=4, name="DeviceShard")


class Bucket(Sharded):
    """One row per shard: a parent that sharded children and indexes can interleave in."""

    __tablename__ = "EventBuckets"
    shard_id: Mapped[int] = key_column("ShardId", autoincrement=False)


class BucketedEvent(Sharded):
    """Events interleaved in their shard's bucket, with an interleaved sharded index."""

    __tablename__ = "BucketedEvents"
    ts: Mapped[dt.datetime] = mapped_column("Timestamp", UTCDateTime)
    shard_id: Mapped[int] = shard_column(
        "ts", count=8, name="ShardId", primary_key=True, autoincrement=False, sort_order=-2
    )
    event_id: Mapped[str] = key_column("EventId", sa.String(36), sort_order=-1)
    kind: Mapped[str] = mapped_column("Kind", sa.String(32))
    __table_args__ = (
        ShardedIndex("BucketedEventsByKind", "Kind", shard="ShardId", interleave_in="EventBuckets"),
        interleave_in("EventBuckets", on_delete_cascade=True),
    )


class Event(TimestampShardedMixin, Sharded):
    """Events keyed (ShardId, Timestamp DESC, EventId), with a sharded index by kind."""

    __tablename__ = "Events"
    __shard_count__ = 8
    kind: Mapped[str] = mapped_column("Kind", sa.String(32))
    payload: Mapped[str | None] = mapped_column("Payload", sa.String(1024))
    __table_args__ = (
        ShardedIndex(
            "EventsByKind", "Kind", sa.desc("Timestamp"), shard="ShardId", storing=["Payload"]
        ),
    )
