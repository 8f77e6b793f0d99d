"""merged(): how few rows it reads, and what it refuses."""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from seed_models import LogEntry, Sharded
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import (
    MergeStats,
    ShardConfigError,
    ShardedIndex,
    ShardTypeError,
    UTCDateTime,
    get_shard_column,
    merged,
    page,
    shard_column,
    sharded_select,
)
from sharded_orm.read.branches import SINGLE_STATEMENT_READS, FoundBound
from sharded_orm.read.merge import order_columns

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


class B(DeclarativeBase):
    pass


class Ev16(B):
    __tablename__ = "ev16"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    kind: Mapped[str] = mapped_column(sa.String(8))
    s: Mapped[int] = shard_column("id", count=16)
    __table_args__ = (ShardedIndex("ev16_by_ts", sa.desc("ts"), shard="s"),)


class Kind(B):
    __tablename__ = "kinds"
    name: Mapped[str] = mapped_column(sa.String(8), primary_key=True)


@pytest.fixture(scope="module")
def conn() -> Iterator[sa.Connection]:
    eng = sa.create_engine("sqlite://")
    B.metadata.create_all(eng)
    Sharded.metadata.create_all(eng)
    rng = random.Random(5)
    with eng.begin() as c:
        c.execute(
            Ev16.__table__.insert(),
            [
                {"id": i, "ts": T0 + dt.timedelta(seconds=rng.randrange(10**6)), "kind": "a"}
                for i in range(4000)
            ],
        )
    with eng.connect() as c:
        yield c
    eng.dispose()


def newest() -> Any:
    return sharded_select(Ev16, index="ev16_by_ts").order_by(Ev16.ts.desc())


@pytest.mark.parametrize("k", [1, 7, 16, 17, 50, 100, 333, 1000])
def test_two_statements_and_at_most_2k_rows(conn: sa.Connection, k: int) -> None:
    stats = MergeStats()
    rows = merged(conn, newest(), k, stats=stats)
    t = Ev16.__table__
    truth = conn.execute(sa.select(t).order_by(t.c.ts.desc(), t.c.id).limit(k)).all()
    assert rows == truth
    assert stats.statements <= 2 and len(stats.rounds) <= 2
    assert stats.rows_transferred <= 2 * k  # per-shard LIMIT k would read 16 * k
    assert len(stats.rounds[0]) == 16  # round 1 asked every shard


@pytest.mark.parametrize("k", [16, 40, 300])
def test_skew_costs_no_extra_statement(k: int) -> None:
    """Every row of shard 3 is newer than every other row: the answer is all in one shard."""
    eng = sa.create_engine("sqlite://")
    B.metadata.create_all(eng)
    shard = get_shard_column(Ev16, "s")
    rng = random.Random(9)
    rows = []
    for i in range(3000):
        ts = T0 + dt.timedelta(seconds=rng.randrange(10**6))
        if shard.compute([i]) == 3:
            ts += dt.timedelta(days=100)
        rows.append({"id": i, "ts": ts, "kind": "a"})
    with eng.begin() as c:
        c.execute(Ev16.__table__.insert(), rows)
        stats = MergeStats()
        got = merged(c, newest(), k, stats=stats)
        t = Ev16.__table__
        assert got == c.execute(sa.select(t).order_by(t.c.ts.desc(), t.c.id).limit(k)).all()
    if 16 * k <= SINGLE_STATEMENT_READS:  # the cost rule: one statement, every shard LIMIT k
        assert stats.statements == 1 and stats.rows_transferred == k
        assert stats.rounds == [dict.fromkeys(range(16), k)]
    else:
        assert stats.statements == 2 and stats.rows_transferred <= 2 * k
        assert 3 in stats.rounds[1]  # round 2 asked the shard that ran out (and few others)
    eng.dispose()


@pytest.mark.parametrize("k", [100, 200, 1000])
def test_shards_of_similar_rates_take_one_statement(conn: sa.Connection, k: int) -> None:
    """N*K above the one-statement rule: one probe, each shard LIMIT ceil(K/N) +
    floor(2K/N), proven exact by positions; it reads within 2K + N*ceil(K/N)."""
    stats = MergeStats()
    rows = merged(conn, newest(), k, stats=stats)
    t = Ev16.__table__
    assert rows == conn.execute(sa.select(t).order_by(t.c.ts.desc(), t.c.id).limit(k)).all()
    assert 16 * k > SINGLE_STATEMENT_READS
    assert (stats.statements, stats.rows_transferred, stats.key_rows_transferred) == (1, k, 0)
    assert stats.server_rows_read <= 2 * k + 16 * math.ceil(k / 16)


