"""The read-surface oracle: SQLAlchemy's settings around a sharded read, enumerated.

Its input space is ``read_surface.py``: the mapper's ``lazy=`` for a many-to-one and a
collection, ``innerjoin`` on the mapper, loader options with their flags, execution
options (an application key read by a ``do_orm_execute`` listener among them), the
Session's binds, boolean pins. Hypothesis draws one entry of each; ``merged()`` (under
every plan of the cost rule, forced) and a ``page()`` walk must give the entities the
unsharded statement gives through a Session configured the same way, with the same
attributes loaded, or refuse with a ``ShardingError``. An unsharded statement SQLAlchemy
itself refuses (``yield_per`` with a joined collection) must be refused too.

The unsharded answer is read in a Session of its own, so nothing the sharded read
loaded can leak into it through the identity map (and the other way round).
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plans import PLANS, forced
from read_surface import (
    BOOLEAN_PINS,
    CALLS,
    COLLECTION_LAZY,
    EXECUTION_OPTIONS,
    LOADER_OPTIONS,
    MANY_TO_ONE_LAZY,
    MAPPER_INNERJOIN,
    SESSION_BINDS,
    dimensions,
)
from sqlalchemy import event, orm
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from sharded_orm import ShardedIndex, UTCDateTime, merged, page, shard_column
from sharded_orm import sharded_select as sharded_select_
from sharded_orm.errors import ShardingError

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
SHARDS = 4
ROWS = 48
OWNERLESS = 14  # the newest rows have no owner: what an inner join drops


class Models:
    """One declarative set built for one (many-to-one lazy, collection lazy, innerjoin)."""

    def __init__(
        self, m2o: str, coll: str, innerjoin: Any, engine: sa.Engine | None = None
    ) -> None:
        class Base(DeclarativeBase):
            pass

        class Owner(Base):
            __tablename__ = "so_owner"
            name: Mapped[str] = mapped_column(sa.String(8), primary_key=True)

        class Tag(Base):
            __tablename__ = "so_tag"
            ev_id: Mapped[int] = mapped_column(
                sa.ForeignKey("so_ev.id"), primary_key=True, autoincrement=False
            )
            tag: Mapped[str] = mapped_column(sa.String(8), primary_key=True)

        joined = {"innerjoin": innerjoin} if m2o == "joined" else {}
        coll_kw: dict[str, Any] = {"order_by": Tag.tag} if coll not in ("write_only",) else {}

        class Ev(Base):
            __tablename__ = "so_ev"
            id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
            tenant: Mapped[int] = mapped_column(sa.BigInteger)
            active: Mapped[bool] = mapped_column(sa.Boolean)
            ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
            score: Mapped[float] = mapped_column(sa.Float)
            owner_name: Mapped[str | None] = mapped_column(
                sa.ForeignKey("so_owner.name"), nullable=True
            )
            s: Mapped[int] = shard_column("id", count=SHARDS)
            owner = relationship(Owner, lazy=m2o, **joined)  # type: ignore[call-overload]
            tags = relationship(Tag, lazy=coll, **coll_kw)  # type: ignore[call-overload]
            __table_args__ = (
                ShardedIndex("so_ev_by_ts", sa.desc("ts"), shard="s"),
                ShardedIndex("so_ev_by_active_ts", "active", sa.desc("ts"), shard="s"),
            )

        self.Base, self.Owner, self.Tag, self.Ev = Base, Owner, Tag, Ev
        self.m2o, self.coll = m2o, coll
        if engine is not None:  # the emulator: one schema
            self.engine = engine
            Base.metadata.create_all(engine)
            with engine.begin() as conn:
                fill(conn, self, first_id=0)
            return
        self.engine = sa.create_engine("sqlite://", poolclass=sa.pool.StaticPool)

        @event.listens_for(self.engine, "connect")
        def attach(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute("ATTACH DATABASE ':memory:' AS other")

        Base.metadata.create_all(self.engine)
        other = self.engine.execution_options(schema_translate_map={None: "other"})
        Base.metadata.create_all(other)
        with self.engine.begin() as conn:
            fill(conn, self, first_id=0)
        with other.begin() as conn:  # another tenant's schema: other rows
            fill(conn, self, first_id=1000)


def fill(conn: sa.Connection, m: Models, first_id: int) -> None:
    conn.execute(sa.insert(m.Owner), [{"name": f"o{i}"} for i in range(3)])
    evs, tags = [], []
    for j in range(ROWS):
        i = first_id + j
        evs.append(
            {
                "id": i,
                "tenant": j % 3,
                "active": j % 4 != 1,
                "ts": T0 - dt.timedelta(seconds=j),  # newest first: j = 0 is the newest
                "score": float(j % 5),
                "owner_name": None if j < OWNERLESS else f"o{j % 3}",
            }
        )
        tags += [{"ev_id": i, "tag": t} for t in "abc"[: j % 3]]
    conn.execute(sa.insert(m.Ev), evs)
    conn.execute(sa.insert(m.Tag), tags)


_MODELS: dict[tuple[str, str, Any], Models] = {}


def models(m2o: str, coll: str, innerjoin: Any) -> Models:
    key = (m2o, coll, innerjoin if m2o == "joined" else False)
    if key not in _MODELS:
        _MODELS[key] = Models(*key)
    return _MODELS[key]


def make_option(m: Models, name: str) -> list[Any]:
    Ev, Owner = m.Ev, m.Owner
    o = orm
    table: dict[str, Any] = {
        "none": lambda: [],
        "joinedload(owner)": lambda: [o.joinedload(Ev.owner)],
        "joinedload(owner, innerjoin=True)": lambda: [o.joinedload(Ev.owner, innerjoin=True)],
        "joinedload(tags)": lambda: [o.joinedload(Ev.tags)],
        "joinedload(tags, innerjoin=True)": lambda: [o.joinedload(Ev.tags, innerjoin=True)],
        "selectinload(owner)": lambda: [o.selectinload(Ev.owner)],
        "selectinload(tags)": lambda: [o.selectinload(Ev.tags)],
        "subqueryload(tags)": lambda: [o.subqueryload(Ev.tags)],
        "immediateload(owner)": lambda: [o.immediateload(Ev.owner)],
        "lazyload(owner)": lambda: [o.lazyload(Ev.owner)],
        "noload(tags)": lambda: [o.noload(Ev.tags)],
        "raiseload(*)": lambda: [o.raiseload("*")],
        "lazyload(*)": lambda: [o.lazyload("*")],
        "defer(score)": lambda: [o.defer(Ev.score)],
        "undefer(score)": lambda: [o.undefer(Ev.score)],
        "load_only(ts, tenant)": lambda: [o.load_only(Ev.ts, Ev.tenant)],
        "with_loader_criteria(Ev, tenant != 99)": lambda: [
            o.with_loader_criteria(Ev, Ev.tenant != 99)
        ],
        "with_loader_criteria(Ev, tenant in 400 values)": lambda: [
            o.with_loader_criteria(Ev, Ev.tenant.in_([0, 2, *range(10, 408)]))
        ],
        "with_loader_criteria(Owner, include_aliases)": lambda: [
            o.with_loader_criteria(Owner, Owner.name != "o1", include_aliases=True)
        ],
        "with_loader_criteria(Ev, propagate_to_loaders=False)": lambda: [
            o.with_loader_criteria(Ev, Ev.tenant != 1, propagate_to_loaders=False)
        ],
    }
    return table[name]()


def make_execution_options(name: str) -> dict[str, Any]:
    return {
        "none": {},
        "populate_existing": {"populate_existing": True},
        "yield_per": {"yield_per": 7},
        "stream_results": {"stream_results": True},
        "schema_translate_map": {"schema_translate_map": {None: "other"}},
        "tenant": {"tenant": 2},
        "autoflush=False": {"autoflush": False},
        "max_row_buffer": {"stream_results": True, "max_row_buffer": 5},
    }[name]


class TenantSession(Session):
    """A Session whose listener turns the ``tenant`` execution option into a filter."""


@event.listens_for(TenantSession, "do_orm_execute")
def _tenant_filter(state: orm.ORMExecuteState) -> None:
    """SQLAlchemy's documented recipe (``with_loader_criteria`` on every SELECT), keyed
    by the statement's ``bind_mapper``. (A listener that looks at ``all_mappers``, the
    entities of the result rows, does not see the bound round, whose rows are sort keys:
    docs/queries.md.)"""
    tenant = state.execution_options.get("tenant")
    if not state.is_select or tenant is None or state.is_relationship_load:
        return
    mapper = state.bind_mapper
    if mapper is not None and hasattr(mapper.class_, "tenant"):
        cls = mapper.class_
        state.statement = state.statement.options(
            orm.with_loader_criteria(cls, cls.tenant == tenant, include_aliases=True)
        )


def make_session(m: Models, binds: str) -> Session:
    if binds == "bind":
        return TenantSession(bind=m.engine)
    if binds == "binds per mapper":
        return TenantSession(binds={m.Ev: m.engine, m.Owner: m.engine, m.Tag: m.engine})
    if binds == "binds per base":
        return TenantSession(binds={m.Base: m.engine})
    tables = m.Base.metadata.tables.values()
    return TenantSession(binds=dict.fromkeys(tables, m.engine))


def make_pin(m: Models, name: str) -> tuple[str, list[Any]]:
    """(index, WHERE conditions) for a pin of ``active``."""
    a = m.Ev.active
    conds = {
        "none": [],
        "== True": [a == True],  # noqa: E712 (as apps write it)
        ".is_(True)": [a.is_(True)],
        "== true()": [a == sa.true()],
        "bare": [a],
        "== False": [a == False],  # noqa: E712
        "~": [~a],
        ".is_(False)": [a.is_(False)],
    }[name]
    return ("so_ev_by_ts" if name == "none" else "so_ev_by_active_ts"), conds


def observed(session: Session, objs: list[Any], m: Models) -> list[tuple[Any, ...]]:
    """Each entity's id and what it has loaded, read without loading anything more."""
    out = []
    for obj in objs:
        state = sa.inspect(obj)
        unloaded = state.unloaded
        loaded: list[tuple[str, Any]] = []
        for key in ("tenant", "active", "ts", "score", "owner_name"):
            if key not in unloaded:
                loaded.append((key, state.dict[key]))
        if "owner" not in unloaded:
            owner = state.dict.get("owner")
            loaded.append(("owner", None if owner is None else owner.name))
        if "tags" not in unloaded and m.coll not in ("dynamic", "write_only"):
            tags = state.dict.get("tags")
            loaded.append(("tags", None if tags is None else sorted(t.tag for t in tags)))
        out.append((state.identity, tuple(loaded)))
    return out


