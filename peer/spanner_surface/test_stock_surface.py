"""sqlalchemy-spanner's own surface on the emulator, as an app uses it: each test passes with
the stock dialect and with sharded-orm imported (``.ci/peers`` compares them per test).

Nothing here uses sharded-orm: it is the app that already runs on sqlalchemy-spanner and
then imports the library. Results are observed (rows read back, INFORMATION_SCHEMA, the
SQL rendered), never the dialect's internals. Names in SQL are compared without quotes:
sharded-orm quotes every name of a primary key and an interleave parent (a deliberate
difference, docs/dialect.md), stock quotes reserved words only.
"""

from __future__ import annotations

import datetime as dt
import decimal
import pickle
from typing import Any

import pytest
import sqlalchemy as sa
from google.api_core.exceptions import GoogleAPICallError
from google.cloud.spanner_dbapi.parsed_statement import AutocommitDmlMode
from google.cloud.spanner_v1 import RequestOptions
from google.cloud.sqlalchemy_spanner import sqlalchemy_spanner as spanner_dialect
from google.cloud.sqlalchemy_spanner.dml import insert_or_ignore, insert_or_update
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.schema import CreateIndex, CreateTable

UTC = dt.timezone.utc


def sql(element: Any, engine: sa.Engine) -> str:
    """``element`` compiled for ``engine``, names unquoted, whitespace collapsed."""
    return " ".join(str(element.compile(dialect=engine.dialect)).replace("`", "").split())


def info_schema(conn: sa.Connection, query: str, **params: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in conn.execute(sa.text(query), params).all()]


# ------------------------------------------------------------------ commit timestamps


def commit_ts_table(md: sa.MetaData) -> sa.Table:
    return sa.Table(
        "events",
        md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(20)),
        sa.Column(
            "committed",
            sa.DateTime(timezone=True),
            spanner_allow_commit_timestamp=True,
            spanner_exclude_from_returning=True,
        ),
    )


def test_commit_timestamp_column(engine: sa.Engine) -> None:
    md = sa.MetaData()
    t = commit_ts_table(md)
    ddl = sql(CreateTable(t), engine)
    assert "committed TIMESTAMP OPTIONS (allow_commit_timestamp=true)" in ddl
    md.create_all(engine)
    stamp = sa.func.pending_commit_timestamp()
    with engine.begin() as conn:
        conn.execute(t.insert().values(id=1, name="a", committed=stamp))
        conn.execute(t.insert().values(id=2, name="b", committed=stamp))
    with engine.begin() as conn:
        conn.execute(t.insert().values(id=3, name="c", committed=stamp))
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t.c.id, t.c.committed).order_by(t.c.id)).all()
        options = info_schema(
            conn,
            "SELECT option_name, option_value FROM information_schema.column_options "
            "WHERE table_name = 'events' AND column_name = 'committed'",
        )
    assert options == [("allow_commit_timestamp", "TRUE")]
    first, second, third = (r.committed for r in rows)
    assert first == second < third  # one commit, one timestamp
    assert abs(dt.datetime.now(UTC) - third) < dt.timedelta(minutes=10)


def test_exclude_from_returning(engine: sa.Engine) -> None:
    md = sa.MetaData()
    t = commit_ts_table(md)
    md.create_all(engine)
    stmt = (
        t.insert()
        .values(id=1, name="a", committed=sa.func.pending_commit_timestamp())
        .returning(*t.c)
    )
    returning = sql(stmt, engine).partition(" THEN RETURN ")[2]
    assert returning.replace("events.", "") == "id, name"
    with engine.begin() as conn:
        returned = conn.execute(stmt).one()
    assert tuple(returned) == (1, "a")


# ------------------------------------------------------------------ foreign keys


