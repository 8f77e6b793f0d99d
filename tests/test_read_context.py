"""merged() and page() read what the user's statement reads around it (issue 40):
its execution options, the Session's binds and listeners, its loader criteria.

- The bound round was a Core SELECT of its own: it dropped the statement's execution
  options (a ``schema_translate_map``; an application key a ``do_orm_execute`` listener
  reads to add a tenant's criteria) and listeners did not see it as a read of the mapped
  table. Inside one transaction a tenant's page raised ``ShardReadError`` ("the rows
  changed"), and a translated schema was a missing table. The bound round is now a read
  of the statement's mapped entity with the statement's options (those of the rows
  alone, ``yield_per``, ``stream_results``, ``populate_existing``, stay in the rows
  statement: ``EXECUTION_OPTIONS``). Sibling: pending objects were flushed by the rows
  statement only, after the bound round counted without them.
- ``Session(binds={Ev: engine})`` (per mapper, base class or table) and no single bind:
  ``UnboundExecutionError``. The bind is resolved as for the statement itself.
- Loader criteria were not counted against the parameter limit: a 400-value criterion
  sent 1,205 parameters to Spanner. Statements are counted as finally compiled, the
  plan that fits is taken, and a read no plan fits is refused with what to do.

The oracle is the unsharded statement through the same Session; a hypothesis test draws
(execution option x Session bind kind x criteria size x plan) on SQLite.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plans import PLANS, forced
from sqlalchemy import event
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    ORMExecuteState,
    Session,
    mapped_column,
    with_loader_criteria,
)

from sharded_orm import (
    MergeStats,
    ShardConfigError,
    ShardedIndex,
    merged,
    page,
    shard_column,
    sharded_select,
)
from sharded_orm import limits as spanner_limits
from sharded_orm.read import context

SCHEMA = "ctx_s"
#: the statement's own map: the table is declared in a schema the databases do not have
TRANSLATE = {"schema_translate_map": {SCHEMA: None}}
ROWS = 120


class CtxBase(DeclarativeBase):
    pass


class SchemaBase(DeclarativeBase):
    pass


def ev_model(name: str, base: Any, schema: str | None) -> Any:
    return type(
        name,
        (base,),
        {
            "__tablename__": "ctx_ev",
            "__table_args__": (
                ShardedIndex("ctx_ev_by_ts", sa.desc("ts"), shard="s"),
                {"schema": schema},
            ),
            "__annotations__": {"id": Mapped[int], "tenant": Mapped[str], "ts": Mapped[int]},
            "id": mapped_column(sa.BigInteger, primary_key=True, autoincrement=False),
            "tenant": mapped_column(sa.String(8)),
            "ts": mapped_column(sa.BigInteger),
            "s": shard_column("id", count=8),
        },
    )


CtxEv = ev_model("CtxEv", CtxBase, None)
#: the same table declared in a schema the database does not have: only a
#: ``schema_translate_map`` on the statement reads it (SQLite: to the main database;
#: Spanner has no unnamed default to translate to, "Dialect has no default schema name")
SchemaEv = ev_model("SchemaEv", SchemaBase, SCHEMA)


class TenantSession(Session):
    """A Session whose listener adds a tenant's criteria to every read that names one."""


@event.listens_for(TenantSession, "do_orm_execute")
def _tenant(state: ORMExecuteState) -> None:
    tenant = state.execution_options.get("ctx_tenant")
    if state.is_select and tenant is not None:
        state.statement = state.statement.options(
            *(
                with_loader_criteria(m, m.tenant == tenant, include_aliases=True)
                for m in (CtxEv, SchemaEv)
            )
        )


def tenant_of(i: int) -> str:
    return "a" if i % 3 else "b"


def fill(engine: sa.Engine) -> None:
    CtxBase.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(
            CtxEv.__table__.insert(),
            [{"id": i, "tenant": tenant_of(i), "ts": (i * 7) % 23} for i in range(ROWS)],
        )


def stmt_with(options: dict[str, Any], criteria: list[str] | None = None, m: Any = CtxEv) -> Any:
    """The read of ``m`` with execution ``options`` and a criterion of ``criteria``."""
    stmt = sharded_select(m, index="ctx_ev_by_ts").order_by(m.ts.desc(), m.id)
    stmt = stmt.execution_options(**options)
    if criteria is not None:
        stmt = stmt.options(with_loader_criteria(m, m.tenant.in_(criteria)))
    return stmt


