"""Adopting on an existing database (issue 31 item 4): autogenerate and ``alembic check``
through our impl and plugin find nothing over a schema that ``create_all`` made from the
same models, models as apps write them.

The app's shapes: two foreign keys to one UNIQUE non-key column (Spanner manages a unique
index for them, which INFORMATION_SCHEMA lists once per foreign key), ``PickleType``,
JSON, ARRAY, a commit-timestamp column, a bit-reversed sequence behind a server default,
an IDENTITY key, a generated column, an interleaved table with an interleaved index, a
DESC key part, and the library's own: a shard column with a DESC ``ShardedIndex``
(STORING, NULL_FILTERED), ``TimestampShardedMixin``, a server-side shard column.

Before: ``DuplicateColumnError: A column with name 'code' is already present in table
'stages'`` (the foreign keys reflected doubled); with that fixed, a drop of the managed
unique constraint, a type change of the PickleType column and a marker to add on every
sharded table.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic_project import Project, no_changes
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import (
    ShardedIndex,
    TimestampShardedMixin,
    UTCDateTime,
    interleave_in,
    key_column,
    shard_column,
)
from sharded_orm.schema.markers import ShardMarker


def app_models(*, spanner: bool) -> sa.MetaData:
    """An app's models (Spanner-only shapes where ``spanner``)."""

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
    md = app_models(spanner=spanner)
    md.create_all(engine)
    proj.check(md)  # raises when autogenerate would find a change
    script = proj.revision(md, "nothing")
    assert no_changes(script), script


def test_a_table_without_its_marker_gets_it(project: Any) -> None:
    """A sharded table made before the tables declared their markers (by hand, or by an
    older create_all): autogenerate records the spec, as it did."""
    proj, engine, _ = project
    legacy = sa.MetaData()
    sa.Table(
        "plays",
        legacy,
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("band_id", sa.String(36), nullable=False),
        sa.Column("at", UTCDateTime, nullable=False),
        sa.Column("device", sa.String(40)),
        sa.Column("PlayShard", sa.Integer, nullable=False),
    )
    legacy.create_all(engine)
    only = sa.MetaData()
    plays = app_models(spanner=False).tables["plays"].to_metadata(only)
    (marker,) = [c for c in plays.constraints if isinstance(c, ShardMarker)]
    script = proj.revision(only, "marker")
    assert f"op.create_check_constraint('{marker.name}', 'plays'" in script, script


# ----------------------------------------------------------------------------- markers


def test_every_client_side_shard_column_declares_its_marker() -> None:
    md = app_models(spanner=True)
    names = {
        t.name: sorted(c.name for c in t.constraints if isinstance(c, ShardMarker))
        for t in md.tables.values()
    }
    assert names["plays"] == ["ck_plays_PlayShard_shard8_" + names["plays"][0][-8:]]
    assert names["ticks"][0].startswith("ck_ticks_ShardId_shard4_")  # a mixin's, resolved late
    assert names["hits"] == []  # server-side: the generated expression is its record
    copy = md.tables["plays"].to_metadata(sa.MetaData())  # copied once, not twice
    assert [c.name for c in copy.constraints if isinstance(c, sa.CheckConstraint)] == names["plays"]


def test_a_core_table_declares_its_marker_whatever_the_column_order() -> None:
    from sharded_orm import get_shard_column
    from sharded_orm.schema.markers import marker_name

    md = sa.MetaData()
    t = sa.Table(
        "core_logs",
        md,
        shard_column("Company", "Ts", count=10, name="Shard").column,  # before its sources
        sa.Column("Company", sa.String(20), primary_key=True),
        sa.Column("Ts", sa.DateTime(timezone=True), primary_key=True),
    )
    get_shard_column(t)  # the first use resolves it
    (marker,) = [c for c in t.constraints if isinstance(c, ShardMarker)]
    assert marker.name == marker_name("core_logs", get_shard_column(t))


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("spanner", marks=pytest.mark.emulator)])
def test_the_marker_keeps_raw_writes_in_range(backend: str, request: pytest.FixtureRequest) -> None:
    engine = (
        sa.create_engine("sqlite://")
        if backend == "sqlite"
        else request.getfixturevalue("spanner_engine")
    )
    md = app_models(spanner=False)
    md.tables["plays"].create(engine)
    bad = sa.text(
        "INSERT INTO plays (id, band_id, at, PlayShard) VALUES ('x', 'b', :at, 8)"
    ).execution_options(sharded_orm_raw_sql_ok=True)
    with pytest.raises(sa.exc.DBAPIError), engine.begin() as conn:
        conn.execute(bad, {"at": dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)})


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
    from alembic_ext.comparing import SpannerComparisons
    from sharded_orm.spanner.dialect import SpannerDialect

    impl: Any = object.__new__(SpannerComparisons)
    impl.dialect = SpannerDialect()
    impl.type_synonyms = ()
    bytes_max = sa.Column("p", sa.LargeBinary(length=2621440))
    assert not impl.compare_type(bytes_max, sa.Column("p", sa.PickleType()))
    assert not impl.compare_type(bytes_max, sa.Column("p", sa.LargeBinary()))
    assert impl.compare_type(bytes_max, sa.Column("p", sa.String()))
