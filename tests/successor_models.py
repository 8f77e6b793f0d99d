"""Models of the dual-write tests (tests/test_successor_writes.py, tests/test_successor_oracle.py).

Fresh classes on every call, so each test module's ``declare_successor`` reaches no other
module's models:

* ``notes()``: ``MirrorNotes`` (8 shards, key ``(ShardId, Timestamp DESC, EventId)``) with SQL
  defaults (``Noted = now()``, ``Token`` = a random string made by the database at each
  evaluation), its successor ``MirrorNotes16``; the new key follows from the old key;
* ``logs()``: ``MirrorLogs`` keyed by ``Id`` alone, a non-key shard of ``(CompanyId, Ts)``,
  its successor ``MirrorLogs16`` keyed ``(Shard16, Id)``: the new key depends on columns an
  UPDATE may change without touching the old key;
* ``unique()``: ``MirrorTags`` and its successor ``MirrorTags16``, which alone has a unique index
  on ``Kind``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.functions import FunctionElement

from sharded_orm import TimestampShardedMixin, UTCDateTime, declare_successor, shard_column


class random_token(FunctionElement[str]):  # noqa: N801 (SQL function name)
    """A string the database makes anew at each evaluation."""

    type = sa.String()
    inherit_cache = True


@compiles(random_token, "sqlite")
def _token_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return "lower(hex(randomblob(16)))"


@compiles(random_token)
def _token_spanner(element: Any, compiler: Any, **kw: Any) -> str:
    return "GENERATE_UUID()"


def notes(declare: bool = True) -> tuple[Any, Any, sa.MetaData]:
    class Base(DeclarativeBase):
        pass

    class Note(TimestampShardedMixin, Base):
        __tablename__ = "MirrorNotes"
        __shard_count__ = 8
        kind: Mapped[str | None] = mapped_column("Kind", sa.String(40))
        noted: Mapped[dt.datetime | None] = mapped_column(
            "Noted", sa.DateTime, default=sa.func.now()
        )
        token: Mapped[str | None] = mapped_column("Token", sa.String(40), default=random_token())

    class Note16(TimestampShardedMixin, Base):
        __tablename__ = "MirrorNotes16"
        __shard_count__ = 16
        kind: Mapped[str | None] = mapped_column("Kind", sa.String(40))
        noted: Mapped[dt.datetime | None] = mapped_column(
            "Noted", sa.DateTime, default=sa.func.now()
        )
        token: Mapped[str | None] = mapped_column("Token", sa.String(40), default=random_token())

    if declare:
        declare_successor(Note, Note16)
    return Note, Note16, Base.metadata


def logs() -> tuple[Any, Any, sa.MetaData]:
    class Base(DeclarativeBase):
        pass

    class Log(Base):
        __tablename__ = "MirrorLogs"
        id: Mapped[str] = mapped_column("Id", sa.String(36), primary_key=True)
        company_id: Mapped[str] = mapped_column("CompanyId", sa.String(20))
        ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime)
        body: Mapped[str | None] = mapped_column("Body", sa.String(40))
        shard8: Mapped[int] = shard_column("company_id", "ts", count=8, name="Shard8")

    class Log16(Base):
        __tablename__ = "MirrorLogs16"
        shard16: Mapped[int] = shard_column(
            "company_id", "ts", count=16, name="Shard16", primary_key=True, sort_order=-10
        )
        id: Mapped[str] = mapped_column("Id", sa.String(36), primary_key=True)
        company_id: Mapped[str] = mapped_column("CompanyId", sa.String(20))
        ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime)
        body: Mapped[str | None] = mapped_column("Body", sa.String(40))

    declare_successor(Log, Log16)
    return Log, Log16, Base.metadata


def unique() -> tuple[Any, Any, sa.MetaData]:
    class Base(DeclarativeBase):
        pass

    class Tag(TimestampShardedMixin, Base):
        __tablename__ = "MirrorTags"
        __shard_count__ = 8
        kind: Mapped[str] = mapped_column("Kind", sa.String(40))

    class Tag16(TimestampShardedMixin, Base):
        __tablename__ = "MirrorTags16"
        __shard_count__ = 16
        kind: Mapped[str] = mapped_column("Kind", sa.String(40))
        __table_args__ = (sa.Index("MirrorTags16ByKind", "Kind", unique=True),)

    declare_successor(Tag, Tag16)
    return Tag, Tag16, Base.metadata


def assert_mirrored(engine: sa.Engine, old: Any, new: Any) -> int:
    """``op.verify_tables`` (``compare_tables``: row for row, every shared column) finds
    the tables equal, and every shard of ``new`` is right (``verify``); returns the row
    count."""
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    import alembic_ext.ops  # noqa: F401 (registers op.verify_tables)
    from sharded_orm.load.copy import compare_tables
    from sharded_orm.load.verify import verify

    diff = compare_tables(engine, old, new)
    assert diff == {"missing_in_target": 0, "missing_in_source": 0, "different": 0}, diff
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"target_metadata": old.metadata})
        Operations(ctx).verify_tables(old.__tablename__, new.__tablename__)
    report = verify(engine, new, progress_mode="off")
    assert report.ok, report.as_dict()
    return report.rows_checked


def serial() -> tuple[Any, Any, sa.MetaData]:
    """``MirrorSerial``: an integer key the database makes (SQLite's ROWID), its successor
    keyed ``(Shard16, Id)``."""

    class Base(DeclarativeBase):
        pass

    class Serial(Base):
        __tablename__ = "MirrorSerial"
        id: Mapped[int] = mapped_column("Id", sa.Integer, primary_key=True, autoincrement=True)
        body: Mapped[str | None] = mapped_column("Body", sa.String(40))

    class Serial16(Base):
        __tablename__ = "MirrorSerial16"
        shard16: Mapped[int] = shard_column(
            "id", count=16, name="Shard16", primary_key=True, sort_order=-10
        )
        id: Mapped[int] = mapped_column("Id", sa.Integer, primary_key=True, autoincrement=False)
        body: Mapped[str | None] = mapped_column("Body", sa.String(40))

    declare_successor(Serial, Serial16)
    return Serial, Serial16, Base.metadata