def _skewed_rows(shard_boost: dict[int, int], count: int, seed: int) -> list[dict[str, Any]]:
    shard = get_shard_column(Ev16, "s")
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        ts = T0 + dt.timedelta(
            seconds=rng.randrange(10**5) + shard_boost.get(shard.compute([i]), 0)
        )
        rows.append({"id": i, "ts": ts, "kind": "a"})
    return rows


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    boost=st.dictionaries(st.integers(0, 15), st.integers(0, 10**5), max_size=4),
    k=st.integers(100, 300),
    count=st.integers(50, 700),
    seed=st.integers(0, 10**6),
)
def test_the_probe_is_exact_whatever_the_skew(
    boost: dict[int, int], k: int, count: int, seed: int
) -> None:
    """Shards boosted by up to a whole spread of timestamps: when a shard gave its LIMIT
    of the first K rows the probe's rows become the bound round, and the answer stays
    exact in two statements."""
    eng = sa.create_engine("sqlite://")
    B.metadata.create_all(eng)
    with eng.begin() as c:
        c.execute(Ev16.__table__.insert(), _skewed_rows(boost, count, seed))
        for after in (None, 1):
            stats = MergeStats()
            t = Ev16.__table__
            q = sa.select(t).order_by(t.c.ts.desc(), t.c.id)
            truth = c.execute(q).all()
            kw: dict[str, Any] = {}
            if after is not None and truth:
                kw["after"] = [truth[0].ts, truth[0].id]
                truth = truth[1:]
            got = merged(c, newest(), k, stats=stats, **kw)
            assert got == truth[:k]
            assert stats.statements <= 2 and stats.rows_transferred <= 2 * k
    eng.dispose()


# quick loop: test_the_probe_is_exact_whatever_the_skew, test_many_shards_on_the_emulator
@pytest.mark.slow
@pytest.mark.emulator
def test_the_probe_on_the_emulator(spanner_engine: sa.Engine) -> None:
    """One statement for shards of similar rates; under skew a second statement finishes,
    which on Spanner finds its own bound (the probe then sends only each row's shard, no
    sort key)."""
    Ev16.__table__.create(spanner_engine)
    t = Ev16.__table__
    sent: list[str] = []
    sa.event.listen(spanner_engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
    for boost, statements in (({}, 1), ({3: 10**6}, 2)):
        with spanner_engine.begin() as c:
            c.execute(t.delete().where(sa.true()))
            c.execute(t.insert(), _skewed_rows(boost, 600, 11))
        with spanner_engine.connect() as c:
            truth = c.execute(sa.select(t).order_by(t.c.ts.desc(), t.c.id).limit(120)).all()
            sent.clear()
            stats = MergeStats()
            got = merged(c, newest(), 120, stats=stats)
        assert [tuple(r) for r in got] == [tuple(r) for r in truth]
        assert stats.statements == statements == len(sent)
        assert "so_k0," not in sent[0].split("FROM")[0]  # the probe's select list: no key
        if statements == 2:
            assert stats.bounds[-1] == FoundBound(120) and stats.key_rows_transferred == 0


def test_froms_are_found_once_per_statement_shape_but_apart_for_aliases(
    conn: sa.Connection,
) -> None:
    """SQLAlchemy finds a statement's FROMs by compiling it: kept per cache key, for
    tables only (two anonymous aliases of one table share a cache key)."""
    from unittest import mock

    from sharded_orm.read.order import final_froms

    real = sa.Select.get_final_froms
    with mock.patch.object(sa.Select, "get_final_froms", autospec=True, side_effect=real) as found:
        assert final_froms(newest().where(Ev16.kind == "a")) == [Ev16.__table__]
        before = found.call_count  # (1, or 0 if an earlier test read this shape)
        for kind in ("b", "c"):
            assert final_froms(newest().where(Ev16.kind == kind)) == [Ev16.__table__]
        assert found.call_count == before
        one, other = sa.orm.aliased(Kind), sa.orm.aliased(Kind)
        for alias in (one, other, one):
            froms = final_froms(newest().join(alias, alias.name == Ev16.kind))
            assert froms[1] is sa.inspect(alias).selectable
        assert found.call_count == before + 3
        assert merged(conn, newest().join(other, other.name == Ev16.kind), 3) == []


def test_limit_from_the_statement(conn: sa.Connection) -> None:
    assert merged(conn, newest().limit(7)) == merged(conn, newest(), 7)
    assert len(merged(conn, newest().limit(7), 7)) == 7


def test_after_continues_strictly_after(conn: sa.Connection) -> None:
    first = merged(conn, newest(), 10)
    cols = order_columns(newest())
    assert [c.key for c, _ in cols] == ["ts", "id"]
    last = [first[-1].ts, first[-1].id]
    assert merged(conn, newest(), 5, after=last) == merged(conn, newest(), 15)[10:]


def test_order_columns_leave_out_pinned_ones() -> None:
    stmt = sharded_select(LogEntry, index="LogEntriesByCompany")
    t = LogEntry.__table__
    assert order_columns(stmt) == [
        (t.c.CompanyId, False),
        (t.c.Timestamp, True),
        (t.c.UserId, False),
    ]
    pinned = stmt.where(LogEntry.company_id == "Acme")
    assert order_columns(pinned) == [(t.c.Timestamp, True), (t.c.UserId, False)]
    # a pinned column may be named in ORDER BY or not
    order_columns(pinned.order_by(LogEntry.company_id, LogEntry.ts.desc()))
    order_columns(pinned.order_by(LogEntry.ts.desc(), LogEntry.user_id))


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "order",
    [
        lambda: [Ev16.kind],  # not in the index
        lambda: [Ev16.ts],  # ascending, the index is DESC
        lambda: [Ev16.id],  # the key, but after ts
        lambda: [Ev16.ts.desc(), Ev16.id.desc()],  # tie-break the wrong way
        lambda: [sa.func.lower(Ev16.kind)],
    ],
)
def test_orders_the_index_cannot_serve(conn: sa.Connection, order: Any) -> None:
    stmt = sharded_select(Ev16, index="ev16_by_ts").order_by(*order())
    with pytest.raises(ShardConfigError, match=r"ORDER BY cannot be served.*\(ts DESC, id\)"):
        merged(conn, stmt, 5)
    with pytest.raises(ShardConfigError, match="ORDER BY cannot be served"):
        page(conn, stmt, 5)