def truth(
    session: Session, options: dict[str, Any], criteria: list[str] | None = None, m: Any = CtxEv
) -> Any:
    """The unsharded statement's ids through ``session``."""
    q = sa.select(m).order_by(m.ts.desc(), m.id).execution_options(**options)
    if criteria is not None:
        q = q.options(with_loader_criteria(m, m.tenant.in_(criteria)))
    return [e.id for e in session.scalars(q)]


def walk(session: Any, stmt: Any, size: int) -> list[int]:
    out: list[int] = []
    cursor = None
    for _ in range(ROWS + 2):
        p = page(session, stmt, size, cursor)
        assert p.stats.statements <= 2
        out += [e.id for e in p.rows]
        if (cursor := p.next_cursor) is None:
            return out
    raise AssertionError("the walk did not end")


@pytest.fixture(scope="module")
def sqlite_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("ctx") / "ctx.db"
    eng = sa.create_engine(f"sqlite:///{path}")
    fill(eng)
    eng.dispose()
    yield path


@pytest.fixture(scope="module")
def sqlite_engine(sqlite_file: Path) -> Iterator[sa.Engine]:
    eng = sa.create_engine(f"sqlite:///{sqlite_file}")
    yield eng
    eng.dispose()


@pytest.fixture(params=["sqlite", pytest.param("emulator", marks=pytest.mark.emulator)])
def engine(request: pytest.FixtureRequest) -> sa.Engine:
    """The database, filled."""
    if request.param == "sqlite":
        eng: sa.Engine = request.getfixturevalue("sqlite_engine")
        return eng
    eng = request.getfixturevalue("spanner_engine")
    fill(eng)
    return eng


def emulated(engine: sa.Engine) -> bool:
    return engine.dialect.name.startswith("spanner")


# ------------------------------------------------------------- execution options, listeners


def test_a_tenant_read_by_a_listener_reaches_the_bound_round(engine: sa.Engine) -> None:
    """The issue's case: one transaction, a tenant's option read by a listener. Each plan
    (the bound round of its own, the probe, one statement) and a page walk give the
    tenant's rows (before: ``ShardReadError``, the rows changed)."""
    with TenantSession(engine) as session, session.begin():
        for tenant in ("a", "b"):
            opts = {"ctx_tenant": tenant}
            expected = truth(session, opts)
            assert expected and all(tenant_of(i) == tenant for i in expected)
            stmt = stmt_with(opts)
            for plan in PLANS:
                with forced(plan):
                    assert [e.id for e in merged(session, stmt, 30)] == expected[:30], plan
                    # (a page keeps a bound round of its own, on Spanner too)
                    assert walk(session, stmt, 20) == expected, plan


def test_the_statement_s_schema_translate_map_reaches_every_statement(
    sqlite_engine: sa.Engine,
) -> None:
    """The table is declared in a schema only the statement's own map translates: the
    bound round read the untranslated name (a missing table), through a Session and a
    Connection, an ORM or a Core statement. (SQLite only: Spanner has no unnamed default
    schema to translate to.)"""
    table = SchemaEv.__table__
    with Session(sqlite_engine) as session:
        expected = truth(session, TRANSLATE, m=SchemaEv)
    core = sharded_select(table, index="ctx_ev_by_ts").order_by(table.c.ts.desc(), table.c.id)
    core = core.execution_options(**TRANSLATE)
    orm = stmt_with(TRANSLATE, m=SchemaEv)
    with sqlite_engine.connect() as conn:
        for plan in PLANS:
            with forced(plan), Session(sqlite_engine) as session:
                assert [e.id for e in merged(session, orm, 40)] == expected[:40]
                assert [r.id for r in merged(conn, core, 40)] == expected[:40]
                assert walk(session, orm, 50) == expected
        assert [r.id for r in page(conn, core, 70).rows] == expected[:70]


def test_pending_objects_are_flushed_before_the_bound_round(engine: sa.Engine) -> None:
    """Sibling: the rows statement flushed the Session's new objects, the bound round (a
    Core SELECT) ran before it without them: the rows 'changed' and the read was repeated
    (with ``autoflush=False`` on the statement neither statement flushes)."""

    def reads(session: Session) -> tuple[list[int], MergeStats]:
        stats = MergeStats()
        got = merged(session, stmt_with({}), 15, stats=stats)
        return [e.id for e in got], stats

    def pages(session: Session) -> tuple[list[int], MergeStats]:
        first = page(session, stmt_with({}), 15)
        return [e.id for e in first.rows], first.stats

    for read in (reads, pages):
        with Session(engine) as session, session.begin(), forced("two rounds"):
            session.add_all(CtxEv(id=1000 + i, tenant="a", ts=100 + i) for i in range(12))
            unflushed = [e.id for e in merged(session, stmt_with({"autoflush": False}), 15)]
            assert unflushed == truth(session, {"autoflush": False})[:15]
            assert 1000 not in unflushed
            got, stats = read(session)
            assert got[:12] == [1000 + i for i in reversed(range(12))]
            assert got == truth(session, {})[:15]
            assert stats.consistency_retries == 0
            session.rollback()


