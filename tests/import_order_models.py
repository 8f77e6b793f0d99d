"""Models for tests/test_import_order.py, imported by its subprocesses after their engine."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import ShardedIndex, UTCDateTime, key_column, shard_column


class DescBase(DeclarativeBase):
    pass


class LastAccess(DescBase):
    """A descending key part and an index with a ``spanner_*`` keyword: no shard column."""

    __tablename__ = "last_access"
    user_id: Mapped[int] = key_column(sa.BigInteger, autoincrement=False)
    last_access: Mapped[dt.datetime] = key_column(UTCDateTime, descending=True)
    code: Mapped[str | None] = mapped_column(sa.String(10))
    __table_args__ = (sa.Index("last_access_by_code", "code", spanner_null_filtered=True),)


class ShardBase(DeclarativeBase):
    pass


class Event(ShardBase):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    shard: Mapped[int] = shard_column("ts", count=4)
    __table_args__ = (ShardedIndex("events_by_ts", "ts", shard="shard"),)