def test_not_enforced_foreign_keys_render_offline(engine: sa.Engine) -> None:
    """The emulator refuses NOT ENFORCED foreign keys: the DDL is checked as SQL."""
    md = sa.MetaData()
    sa.Table("singers", md, sa.Column("id", sa.String(36), primary_key=True))
    albums = sa.Table(
        "albums",
        md,
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column(
            "singer_id",
            sa.String(36),
            sa.ForeignKey("singers.id", name="fk_singer", spanner_not_enforced=True),
        ),
        sa.Column("other_id", sa.String(36)),
        sa.ForeignKeyConstraint(
            ["other_id"], ["singers.id"], name="fk_other", spanner_not_enforced=True
        ),
    )
    ddl = sql(CreateTable(albums), engine)
    assert "CONSTRAINT fk_singer FOREIGN KEY(singer_id) REFERENCES singers (id) NOT ENFORCED" in ddl
    assert "CONSTRAINT fk_other FOREIGN KEY(other_id) REFERENCES singers (id) NOT ENFORCED" in ddl


def test_enforced_foreign_key(engine: sa.Engine) -> None:
    md = sa.MetaData()
    singers = sa.Table("singers", md, sa.Column("id", sa.String(36), primary_key=True))
    albums = sa.Table(
        "albums",
        md,
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("singer_id", sa.String(36), sa.ForeignKey("singers.id", name="fk_singer")),
    )
    md.create_all(engine)
    with engine.begin() as conn:
        conn.execute(singers.insert(), [{"id": "s1"}])
        conn.execute(albums.insert(), [{"id": "a1", "singer_id": "s1"}])
    with pytest.raises(sa.exc.SQLAlchemyError), engine.begin() as conn:
        conn.execute(albums.insert(), [{"id": "a2", "singer_id": "nobody"}])
    with engine.connect() as conn:
        fks = sa.inspect(conn).get_foreign_keys("albums")
        assert conn.execute(sa.select(sa.func.count()).select_from(albums)).scalar() == 1
    assert [(f["name"], f["constrained_columns"], f["referred_table"]) for f in fks] == [
        ("fk_singer", ["singer_id"], "singers")
    ]


# ------------------------------------------------------------------ ids: sequences, IDENTITY


def test_bit_reversed_sequence(engine: sa.Engine) -> None:
    md = sa.MetaData()
    seq = sa.Sequence("ticket_ids")
    t = sa.Table(
        "tickets",
        md,
        sa.Column("id", sa.BigInteger, seq, server_default=seq.next_value(), primary_key=True),
        sa.Column("what", sa.String(20)),
    )
    md.create_all(engine)
    with Session(engine) as s:
        insert = t.insert().returning(t.c.id)
        ids = [s.execute(insert.values(what=f"t{i}")).scalar() for i in range(5)]
        s.commit()
    with engine.connect() as conn:
        kinds = info_schema(
            conn,
            "SELECT o.option_value FROM information_schema.sequence_options o "
            "WHERE o.name = 'ticket_ids' AND o.option_name = 'sequence_kind'",
        )
        assert sorted(conn.execute(sa.select(t.c.id)).scalars()) == sorted(ids)
        direct = conn.execute(sa.select(seq.next_value())).scalar()
    assert kinds == [("bit_reversed_positive",)]
    assert len(set(ids + [direct])) == 6 and all(i > 0 for i in ids)


def test_identity_primary_key(engine: sa.Engine) -> None:
    class Base(DeclarativeBase):
        pass

    class Singer(Base):
        __tablename__ = "singers"
        id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)
        name: Mapped[str] = mapped_column(sa.String(50))

    ddl = sql(CreateTable(Singer.__table__), engine)
    assert "id INT64 NOT NULL GENERATED BY DEFAULT AS IDENTITY (BIT_REVERSED_POSITIVE)" in ddl
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        singers = [Singer(name=f"s{i}") for i in range(4)]
        s.add_all(singers)
        s.commit()
        ids = [x.id for x in singers]
    assert len(set(ids)) == 4 and all(i > 0 for i in ids)
    with Session(engine) as s:
        assert sorted(s.scalars(sa.select(Singer.name))) == ["s0", "s1", "s2", "s3"]