@pytest.mark.parametrize(
    "options",
    [
        {"populate_existing": True},
        {"yield_per": 7},
        {"stream_results": True},
        {"stream_results": True, "max_row_buffer": 5},
        {"autoflush": False},
        {"logging_token": "ctx"},
        {"ctx_app_key": object()},
    ],
    ids=lambda o: "+".join(o),
)
def test_every_execution_option_reads_the_unsharded_rows(
    engine: sa.Engine, options: dict[str, Any]
) -> None:
    with TenantSession(engine) as session, session.begin():
        expected = truth(session, options)
        for plan in PLANS:
            with forced(plan):
                got = merged(session, stmt_with(options), 25)
            assert [e.id for e in got] == expected[:25], plan
        assert walk(session, stmt_with(options), 30) == expected


@pytest.mark.parametrize(
    "options",
    [
        {"isolation_level": "SERIALIZABLE"},
        {"isolation_level": "AUTOCOMMIT"},
        {"compiled_cache": None},
    ],
    ids=str,
)
def test_connection_options_hold_for_every_statement(
    engine: sa.Engine, options: dict[str, Any]
) -> None:
    """Options SQLAlchemy takes only on a Connection or Engine (it refuses them on a
    statement): every statement of a read runs on that connection."""
    with pytest.raises(sa.exc.ArgumentError, match="execution option may only be specified"):
        stmt_with(options)
    with TenantSession(engine.execution_options(**options)) as session:
        opts = {"ctx_tenant": "a"}
        expected = truth(session, opts)
        for plan in PLANS:
            with forced(plan):
                assert [e.id for e in merged(session, stmt_with(opts), 25)] == expected[:25]
        assert walk(session, stmt_with(opts), 30) == expected


def test_each_documented_execution_option_has_its_place() -> None:
    """Every option is judged (the rows statement carries them all); an application's
    own key goes to every statement."""
    assert set(context.EXECUTION_OPTIONS.values()) == {"every", "rows", "connection"}
    rows_only = {k for k, v in context.EXECUTION_OPTIONS.items() if v == "rows"}
    assert rows_only == {"yield_per", "stream_results", "max_row_buffer", "populate_existing"}
    opts = {"yield_per": 3, "ctx_tenant": "a", "populate_existing": True, **TRANSLATE}
    assert context.bound_round_options(stmt_with(opts)) == {**TRANSLATE, "ctx_tenant": "a"}


# ------------------------------------------------------------------------ Session binds


def bind_kinds(engine: Any, m: Any = CtxEv) -> dict[str, dict[str, Any]]:
    return {
        "one": {"bind": engine},
        "mapper": {"binds": {m: engine}},
        "base": {"binds": {m.__mro__[1]: engine}},
        "table": {"binds": {m.__table__: engine}},
    }


@pytest.mark.parametrize("kind", ["mapper", "base", "table"])
def test_a_session_bound_per_mapper_base_or_table(engine: sa.Engine, kind: str) -> None:
    """No single bind: ``UnboundExecutionError`` before (``get_bind()``, ``connection()``)."""
    with Session(engine) as session:
        expected = truth(session, {})
    table = CtxEv.__table__
    core = sharded_select(table, index="ctx_ev_by_ts").order_by(table.c.ts.desc(), table.c.id)
    with TenantSession(**bind_kinds(engine)[kind]) as session:
        for plan in PLANS:
            with forced(plan):
                assert [e.id for e in merged(session, stmt_with({}), 30)] == expected[:30]
        assert walk(session, stmt_with({}), 25) == expected
        if kind == "table":  # a Core statement finds its table's bind
            assert [r.id for r in merged(session, core, 30)] == expected[:30]
        opts = {"ctx_tenant": "b"}
        assert walk(session, stmt_with(opts), 25) == truth(session, opts)


def test_an_async_session_bound_per_mapper(sqlite_file: Path) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    async def go() -> tuple[list[int], list[int], list[int]]:
        eng = create_async_engine(f"sqlite+aiosqlite:///{sqlite_file}")
        try:
            binds = {CtxEv: eng}
            async with AsyncSession(binds=binds, sync_session_class=TenantSession) as s:
                opts = {"ctx_tenant": "a"}
                expected = await s.run_sync(lambda sync: truth(sync, opts))
                with forced("two rounds"):
                    got = await merged(s, stmt_with(opts), 30)
                first = await page(s, stmt_with(opts), 30)
                return expected, [e.id for e in got], [e.id for e in first.rows]
        finally:
            await eng.dispose()

    expected, got, first = asyncio.run(go())
    assert got == expected[:30] and first == expected[:30]