def reference(m: Models, ex: dict[str, Any], stmt_of: Any) -> list[tuple[Any, ...]] | Exception:
    with make_session(m, ex["binds"]) as s:
        stmt = stmt_of(sa.select(m.Ev))
        try:
            try:
                objs = list(s.scalars(stmt))
            except sa.exc.InvalidRequestError as exc:  # a joined collection wants unique()
                if "unique" not in str(exc):
                    raise
                objs = list(s.scalars(stmt).unique())
        except Exception as exc:  # noqa: BLE001 (SQLAlchemy refuses the statement itself)
            return exc
        return observed(s, objs, m)


def statement_maker(m: Models, ex: dict[str, Any]) -> tuple[str, Any]:
    index, conds = make_pin(m, ex["pin"])
    opts = make_option(m, ex["option"])
    xopts = make_execution_options(ex["xopt"])

    def build(base: Any) -> Any:
        stmt = base.where(*conds).order_by(m.Ev.ts.desc())
        if opts:
            stmt = stmt.options(*opts)
        if xopts:
            stmt = stmt.execution_options(**xopts)
        return stmt

    return index, build


def check(ex: dict[str, Any], m: Models | None = None) -> str:
    """'exact' or 'refused: <message>'; fails on anything else."""
    if m is None:
        m = models(ex["m2o"], ex["coll"], ex["innerjoin"])
    index, build = statement_maker(m, ex)
    everything = reference(m, ex, build)
    k = ex["k"]
    sharded = build(sharded_select_(m.Ev, index=index))
    if isinstance(everything, Exception):
        with pytest.raises(Exception), make_session(m, ex["binds"]) as s:  # noqa: B017
            merged(s, sharded, k)
        return "refused by SQLAlchemy"
    try:
        for plan in PLANS:
            with forced(plan), make_session(m, ex["binds"]) as s:
                if ex["call"] == "merged":
                    got = observed(s, merged(s, sharded, k), m)
                    assert got == everything[:k], (plan, ex)
                else:
                    got, cursor = [], None
                    for _ in range(len(everything) + 2):
                        p = page(s, sharded, k, cursor)
                        got += observed(s, p.rows, m)
                        cursor = p.next_cursor
                        if cursor is None:
                            break
                    assert got == everything, (plan, ex)
    except ShardingError as exc:
        message = str(exc)
        assert message.strip(), "a refusal must say what is wrong"
        return f"refused: {type(exc).__name__}: {message.splitlines()[0][:90]}"
    return "exact"


