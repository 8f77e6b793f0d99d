"""merged() and page() accept a statement only in a shape they provably answer exactly
(``sharded_orm.read.shapes``, docs/queries.md's table): generated statements, inside the
allowlist and outside it (windows, aggregates, GROUP BY, HAVING, unknown functions, SQL
text, FOR UPDATE, subqueries, joins, labels, NULLS placement), are each refused before
any statement runs or give the unsharded statement's answer, never another one. Before
the allowlist, ``count() OVER ()`` gave the count of a page's branches, ``min(ts)`` the
minimum of theirs and ``lag(ts)`` NULL on a page's first row, silently on SQLite (a raw
ProgrammingError on Spanner); ``ts DESC NULLS LAST`` and ORDER BY a label were refused.
Loader criteria (a tenant filter) and unions are generated too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plans import PLANS, forced, walk
from sqlalchemy import event
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    aliased,
    mapped_column,
    with_loader_criteria,
)

from sharded_orm import ShardConfigError, ShardedIndex, merged, page, shard_column, sharded_select
from sharded_orm.read.order import order_columns
from sharded_orm.read.shapes import row_level


class B(DeclarativeBase):
    pass


def _model(n: int) -> Any:
    return type(
        f"Sh{n}",
        (B,),
        {
            "__tablename__": f"shape_ev{n}",
            "__annotations__": {
                "id": Mapped[int],
                "tenant": Mapped[int],
                "ts": Mapped[int | None],
                "name": Mapped[str],
                "s": Mapped[int],
            },
            "id": mapped_column(sa.BigInteger, primary_key=True, autoincrement=False),
            "tenant": mapped_column(sa.BigInteger),
            "ts": mapped_column(sa.BigInteger, nullable=True),
            "name": mapped_column(sa.String(8)),
            "s": shard_column("id", count=n),
            "__table_args__": (ShardedIndex(f"shape_ev{n}_by_ts", sa.desc("ts"), shard="s"),),
        },
    )


MODELS = {n: _model(n) for n in (1, 3, 8)}


class Tag(B):
    __tablename__ = "shape_tag"
    ev_id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    tag: Mapped[str] = mapped_column(sa.String(8), primary_key=True)


# (name, in the allowlist, the select list's extra columns for model m)
Column = tuple[str, bool, Callable[[Any], list[Any]]]


def _tag_count(m: Any) -> Any:
    tag = aliased(Tag)  # (the statement may join Tag itself)
    return sa.select(sa.func.count()).where(tag.ev_id == m.id).scalar_subquery().label("n_tags")


def _tagged(m: Any) -> Any:
    tag = aliased(Tag)
    return sa.exists().where(tag.ev_id == m.id).label("e")


def _all_rows(m: Any) -> Any:
    other = aliased(m)
    return sa.select(sa.func.count(other.id)).scalar_subquery().label("n_all")


def _newest(m: Any) -> Any:
    other = aliased(m)
    return sa.select(sa.func.max(other.ts)).scalar_subquery().label("newest")


COLUMNS: list[Column] = [
    ("ts + 1", True, lambda m: [(m.ts + 1).label("t1")]),
    ("lower(name)", True, lambda m: [sa.func.lower(m.name).label("ln")]),
    ("coalesce", True, lambda m: [sa.func.coalesce(m.ts, -1).label("c")]),
    ("case", True, lambda m: [sa.case((m.ts > 5, "late"), else_="early").label("k")]),
    # (Float: the stock dialect casts to STRING(MAX), which Spanner refuses)
    ("cast", True, lambda m: [sa.cast(m.tenant, sa.Float).label("ct")]),
    ("literal", True, lambda m: [sa.literal(7).label("seven")]),
    ("a label of ts", True, lambda m: [m.ts.label("t")]),
    ("correlated count (subquery)", True, lambda m: [_tag_count(m)]),
    ("count of all rows (subquery)", True, lambda m: [_all_rows(m)]),
    ("max(ts) of all rows (subquery)", True, lambda m: [_newest(m)]),
    ("exists (subquery)", True, lambda m: [_tagged(m)]),
    ("count() over ()", False, lambda m: [sa.func.count().over().label("w")]),
    ("lag(ts)", False, lambda m: [sa.func.lag(m.ts).over(order_by=m.id).label("w")]),
    (
        "row_number by tenant",
        False,
        lambda m: [sa.func.row_number().over(partition_by=m.tenant, order_by=m.id).label("w")],
    ),
    ("min(ts)", False, lambda m: [sa.func.min(m.ts).label("a")]),
    ("count()", False, lambda m: [sa.func.count().label("a")]),
    ("coalesce(max(ts))", False, lambda m: [sa.func.coalesce(sa.func.max(m.ts), 0).label("a")]),
    ("an unknown function", False, lambda m: [sa.func.my_agg(m.ts).label("a")]),
    ("literal_column", False, lambda m: [sa.literal_column("count(*) over ()").label("a")]),
    ("distinct()", False, lambda m: [sa.distinct(m.tenant)]),
]

# (name, in the allowlist (None: with DISTINCT only), change of the statement)
CHANGES: list[tuple[str, bool | None, Callable[[Any, Any], Any]]] = [
    ("tenant =", True, lambda s, m: s.where(m.tenant == 1)),
    ("IN (subquery)", True, lambda s, m: s.where(m.id.in_(sa.select(Tag.ev_id)))),
    (
        "IN (a union)",
        True,
        lambda s, m: s.where(m.id.in_(sa.union(sa.select(Tag.ev_id), sa.select(sa.literal(3))))),
    ),
    ("ts < max (subquery)", True, lambda s, m: s.where(m.ts < _newest(m))),
    ("join", True, lambda s, m: s.join(Tag, Tag.ev_id == m.id)),
    ("outer join", True, lambda s, m: s.outerjoin(Tag, Tag.ev_id == m.id)),
    ("join a grouped subquery", True, lambda s, m: s.join(GROUPED, GROUPED.c.ev_id == m.id)),
    # DISTINCT rows are told apart by their columns: then any join is in the allowlist
    ("join a subquery without the key", None, lambda s, m: s.join(IDS, IDS.c.ev_id == m.id)),
    ("full join", False, lambda s, m: s.outerjoin(Tag, Tag.ev_id == m.id, full=True)),
    ("GROUP BY", False, lambda s, m: s.group_by(m.id)),
    ("HAVING", False, lambda s, m: s.having(m.id > 0)),
    ("FOR UPDATE", False, lambda s, m: s.with_for_update()),
    ("a prefix", False, lambda s, m: s.prefix_with("ALL")),
    ("a suffix", False, lambda s, m: s.suffix_with("-- x")),
]
GROUPED = sa.select(Tag.ev_id, sa.func.count().label("n")).group_by(Tag.ev_id).subquery("grouped")
IDS = sa.select(Tag.ev_id).subquery("ids")

# (name, in the allowlist, ORDER BY for model m, given the select list's labels)
ORDERS: list[tuple[str, bool, Callable[[Any], list[Any]]]] = [
    ("none", True, lambda m: []),
    ("ts DESC", True, lambda m: [m.ts.desc()]),
    ("ts DESC NULLS LAST", True, lambda m: [m.ts.desc().nulls_last(), m.id.nulls_first()]),
    ("a label DESC", True, lambda m: [m.ts.label("t").desc()]),
    ("ts DESC NULLS FIRST", False, lambda m: [m.ts.desc().nulls_first()]),
    ("ts ASC", False, lambda m: [m.ts]),
    ("name", False, lambda m: [m.name]),
]


def examples(max_rows: int) -> Any:
    return st.fixed_dictionaries(
        {
            "n": st.sampled_from(sorted(MODELS)),
            "rows": st.lists(
                st.tuples(st.integers(0, 2), st.none() | st.integers(0, 9), st.integers(0, 3)),
                max_size=max_rows,
            ),
            "tags": st.lists(st.integers(0, max_rows), max_size=max_rows),
            "columns": st.lists(st.sampled_from(range(len(COLUMNS))), max_size=2, unique=True),
            "changes": st.lists(st.sampled_from(range(len(CHANGES))), max_size=2, unique=True),
            "order": st.sampled_from(range(len(ORDERS))),
            "entity": st.booleans(),
            "distinct": st.booleans(),
            "union": st.sampled_from([False, False, False, True]),  # a set operation of it
            "criteria": st.booleans(),  # with_loader_criteria: a tenant filter
            "k": st.integers(1, 12),
            "page": st.integers(1, 5),
        }
    )


def build(ex: dict[str, Any]) -> tuple[Any, Any, bool]:
    """(sharded statement, the same statement unsharded, whether it is in the allowlist)."""
    m = MODELS[ex["n"]]
    cols = [m] if ex["entity"] else [m.id, m.ts]
    ok = True
    for i in ex["columns"]:
        _, accepted, make = COLUMNS[i]
        cols += make(m)
        ok = ok and accepted
    stmt = sharded_select(m, index=f"shape_ev{ex['n']}_by_ts").with_only_columns(*cols)
    plain = sa.select(*cols)
    tag_joins = [i for i in ex["changes"] if CHANGES[i][0] in ("join", "outer join", "full join")]
    for i in ex["changes"]:
        if i in tag_joins[1:]:
            continue  # (Tag joined twice: ambiguous names, sharded or not)
        _, accepted, change = CHANGES[i]
        stmt, plain = change(stmt, m), change(plain, m)
        ok = ok and (ex["distinct"] if accepted is None else accepted)
    _, accepted, order = ORDERS[ex["order"]]
    stmt = stmt.order_by(*order(m))
    ok = ok and accepted
    if ex["distinct"]:
        stmt, plain = stmt.distinct(), plain.distinct()
    if ex.get("criteria"):
        tenant = with_loader_criteria(m, m.tenant != 2)
        stmt, plain = stmt.options(tenant), plain.options(tenant)
    if ex.get("union"):  # not a sharded_select any more: run it as one query
        stmt, ok = sa.union_all(stmt, stmt), False
    return stmt, plain, ok


def reset(conn: sa.Connection, ex: dict[str, Any]) -> None:
    m = MODELS[ex["n"]]
    for table in (m.__table__, Tag.__table__):
        conn.execute(sa.delete(table).where(sa.true()))
    rows = [
        {"id": i, "tenant": t, "ts": ts, "name": "AbCd"[n:]}
        for i, (t, ts, n) in enumerate(ex["rows"])
    ]
    if rows:
        conn.execute(m.__table__.insert(), rows)
    tags = sorted({(i, f"t{j % 2}") for j, i in enumerate(ex["tags"])})
    if tags:
        conn.execute(Tag.__table__.insert(), [{"ev_id": i, "tag": t} for i, t in tags])


class Statements:
    """Counts the statements sent through an engine."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine, self.count = engine, 0

    def __enter__(self) -> Statements:
        event.listen(self.engine, "before_cursor_execute", self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._seen)

    def _seen(self, *args: Any) -> None:
        self.count += 1


