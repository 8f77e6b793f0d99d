"""Constructs using every ``spanner_*`` keyword sqlalchemy-spanner honours, compiled by a dialect.

Imports nothing of sharded-orm: ``tests/test_stock_keywords.py`` runs :func:`rendered` in a
process that never imports the library (the stock dialect, as an app without sharded-orm
has it) and in its own (our dialect), and compares the two.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import sqlalchemy as sa
from sqlalchemy.schema import CreateIndex, CreateTable


def constructs() -> dict[str, Any]:
    """Name -> a construct to compile, one per keyword (and one with none)."""
    md = sa.MetaData()
    parent = sa.Table(
        "Singers",
        md,
        sa.Column("SingerId", sa.String(36), primary_key=True),
        sa.Column("Name", sa.String(100)),
        sa.Column("Code", sa.String(10)),
        sa.Column(
            "Updated",
            sa.DateTime(timezone=True),
            spanner_allow_commit_timestamp=True,
            spanner_exclude_from_returning=True,
        ),
    )
    child = sa.Table(
        "Albums",
        md,
        sa.Column("SingerId", sa.String(36), primary_key=True),
        sa.Column("AlbumId", sa.String(36), primary_key=True),
        sa.Column("Title", sa.String(100)),
        spanner_interleave_in="Singers",
        spanner_interleave_on_delete_cascade=True,
    )
    venues = sa.Table(
        "Venues",
        md,
        sa.Column("VenueId", sa.String(36), primary_key=True),
        sa.Column("SingerId", sa.String(36), sa.ForeignKey("Singers.SingerId")),
        sa.Column("Code", sa.String(10)),
        sa.ForeignKeyConstraint(
            ["Code"], ["Singers.Code"], name="FK_Code", spanner_not_enforced=True
        ),
    )
    informal = sa.Table(
        "Concerts",
        md,
        sa.Column("ConcertId", sa.String(36), primary_key=True),
        sa.Column(
            "VenueId",
            sa.String(36),
            sa.ForeignKey("Venues.VenueId", name="FK_Venue", spanner_not_enforced=True),
        ),
    )
    in_schema = sa.Table(
        "Users",
        md,
        sa.Column("UserId", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("Name", sa.String(16), index=True),
        schema="app",
    )
    return {
        "table_in_schema": CreateTable(in_schema),
        "index_in_schema": CreateIndex(next(iter(in_schema.indexes))),
        "index_in_schema_storing": CreateIndex(
            sa.Index("UsersByName", in_schema.c.Name, spanner_storing=["UserId"])
        ),
        "table_commit_timestamp": CreateTable(parent),
        "table_interleaved": CreateTable(child),
        "table_fk_constraint_not_enforced": CreateTable(venues),
        "table_fk_not_enforced": CreateTable(informal),
        "index_plain": CreateIndex(sa.Index("SingersByName", parent.c.Name)),
        "index_storing": CreateIndex(
            sa.Index("SingersByName2", parent.c.Name, spanner_storing=["Code"])
        ),
        "index_null_filtered": CreateIndex(
            sa.Index("SingersByCode", parent.c.Code, spanner_null_filtered=True)
        ),
        "index_all": CreateIndex(
            sa.Index(
                "AlbumsByTitle",
                child.c.SingerId,
                sa.desc(child.c.Title),
                unique=True,
                spanner_null_filtered=True,
                spanner_storing=[child.c.AlbumId],
                spanner_interleave_in="Singers",
            )
        ),
        "insert_returning": sa.insert(parent)
        .values(SingerId="a", Name="b", Updated=sa.func.pending_commit_timestamp())
        .returning(*parent.c),
        "update_returning": sa.update(parent).values(Name="c").returning(*parent.c),
    }


def rendered(dialect: Any) -> dict[str, str]:
    return {name: str(c.compile(dialect=dialect)) for name, c in constructs().items()}


if __name__ == "__main__":
    # ``python stock_constructs.py``: the stock dialect, sharded-orm never imported
    from google.cloud.sqlalchemy_spanner import SpannerDialect

    assert not [m for m in sys.modules if m.startswith("sharded_orm")]
    json.dump(rendered(SpannerDialect()), sys.stdout)