def example() -> Any:
    return st.fixed_dictionaries(
        {
            "m2o": st.sampled_from(MANY_TO_ONE_LAZY),
            "coll": st.sampled_from(COLLECTION_LAZY),
            "innerjoin": st.sampled_from(MAPPER_INNERJOIN),
            "option": st.sampled_from(LOADER_OPTIONS),
            "xopt": st.sampled_from(EXECUTION_OPTIONS),
            "binds": st.sampled_from(SESSION_BINDS),
            "pin": st.sampled_from(BOOLEAN_PINS),
            "call": st.sampled_from(CALLS),
            "k": st.sampled_from([1, 5, 17, 60]),
        }
    )


OUTCOMES: dict[str, int] = {}


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    if OUTCOMES:
        print("\nread-surface oracle outcomes:")
        for outcome, n in sorted(OUTCOMES.items(), key=lambda kv: -kv[1]):
            print(f"  {n:5d}  {outcome}")


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(example())
def test_read_surface_oracle(ex: dict[str, Any]) -> None:
    outcome = check(ex)
    OUTCOMES[outcome] = OUTCOMES.get(outcome, 0) + 1


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(example())
def test_read_surface_oracle_wide(ex: dict[str, Any]) -> None:
    outcome = check(ex)
    OUTCOMES[outcome] = OUTCOMES.get(outcome, 0) + 1