# -------------------------------------------------------------------- criteria parameters


def lower_variables(session: Session, to: int, m: Any = CtxEv) -> int:
    """The Session's SQLite limit on variables lowered to ``to`` (an async driver's
    connection cannot be: the default stays), and the limit now."""
    raw = session.connection(bind_arguments={"mapper": m}).connection.driver_connection
    if not hasattr(raw, "setlimit"):
        return spanner_limits.SQLITE_VARIABLES
    raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, to)
    return to


class Sent:
    def __init__(self, engine: sa.Engine) -> None:
        self.engine, self.params = engine, list[int]()

    def __enter__(self) -> Sent:
        event.listen(self.engine, "before_cursor_execute", self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, sql: str, params: Any, *rest: Any) -> None:
        self.params.append(len(params) if params else 0)


def test_loader_criteria_counted_on_sqlite(sqlite_engine: sa.Engine) -> None:
    """A criterion of 150 values is in each of 8 branches: 1,200 parameters and more,
    over a limit of 1,000 the statement itself fits (before: a raw OperationalError)."""
    values = [f"x{i}" for i in range(150)] + ["a"]
    with Session(sqlite_engine) as session:
        lower_variables(session, 1000)
        expected = truth(session, {}, values)
        for plan in PLANS:
            with (
                forced(plan),
                Sent(sqlite_engine) as sent,
                pytest.raises(ShardConfigError, match=r"sqlite accepts at most 1,000.*loader"),
            ):
                merged(session, stmt_with({}, values), 10)
            assert all(p <= 1000 for p in sent.params)
        fits = values[-60:]  # 60 values in 8 branches and around them: under the limit
        expected = truth(session, {}, fits)
        for plan in PLANS:
            with forced(plan):
                got = [e.id for e in merged(session, stmt_with({}, fits), 10)]
            assert got == expected[:10]


def test_a_listener_s_criteria_counted_on_sqlite(sqlite_engine: sa.Engine) -> None:
    """What a listener adds is known as the statement is sent: counted there."""

    opts = {"ctx_values": [f"x{i}" for i in range(150)] + ["a"]}
    with Wide(sqlite_engine) as session:
        lower_variables(session, 1000)
        assert len(truth(session, opts)) == len([i for i in range(ROWS) if tenant_of(i) == "a"])
        with pytest.raises(ShardConfigError, match="do_orm_execute listener"):
            page(session, stmt_with(opts), 10)


@pytest.mark.emulator
def test_a_400_value_criterion_on_the_emulator(spanner_engine: sa.Engine) -> None:
    """The issue's case: 400 values in a loader criterion. Every plan fits or takes the
    plan that fits (the bound round on its own); nothing over 950 is sent."""
    fill(spanner_engine)
    eng = spanner_engine
    values = [f"x{i}" for i in range(399)] + ["a"]
    with Session(eng) as session, Sent(eng) as sent:
        expected = truth(session, {}, values)
        for plan in PLANS:
            with forced(plan):
                got = [e.id for e in merged(session, stmt_with({}, values), 10)]
            assert got == expected[:10], plan
        assert walk(session, stmt_with({}, values), 40) == expected
        assert max(sent.params) <= spanner_limits.SPANNER_PARAMETERS
        many = [f"x{i}" for i in range(940)] + ["a"]
        sent.params.clear()
        with pytest.raises(ShardConfigError, match=r"Spanner accepts at most 950.*loader"):
            merged(session, stmt_with({}, many), 10)
        assert all(p <= spanner_limits.SPANNER_PARAMETERS for p in sent.params)


class Wide(Session):
    """A Session whose listener adds a criterion of ``ctx_values`` to every read."""


@event.listens_for(Wide, "do_orm_execute")
def _wide(state: ORMExecuteState) -> None:
    values = state.execution_options.get("ctx_values")
    if state.is_select and values:
        state.statement = state.statement.options(
            with_loader_criteria(CtxEv, CtxEv.tenant.in_(values))
        )