def check(engine: sa.Engine, conn: Any, ex: dict[str, Any]) -> None:
    stmt, plain, ok = build(ex)
    k = ex["k"]
    with Statements(engine) as sent:
        try:
            merged(conn, stmt, k)
            columns = order_columns(stmt)
        except ShardConfigError:
            assert not ok, "a statement in the allowlist was refused"
            assert sent.count == 0, "refused after a statement ran"
            with pytest.raises(ShardConfigError):
                page(conn, stmt, ex["page"])
            assert sent.count == 0
            return
    assert ok, "a statement outside the allowlist was accepted"
    labels = [c.label(f"o{i}") for i, (c, _) in enumerate(columns)]
    ordered = plain.add_columns(*labels).order_by(
        *(lbl.desc() if d else lbl for lbl, (_, d) in zip(labels, columns, strict=True))
    )
    width = len(plain.selected_columns)
    truth = [tuple(r)[:width] for r in conn.execute(ordered)]
    for name in PLANS:
        with forced(name):
            assert [tuple(r) for r in merged(conn, stmt, k)] == truth[:k], name
            assert [tuple(r) for r in walk(conn, stmt, ex["page"])] == truth, name


@pytest.fixture(scope="module")
def sqlite_engine() -> Iterator[sa.Engine]:
    eng = sa.create_engine("sqlite://")
    B.metadata.create_all(eng)
    yield eng
    eng.dispose()


FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@settings(max_examples=80, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=examples(max_rows=20))
def test_refused_or_the_unsharded_answer_on_sqlite(
    sqlite_engine: sa.Engine, ex: dict[str, Any]
) -> None:
    refused_or_the_unsharded_answer(sqlite_engine, ex)


# the oracle's wide variant (many drawn examples); quick loop:
# test_refused_or_the_unsharded_answer_on_sqlite
@pytest.mark.slow
@settings(max_examples=250, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=examples(max_rows=20))
def test_refused_or_the_unsharded_answer_on_sqlite_wide(
    sqlite_engine: sa.Engine, ex: dict[str, Any]
) -> None:
    refused_or_the_unsharded_answer(sqlite_engine, ex)


def refused_or_the_unsharded_answer(sqlite_engine: sa.Engine, ex: dict[str, Any]) -> None:
    with sqlite_engine.connect() as conn:
        reset(conn, ex)
        check(sqlite_engine, conn, ex)
        conn.rollback()


# 20 drawn examples on the emulator; quick loop: test_refused_or_the_unsharded_answer_on_sqlite,
# test_nulls_placed_as_the_index_keeps_them_and_labels_are_accepted
@pytest.mark.slow
@pytest.mark.emulator
@settings(max_examples=20, deadline=None, suppress_health_check=FIXTURE_OK)
@given(ex=examples(max_rows=10))
def test_refused_or_the_unsharded_answer_on_the_emulator(
    spanner_engine: sa.Engine, ex: dict[str, Any]
) -> None:
    if not sa.inspect(spanner_engine).has_table("shape_ev1"):
        B.metadata.create_all(spanner_engine)
    if "an unknown function" in [COLUMNS[i][0] for i in ex["columns"]]:
        ex["columns"] = []  # (Spanner has no my_agg: refused anyway, shown on SQLite)
    with spanner_engine.begin() as conn:
        reset(conn, ex)
        check(spanner_engine, conn, ex)