#: one entry of each dimension at least once, the rest at their first value: every
#: setting is tried whatever hypothesis draws
def _each_entry() -> Iterator[dict[str, Any]]:
    base = {name: values[0] for name, values in dimensions().items()}
    keys = {
        "many_to_one_lazy": "m2o",
        "collection_lazy": "coll",
        "mapper_innerjoin": "innerjoin",
        "loader_option": "option",
        "execution_option": "xopt",
        "session_binds": "binds",
        "boolean_pin": "pin",
        "call": "call",
    }
    seen = set()
    for name, values in dimensions().items():
        for value in values:
            ex = {keys[k]: v for k, v in base.items()} | {keys[name]: value, "k": 17}
            if name == "mapper_innerjoin":
                ex["m2o"] = "joined"
            ident = tuple(sorted((k, repr(v)) for k, v in ex.items()))
            if ident not in seen:
                seen.add(ident)
                yield pytest.param(ex, id=f"{name}={value}")


EACH = list(_each_entry())


@pytest.mark.parametrize("ex", EACH)
def test_each_setting_once(ex: dict[str, Any]) -> None:
    check(ex)


def test_the_surface_is_what_the_docs_list() -> None:
    dims = dimensions()
    assert set(dims["many_to_one_lazy"]) >= {"select", "joined", "subquery", "selectin"}
    assert len(list(itertools.product(*dims.values()))) > 100_000  # the space drawn from


# ----------------------------------------------------------------------- the emulator