def test_unpinned_leading_column_must_lead_the_order() -> None:
    stmt = sharded_select(LogEntry, index="LogEntriesByCompany").order_by(LogEntry.ts.desc())
    with pytest.raises(ShardConfigError, match=r"serves \(CompanyId, Timestamp DESC, UserId\)"):
        order_columns(stmt)


@pytest.mark.parametrize(
    ("limit", "error"),
    [
        (0, ShardConfigError),
        (-3, ShardConfigError),
        (2.5, ShardTypeError),
        (True, ShardTypeError),
        ("5", ShardTypeError),
    ],
)
def test_bad_limits(conn: sa.Connection, limit: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="limit"):
        merged(conn, newest(), limit)
    with pytest.raises(error, match="page_size"):
        page(conn, newest(), limit)


def test_limit_missing_or_contradicting(conn: sa.Connection) -> None:
    with pytest.raises(ShardTypeError, match=r"give limit, or \.limit\(n\)"):
        merged(conn, newest())
    with pytest.raises(ShardConfigError, match=r"limit=5 disagrees with the statement's \.limit"):
        merged(conn, newest().limit(3), 5)


@pytest.mark.parametrize(
    ("change", "what"),
    [
        (lambda s: s.group_by(Ev16.id), "GROUP BY"),
        (lambda s: s.having(sa.func.count() > 1), "HAVING"),
        (lambda s: s.with_only_columns(Ev16.kind).distinct(), r"select list \(missing: ts, id\)"),
        (lambda s: s.offset(sa.bindparam("o")), "OFFSET as a non-negative int"),
        (
            lambda s: s.join(sa.select(sa.func.lower(Kind.name).label("x")).subquery(), sa.true()),
            "no primary key",
        ),
    ],
)
def test_statements_the_merge_cannot_honour(conn: sa.Connection, change: Any, what: str) -> None:
    with pytest.raises(ShardConfigError, match=what):
        merged(conn, change(newest()), 5)


