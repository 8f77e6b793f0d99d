"""Adopting on an existing database (issue 31 item 4): autogenerate and ``alembic check``
through our impl and plugin find nothing over a schema that ``create_all`` made from the
same models, models as apps write them.

The app's shapes: two foreign keys to one UNIQUE non-key column (Spanner manages a unique
index for them, which INFORMATION_SCHEMA lists once per foreign key), ``PickleType``,
JSON, ARRAY, a commit-timestamp column, a bit-reversed sequence behind a server default,
an IDENTITY key, a generated column, an interleaved table with an interleaved index, a
DESC key part. With the library's own (a shard column with DESC ShardedIndexes,
STORING, NULL_FILTERED, ``TimestampShardedMixin``, a server-side shard column), the one
change is each client-side shard column's marker, which ``create_all`` does not make.

Before: ``DuplicateColumnError: A column with name 'code' is already present in table
'stages'`` (the foreign keys reflected doubled); with that fixed, a drop of the managed
unique constraint and a type change of the PickleType column.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic_project import Project, body, no_changes
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import (
    ShardedIndex,
    TimestampShardedMixin,
    UTCDateTime,
    interleave_in,
    key_column,
    shard_column,
)


def app_models(*, spanner: bool, sharded: bool = True) -> sa.MetaData:
    """An app's models (Spanner-only shapes where ``spanner``; the library's own shapes
    where ``sharded``)."""

    class Base(DeclarativeBase):
        pass

    class Band(Base):
        __tablename__ = "bands"
        id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
        name: Mapped[str] = mapped_column(sa.String(120))
        settings: Mapped[object | None] = mapped_column(sa.PickleType)
        profile: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
        if spanner:
            shout: Mapped[str | None] = mapped_column(sa.String, sa.Computed("UPPER(name)"))

    class Record(Base):
        __tablename__ = "records"
        id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
        band_id: Mapped[str] = mapped_column(sa.ForeignKey("bands.id"))
        title: Mapped[str] = mapped_column(sa.String(200))

    class Song(Base):
        __tablename__ = "songs"
        id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
        number: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
        title: Mapped[str] = mapped_column(sa.String(200))
        __table_args__ = (
            sa.Index("songs_by_title", "id", "title", spanner_interleave_in="records"),
            interleave_in("records", on_delete_cascade=True),
        )

    class Stage(Base):
        __tablename__ = "stages"
        __table_args__ = (sa.Index("stages_by_code", "code", unique=True),)
        id: Mapped[int] = mapped_column(primary_key=True)  # IDENTITY on Spanner
        code: Mapped[str] = mapped_column(sa.String(8))
        notes: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)

    class Gig(Base):  # one foreign key to stages.code, part of the key
        __tablename__ = "gigs"
        stage_code: Mapped[str] = mapped_column(
            sa.String(8), sa.ForeignKey("stages.code"), primary_key=True
        )
        starts: Mapped[dt.datetime] = key_column("starts", UTCDateTime, descending=True)
        band_id: Mapped[str] = mapped_column(sa.String(36), sa.ForeignKey("bands.id"))

    class Booking(Base):  # the other foreign key to stages.code
        __tablename__ = "bookings"
        if spanner:
            id: Mapped[int] = mapped_column(
                sa.BigInteger,
                sa.Sequence("booking_ids"),
                server_default=sa.text("GET_NEXT_SEQUENCE_VALUE(SEQUENCE booking_ids)"),
                primary_key=True,
            )
            seats: Mapped[list[str]] = mapped_column(sa.ARRAY(sa.String(8)))
            changed: Mapped[dt.datetime] = mapped_column(spanner_allow_commit_timestamp=True)
        else:
            id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)
        stage_code: Mapped[str] = mapped_column(sa.String(8), sa.ForeignKey("stages.code"))

    if not sharded:
        return Base.metadata

    class Play(Base):  # the library's: a shard column and its index
        __tablename__ = "plays"
        id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
        band_id: Mapped[str] = mapped_column(sa.String(36))
        at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
        device: Mapped[str | None] = mapped_column(sa.String(40))
        shard: Mapped[int] = shard_column("band_id", "at", count=8, name="PlayShard")
        __table_args__ = (
            ShardedIndex(
                "plays_by_band", "band_id", sa.desc("at"), shard="PlayShard", storing=["device"]
            ),
            ShardedIndex("plays_by_device", "device", shard="PlayShard", null_filtered=True),
        )

    class Tick(TimestampShardedMixin, Base):  # keyed (ShardId, Timestamp DESC, EventId)
        __tablename__ = "ticks"
        __shard_count__ = 4
        kind: Mapped[str] = mapped_column(sa.String(16))

    if spanner:

        class Hit(Base):  # Spanner computes this shard
            __tablename__ = "hits"
            id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
            page: Mapped[str] = mapped_column(sa.String(100))
            shard: Mapped[int] = shard_column(
                "page", count=16, algorithm="farm_fingerprint", server_side=True, name="HitShard"
            )
            __table_args__ = (ShardedIndex("hits_by_page", "page", shard="HitShard"),)

    return Base.metadata


@pytest.fixture(params=["sqlite", pytest.param("spanner", marks=pytest.mark.emulator)])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'app.sqlite'}"
    else:
        emulator = request.getfixturevalue("spanner_emulator")
        url = emulator.url(emulator.create_database())
    engine = sa.create_engine(url)
    yield Project(tmp_path, url), engine, request.param == "spanner"
    engine.dispose()


def test_autogenerate_over_create_all_is_empty(project: Any) -> None:
    proj, engine, spanner = project
    md = app_models(spanner=spanner, sharded=False)
    md.create_all(engine)
    proj.check(md)  # raises when autogenerate would find a change
    script = proj.revision(md, "nothing")
    assert no_changes(script), script


# adoption journey; quick loop: test_autogenerate_over_create_all_is_empty
@pytest.mark.slow
def test_over_sharded_tables_only_the_markers(project: Any) -> None:
    """Tables with shard columns, made by create_all: the one change is each client-side
    shard column's marker (create_all makes none: docs/migrations.md, "Shard markers"),
    which records its spec; after it, nothing."""
    from alembic_ext.markers import marker_for
    from sharded_orm import shard_columns

    proj, engine, spanner = project
    md = app_models(spanner=spanner)
    md.create_all(engine)
    script = proj.revision(md, "markers")
    ops = [ln.strip() for ln in body(script, "upgrade").splitlines()]
    ops = [ln for ln in ops if ln.startswith("op.")]
    markers = sorted(
        marker_for(sc).name
        for t in md.tables.values()
        for sc in shard_columns(t)
        if not sc.server_side
    )
    assert len(markers) == 2 and len(ops) == 2, ops
    assert sorted(ln.split("'")[1] for ln in ops) == markers
    assert all(ln.startswith("op.create_check_constraint(") for ln in ops)
    if not spanner:
        return  # SQLite adds a CHECK only in Alembic's batch mode
    proj.upgrade()
    proj.check(md)
    assert no_changes(proj.revision(md, "nothing")), script


# ----------------------------------------------------------------------------- reflection


@pytest.fixture
def stages(spanner_engine: sa.Engine) -> sa.Engine:
    app_models(spanner=True).create_all(spanner_engine)
    return spanner_engine


@pytest.mark.emulator
def test_foreign_keys_to_one_unique_column_reflect_once(stages: sa.Engine) -> None:
    insp = sa.inspect(stages)
    for table in ("gigs", "bookings"):
        found = [(fk["constrained_columns"], fk["referred_table"], fk["referred_columns"])
                 for fk in insp.get_foreign_keys(table)]  # fmt: skip
        assert found.count((["stage_code"], "stages", ["code"])) == 1, found
        assert len(found) == (2 if table == "gigs" else 1), found
    (fk,) = insp.get_foreign_keys("records")
    assert fk["referred_columns"] == ["id"]


@pytest.mark.emulator
def test_the_unique_index_spanner_manages_is_not_reflected(stages: sa.Engine) -> None:
    insp = sa.inspect(stages)
    assert insp.get_unique_constraints("stages") == []
    assert [ix["name"] for ix in insp.get_indexes("stages")] == ["stages_by_code"]


@pytest.mark.emulator
def test_upstream_reflection_doubles_them(stages: sa.Engine) -> None:
    """Trips when sqlalchemy-spanner reflects these once itself (then ours can go)."""
    from google.cloud.sqlalchemy_spanner.sqlalchemy_spanner import SpannerDialect as Stock

    with stages.connect() as conn:
        stock_fks = Stock.get_multi_foreign_keys(stages.dialect, conn, filter_names=["gigs"])
        stock_uq = Stock.get_unique_constraints(stages.dialect, conn, "stages")
    to_stages = [fk for fk in stock_fks[(None, "gigs")] if fk["referred_table"] == "stages"]
    assert len(to_stages) == 2
    assert to_stages[0]["constrained_columns"] == ["stage_code", "stage_code"]
    assert len(stock_uq) == 4 and stock_uq[0]["name"].startswith("IDX_stages_code_U_")


def test_a_decorated_type_compares_as_what_it_stores() -> None:
    from alembic_ext.compare import SpannerComparisons
    from sharded_orm.spanner.dialect import SpannerDialect

    impl: Any = object.__new__(SpannerComparisons)
    impl.dialect = SpannerDialect()
    impl.type_synonyms = ()
    bytes_max = sa.Column("p", sa.LargeBinary(length=2621440))
    assert not impl.compare_type(bytes_max, sa.Column("p", sa.PickleType()))
    assert not impl.compare_type(bytes_max, sa.Column("p", sa.LargeBinary()))
    assert impl.compare_type(bytes_max, sa.Column("p", sa.String()))