# ------------------------------------------------------------------ interleaving, indexes


def test_interleaved_tables(engine: sa.Engine) -> None:
    md = sa.MetaData()
    singers = sa.Table("singers", md, sa.Column("singer_id", sa.String(36), primary_key=True))
    albums = sa.Table(
        "albums",
        md,
        sa.Column("singer_id", sa.String(36), primary_key=True),
        sa.Column("album_id", sa.String(36), primary_key=True),
        sa.Column("title", sa.String(100)),
        spanner_interleave_in="singers",
        spanner_interleave_on_delete_cascade=True,
    )
    assert sql(CreateTable(albums), engine).endswith(
        "PRIMARY KEY (singer_id, album_id), INTERLEAVE IN PARENT singers ON DELETE CASCADE"
    )
    md.create_all(engine)
    with engine.begin() as conn:
        conn.execute(singers.insert(), [{"singer_id": "s1"}, {"singer_id": "s2"}])
        conn.execute(
            albums.insert(),
            [{"singer_id": s, "album_id": a, "title": s + a} for s in ("s1", "s2") for a in "ab"],
        )
    # a missing parent: the stock DB-API lets the client's NotFound through unwrapped
    # (sharded-orm raises IntegrityError, docs/dialect.md): either is refused here
    refused = pytest.raises((sa.exc.SQLAlchemyError, GoogleAPICallError))
    with refused, engine.begin() as conn:
        conn.execute(albums.insert(), [{"singer_id": "none", "album_id": "x", "title": "x"}])
    with engine.begin() as conn:
        conn.execute(singers.delete().where(singers.c.singer_id == "s1"))
    with engine.connect() as conn:
        left = conn.execute(sa.select(albums.c.title).order_by(albums.c.title)).scalars().all()
        parent = info_schema(
            conn,
            "SELECT parent_table_name, on_delete_action FROM information_schema.tables "
            "WHERE table_name = 'albums'",
        )
    assert left == ["s2a", "s2b"]
    assert parent == [("singers", "CASCADE")]


def test_index_keywords(engine: sa.Engine) -> None:
    md = sa.MetaData()
    singers = sa.Table("singers", md, sa.Column("singer_id", sa.String(36), primary_key=True))
    albums = sa.Table(
        "albums",
        md,
        sa.Column("singer_id", sa.String(36), primary_key=True),
        sa.Column("album_id", sa.String(36), primary_key=True),
        sa.Column("title", sa.String(100)),
        sa.Column("year", sa.BigInteger),
        spanner_interleave_in="singers",
    )
    ix = sa.Index(
        "albums_by_title",
        albums.c.singer_id,
        sa.desc(albums.c.title),
        spanner_storing=["year"],
        spanner_null_filtered=True,
        spanner_interleave_in="singers",
    )
    plain = sa.Index("albums_by_year", albums.c.year)
    assert sql(CreateIndex(ix), engine) == (
        "CREATE NULL_FILTERED INDEX albums_by_title ON albums (singer_id, title DESC) "
        "STORING (year), INTERLEAVE IN singers"
    )
    assert sql(CreateIndex(plain), engine) == "CREATE INDEX albums_by_year ON albums (year)"
    md.create_all(engine)
    with engine.begin() as conn:
        conn.execute(singers.insert(), [{"singer_id": "s1"}])
        conn.execute(
            albums.insert(),
            [
                {"singer_id": "s1", "album_id": "1", "title": "B", "year": 2001},
                {"singer_id": "s1", "album_id": "2", "title": None, "year": 2002},
                {"singer_id": "s1", "album_id": "3", "title": "A", "year": 2003},
            ],
        )
    with engine.connect() as conn:
        indexes = info_schema(
            conn,
            "SELECT index_name, is_null_filtered, parent_table_name "
            "FROM information_schema.indexes WHERE table_name = 'albums' ORDER BY index_name",
        )
        columns = info_schema(
            conn,
            "SELECT column_name, column_ordering FROM information_schema.index_columns "
            "WHERE index_name = 'albums_by_title' ORDER BY ordinal_position, column_name",
        )
        hinted = (
            sa.select(albums.c.title, albums.c.year)
            .with_hint(albums, "@{FORCE_INDEX=albums_by_title}", "spanner+spanner")
            .where(albums.c.singer_id == "s1", albums.c.title.is_not(None))
            .order_by(albums.c.title.desc())
        )
        assert "FROM albums @{FORCE_INDEX=albums_by_title}" in sql(hinted, engine)
        rows = conn.execute(
            hinted.with_hint(
                albums,
                "@{FORCE_INDEX=albums_by_title,"
                "spanner_emulator.disable_query_null_filtered_index_check=true}",
                "spanner+spanner",
            )
        ).all()
    assert indexes == [
        ("PRIMARY_KEY", False, ""),
        ("albums_by_title", True, "singers"),
        ("albums_by_year", False, ""),
    ]
    assert ("singer_id", "ASC") in columns and ("title", "DESC") in columns
    assert ("year", None) in columns  # stored
    assert [tuple(r) for r in rows] == [("B", 2001), ("A", 2003)]