@pytest.mark.emulator
def test_a_listener_s_400_values_take_the_plan_that_fits(spanner_engine: sa.Engine) -> None:
    """What a listener adds is seen only as each statement is sent: the statement that
    holds the bound round (its criterion three times, about 1,200 parameters) is not
    sent, and the bound round runs as a statement of its own."""
    fill(spanner_engine)
    values = [f"x{i}" for i in range(399)] + ["a"]
    opts = {"ctx_values": values}
    with Wide(spanner_engine) as session, Sent(spanner_engine) as sent:
        expected = truth(session, opts)
        for plan in PLANS:
            stats = MergeStats()
            with forced(plan):
                got = [e.id for e in merged(session, stmt_with(opts), 10, stats=stats)]
            assert got == expected[:10], plan
            if plan == "two rounds":
                assert stats.plan == "two rounds" and stats.statements == 2
        assert walk(session, stmt_with(opts), 40) == expected
        assert max(sent.params) <= spanner_limits.SPANNER_PARAMETERS


# ------------------------------------------------------------------------------ oracle

#: execution options a read may carry, one line each: (on the statement, on the engine)
OPTIONS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({}, {}),
    ({"ctx_tenant": "a"}, {}),
    ({"ctx_tenant": "b"}, {}),
    ({"populate_existing": True}, {}),
    ({"yield_per": 5}, {}),
    ({"stream_results": True}, {}),
    ({"stream_results": True, "max_row_buffer": 3}, {}),
    ({"autoflush": False}, {}),
    ({"logging_token": "t"}, {}),
    ({"ctx_app_key": 7}, {}),
    ({}, {"compiled_cache": None}),
    ({"ctx_tenant": "a"}, {"isolation_level": "SERIALIZABLE"}),
    ({}, {"isolation_level": "AUTOCOMMIT"}),
]
BINDS = ["one", "mapper", "base", "table", "async"]
LIMIT = 600  # SQLite's variables, lowered: 8 branches of a 75-value criterion pass it


def outcome(run: Any) -> tuple[str, Any]:
    try:
        return "rows", run()
    except ShardConfigError as e:
        return "refused", str(e)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    drawn=st.sampled_from(OPTIONS),
    bind=st.sampled_from(BINDS),
    values=st.sampled_from([None, 0, 1, 20, 60, 80, 200]),
    plan=st.sampled_from(list(PLANS)),
    translated=st.booleans(),
    k=st.integers(1, 60),
    size=st.integers(10, 60),
)
def test_oracle_options_binds_and_criteria(
    sqlite_file: Path,
    sqlite_engine: sa.Engine,
    drawn: tuple[dict[str, Any], dict[str, Any]],
    bind: str,
    values: int | None,
    plan: str,
    translated: bool,
    k: int,
    size: int,
) -> None:
    """(execution option on the statement or the engine) x (Session: one bind, binds= per
    mapper, base or table, AsyncSession per mapper) x (loader criterion size) x (plan) x
    (the table in a schema the statement's own map translates): the unsharded answer, or
    a refusal where no plan fits the parameter limit."""
    criteria = None if values is None else [f"x{i}" for i in range(values)] + ["a"]
    options, on_engine = drawn
    m = SchemaEv if translated else CtxEv
    if translated:
        options = {**options, **TRANSLATE}
    stmt = stmt_with(options, criteria, m)

    def sync_reads(session: Session) -> tuple[int, Any, Any, Any]:
        limit = lower_variables(session, LIMIT, m)
        expected = outcome(lambda: truth(session, options, criteria, m))
        with forced(plan):
            got = outcome(lambda: [e.id for e in merged(session, stmt, k)])
        walked = outcome(lambda: walk(session, stmt, size))
        return limit, expected, got, walked

    if bind == "async":
        from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

        async def go() -> Any:
            eng = create_async_engine(f"sqlite+aiosqlite:///{sqlite_file}")
            try:
                binds = {m: eng.execution_options(**on_engine)}
                async with AsyncSession(binds=binds, sync_session_class=TenantSession) as s:
                    return await s.run_sync(sync_reads)
            finally:
                await eng.dispose()

        limit, expected, got, walked = asyncio.run(go())
    else:
        kinds = bind_kinds(sqlite_engine.execution_options(**on_engine), m)
        with TenantSession(**kinds[bind]) as session:
            limit, expected, got, walked = sync_reads(session)
    assert expected[0] == "rows"
    # a refusal only where no plan fits: on SQLite every plan's rows statement has the
    # criterion in each of the 8 branches and around them, and a page's branches their
    # cursor's and bound's values (about a dozen each)
    fits = criteria is None or 8 * (len(criteria) + 12) + len(criteria) + 40 <= limit
    for result, want in ((got, expected[1][:k]), (walked, expected[1])):
        if result[0] == "refused":
            assert not fits and "loader criteria" in result[1]
        else:
            assert result == ("rows", want)