def test_join_offset_distinct_are_the_statement_s(conn: sa.Connection) -> None:
    """Issue 11 item 8: the statement runs as written (it used to be rebuilt from the table
    and WHERE clause: a JOIN became a cartesian product, OFFSET and DISTINCT were lost)."""
    t, kinds = Ev16.__table__, Kind.__table__
    conn.execute(kinds.insert(), [{"name": "a"}, {"name": "b"}])
    try:
        joined = newest().join(Kind, Kind.name == Ev16.kind).where(Kind.name == "a")
        truth = conn.execute(sa.select(t).order_by(t.c.ts.desc(), t.c.id).limit(30)).all()
        assert merged(conn, joined, 30) == truth
        assert merged(conn, newest().offset(7), 10) == truth[7:17]
        assert merged(conn, newest().offset(7).limit(10)) == truth[7:17]
        # a join that repeats each row twice, then DISTINCT takes the copies away again
        both = newest().join(Kind, Kind.name != "")
        assert len(merged(conn, both, 30)) == 30
        assert [r.id for r in merged(conn, both, 30)][::2] == [r.id for r in truth[:15]]
        assert merged(conn, both.distinct(), 30) == truth
    finally:
        conn.execute(kinds.delete())
        conn.commit()


def test_only_sharded_selects(conn: sa.Connection) -> None:
    with pytest.raises(ShardConfigError, match=r"needs a statement made by sharded_select"):
        merged(conn, sa.select(Ev16), 5)


def test_after_of_the_wrong_length(conn: sa.Connection) -> None:
    with pytest.raises(ShardConfigError, match="orders by 2 columns"):
        merged(conn, newest(), 5, after=[T0])


# ----------------------------------------------------------------------------- many shards


class Ev64(B):
    __tablename__ = "ev64"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    s: Mapped[int] = shard_column("id", count=64)
    __table_args__ = (ShardedIndex("ev64_by_ts", sa.desc("ts"), shard="s"),)


@pytest.mark.emulator
def test_many_shards_on_the_emulator(spanner_engine: sa.Engine) -> None:
    # 64 branches with keyset bounds exceed the 10,000 tokens the Spanner DB-API's
    # sqlparse accepts in one statement: the merge splits them
    Ev64.__table__.create(spanner_engine)
    rng = random.Random(3)
    with spanner_engine.begin() as c:
        c.execute(
            Ev64.__table__.insert(),
            [{"id": i, "ts": T0 + dt.timedelta(seconds=rng.randrange(50))} for i in range(300)],
        )
    t = Ev64.__table__
    with spanner_engine.connect() as c:
        truth = c.execute(sa.select(t).order_by(t.c.ts.desc(), t.c.id).limit(64)).all()
        stats = MergeStats()
        got = merged(c, sharded_select(Ev64, index="ev64_by_ts"), 64, stats=stats)
    assert [tuple(r) for r in got] == [tuple(r) for r in truth]
    assert stats.statements <= 2 and stats.rows_transferred <= 2 * 64


WIDE_COLUMNS = 60


def _wide_model() -> Any:
    columns: dict[str, Any] = {
        "__tablename__": "wide64",
        "__annotations__": {"id": Mapped[int], "ts": Mapped[dt.datetime | None], "s": Mapped[int]},
        "id": mapped_column(primary_key=True, autoincrement=False),
        "ts": mapped_column(UTCDateTime, nullable=True),
        "s": shard_column("id", count=64),
        "__table_args__": (ShardedIndex("wide64_by_ts", sa.desc("ts"), shard="s"),),
    }
    for i in range(WIDE_COLUMNS):
        columns[f"a_rather_long_column_name_{i:02d}"] = sa.orm.mapped_column(
            sa.String(16), nullable=True
        )
    return type("Wide64", (B,), columns)


Wide64 = _wide_model()