# ------------------------------------------------------------------ upserts


def test_insert_or_update_and_insert_or_ignore(engine: sa.Engine) -> None:
    md = sa.MetaData()
    t = sa.Table(
        "singers",
        md,
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(50)),
    )
    md.create_all(engine)
    upsert = insert_or_update(t)
    ignore = insert_or_ignore(t)
    assert sql(upsert.values(id="1", name="x"), engine).startswith("INSERT OR UPDATE INTO singers")
    assert sql(ignore.values(id="1", name="x"), engine).startswith("INSERT OR IGNORE INTO singers")
    with engine.begin() as conn:
        conn.execute(t.insert(), [{"id": "1", "name": "one"}, {"id": "2", "name": "two"}])
    with engine.begin() as conn:
        conn.execute(upsert, [{"id": "1", "name": "ONE"}, {"id": "3", "name": "three"}])
        conn.execute(ignore, [{"id": "2", "name": "TWO"}, {"id": "4", "name": "four"}])
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t.c.id, t.c.name).order_by(t.c.id)).all()
    assert [tuple(r) for r in rows] == [("1", "ONE"), ("2", "two"), ("3", "three"), ("4", "four")]


# ------------------------------------------------------------------ types


def test_json(engine: sa.Engine) -> None:
    md = sa.MetaData()
    t = sa.Table(
        "venues",
        md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("description", sa.JSON),
    )
    md.create_all(engine)
    docs = [
        {"name": "Hall", "capacity": 1000, "tags": ["a", "b"], "open": True},
        [{"floor": 1}, {"floor": 2}],
        None,
    ]
    with engine.begin() as conn:
        conn.execute(t.insert(), [{"id": i, "description": d} for i, d in enumerate(docs)])
    with engine.connect() as conn:
        got = conn.execute(sa.select(t.c.description).order_by(t.c.id)).scalars().all()
        name = conn.execute(
            sa.select(t.c.id).where(sa.func.JSON_VALUE(t.c.description, "$.name") == "Hall")
        ).scalars()
        assert list(name) == [0]
    assert [None if g is None else dict(g) if isinstance(docs[i], dict) else list(g)
            for i, g in enumerate(got)] == docs  # fmt: skip


