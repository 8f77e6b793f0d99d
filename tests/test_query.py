"""sharded_select: the SQL it sends (shard predicate, point lookups, FORCE_INDEX) and its
refusals."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa
from google.api_core.exceptions import GoogleAPICallError
from seed_models import Event, LogEntry, Sharded
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, aliased, mapped_column

from sharded_orm import (
    ShardConfigError,
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
    return str(expand(stmt, SpannerDialect()).compile(dialect=SpannerDialect()))


# ----------------------------------------------------------------------------- SQL shape


def test_spanner_sql_has_hint_and_every_shard() -> None:
    compiled = expand(by_company(), SpannerDialect()).compile(dialect=SpannerDialect())
    assert "FROM `LogEntries` @{FORCE_INDEX=LogEntriesByCompany}" in str(compiled)
    assert "`LogEntries`.`EntryShardId` BETWEEN :EntryShardId_1 AND :EntryShardId_2" in str(
        compiled
    )
    assert (compiled.params["EntryShardId_1"], compiled.params["EntryShardId_2"]) == (0, 9)


def test_no_hint_on_other_dialects() -> None:
    dialect = sa.create_engine("sqlite://").dialect
    sql = str(expand(by_company(), dialect).compile(dialect=dialect))
    assert "FORCE_INDEX" not in sql and '"EntryShardId" BETWEEN' in sql


def test_primary_key_plan_has_no_hint() -> None:
    # index=None: the shard column leading the key; no index to force
    sql = spanner_sql(sharded_select(Event).where(Event.kind == "click"))
    assert "FORCE_INDEX" not in sql and "`Events`.`ShardId` BETWEEN" in sql


def test_point_lookup_reads_one_shard() -> None:
    stmt = sharded_select(LogEntry, index="LogEntriesByCompany").where(
        LogEntry.company_id == "Acme", LogEntry.ts == T0
    )
    compiled = expand(stmt, SpannerDialect()).compile(dialect=SpannerDialect())
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


def test_merge_sends_one_hinted_branch_per_shard(mock_spanner: Any) -> None:
    engine = mock_spanner.engine()
    with pytest.raises((sa.exc.DBAPIError, GoogleAPICallError)), engine.connect() as conn:
        merged(conn, by_company(), 20)
    text = [s for s in mock_spanner.executed_sql() if "LogEntries" in s][0]
    assert text.count("FROM `LogEntries` @{FORCE_INDEX=LogEntriesByCompany}") == 10
    assert text.count("UNION ALL") == 9
    assert text.count("`LogEntries`.`EntryShardId` = @") == 10
    assert "BETWEEN" not in text
    engine.dispose()


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
        sa.Column("id", sa.Integer, primary_key=True),
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