# 64 shards x 60 columns; quick loop: test_many_shards_on_the_emulator
@pytest.mark.slow
@pytest.mark.emulator
def test_a_wide_statement_at_64_shards_stays_under_sqlparses_token_limit(
    spanner_engine: sa.Engine,
) -> None:
    """Issue 21 risk: the Spanner DB-API runs every statement through sqlparse, which
    refuses more than 10,000 tokens. A UNION ALL of 64 branches of a 60-column statement
    passed it; the correlated form's text does not grow with N."""
    import sqlparse

    Wide64.__table__.create(spanner_engine)
    rng = random.Random(4)
    cols = [f"a_rather_long_column_name_{i:02d}" for i in range(WIDE_COLUMNS)]
    with spanner_engine.begin() as c:
        c.execute(
            Wide64.__table__.insert(),
            [
                {
                    "id": i,
                    "ts": None if i % 9 == 0 else T0 + dt.timedelta(seconds=rng.randrange(40)),
                    **{name: f"v{i}" for name in cols},
                }
                for i in range(200)
            ],
        )
    sent: list[str] = []

    @sa.event.listens_for(spanner_engine, "before_cursor_execute")
    def _keep(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    t = Wide64.__table__
    stmt = sharded_select(Wide64, index="wide64_by_ts").where(
        sa.or_(*(t.c[name] != "x" for name in cols[:20]))
    )
    with spanner_engine.connect() as c:
        truth = [r.id for r in c.execute(stmt.order_by(t.c.ts.desc(), t.c.id))]
        got = [r.id for r in merged(c, stmt, 150)]
        walked, cursor = [], None
        while True:
            p = page(c, stmt, 40, cursor)
            walked += [r.id for r in p.rows]
            if (cursor := p.next_cursor) is None:
                break
    sa.event.remove(spanner_engine, "before_cursor_execute", _keep)
    assert got == truth[:150] and walked == truth
    tokens = max(len(list(sqlparse.parse(s)[0].flatten())) for s in sent)
    assert tokens < 10_000 / 4, tokens  # far from the limit, whatever N


class FloatEv(B):
    __tablename__ = "float_ev"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    score: Mapped[float | None] = mapped_column(sa.Float)
    s: Mapped[int] = shard_column("id", count=4)
    __table_args__ = (
        ShardedIndex("float_ev_up", "score", shard="s"),
        ShardedIndex("float_ev_down", sa.desc("score"), shard="s"),
    )


@pytest.mark.emulator
def test_nan_orders_as_spanner_orders_it(spanner_engine: sa.Engine) -> None:
    """Issue 21 item 3: Spanner orders NULL, then NaN, then the numbers; NaN compares false
    with everything. Bounds and cursors that land on NaN (or NULL, or an infinity) must
    still give the unsharded order: the conditions tell NaN with IS_NAN, in SQL."""
    FloatEv.__table__.create(spanner_engine)
    rng = random.Random(11)
    values = [None, math.nan, -math.inf, math.inf, 0.0, 1.5, -2.0]
    with spanner_engine.begin() as c:
        c.execute(
            FloatEv.__table__.insert(),
            [{"id": i, "score": rng.choice(values)} for i in range(60)],
        )
    t = FloatEv.__table__
    for index, desc in (("float_ev_up", False), ("float_ev_down", True)):
        key = t.c.score.desc() if desc else t.c.score
        with spanner_engine.connect() as c:
            truth = [r.id for r in c.execute(sa.select(t).order_by(key, t.c.id))]
            scores = {r.id: r.score for r in c.execute(sa.select(t))}
            order = [scores[i] for i in truth]
            nulls = order.count(None)
            nans = [i for i, v in enumerate(order) if v is not None and math.isnan(v)]
            # Spanner's own order: NULL first, then NaN (reversed for DESC)
            if desc:
                assert order[-nulls:] == [None] * nulls and nans[-1] == len(order) - nulls - 1
            else:
                assert order[:nulls] == [None] * nulls and nans[0] == nulls
            stmt = sharded_select(FloatEv, index=index)
            for k in (5, 17, 40):
                assert [r.id for r in merged(c, stmt, k)] == truth[:k], (index, k)
            for size in (3, 7):
                walked, cursor = [], None
                while True:
                    p = page(c, stmt, size, cursor)
                    walked += [r.id for r in p.rows]
                    if (cursor := p.next_cursor) is None:
                        break
                assert walked == truth, (index, size)


class _Score(sa.TypeDecorator[float]):
    impl = sa.Float
    cache_ok = True


@pytest.mark.parametrize("type_", [sa.Float(), sa.Double(), sa.REAL(), _Score()])
def test_every_float_type_gets_the_nan_conditions(type_: sa.types.TypeEngine[float]) -> None:
    """A page's conditions on a float column tell NaN with IS_NAN on Spanner, whatever the
    float type: SQLAlchemy 2.0 reports Float's type affinity as Numeric, which once left
    them out there (a page after a NaN cursor came back empty)."""
    from google.cloud.sqlalchemy_spanner.sqlalchemy_spanner import SpannerDialect

    from sharded_orm.read.order import after_condition

    col = sa.Column("score", type_)
    sa.Table("scores", sa.MetaData(), col, sa.Column("id", sa.Integer, primary_key=True))
    sql = str(after_condition([(col, False)], [math.nan]).compile(dialect=SpannerDialect()))
    assert "IS_NAN(scores.score)" in sql
