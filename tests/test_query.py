"""sharded_select: the SQL it sends (shard predicate, point lookups, FORCE_INDEX) and its
refusals."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any

import pytest
import sqlalchemy as sa
from google.api_core.exceptions import GoogleAPICallError
from seed_models import Event, LogEntry, Sharded
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, aliased, mapped_column

from sharded_orm import (
    ShardConfigError,
    ShardedIndex,
    ShardTypeError,
    UTCDateTime,
    compute_shard,
    merged,
    shard_column,
    sharded_select,
)
from sharded_orm.read.merge import MergeStats
from sharded_orm.read.plan import expand
from sharded_orm.spanner.dialect import SpannerDialect

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)


def by_company() -> sa.Select[Any]:
    return (
        sharded_select(LogEntry, index="LogEntriesByCompany")
        .where(LogEntry.company_id == "Acme", LogEntry.ts > T0, LogEntry.ts < T0 + dt.timedelta(1))
        .order_by(LogEntry.ts.desc())
    )


def spanner_sql(stmt: Any) -> str:
    return str(stmt.compile(dialect=SpannerDialect()))


# ----------------------------------------------------------------------------- SQL shape


def test_spanner_sql_has_hint_and_every_shard() -> None:
    # the statement itself, not a rewritten copy: str() shows what runs
    compiled = by_company().compile(dialect=SpannerDialect())
    assert "FROM `LogEntries` @{FORCE_INDEX=LogEntriesByCompany}" in str(compiled)
    assert "`LogEntries`.`EntryShardId` BETWEEN :EntryShardId_1 AND :EntryShardId_2" in str(
        compiled
    )
    assert (compiled.params["EntryShardId_1"], compiled.params["EntryShardId_2"]) == (0, 9)


def test_no_hint_on_other_dialects() -> None:
    dialect = sa.create_engine("sqlite://").dialect
    sql = str(by_company().compile(dialect=dialect))
    assert "FORCE_INDEX" not in sql and '"EntryShardId" BETWEEN' in sql


def test_primary_key_plan_has_no_hint() -> None:
    # index=None: the shard column leading the key; no index to force
    sql = spanner_sql(sharded_select(Event).where(Event.kind == "click"))
    assert "FORCE_INDEX" not in sql and "`Events`.`ShardId` BETWEEN" in sql


def test_point_lookup_reads_one_shard() -> None:
    stmt = sharded_select(LogEntry, index="LogEntriesByCompany").where(
        LogEntry.company_id == "Acme", LogEntry.ts == T0
    )
    compiled = stmt.compile(dialect=SpannerDialect())
    assert "`LogEntries`.`EntryShardId` = :EntryShardId_1" in str(compiled)
    assert "BETWEEN" not in str(compiled)
    assert compiled.params["EntryShardId_1"] == compute_shard(("Acme", T0), 10)


def test_a_range_on_a_source_is_not_a_point_lookup() -> None:
    stmt = sharded_select(LogEntry, index="LogEntriesByCompany").where(
        LogEntry.company_id == "Acme", LogEntry.ts >= T0
    )
    assert "`EntryShardId` BETWEEN" in spanner_sql(stmt)


def test_point_lookup_from_execution_parameters() -> None:
    # bindparam values given at execute time count too (the hook sees them)
    stmt = sharded_select(LogEntry, index="LogEntriesByCompany").where(
        LogEntry.company_id == sa.bindparam("c"), LogEntry.ts == sa.bindparam("t")
    )
    new = expand(stmt, SpannerDialect(), {"c": "Acme", "t": T0})
    compiled = new.compile(dialect=SpannerDialect())
    assert compiled.params["EntryShardId_1"] == compute_shard(("Acme", T0), 10)
    assert "BETWEEN" in spanner_sql(stmt)  # unknown values: every shard


def test_sql_sent_shows_hint_and_predicate(mock_spanner: Any) -> None:
    engine = mock_spanner.engine()
    # nothing registered: the mock refuses the query, but records what arrived
    with pytest.raises((sa.exc.DBAPIError, GoogleAPICallError)), engine.connect() as conn:
        conn.execute(by_company()).all()
    sent = [s for s in mock_spanner.executed_sql() if "LogEntries" in s]
    assert sent
    for text in sent:
        assert "FROM `LogEntries` @{FORCE_INDEX=LogEntriesByCompany}" in text
        assert "`LogEntries`.`EntryShardId` BETWEEN @a" in text
    engine.dispose()


def test_merge_sends_one_hinted_correlated_branch_for_every_shard(mock_spanner: Any) -> None:
    # on Spanner the N branches are one correlated subquery over GENERATE_ARRAY(0, N-1):
    # the text does not grow with N (the DB-API's sqlparse pass is most of a read's CPU)
    engine = mock_spanner.engine()
    with pytest.raises((sa.exc.DBAPIError, GoogleAPICallError)), engine.connect() as conn:
        merged(conn, by_company(), 200)  # N*K = 2000: the bound round comes first
    text = [s for s in mock_spanner.executed_sql() if "LogEntries" in s][0]
    assert text.count("FROM `LogEntries` @{FORCE_INDEX=LogEntriesByCompany}") == 1
    assert "UNION ALL" not in text
    assert "(UNNEST(GENERATE_ARRAY(0, 9)) AS so_shard_n CROSS JOIN UNNEST(ARRAY(SELECT AS" in text
    assert text.count("`LogEntries`.`EntryShardId` = so_shard_n") == 1
    assert "BETWEEN" not in text
    engine.dispose()


@pytest.mark.emulator
def test_the_rows_statement_finds_rows_by_key_not_through_the_index(
    spanner_engine: sa.Engine,
) -> None:
    # the rows statement joins the user's statement on the primary key to the branches,
    # which carry the hint and the shard predicate; on the outer table the hint would
    # make Spanner find each row through the index (reading the range), and the predicate
    # would be text the DB-API parses for nothing
    Sharded.metadata.create_all(spanner_engine, tables=[LogEntry.__table__])
    with Session(spanner_engine) as s:
        s.add_all(
            LogEntry(company_id="Acme", user_id=f"u{i}", ts=T0 + dt.timedelta(minutes=i))
            for i in range(40)
        )
        s.commit()
    sent: list[str] = []

    def _keep(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    sa.event.listen(spanner_engine, "before_cursor_execute", _keep)
    try:
        with Session(spanner_engine) as s:
            truth = s.scalars(by_company().limit(200)).all()
            sent.clear()
            stats = MergeStats()
            got = merged(s, by_company(), 200, stats=stats)  # one statement (the probe)
    finally:
        sa.event.remove(spanner_engine, "before_cursor_execute", _keep)
    assert [e.user_id for e in got] == [e.user_id for e in truth] and len(got) == 39
    assert stats.statements == len(sent) == 1
    rows = sent[0]
    assert rows.count("@{FORCE_INDEX=LogEntriesByCompany}") == 1  # in the branches only
    assert "BETWEEN" not in rows and rows.count("`EntryShardId` = so_shard_n") == 1
    assert "JOIN (UNNEST(GENERATE_ARRAY(0, 9)) AS so_shard_n CROSS JOIN UNNEST(ARRAY(" in rows
    # the WHERE clause is the branches' (each row joined passed it there)
    assert rows.count("`CompanyId` = %s") == 1


def test_rows_on_the_backend(engine: sa.Engine) -> None:
    Sharded.metadata.create_all(engine)
    with Session(engine) as s:
        s.add_all(
            LogEntry(company_id=c, user_id=f"u{i}", ts=T0 + dt.timedelta(minutes=i))
            for i in range(30)
            for c in ("Acme", "Other")
        )
        s.commit()
        got = s.scalars(by_company().limit(5)).all()
        assert [e.ts for e in got] == [T0 + dt.timedelta(minutes=m) for m in (29, 28, 27, 26, 25)]
        assert {e.company_id for e in got} == {"Acme"}
        point = sharded_select(LogEntry, index="LogEntriesByCompany").where(
            LogEntry.company_id == "Acme", LogEntry.ts == T0 + dt.timedelta(minutes=3)
        )
        assert [e.user_id for e in s.scalars(point)] == ["u3"]
        stats = MergeStats()
        assert [e.user_id for e in merged(s, point, 5, stats=stats)] == ["u3"]
        # the point lookup's merge read one shard, once
        assert stats.statements == 1
        assert list(stats.rounds[0]) == [compute_shard(("Acme", T0 + dt.timedelta(minutes=3)), 10)]


# ----------------------------------------------------------------------------- bad input


class B(DeclarativeBase):
    pass


class Unsharded(B):
    __tablename__ = "unsharded"
    id: Mapped[int] = mapped_column(primary_key=True)
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    __table_args__ = (sa.Index("unsharded_by_ts", "ts"),)


def test_unknown_index() -> None:
    with pytest.raises(ShardConfigError, match="no index named 'Nope'.*LogEntriesByCompany"):
        sharded_select(LogEntry, index="Nope")


def test_index_or_key_without_shard_column() -> None:
    with pytest.raises(ShardConfigError, match="not led by a shard column"):
        sharded_select(Unsharded, index="unsharded_by_ts")
    with pytest.raises(ShardConfigError, match="primary key of 'unsharded' is not led by a shard"):
        sharded_select(Unsharded)


def test_a_plain_index_led_by_a_shard_column_works() -> None:
    t = sa.Table(
        "plain",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("ts", UTCDateTime),
        shard_column("id", count=4, name="s").column,
    )
    sa.Index("plain_by_ts", t.c.s, t.c.ts.desc())
    sql = spanner_sql(sharded_select(t, index="plain_by_ts"))
    assert "@{FORCE_INDEX=plain_by_ts}" in sql and "plain.s BETWEEN" in sql


@pytest.mark.parametrize("name", ["ix}; DROP TABLE x", "1ix", "a b", "", "ix@{X=1}", "ix\n", 3])
def test_hint_names_must_be_identifiers(name: Any) -> None:
    with pytest.raises(ShardConfigError, match="not a plain identifier"):
        sharded_select(LogEntry, index=name)


def test_entity_must_be_a_mapped_class_or_table() -> None:
    with pytest.raises(ShardTypeError, match="an alias"):
        sharded_select(aliased(LogEntry))
    with pytest.raises(ShardTypeError, match="mapped class or a Table"):
        sharded_select("LogEntries")


# ----------------------------------------------------------------------------- composition


def test_print_shows_the_predicate() -> None:
    # issue 16: the predicate is part of the statement, not added at execution only
    text = str(by_company())
    assert '"LogEntries"."EntryShardId" BETWEEN' in text


def compositions() -> dict[str, Any]:
    stmt = by_company()
    sub = stmt.subquery()
    cte = stmt.cte("recent")
    return {
        "subquery": sa.select(sub.c.UserId).order_by(sub.c.UserId),
        "cte": sa.select(cte.c.UserId).order_by(cte.c.UserId),
        "count": sa.select(sa.func.count()).select_from(stmt.subquery()),
        "union": sa.union_all(
            stmt.with_only_columns(LogEntry.user_id).order_by(None),
            sharded_select(LogEntry, index="LogEntriesByCompany")
            .with_only_columns(LogEntry.user_id)
            .where(LogEntry.company_id == "Other"),
        ),
    }


@pytest.mark.parametrize("name", ["subquery", "cte", "count", "union"])
def test_compositions_show_predicate_and_hint(name: str) -> None:
    sql = spanner_sql(compositions()[name])
    assert "@{FORCE_INDEX=LogEntriesByCompany}" in sql
    assert "`LogEntries`.`EntryShardId` BETWEEN" in sql


@pytest.mark.parametrize("name", ["subquery", "cte", "count", "union"])
def test_compositions_send_predicate_and_hint(mock_spanner: Any, name: str) -> None:
    engine = mock_spanner.engine()
    with pytest.raises((sa.exc.DBAPIError, GoogleAPICallError)), engine.connect() as conn:
        conn.execute(compositions()[name]).all()
    sent = [s for s in mock_spanner.executed_sql() if "LogEntries" in s]
    assert sent
    for text in sent:
        assert "FROM `LogEntries` @{FORCE_INDEX=LogEntriesByCompany}" in text
        assert "`LogEntries`.`EntryShardId` BETWEEN @" in text
    engine.dispose()


def test_compositions_give_the_oracle_rows(engine: sa.Engine) -> None:
    Sharded.metadata.create_all(engine)
    with Session(engine) as s:
        s.add_all(
            LogEntry(company_id=c, user_id=f"u{i:02}", ts=T0 + dt.timedelta(hours=i))
            for i in range(30)
            for c in ("Acme", "Other")
        )
        s.commit()
    cond = [LogEntry.company_id == "Acme", LogEntry.ts > T0, LogEntry.ts < T0 + dt.timedelta(1)]
    acme = [f"u{i:02}" for i in range(1, 24)]
    with engine.connect() as conn:
        got = {name: conn.execute(stmt).all() for name, stmt in compositions().items()}
        plain = sa.select(LogEntry.user_id).where(*cond)
        other = sa.select(LogEntry.user_id).where(LogEntry.company_id == "Other")
        assert [r[0] for r in got["subquery"]] == acme == [r[0] for r in got["cte"]]
        assert got["count"] == [(len(acme),)]
        assert sorted(r[0] for r in got["union"]) == sorted(
            [r[0] for r in conn.execute(plain)] + [r[0] for r in conn.execute(other)]
        )


def test_point_lookups_are_cached_per_shard(engine: sa.Engine) -> None:
    """Two executions of one statement shape with different point values read different
    shards: the shard is part of the cache key, never frozen into a shared compiled form."""
    Sharded.metadata.create_all(engine)
    with Session(engine) as s:
        s.add_all(LogEntry(company_id=f"c{i}", user_id="u", ts=T0) for i in range(12))
        s.commit()
        for i in range(12):
            stmt = sharded_select(LogEntry, index="LogEntriesByCompany").where(
                LogEntry.company_id == f"c{i}", LogEntry.ts == T0
            )
            assert stmt.point_shard == compute_shard((f"c{i}", T0), 10)
            assert [e.company_id for e in s.scalars(stmt)] == [f"c{i}"]


def test_point_lookup_from_execution_parameters_runs(engine: sa.Engine) -> None:
    Sharded.metadata.create_all(engine)
    with Session(engine) as s:
        s.add_all(LogEntry(company_id=f"c{i}", user_id="u", ts=T0) for i in range(6))
        s.commit()
        stmt = sharded_select(LogEntry, index="LogEntriesByCompany").where(
            LogEntry.company_id == sa.bindparam("c"), LogEntry.ts == sa.bindparam("t")
        )
        assert stmt.point_shard is None  # unknown until execution
        for i in range(6):
            got = s.scalars(stmt, {"c": f"c{i}", "t": T0}).all()
            assert [e.company_id for e in got] == [f"c{i}"]


# ----------------------------------------------------------------------------- item 7


class Color(str, enum.Enum):
    RED = "red"


class P(DeclarativeBase):
    pass


class Loose(P):
    """Sources the database compares after conversion or collation."""

    __tablename__ = "loose"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    company: Mapped[str] = mapped_column(sa.String(20, collation="NOCASE"))
    flag: Mapped[bool] = mapped_column(sa.Boolean)
    n: Mapped[int] = mapped_column(sa.Integer)
    color: Mapped[str] = mapped_column(sa.String(10))
    u: Mapped[str] = mapped_column(sa.Uuid(as_uuid=False))
    s_company: Mapped[int] = shard_column("company", count=16)
    s_flag: Mapped[int] = shard_column("flag", count=16)
    s_n: Mapped[int] = shard_column("n", count=16)
    s_color: Mapped[int] = shard_column("color", count=16)
    s_u: Mapped[int] = shard_column("u", count=16)
    __table_args__ = tuple(
        ShardedIndex(f"loose_by_{c}", c, shard=f"s_{c}")
        for c in ("company", "flag", "n", "color", "u")
    )


U = "15B7BD1F-8473-4F3C-9A31-6E3C1D1E0F01"


@pytest.mark.parametrize(
    ("column", "cond", "pruned"),
    [
        ("company", lambda: Loose.company == "ACME", False),  # NOCASE: read every shard
        ("flag", lambda: Loose.flag == 1, True),  # stored true: hash True
        ("n", lambda: Loose.n == "01", False),  # the database converts '01': every shard
        ("n", lambda: Loose.n == 1.0, False),  # a float literal: every shard, no error
        ("color", lambda: Loose.color == Color.RED, True),  # stored 'red'
        ("u", lambda: Loose.u == U, True),  # stored lower-case
    ],
)
def test_point_lookup_hashes_what_the_database_compares(
    column: str, cond: Any, pruned: bool
) -> None:
    """Issue 11 items 7 and 10: the lookup used to hash the Python literal and filter out
    the row (or raise ShardTypeError for 1.0)."""
    eng = sa.create_engine("sqlite://")
    P.metadata.create_all(eng)
    with Session(eng) as s:
        s.add(Loose(id=1, company="Acme", flag=True, n=1, color="red", u=U.lower()))
        s.commit()
        stmt = sharded_select(Loose, index=f"loose_by_{column}").where(cond())
        assert (stmt.point_shard is not None) == pruned
        plain = [e.id for e in s.scalars(sa.select(Loose).where(cond()))]
        assert plain == ([] if column == "u" else [1])  # SQLite compares UUID text as is
        assert [e.id for e in s.scalars(stmt)] == plain
        assert [e.id for e in merged(s, stmt, 5)] == plain
    eng.dispose()


class SsU(P):
    __tablename__ = "SsU"
    shard: Mapped[int] = shard_column(
        "u", count=16, algorithm="farm_fingerprint", server_side=True, primary_key=True
    )
    u: Mapped[str] = mapped_column(sa.Uuid(as_uuid=False), primary_key=True)
    color: Mapped[str] = mapped_column(sa.String(10))


@pytest.mark.emulator
def test_point_lookup_on_server_side_shards(spanner_engine: sa.Engine) -> None:
    """The server rebuilds the canonical UUID text from whatever the column holds (here
    what the driver was sent), so the lookup prunes to one shard and finds the row."""
    SsU.__table__.create(spanner_engine)
    with Session(spanner_engine) as s:
        s.add(SsU(u=U, color=Color.RED))
        s.commit()
        stmt = sharded_select(SsU).where(SsU.u == U)
        assert stmt.point_shard is not None
        # stored as written (case kept): the caller's own literal finds it, sharded or not
        plain = [e.color for e in s.scalars(sa.select(SsU).where(SsU.u == U))]
        assert [e.color for e in s.scalars(stmt)] == plain == ["red"]
        lower = sharded_select(SsU).where(SsU.u == U.lower())
        plain_lower = [e.color for e in s.scalars(sa.select(SsU).where(SsU.u == U.lower()))]
        assert [e.color for e in s.scalars(lower)] == plain_lower
        assert [e.color for e in s.scalars(sharded_select(SsU).where(SsU.color == Color.RED))] == [
            "red"
        ]
