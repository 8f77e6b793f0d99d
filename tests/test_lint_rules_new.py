"""The linter's rules for sequences and IDENTITY keys, and the per-index hook for Alembic."""

from __future__ import annotations

import datetime as dt
import itertools

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import shard_column
from sharded_orm.tools.lint import index_warnings, lint

_counter = itertools.count(1)


def _md(**info: object) -> sa.MetaData:
    return sa.MetaData(info=dict(info))


def test_counter_behind_a_tenant_is_flagged_but_user_timestamp_is_not() -> None:
    md = _md()
    sa.Table(
        "Orders",
        md,
        sa.Column("TenantId", sa.String(36), primary_key=True),
        sa.Column("OrderNo", sa.BigInteger, primary_key=True, default=lambda: next(_counter)),
    )
    md.tables["Orders"].c.OrderNo.info["sharded_orm.sequential"] = True
    sa.Table(
        "Events",
        md,
        sa.Column("UserId", sa.String(36), primary_key=True),
        sa.Column("Timestamp", sa.DateTime, primary_key=True),
    )
    rules = {(f.rule, f.table) for f in lint(md)}
    assert ("SO108", "Orders") in rules
    assert not any(t == "Events" and r in ("SO101", "SO108") for r, t in rules)


def test_index_warnings_on_any_table() -> None:
    md = _md()
    t = sa.Table(
        "Child",
        md,
        sa.Column("ParentId", sa.String(36), primary_key=True),
        sa.Column("ChildId", sa.String(36), primary_key=True),
        sa.Column("Created", sa.DateTime),
        spanner_interleave_in="Parent",
    )
    ix = sa.Index("ChildByCreated", t.c.Created)
    assert [f.rule for f in index_warnings(ix)] == ["SO102"]


def test_monotonic_part_behind_a_part_that_never_varies_is_leading() -> None:
    class Base(DeclarativeBase):
        pass

    class Log(Base):
        __tablename__ = "Logs"
        ts: Mapped[dt.datetime] = mapped_column("Timestamp", sa.DateTime)
        shard: Mapped[int] = shard_column("ts", count=1, name="ShardId")
        log_id: Mapped[str] = mapped_column("LogId", sa.String(36))
        __table_args__ = (sa.PrimaryKeyConstraint("ShardId", "Timestamp", "LogId"),)

    class Versioned(Base):
        __tablename__ = "Versioned"
        version: Mapped[int] = mapped_column(
            "Version", primary_key=True, autoincrement=False, info={"sharded_orm.constant": True}
        )
        user_id: Mapped[str] = mapped_column("UserId", sa.String(36), primary_key=True)
        ts: Mapped[dt.datetime] = mapped_column("Timestamp", sa.DateTime, primary_key=True)

    found = {(f.rule, f.table, f.target) for f in lint(Base)}
    assert ("SO101", "Logs", "column Timestamp") in found
    assert ("SO106", "Logs", "column ShardId") in found
    # (constant, UserId, Timestamp): UserId leads in effect, so no false positive
    assert not any(r == "SO101" and t == "Versioned" for r, t, _ in found)


def test_index_warnings_takes_an_index() -> None:
    import pytest

    from sharded_orm import ShardTypeError

    with pytest.raises(ShardTypeError, match="takes a sqlalchemy Index, got None"):
        index_warnings(None)  # type: ignore[arg-type]