#: each class the issue named, and a setting of every dimension, on Spanner: (lazy of
#: the many-to-one, its innerjoin) -> the examples run on one database of that model
EMULATOR = {
    ("joined", False): [
        {"option": "none", "call": "merged", "k": 10},
        {"option": "none", "call": "page", "k": 17},
    ],
    ("joined", True): [{"option": "none", "call": "merged", "k": 10}],
    ("select", False): [
        {"option": "joinedload(owner, innerjoin=True)", "call": "merged", "k": 10},
        {"option": "joinedload(owner, innerjoin=True)", "call": "page", "k": 7},
        {"option": "with_loader_criteria(Ev, tenant in 400 values)", "call": "merged", "k": 5},
        {"xopt": "tenant", "call": "page", "k": 7},
        {"binds": "binds per mapper", "call": "merged", "k": 5},
        {"binds": "binds per table", "call": "page", "k": 9},
        {"pin": "== True", "call": "merged", "k": 5},
        {"pin": "bare", "call": "page", "k": 9},
        {"pin": "~", "call": "merged", "k": 5},
        {"option": "selectinload(tags)", "call": "merged", "k": 5},
        {"xopt": "populate_existing", "call": "page", "k": 9},
    ],
}


@pytest.mark.emulator
@pytest.mark.parametrize("model", list(EMULATOR), ids=[f"{a}-innerjoin={b}" for a, b in EMULATOR])
def test_read_surface_on_spanner(spanner_emulator: Any, model: tuple[str, bool]) -> None:
    m2o, innerjoin = model
    engine = spanner_emulator.engine(spanner_emulator.create_database())
    try:
        m = Models(m2o, "select", innerjoin, engine=engine)
        for part in EMULATOR[model]:
            ex = {
                "m2o": m2o,
                "coll": "select",
                "innerjoin": innerjoin,
                "option": "none",
                "xopt": "none",
                "binds": "bind",
                "pin": "none",
            } | part
            assert check(ex, m) == "exact", ex
    finally:
        engine.dispose()


#: the models the drawn emulator examples read, one database each (made once a module)
SPANNER_MODELS = [
    ("joined", "select", False),
    ("select", "joined", False),
    ("joined", "select", True),
]
_ON_SPANNER: dict[tuple[str, str, bool], Models] = {}


@pytest.fixture(scope="module")
def spanner_models(request: pytest.FixtureRequest) -> Iterator[dict[tuple[str, str, bool], Models]]:
    emulator = request.getfixturevalue("spanner_emulator")
    engines = []
    for key in SPANNER_MODELS:
        engine = emulator.engine(emulator.create_database())
        engines.append(engine)
        _ON_SPANNER[key] = Models(*key, engine=engine)
    yield _ON_SPANNER
    _ON_SPANNER.clear()
    for engine in engines:
        engine.dispose()


def spanner_example() -> Any:
    """Drawn as on SQLite, from every dimension but the schema map (Spanner's default
    schema has no name SQLAlchemy can translate) and the mapper's settings, which the
    three databases fix."""
    return st.fixed_dictionaries(
        {
            "model": st.sampled_from(SPANNER_MODELS),
            "option": st.sampled_from(LOADER_OPTIONS),
            "xopt": st.sampled_from([x for x in EXECUTION_OPTIONS if x != "schema_translate_map"]),
            "binds": st.sampled_from(SESSION_BINDS),
            "pin": st.sampled_from(BOOLEAN_PINS),
            "call": st.sampled_from(CALLS),
            "k": st.sampled_from([1, 5, 17]),
        }
    )


def _on_spanner(models: dict[tuple[str, str, bool], Models], ex: dict[str, Any]) -> None:
    m2o, coll, innerjoin = ex.pop("model")
    ex |= {"m2o": m2o, "coll": coll, "innerjoin": innerjoin}
    outcome = f"spanner: {check(ex, models[(m2o, coll, innerjoin)])}"
    OUTCOMES[outcome] = OUTCOMES.get(outcome, 0) + 1


@pytest.mark.emulator
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(spanner_example())
def test_read_surface_oracle_on_spanner(
    spanner_models: dict[tuple[str, str, bool], Models], ex: dict[str, Any]
) -> None:
    _on_spanner(spanner_models, ex)


@pytest.mark.emulator
@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(spanner_example())
def test_read_surface_oracle_on_spanner_wide(
    spanner_models: dict[tuple[str, str, bool], Models], ex: dict[str, Any]
) -> None:
    _on_spanner(spanner_models, ex)