def test_pickle_type_with_spanner_pickle(engine: sa.Engine) -> None:
    md = sa.MetaData()
    t = sa.Table(
        "settings",
        md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("prefs", sa.PickleType(impl=spanner_dialect.SpannerPickleType)),
    )
    md.create_all(engine)
    value = {"theme": "dark", "langs": ["en", "fr"], "since": dt.date(2020, 1, 2)}
    with engine.begin() as conn:
        conn.execute(t.insert(), [{"id": 1, "prefs": value}, {"id": 2, "prefs": None}])
    with engine.connect() as conn:
        got = conn.execute(sa.select(t.c.prefs).order_by(t.c.id)).scalars().all()
        raw = conn.execute(sa.text("SELECT prefs FROM settings WHERE id = 1")).scalar()
    assert got == [value, None]
    assert raw is not None and raw != pickle.dumps(value)  # stored base64-encoded


def test_scalar_types_round_trip(engine: sa.Engine) -> None:
    md = sa.MetaData()
    t = sa.Table(
        "values_",
        md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("b", sa.Boolean),
        sa.Column("f64", sa.Float),
        sa.Column("f32", sa.REAL),
        sa.Column("n", sa.Numeric),
        sa.Column("s", sa.String(10)),
        sa.Column("txt", sa.Text),
        sa.Column("d", sa.Date),
        sa.Column("ts", sa.DateTime(timezone=True)),
        sa.Column("naive", sa.DateTime),
        sa.Column("arr", sa.ARRAY(sa.BigInteger)),
    )
    md.create_all(engine)
    row = {
        "id": 1,
        "b": True,
        "f64": 1.5,
        "f32": 2.25,
        "n": decimal.Decimal("12345.678901234"),
        "s": "héllo",
        "txt": "x" * 3000,
        "d": dt.date(1999, 12, 31),
        "ts": dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=UTC),
        "naive": dt.datetime(2024, 3, 1, 8, 30),
        "arr": [3, 1, 2],
    }
    with engine.begin() as conn:
        conn.execute(t.insert(), [row])
        conn.execute(t.insert(), [{"id": 2}])
    with engine.connect() as conn:
        got = conn.execute(sa.select(t).order_by(t.c.id)).all()
    first = got[0]._asdict()
    naive = first.pop("naive")
    assert first == {k: v for k, v in row.items() if k != "naive"}
    # stored as the UTC instant of the naive value, read back aware
    assert naive.replace(tzinfo=UTC) == row["naive"].replace(tzinfo=UTC)
    assert all(v is None for k, v in got[1]._asdict().items() if k != "id")


def test_computed_and_default_columns(engine: sa.Engine) -> None:
    md = sa.MetaData()
    t = sa.Table(
        "people",
        md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("first", sa.String(20)),
        sa.Column("last", sa.String(20)),
        sa.Column("full", sa.String(41), sa.Computed("CONCAT(first, ' ', last)")),
        sa.Column("kind", sa.String(10), server_default=sa.text("'person'")),
        sa.Column("created", sa.DateTime(timezone=True), server_default=sa.func.now()),
    )
    ddl = sql(CreateTable(t), engine)
    assert "full STRING(41) AS (CONCAT(first, ' ', last)) STORED" in ddl
    assert "kind STRING(10) DEFAULT ('person')" in ddl
    md.create_all(engine)
    with engine.begin() as conn:
        conn.execute(t.insert(), [{"id": 1, "first": "Ada", "last": "Lovelace"}])
    with engine.connect() as conn:
        row = conn.execute(sa.select(t.c.full, t.c.kind, t.c.created)).one()
    assert (row.full, row.kind) == ("Ada Lovelace", "person")
    assert row.created is not None


# ------------------------------------------------------------------ reads and transactions


def small_table(engine: sa.Engine) -> sa.Table:
    md = sa.MetaData()
    t = sa.Table(
        "singers",
        md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(50)),
    )
    md.create_all(engine)
    return t


