"""sharded_select, merged() and page() against an oracle: the same statement, unsharded.

Generated schemas and queries: shard counts 1, 3, 8; an index on (tenant, ts DESC) and one
on a nullable float ascending; few distinct values (ties across shards) and NULLs in both
ordering columns; a many-to-one join, a join that repeats rows, DISTINCT, OFFSET, the
statement's own LIMIT. The result of the sharded statement executed directly, of
``merged`` and of every page must equal the unsharded statement's rows in its order
(``ORDER BY`` the merge's total order), on SQLite and, with fewer and smaller examples, on
the Spanner emulator, under every plan of the cost rule (one statement, two rounds, the
probe), each forced: examples this small fall under the one-statement rule. Also: rows
inserted between pages. On the emulator both engines: the sync one and the async one
(``spanner+spanner_async``: the same body on ``AsyncEngine.sync_engine`` in SQLAlchemy's
greenlet, ``run_through``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plans import PLANS, forced
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import (
    MergeStats,
    ShardedIndex,
    UTCDateTime,
    get_shard_column,
    merged,
    page,
    shard_column,
)
from sharded_orm import sharded_select as sharded_select_
from sharded_orm.read.order import order_columns
from sharded_orm.testing.async_engines import run_through

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
SCORES = [None, -2.25, 0.5, 1.0, 3.75]


class OracleBase(DeclarativeBase):
    pass


class Owner(OracleBase):
    __tablename__ = "Owner"  # as the column ev.owner: a name clash in ORDER BY on Spanner
    name: Mapped[str] = mapped_column(sa.String(8), primary_key=True)
    active: Mapped[bool] = mapped_column(sa.Boolean)


class Tag(OracleBase):
    __tablename__ = "oracle_tag"
    ev_id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    tag: Mapped[str] = mapped_column(sa.String(8), primary_key=True)


def _event_model(n: int) -> Any:
    return type(
        f"Ev{n}",
        (OracleBase,),
        {
            "__tablename__": f"ev{n}",
            "__annotations__": {
                "id": Mapped[int],
                "tenant": Mapped[int],
                "ts": Mapped[dt.datetime | None],
                "score": Mapped[float | None],
                "owner": Mapped[str | None],
                "s": Mapped[int],
            },
            "id": mapped_column(sa.BigInteger, primary_key=True, autoincrement=False),
            "tenant": mapped_column(sa.BigInteger),
            "ts": mapped_column(UTCDateTime, nullable=True),
            "score": mapped_column(sa.Float, nullable=True),
            "owner": mapped_column(sa.String(8), nullable=True),
            "s": shard_column("id", count=n),
            "__table_args__": (
                ShardedIndex(f"ev{n}_by_tenant_ts", "tenant", sa.desc("ts"), shard="s"),
                ShardedIndex(f"ev{n}_by_score", "score", shard="s"),
            ),
        },
    )


MODELS = {n: _event_model(n) for n in (1, 3, 8)}


def rows_strategy(max_rows: int) -> Any:
    # (tenant, seconds or None, score index, owner index, tags): few values, many ties
    return st.lists(
        st.tuples(
            st.integers(0, 2),
            st.none() | st.integers(0, 12),
            st.integers(0, len(SCORES) - 1),
            st.none() | st.integers(0, 2),
            st.lists(st.sampled_from(["a", "b", "c"]), unique=True, max_size=2),
        ),
        max_size=max_rows,
    )


def examples(max_rows: int, max_limit: int, min_page: int) -> Any:
    return st.fixed_dictionaries(
        {
            "n": st.sampled_from(sorted(MODELS)),
            "rows": rows_strategy(max_rows),
            # every row in these shards (None: ids 0, 1, 2...): a bound round then sees
            # fewer keys than the merge wants while a shard holds more
            "hot": st.none() | st.lists(st.integers(0, 7), min_size=1, max_size=2),
            "active": st.lists(st.booleans(), min_size=3, max_size=3),
            "index": st.sampled_from(["tenant_ts", "score"]),
            "tenant": st.none() | st.integers(0, 2),  # None: every tenant
            "range": st.none() | st.tuples(st.integers(-1, 12), st.integers(0, 14)),
            "join": st.sampled_from([None, "owner", "tag", "outer tag"]),
            "distinct": st.booleans(),
            "offset": st.sampled_from([0, 0, 1, 4]),
            "own_limit": st.booleans(),  # .limit(n) on the statement, or limit= to merged
            "order": st.booleans(),  # spell out the ORDER BY the index serves, or not
            "limit": st.integers(1, max_limit),
            "page": st.integers(min_page, 9),
        }
    )


def make_query(ex: dict[str, Any]) -> tuple[Any, Any]:
    """(sharded statement, the same statement unsharded, ordered the merge's way).

    Neither has the example's OFFSET: Spanner takes OFFSET only after a LIMIT, so the
    oracle applies it in Python.
    """
    m = MODELS[ex["n"]]
    t = m.__table__
    stmt = sharded_select_(m, index=f"ev{ex['n']}_by_{ex['index']}")
    plain = sa.select(m)
    conds = []
    if ex["tenant"] is not None:
        conds.append(m.tenant == ex["tenant"])
    if ex["range"] is not None:
        lo = T0 + dt.timedelta(seconds=ex["range"][0])
        conds += [m.ts >= lo, m.ts < lo + dt.timedelta(seconds=ex["range"][1])]
    if ex["join"] == "owner":
        stmt = stmt.join(Owner, Owner.name == m.owner)
        plain = plain.join(Owner, Owner.name == m.owner)
        conds.append(Owner.active.is_(True))
    elif ex["join"] == "tag":
        stmt = stmt.join(Tag, Tag.ev_id == m.id)
        plain = plain.join(Tag, Tag.ev_id == m.id)
    elif ex["join"] == "outer tag":  # an untagged event's Tag key is NULL
        stmt = stmt.outerjoin(Tag, Tag.ev_id == m.id)
        plain = plain.outerjoin(Tag, Tag.ev_id == m.id)
    stmt, plain = stmt.where(*conds), plain.where(*conds)
    if ex["distinct"]:
        stmt, plain = stmt.distinct(), plain.distinct()
    if ex["order"]:
        lead = [t.c.tenant] if ex["index"] == "tenant_ts" and ex["tenant"] is None else []
        stmt = stmt.order_by(*lead, t.c.ts.desc() if ex["index"] == "tenant_ts" else t.c.score)
    return stmt, ordered(plain, order_columns(stmt))


def ordered(stmt: Any, columns: Any) -> Any:
    """``stmt`` ordered by ``columns``, each selected under a label and ordered by it:
    Spanner resolves ORDER BY names against the select list first, so ``Owner.name``
    would find the output column ``owner``. The labels come last (see user_part)."""
    labels = [c.label(f"o{i}") for i, (c, _) in enumerate(columns)]
    order = [lbl.desc() if d else lbl for lbl, (_, d) in zip(labels, columns, strict=True)]
    return stmt.add_columns(*labels).order_by(None).order_by(*order)


def user_part(rows: Any) -> list[tuple[Any, ...]]:
    return [tuple(r)[:6] for r in rows]  # the columns of the event table


def reset(conn: sa.Connection, ex: dict[str, Any]) -> None:
    for table in OracleBase.metadata.sorted_tables:
        conn.execute(sa.delete(table).where(sa.true()))
    conn.execute(
        Owner.__table__.insert(),
        [{"name": f"o{i}", "active": a} for i, a in enumerate(ex["active"])],
    )
    rows, tags = [], []
    ids = row_ids(ex["n"], ex.get("hot"), len(ex["rows"]))
    for i, (tenant, s, score, owner, tag_list) in zip(ids, ex["rows"], strict=True):
        rows.append(
            {
                "id": i,
                "tenant": tenant,
                "ts": None if s is None else T0 + dt.timedelta(seconds=s),
                "score": SCORES[score],
                "owner": None if owner is None else f"o{owner}",
            }
        )
        tags += [{"ev_id": i, "tag": g} for g in tag_list]
    if rows:
        conn.execute(MODELS[ex["n"]].__table__.insert(), rows)
    if tags:
        conn.execute(Tag.__table__.insert(), tags)


def row_ids(n: int, hot: list[int] | None, count: int) -> list[int]:
    """``count`` ids: 0, 1, 2... or, with ``hot``, the first ids whose shard is in it."""
    if hot is None:
        return list(range(count))
    shard, wanted = get_shard_column(MODELS[n], "s"), {h % n for h in hot}
    return [i for i in range(count * n * 8) if shard.compute([i]) in wanted][:count]


def all_pages(conn: Any, stmt: Any, size: int, bound: int) -> list[Any]:
    out: list[Any] = []
    cursor = None
    for _ in range(bound):
        p = page(conn, stmt, size, cursor)
        assert len(p.rows) <= size and p.stats.statements <= 2
        out.extend(p.rows)
        cursor = p.next_cursor
        if cursor is None:
            return out
        assert len(p.rows) == size
    raise AssertionError("pagination did not end")


def check_against_oracle(conn: sa.Connection, ex: dict[str, Any]) -> None:
    reset(conn, ex)
    stmt, plain = make_query(ex)
    everything = user_part(conn.execute(plain))
    # the sharded statement itself, in the same order
    direct = ordered(stmt, order_columns(stmt))
    assert user_part(conn.execute(direct)) == everything
    for name in PLANS:
        with forced(name):
            check_merges(conn, ex, stmt, everything)


def check_merges(conn: sa.Connection, ex: dict[str, Any], stmt: Any, everything: Any) -> None:
    oracle = everything[ex["offset"] :]
    stmt = stmt.offset(ex["offset"]) if ex["offset"] else stmt
    k = ex["limit"]
    stats = MergeStats()
    if ex["own_limit"]:
        got = merged(conn, stmt.limit(k), stats=stats)
    else:
        got = merged(conn, stmt, k, stats=stats)
    assert [tuple(r) for r in got] == oracle[:k]
    assert stats.statements <= 2
    assert stats.rows_transferred <= 2 * (ex["offset"] + k)
    limited = stmt.limit(k) if ex["own_limit"] else stmt
    expect = oracle[:k] if ex["own_limit"] else oracle
    assert [tuple(r) for r in all_pages(conn, limited, ex["page"], len(oracle) + 2)] == expect


# ----------------------------------------------------------------------------- SQLite


@pytest.fixture(scope="module")
def sqlite_engine() -> Iterator[sa.Engine]:
    eng = sa.create_engine("sqlite://")
    OracleBase.metadata.create_all(eng)
    yield eng
    eng.dispose()


FIXTURE_OK = [HealthCheck.function_scoped_fixture]


# 300 drawn examples; quick loop: test_oracle_on_the_emulator, test_entities_through_a_session
@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=examples(max_rows=40, max_limit=45, min_page=1))
def test_oracle_on_sqlite(sqlite_engine: sa.Engine, ex: dict[str, Any]) -> None:
    with sqlite_engine.begin() as conn:
        check_against_oracle(conn, ex)


@settings(max_examples=40, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=examples(max_rows=25, max_limit=30, min_page=1))
def test_entities_through_a_session(sqlite_engine: sa.Engine, ex: dict[str, Any]) -> None:
    with Session(sqlite_engine) as session:
        reset(session.connection(), ex)
        stmt, plain = make_query(ex)
        oracle = [r.id for r in session.connection().execute(plain)][ex["offset"] :]
        stmt = stmt.offset(ex["offset"]) if ex["offset"] else stmt
        for name in PLANS:
            with forced(name):
                got = merged(session, stmt, ex["limit"])
                assert all(isinstance(e, MODELS[ex["n"]]) for e in got)
                assert [e.id for e in got] == oracle[: ex["limit"]]
                walked = all_pages(session, stmt, ex["page"], len(oracle) + 2)
                assert [e.id for e in walked] == oracle
        session.rollback()


# ----------------------------------------------------------------------------- inserts


inserts = st.fixed_dictionaries(
    {
        "n": st.sampled_from(sorted(MODELS)),
        "rows": rows_strategy(30),
        "active": st.just([True, True, True]),
        "index": st.sampled_from(["tenant_ts", "score"]),
        "tenant": st.none() | st.integers(0, 2),
        "range": st.none(),
        "join": st.just(None),
        "distinct": st.just(False),
        "offset": st.just(0),
        "order": st.just(False),
        "page": st.integers(1, 6),
        # rows inserted after each page (tenant, seconds or None, score, owner, tags)
        "later": st.lists(rows_strategy(4), max_size=8),
    }
)


def check_inserts_between_pages(conn: sa.Connection, ex: dict[str, Any]) -> None:
    """No row is skipped or repeated; a row inserted between pages shows up exactly when
    it sorts after the cursor in force when it was inserted."""
    reset(conn, ex)
    stmt, plain = make_query(ex)
    t = MODELS[ex["n"]].__table__
    expected = {r.id for r in conn.execute(plain)}  # every row there at the start
    seen: list[Any] = []
    cursor = None
    next_id = len(ex["rows"])
    for round_ in range(len(ex["rows"]) + len(ex["later"]) * 4 + 2):
        p = page(conn, stmt, ex["page"], cursor)
        seen.extend(p.rows)
        cursor = p.next_cursor
        if cursor is None:
            break
        if round_ < len(ex["later"]):
            new = [
                {
                    "id": next_id + j,
                    "tenant": tn,
                    "ts": None if s is None else T0 + dt.timedelta(seconds=s),
                    "score": SCORES[sc],
                    "owner": None,
                }
                for j, (tn, s, sc, _, _) in enumerate(ex["later"][round_])
            ]
            next_id += len(new)
            if new:
                conn.execute(t.insert(), new)
            # where the new rows sort: after the last row read, or before it
            ordered = [r.id for r in conn.execute(plain)]
            last = ordered.index(p.rows[-1].id)
            expected |= {r["id"] for r in new if r["id"] in ordered[last + 1 :]}
    ids = [r.id for r in seen]
    assert len(ids) == len(set(ids)), "a row was repeated"
    assert set(ids) == expected, "a row was skipped, or one behind the cursor appeared"
    final = [r.id for r in conn.execute(plain)]
    assert ids == [i for i in final if i in expected], "pages are out of order"


@settings(max_examples=100, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=inserts)
def test_inserts_between_pages_on_sqlite(sqlite_engine: sa.Engine, ex: dict[str, Any]) -> None:
    with sqlite_engine.begin() as conn:
        check_inserts_between_pages(conn, ex)


# ----------------------------------------------------------------------------- emulator


def with_tables(engine: sa.Engine) -> sa.Engine:
    if not sa.inspect(engine).has_table("ev1"):  # once per test: hypothesis reuses the fixture
        OracleBase.metadata.create_all(engine)
    return engine


def oracle_on(engine: sa.Engine, ex: dict[str, Any]) -> None:
    with with_tables(engine).begin() as conn:
        check_against_oracle(conn, ex)


def inserts_on(engine: sa.Engine, ex: dict[str, Any]) -> None:
    with with_tables(engine).begin() as conn:
        check_inserts_between_pages(conn, ex)


EMULATOR_EXAMPLES = examples(max_rows=16, max_limit=20, min_page=2)
EMULATOR_INSERTS = inserts.map(
    lambda ex: {**ex, "rows": ex["rows"][:12], "page": max(2, ex["page"])}
)


@pytest.mark.emulator
@settings(max_examples=12, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=EMULATOR_EXAMPLES)
def test_oracle_on_the_emulator(spanner_engine: sa.Engine, ex: dict[str, Any]) -> None:
    oracle_on(spanner_engine, ex)


# the emulator oracle's wide variant (a third of a second an example); quick loop:
# test_oracle_on_the_emulator
@pytest.mark.slow
@pytest.mark.emulator
@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=EMULATOR_EXAMPLES)
def test_oracle_on_the_emulator_wide(spanner_engine: sa.Engine, ex: dict[str, Any]) -> None:
    oracle_on(spanner_engine, ex)


@pytest.mark.emulator
@settings(max_examples=8, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=EMULATOR_INSERTS)
def test_inserts_between_pages_on_the_emulator(
    spanner_engine: sa.Engine, ex: dict[str, Any]
) -> None:
    inserts_on(spanner_engine, ex)


# ------------------------------------------------------------ emulator, async engine


@pytest.mark.emulator
@settings(max_examples=2, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=EMULATOR_EXAMPLES)
def test_oracle_through_the_async_engine(spanner_async_engine: Any, ex: dict[str, Any]) -> None:
    run_through(spanner_async_engine, oracle_on, ex)


# async variant; quick loop: test_oracle_through_the_async_engine
@pytest.mark.slow
@pytest.mark.emulator
@settings(max_examples=25, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=EMULATOR_EXAMPLES)
def test_oracle_through_the_async_engine_wide(
    spanner_async_engine: Any, ex: dict[str, Any]
) -> None:
    run_through(spanner_async_engine, oracle_on, ex)


# async variant; quick loop: test_oracle_through_the_async_engine
@pytest.mark.slow
@pytest.mark.emulator
@settings(max_examples=8, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=EMULATOR_INSERTS)
def test_inserts_between_pages_through_the_async_engine(
    spanner_async_engine: Any, ex: dict[str, Any]
) -> None:
    run_through(spanner_async_engine, inserts_on, ex)
