"""The linter's rules for sequences and IDENTITY keys, and the per-index hook for Alembic."""

from __future__ import annotations

import itertools

import sqlalchemy as sa

from sharded_orm.tools.lint import SEQUENCE_KIND_KEY, index_warnings, lint

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


def test_auto_increment_key_wants_default_sequence_kind() -> None:
    md = _md()
    sa.Table("Carts", md, sa.Column("CartId", sa.BigInteger, primary_key=True, autoincrement=True))
    assert [f.rule for f in lint(md)] == ["SO109"]
    md2 = _md(**{SEQUENCE_KIND_KEY: "bit_reversed_positive"})
    sa.Table("Carts", md2, sa.Column("CartId", sa.BigInteger, primary_key=True, autoincrement=True))
    assert lint(md2) == []


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