def test_read_only_transactions(engine: sa.Engine) -> None:
    t = small_table(engine)
    with engine.begin() as conn:
        conn.execute(t.insert(), [{"id": 1, "name": "a"}])
    with Session(engine.execution_options(read_only=True)) as s:
        assert s.execute(sa.select(t.c.name)).scalars().all() == ["a"]
        s.commit()
    with (
        pytest.raises(sa.exc.SQLAlchemyError),
        engine.connect().execution_options(read_only=True) as conn,
    ):
        conn.execute(t.insert(), [{"id": 2, "name": "b"}])
        conn.commit()
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(t)).scalar() == 1


def test_stale_reads(engine: sa.Engine) -> None:
    t = small_table(engine)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        before = conn.execute(sa.select(sa.text("CURRENT_TIMESTAMP"))).scalar()
    with engine.begin() as conn:
        conn.execute(t.insert(), [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}])
    with Session(engine.execution_options(read_only=True)) as s:
        assert len(s.execute(sa.select(t)).all()) == 2
    past = engine.execution_options(read_only=True, staleness={"read_timestamp": before})
    with Session(past) as s:
        assert s.execute(sa.select(t)).all() == []
    bounded = engine.execution_options(
        isolation_level="AUTOCOMMIT", staleness={"max_staleness": {"seconds": 15}}
    )
    with bounded.connect() as conn:
        assert len(conn.execute(sa.select(t)).all()) in (0, 2)  # any state of the last 15 s
    with engine.connect() as conn:  # back to strong reads afterwards
        assert len(conn.execute(sa.select(t)).all()) == 2


def test_request_and_transaction_tags(engine: sa.Engine) -> None:
    t = small_table(engine)
    seen: list[tuple[Any, Any]] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, *args: Any) -> None:
        driver = conn.connection.driver_connection
        seen.append((getattr(cursor, "request_tag", None), driver.request_priority))

    tagged = engine.execution_options(transaction_tag="import-job", request_tag="insert-singer")
    with Session(tagged) as s:
        s.execute(t.insert(), [{"id": 1, "name": "a"}])
        s.commit()
    low = RequestOptions.Priority.PRIORITY_LOW
    with engine.connect().execution_options(request_tag="count", request_priority=low) as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(t)).scalar() == 1
    assert [tag for tag, _ in seen] == ["insert-singer", "count"]
    assert seen[-1][1] == low


@pytest.mark.parametrize("level", ["SERIALIZABLE", "REPEATABLE READ", "AUTOCOMMIT"])
def test_isolation_levels(url: str, level: str) -> None:
    engine = sa.create_engine(url, isolation_level=level)
    try:
        t = small_table(engine)
        with engine.connect() as conn:
            assert conn.get_isolation_level() == level
            conn.execute(t.insert(), [{"id": 1, "name": "a"}])
            conn.commit()
        other = "SERIALIZABLE" if level != "SERIALIZABLE" else "REPEATABLE READ"
        with Session(engine.execution_options(isolation_level=other)) as s:
            assert s.connection().get_isolation_level() == other
            s.execute(t.insert(), [{"id": 2, "name": "b"}])
            s.commit()
        with engine.connect() as conn:
            assert conn.execute(sa.select(t.c.id).order_by(t.c.id)).scalars().all() == [1, 2]
    finally:
        engine.dispose()


def test_rollback_discards(engine: sa.Engine) -> None:
    t = small_table(engine)
    with engine.connect() as conn:
        conn.execute(t.insert(), [{"id": 1, "name": "a"}])
        conn.rollback()
        conn.execute(t.insert(), [{"id": 2, "name": "b"}])
        conn.commit()
    with engine.connect() as conn:
        assert conn.execute(sa.select(t.c.id)).scalars().all() == [2]