# ----------------------------------------------------------------------------- one by one


@pytest.fixture
def db() -> Iterator[sa.Connection]:
    eng = sa.create_engine("sqlite://")
    B.metadata.create_all(eng)
    with eng.connect() as conn:
        reset(conn, {"n": 3, "rows": [(i % 3, 50 - i, i % 4) for i in range(50)], "tags": []})
        yield conn
    eng.dispose()


def test_a_window_over_200_rows_is_refused_not_answered_from_a_page_s_branches(
    db: sa.Connection,
) -> None:
    m = MODELS[3]
    stmt = sharded_select(m, index="shape_ev3_by_ts").add_columns(sa.func.count().over())
    for read in (lambda: merged(db, stmt, 5), lambda: page(db, stmt, 5)):
        with pytest.raises(ShardConfigError, match=r"count\(\*\) OVER \(\).*window function"):
            read()


def test_an_aggregate_says_what_to_do(db: sa.Connection) -> None:
    m = MODELS[3]
    stmt = sharded_select(m, index="shape_ev3_by_ts").with_only_columns(sa.func.min(m.ts))
    with pytest.raises(ShardConfigError, match=r"min\(\) is an aggregate.*scalar_subquery"):
        merged(db, stmt, 1)


def test_a_function_declared_row_level_is_accepted(db: sa.Connection) -> None:
    m = MODELS[3]
    stmt = sharded_select(m, index="shape_ev3_by_ts").add_columns(sa.func.so_twice(m.ts))
    with pytest.raises(ShardConfigError, match=r"row_level\('so_twice'\)"):
        merged(db, stmt, 1)
    db.connection.dbapi_connection.create_function(  # type: ignore[union-attr]
        "so_twice", 1, lambda v: None if v is None else 2 * v
    )
    row_level("so_twice")
    assert [r[-1] for r in merged(db, stmt, 3)] == [100, 98, 96]


def test_loader_options_with_expression_by_the_select_list_s_rule(db: sa.Connection) -> None:
    from sqlalchemy.orm import query_expression, with_expression

    class Expr(B):
        __tablename__ = "shape_expr"
        id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
        ts: Mapped[int] = mapped_column(sa.BigInteger)
        s: Mapped[int] = shard_column("id", count=3)
        later: Mapped[int | None] = query_expression()
        __table_args__ = (ShardedIndex("shape_expr_by_ts", "ts", shard="s"),)

    Expr.__table__.create(db)
    db.execute(Expr.__table__.insert(), [{"id": i, "ts": i} for i in range(9)])
    with Session(bind=db) as session:
        base = sharded_select(Expr, index="shape_expr_by_ts")
        got = merged(session, base.options(with_expression(Expr.later, Expr.ts + 1)), 3)
        assert [(e.id, e.later) for e in got] == [(0, 1), (1, 2), (2, 3)]
        window = base.options(with_expression(Expr.later, sa.func.count().over()))
        with pytest.raises(ShardConfigError, match="window function"):
            merged(session, window, 3)


def test_nulls_placed_as_the_index_keeps_them_and_labels_are_accepted(engine: sa.Engine) -> None:
    """``ts DESC NULLS LAST`` is what DESC means on SQLite and Spanner, and a label of
    the ordering column is that column: both were refused as 'cannot be served'."""
    m = MODELS[3]
    B.metadata.create_all(engine)
    with engine.begin() as conn:
        reset(
            conn,
            {
                "n": 3,
                "rows": [(0, None if i % 4 == 0 else i % 5, 0) for i in range(12)],
                "tags": [],
            },
        )
    base = sharded_select(m, index="shape_ev3_by_ts").with_only_columns(m.id, m.ts)
    t = m.ts.label("t")
    with engine.connect() as conn:
        truth = [tuple(r) for r in conn.execute(base.order_by(m.ts.desc(), m.id))]
        assert truth[-1][1] is None  # NULL last, descending
        for stmt in (
            base.order_by(m.ts.desc().nulls_last()),
            base.order_by(m.ts.desc().nulls_last(), m.id.asc().nulls_first()),
            base.add_columns(t).order_by(t.desc()),
            base.add_columns(t).order_by(sa.desc("t"), m.id),
        ):
            width = 2
            for plan in PLANS:
                with forced(plan):
                    assert [tuple(r)[:width] for r in merged(conn, stmt, 12)] == truth
                    assert [tuple(r)[:width] for r in walk(conn, stmt, 5)] == truth
        with pytest.raises(
            ShardConfigError, match="NULLS FIRST cannot be served.*Write NULLS LAST"
        ):
            merged(conn, base.order_by(m.ts.desc().nulls_first()), 3)
        # NOT NULL: a NULLS placement orders nothing
        assert merged(conn, base.order_by(m.ts.desc().nulls_last(), m.id.nulls_last()), 3)
