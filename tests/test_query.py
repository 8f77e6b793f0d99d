"""Sharded queries: the SQL they send, and the rows they return against an oracle."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from google.api_core.exceptions import GoogleAPICallError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from seed_models import LogEntry, Sharded
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import (
    ShardConfigError,
    ShardedIndex,
    ShardTypeError,
    UTCDateTime,
    compute_shard,
    shard_column,
)
from sharded_orm.merge import MergeStats, merged
from sharded_orm.pagination import CursorError, page
from sharded_orm.query import expand, sharded_select
from sharded_orm.spanner.dialect import SpannerDialect

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)


def by_company() -> sa.Select[Any]:
    return (
        sharded_select(LogEntry, index="LogEntriesByCompany")
        .where(LogEntry.company_id == "Acme", LogEntry.ts > T0, LogEntry.ts < T0 + dt.timedelta(1))
        .order_by(LogEntry.ts.desc())
    )


# ----------------------------------------------------------------------------- SQL shape


def test_expanded_sql_on_spanner_has_hint_and_all_shards() -> None:
    sql = str(expand(by_company(), SpannerDialect()).compile(dialect=SpannerDialect()))
    assert "FROM `LogEntries` @{FORCE_INDEX=LogEntriesByCompany}" in sql
    assert "`LogEntries`.`EntryShardId` BETWEEN" in sql


def test_no_hint_elsewhere() -> None:
    dialect = sa.create_engine("sqlite://").dialect
    sql = str(expand(by_company(), dialect).compile(dialect=dialect))
    assert "FORCE_INDEX" not in sql and '"EntryShardId" BETWEEN' in sql


def test_point_lookup_hits_one_shard() -> None:
    stmt = sharded_select(LogEntry, index="LogEntriesByCompany").where(
        LogEntry.company_id == "Acme", LogEntry.ts == T0
    )
    compiled = expand(stmt, SpannerDialect()).compile(dialect=SpannerDialect())
    assert "`LogEntries`.`EntryShardId` = " in str(compiled)
    assert compute_shard(("Acme", T0), 10) in compiled.params.values()


def test_sql_sent_shows_hint_and_predicate(mock_spanner: Any) -> None:
    engine = mock_spanner.engine()
    # nothing registered: the mock refuses the query, but records what arrived
    with pytest.raises((sa.exc.DBAPIError, GoogleAPICallError)), engine.connect() as conn:
        conn.execute(by_company()).all()
    sent = [s for s in mock_spanner.executed_sql() if "LogEntries" in s]
    assert sent  # (the client retries once: the same text twice)
    for text in sent:
        assert "FROM `LogEntries` @{FORCE_INDEX=LogEntriesByCompany}" in text
        assert "`LogEntries`.`EntryShardId` BETWEEN @a" in text
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
        one = s.scalars(
            sharded_select(LogEntry, index="LogEntriesByCompany").where(
                LogEntry.company_id == "Acme", LogEntry.ts == T0 + dt.timedelta(minutes=3)
            )
        ).all()
        assert [e.user_id for e in one] == ["u3"]


# ----------------------------------------------------------------------------- bad input


def test_unknown_index_and_index_without_shard() -> None:
    with pytest.raises(ShardConfigError, match="no index named 'Nope'"):
        sharded_select(LogEntry, index="Nope")

    class B(DeclarativeBase):
        pass

    class M(B):
        __tablename__ = "m"
        id: Mapped[int] = mapped_column(primary_key=True)
        ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
        __table_args__ = (sa.Index("m_by_ts", "ts"),)

    with pytest.raises(ShardConfigError, match="not led by a shard column"):
        sharded_select(M, index="m_by_ts")
    with pytest.raises(ShardConfigError, match="primary key of 'm' is not led by a shard"):
        sharded_select(M)


@pytest.mark.parametrize("name", ["ix}; DROP TABLE x", "1ix", "a b", "", "ix@{X=1}"])
def test_hint_names_must_be_identifiers(name: str) -> None:
    with pytest.raises(ShardConfigError, match="not a plain identifier"):
        sharded_select(LogEntry, index=name)


@pytest.mark.parametrize(
    ("limit", "error"),
    [(0, ShardConfigError), (-3, ShardConfigError), (2.5, ShardTypeError), (True, ShardTypeError)],
)
def test_bad_limits(limit: Any, error: type[Exception]) -> None:
    eng = sa.create_engine("sqlite://")
    Sharded.metadata.create_all(eng)
    with eng.connect() as conn:
        with pytest.raises(error):
            merged(conn, by_company(), limit)
        with pytest.raises(error):
            page(conn, by_company(), limit)


def test_order_the_index_cannot_serve() -> None:
    eng = sa.create_engine("sqlite://")
    Sharded.metadata.create_all(eng)
    stmt = sharded_select(LogEntry, index="LogEntriesByCompany").order_by(LogEntry.user_id)
    with eng.connect() as conn, pytest.raises(ShardConfigError, match="ORDER BY cannot be served"):
        merged(conn, stmt, 5)


def test_cursors_from_elsewhere_are_refused() -> None:
    eng = sa.create_engine("sqlite://")
    Sharded.metadata.create_all(eng)
    with eng.begin() as conn:
        conn.execute(
            LogEntry.__table__.insert(),
            [
                {"CompanyId": "Acme", "UserId": f"u{i}", "Timestamp": T0 + dt.timedelta(seconds=i)}
                for i in range(1, 10)
            ],
        )
    with eng.connect() as conn:
        first = page(conn, by_company(), 3)
        assert first.next_cursor is not None
        other = by_company().where(LogEntry.user_id != "u1")
        with pytest.raises(CursorError, match="another query"):
            page(conn, other, 3, first.next_cursor)
        tampered = first.next_cursor[:-2] + ("A" if first.next_cursor[-2] != "A" else "B") + "x"
        with pytest.raises(CursorError):
            page(conn, by_company(), 3, tampered)
        with pytest.raises(CursorError):
            page(conn, by_company(), 3, "not-a-cursor")


# ----------------------------------------------------------------------------- oracle


class OracleBase(DeclarativeBase):
    pass


def _event_model(n: int) -> type:
    return type(
        f"Ev{n}",
        (OracleBase,),
        {
            "__tablename__": f"ev{n}",
            "__annotations__": {"id": Mapped[int], "ts": Mapped[dt.datetime], "s": Mapped[int]},
            "id": mapped_column(primary_key=True, autoincrement=False),
            "ts": mapped_column(UTCDateTime),
            "s": shard_column("id", count=n),
            "__table_args__": (ShardedIndex(f"ev{n}_by_ts", sa.desc("ts"), shard="s"),),
        },
    )


MODELS = {n: _event_model(n) for n in (1, 3, 8)}

examples = st.fixed_dictionaries(
    {
        "n": st.sampled_from(sorted(MODELS)),
        # few distinct timestamps: many ties across shards
        "ts": st.lists(st.integers(0, 12), min_size=0, max_size=40),
        "lo": st.integers(-1, 12),
        "span": st.integers(0, 14),
        "limit": st.integers(1, 45),
        "page": st.integers(1, 9),
    }
)


def check_against_oracle(conn: sa.Connection, ex: dict[str, Any]) -> None:
    model = MODELS[ex["n"]]
    t = model.__table__
    for m in MODELS.values():
        conn.execute(sa.delete(m.__table__).where(sa.true()))
    if ex["ts"]:
        conn.execute(
            t.insert(),
            [{"id": i, "ts": T0 + dt.timedelta(seconds=s)} for i, s in enumerate(ex["ts"])],
        )
    lo = T0 + dt.timedelta(seconds=ex["lo"])
    hi = lo + dt.timedelta(seconds=ex["span"])
    stmt = sharded_select(model, index=f"ev{ex['n']}_by_ts").where(t.c.ts >= lo, t.c.ts < hi)
    oracle = [
        tuple(r)
        for r in conn.execute(
            sa.select(t).where(t.c.ts >= lo, t.c.ts < hi).order_by(t.c.ts.desc(), t.c.id)
        )
    ]
    stats = MergeStats()
    assert [tuple(r) for r in merged(conn, stmt, ex["limit"], stats=stats)] == oracle[: ex["limit"]]
    pages: list[tuple[Any, ...]] = []
    cursor = None
    for _ in range(len(oracle) + 2):
        p = page(conn, stmt, ex["page"], cursor)
        pages.extend(tuple(r) for r in p.rows)
        cursor = p.next_cursor
        if cursor is None:
            break
    assert pages == oracle


@pytest.fixture(scope="module")
def sqlite_oracle_engine() -> Iterator[sa.Engine]:
    eng = sa.create_engine("sqlite://")
    OracleBase.metadata.create_all(eng)
    yield eng
    eng.dispose()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ex=examples)
def test_oracle_on_sqlite(sqlite_oracle_engine: sa.Engine, ex: dict[str, Any]) -> None:
    with sqlite_oracle_engine.begin() as conn:
        check_against_oracle(conn, ex)


@pytest.mark.emulator
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ex=examples)
def test_oracle_on_the_emulator(spanner_engine: sa.Engine, ex: dict[str, Any]) -> None:
    if not sa.inspect(spanner_engine).get_table_names():
        OracleBase.metadata.create_all(spanner_engine)
    with spanner_engine.begin() as conn:
        check_against_oracle(conn, ex)