def test_partitioned_dml(engine: sa.Engine) -> None:
    md = sa.MetaData()
    t = sa.Table(
        "venues",
        md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("active", sa.Boolean),
    )
    md.create_all(engine)
    with engine.begin() as conn:
        conn.execute(t.insert(), [{"id": i, "active": None if i % 5 else False} for i in range(50)])
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.connection.set_autocommit_dml_mode(AutocommitDmlMode.PARTITIONED_NON_ATOMIC)
        stmt = sa.text("UPDATE venues SET active = true WHERE active IS NULL")
        count = conn.execute(stmt).rowcount
        # the mode stays on the pooled DB-API connection (stock and ours): set it back
        conn.connection.set_autocommit_dml_mode(AutocommitDmlMode.TRANSACTIONAL)
    assert count >= 40  # a lower bound, as Partitioned DML reports
    with engine.connect() as conn:
        active = conn.execute(sa.select(t.c.active, sa.func.count()).group_by(t.c.active)).all()
    assert sorted(tuple(r) for r in active) == [(False, 10), (True, 40)]


def test_database_role(engine: sa.Engine, url: str) -> None:
    """The emulator has no roles (CREATE ROLE is refused) and ignores the one a session
    names: the role reaches the client's database, and reads and writes run."""
    t = small_table(engine)
    with engine.begin() as conn:
        conn.execute(t.insert(), [{"id": 1, "name": "a"}])
    as_reader = sa.create_engine(url, connect_args={"database_role": "reader"})
    try:
        with as_reader.connect() as conn:
            assert conn.connection.dbapi_connection.database.database_role == "reader"
            assert conn.execute(sa.select(t.c.name)).scalars().all() == ["a"]
    finally:
        as_reader.dispose()


def test_insertmany_and_limits(engine: sa.Engine) -> None:
    class Base(DeclarativeBase):
        pass

    class Track(Base):
        __tablename__ = "tracks"
        id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)
        title: Mapped[str] = mapped_column(sa.String(20))
        length: Mapped[int] = mapped_column(sa.BigInteger)

    Base.metadata.create_all(engine)
    with Session(engine) as s:
        tracks = [Track(title=f"t{i:03d}", length=i) for i in range(300)]
        s.add_all(tracks)
        s.commit()
        assert len({t.id for t in tracks}) == 300
    with Session(engine) as s:
        page = s.scalars(sa.select(Track.title).order_by(Track.title).limit(3).offset(10)).all()
        total = s.scalar(sa.select(sa.func.sum(Track.length)))
        found = s.scalars(sa.select(Track.length).where(Track.length.in_([5, 7, 400]))).all()
    assert page == ["t010", "t011", "t012"] and total == sum(range(300))
    assert sorted(found) == [5, 7]


def test_reflection(engine: sa.Engine) -> None:
    md = sa.MetaData()
    sa.Table("singers", md, sa.Column("singer_id", sa.String(36), primary_key=True))
    sa.Table(
        "albums",
        md,
        sa.Column("singer_id", sa.String(36), primary_key=True),
        sa.Column("album_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("title", sa.String(100), nullable=False),
        sa.Column("price", sa.Numeric),
        sa.Index("albums_by_title", "title", unique=True),
        spanner_interleave_in="singers",
    )
    md.create_all(engine)
    insp = sa.inspect(engine)
    assert sorted(insp.get_table_names()) == ["albums", "singers"]
    assert insp.has_table("albums") and not insp.has_table("nope")
    assert insp.get_pk_constraint("albums")["constrained_columns"] == ["singer_id", "album_id"]
    cols = {c["name"]: c for c in insp.get_columns("albums")}
    assert list(cols) == ["singer_id", "album_id", "title", "price"]
    assert cols["title"]["nullable"] is False and cols["price"]["nullable"] is True
    assert isinstance(cols["album_id"]["type"], sa.BigInteger)
    (ix,) = insp.get_indexes("albums")
    assert (ix["name"], ix["column_names"], ix["unique"]) == ("albums_by_title", ["title"], True)
    reflected = sa.Table("albums", sa.MetaData(), autoload_with=engine)
    assert [c.name for c in reflected.primary_key] == ["singer_id", "album_id"]
