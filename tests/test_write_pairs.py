"""The write-pair oracle: every pair of the library's write features, drawn.

Its input space is ``write_features.py``: a successor declared or not, a client- or
server-side shard, in the key or beside it, keys of 1 to 3 columns, the first source of
each column type, every kind of ``default=`` and ``onupdate=`` on the second source, every
write path SQLAlchemy offers, and batch sizes. For each drawn example the same writes run
on the sharded model and on a plain twin (the same columns, no shard column, no
successor) in a database of its own. After them:

* the sharded table holds what the twin holds, column for column (what plain SQLAlchemy
  stores is what the library stores);
* every stored shard is ``compute`` of the stored sources;
* with a successor, both tables hold the same rows (``compare_tables``) and every shard of
  the successor is right (``verify``);

or the library refused with a ``ShardingError`` that says what is wrong, and wrote
nothing. A write that plain SQLAlchemy itself refuses must fail too.

The backend is a dimension: SQLite (in memory, a database per example) and the Spanner
emulator (one database a module, shared by every example, each with tables of its own
names, so an example costs its DDL and its writes, not a database), reached through the
sync engine or through the async one (``spanner_async``: the same ``check`` run on
``AsyncEngine.sync_engine`` in SQLAlchemy's greenlet, every DB-API call through the async
dialect's adapter).
"""

from __future__ import annotations

import datetime as dt
import enum
import itertools
import math
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import DeclarativeBase, Session, mapped_column, relationship
from write_features import (
    CHILD,
    DEFAULT,
    KEY_COLUMNS,
    ONLY_ON,
    ONUPDATE,
    SHARD_POSITION,
    SHARD_SIDE,
    SUCCESSOR,
    WRITE_PATHS,
    batches,
    dimensions,
    source_types,
    write_paths,
)

from sharded_orm import UTCDateTime, declare_successor, get_shard_column, shard_column
from sharded_orm.errors import ShardingError

_T = TypeVar("_T")
T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
D0 = dt.date(2024, 1, 1)
NAIVE0 = dt.datetime(2024, 1, 1, 12, 30)


class Colour(enum.Enum):
    red = 1
    green = 2
    blue = 3


class Tone(str, enum.Enum):
    LIGHT = "light"
    DARK = "dark"


class Lowered(sa.TypeDecorator[str]):
    """Stores its text lower-cased: the shard is of what is stored."""

    impl = sa.String(20)
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Any) -> str | None:
        return None if value is None else value.lower()


def source_type(name: str) -> Any:
    return {
        "String": sa.String(20),
        "BigInteger": sa.BigInteger(),
        "UTCDateTime": UTCDateTime(),
        "AwareDateTime": sa.DateTime(timezone=True),
        "NaiveDateTime": sa.DateTime(),
        "Date": sa.Date(),
        "Numeric": sa.Numeric(12, 2),
        "Boolean": sa.Boolean(),
        "Enum": sa.Enum(Colour, native_enum=False, length=8),
        "StrEnum": sa.String(8),
        "Uuid": sa.Uuid(),
        "LargeBinary": sa.LargeBinary(16),
        "TypeDecorator": Lowered(),
        "Float": sa.Float(),
        "JSON": sa.JSON(),
        "Array": sa.ARRAY(sa.String(8)),
    }[name]


def source_value(name: str, i: int) -> Any:
    j = i % 5
    return {
        "String": f"v{j}",
        "BigInteger": j * 1_000_003,
        "UTCDateTime": T0 + dt.timedelta(seconds=j, microseconds=7),
        "AwareDateTime": T0 + dt.timedelta(minutes=j, microseconds=11),
        "NaiveDateTime": NAIVE0 + dt.timedelta(hours=j, microseconds=3),
        "Date": D0 + dt.timedelta(days=j),
        "Numeric": Decimal(f"{j}.25"),
        "Boolean": j % 2 == 0,
        "Enum": list(Colour)[j % 3],
        "StrEnum": list(Tone)[j % 2],
        "Uuid": uuid.UUID(int=j + 1),
        "LargeBinary": bytes([j]) * 3,
        "TypeDecorator": f"V{j}",
        "Float": j + 0.5,
        "JSON": {"j": j},
        "Array": [f"a{j}"],
    }[name]


def _context_default(ctx: Any) -> str:
    return "d-" + str(ctx.get_current_parameters().get("body"))


def _context_onupdate(ctx: Any) -> str:
    return "u-" + str(ctx.get_current_parameters().get("body"))


def b_column(default: str, onupdate: str) -> Any:
    kw: dict[str, Any] = {
        "default": {
            "scalar": "ds",
            "callable": lambda: "dc",
            "context": _context_default,
            "sql": sa.func.lower("DSQL"),
        }[default]
    }
    if onupdate != "none":
        kw["onupdate"] = {
            "scalar": "us",
            "callable": lambda: "uc",
            "context": _context_onupdate,
            "sql": sa.func.lower("USQL"),
        }[onupdate]
    return mapped_column(sa.String(40), **kw)


KEYS: list[tuple[str, Any]] = [("id", sa.BigInteger), ("n", sa.String(8)), ("m", sa.BigInteger)]


class Models:
    """The sharded model (and its successor, and its child) and the plain twin, for one
    example; ``suffix`` makes the table names its own (the emulator's database is shared)."""

    sharded: Any
    successor: Any
    plain: Any
    sharded_child: Any
    plain_child: Any

    def __init__(self, ex: dict[str, Any], suffix: str = "") -> None:
        self.ex = ex
        self.suffix = suffix
        self.keys = [k for k, _ in KEYS[: ex["key_columns"]]]
        self.sharded, self.successor, self.sharded_child, self.sharded_meta = self._build(True)
        self.plain, _, self.plain_child, self.plain_meta = self._build(False)

    def _build(self, shard: bool) -> tuple[Any, Any, Any, sa.MetaData]:
        ex, sfx = self.ex, self.suffix

        class Base(DeclarativeBase):
            pass

        def columns(count: int | None, name: str) -> dict[str, Any]:
            attrs: dict[str, Any] = {"__tablename__": name, "__annotations__": {}}
            for key, type_ in KEYS[: ex["key_columns"]]:
                attrs[key] = mapped_column(type_, primary_key=True, autoincrement=False)
            attrs["src"] = mapped_column(source_type(ex["source_type"]))
            attrs["b"] = b_column(ex["default"], ex["onupdate"])
            attrs["body"] = mapped_column(sa.String(40), nullable=True)
            attrs["kind"] = mapped_column(sa.String(4))
            if count is not None:
                server = ex["shard_side"] == "server"
                in_key = ex["shard_position"] == "key" or count == 16
                naive = {"naive_datetimes": "utc"} if ex["source_type"] == "NaiveDateTime" else {}
                attrs["s"] = shard_column(
                    "src",
                    "b",
                    count=count,
                    algorithm="farm_fingerprint" if server else "crc32",
                    server_side=server,
                    primary_key=in_key,
                    sort_order=-10,
                    **naive,
                )
            return attrs

        # the twin has a name of its own: the library checks every table of a sharded
        # table's name against it (schema/registry.py)
        name = f"wp{sfx}" if shard else f"wpp{sfx}"
        attrs = columns(8, name) if shard else columns(None, name)
        child = None
        if ex.get("child", "none") != "none":
            parent_key = (["s"] if shard and ex["shard_position"] == "key" else []) + self.keys
            child = self._child(Base, name, parent_key, attrs)
            attrs["children"] = relationship(
                child,
                cascade="all, delete-orphan",
                passive_deletes=ex["child"] == "on_delete_cascade",
            )
        old = type(f"W{id(self)}{shard}", (Base,), attrs)
        new = None
        if shard and ex["successor"]:
            new = type(f"W16{id(self)}", (Base,), columns(16, f"wp16{sfx}"))
            declare_successor(old, new)
        return old, new, child, Base.metadata

    def _child(self, base: Any, parent: str, parent_key: list[str], attrs: dict[str, Any]) -> Any:
        """A child keyed by its parent's whole key and a number, its foreign key that key."""
        cols: dict[str, Any] = {"__tablename__": f"{parent}c", "__annotations__": {}}
        for k in parent_key:
            type_ = sa.BigInteger if k == "s" else dict(KEYS)[k]
            cols[f"p_{k}"] = mapped_column(type_, primary_key=True, autoincrement=False)
        cols["c"] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
        cols["note"] = mapped_column(sa.String(8), nullable=True)
        ondelete = "CASCADE" if self.ex["child"] == "on_delete_cascade" else None
        cols["__table_args__"] = (
            sa.ForeignKeyConstraint(
                [f"p_{k}" for k in parent_key],
                [f"{parent}.{k}" for k in parent_key],
                ondelete=ondelete,
            ),
        )
        return type(f"C{id(self)}{parent}", (base,), cols)


def row(m: Models, i: int, with_b: bool = True) -> dict[str, Any]:
    r: dict[str, Any] = {"id": i, "n": f"n{i % 3}", "m": i % 2}
    r = {k: r[k] for k in m.keys}
    r |= {"src": source_value(m.ex["source_type"], i), "body": f"body{i}", "kind": "ab"[i % 2]}
    if with_b:
        r["b"] = f"b{i % 4}"
    return r


def key_of(m: Models, model: Any, i: int) -> dict[str, Any]:
    """Row ``i``'s whole primary key, as an application passes it (a shard in the key
    included, as stored)."""
    r = row(m, i)
    key = {k: v for k, v in r.items() if k in m.keys}
    if "s" in model.__table__.c and model.__table__.c.s.primary_key:
        key["s"] = get_shard_column(model, "s").compute([r["src"], r["b"]])
    return key


def child_rows(m: Models, model: Any) -> list[dict[str, Any]]:
    """Two children of every even row of the first load."""
    out = []
    for i in range(0, m.ex["batch"], 2):
        key = {f"p_{k}": v for k, v in key_of(m, model, i).items()}
        out += [key | {"c": c, "note": f"c{i}"} for c in (0, 1)]
    return out


def write(engine: sa.Engine, model: Any, m: Models) -> None:
    """The example's write path, over ``batch`` rows already stored (ids 0..batch-1)."""
    ex, n = m.ex, m.ex["batch"]
    t = model.__table__
    new_rows = [row(m, n + j) for j in range(n)]
    path = ex["write_path"]
    kind_a = t.c.kind == "a"
    if path.startswith(("orm_", "bulk_")):
        with Session(engine) as s:
            if path == "orm_add":
                s.add_all(model(**r) for r in new_rows)
            elif path in ("orm_change_b", "orm_change_body", "orm_delete"):
                by_key = [getattr(model, k) for k in m.keys]  # the twin's order
                objs = s.scalars(sa.select(model).order_by(*by_key)).all()
                for j, obj in enumerate(objs):
                    if path == "orm_change_b":
                        obj.b = f"nb{j % 3}"
                    elif path == "orm_change_body":
                        obj.body = f"nbody{j}"
                    elif j % 2 == 0:
                        s.delete(obj)
            elif path == "bulk_insert_mappings":
                s.bulk_insert_mappings(model, new_rows)
            elif path == "bulk_update_mappings":
                s.bulk_update_mappings(
                    model, [key_of(m, model, i) | {"b": f"nb{i % 3}"} for i in range(n)]
                )
            elif path == "orm_insert_many":
                s.execute(sa.insert(model), new_rows)
            elif path.startswith(("orm_update_where", "orm_delete_where")):
                sync = {"auto": "auto", "evaluate": "evaluate", "fetch": "fetch", "none": False}
                options = {"synchronize_session": sync[path.rsplit("_", 1)[1]]}
                objs = s.scalars(sa.select(model)).all()  # in the identity map: synchronized
                if path.startswith("orm_update_where"):
                    stmt: Any = sa.update(model).where(model.kind == "a").values(body="q")
                else:
                    stmt = sa.delete(model).where(model.kind == "a")
                s.execute(stmt, execution_options=options)
                del objs
            s.commit()
        return
    with engine.begin() as conn:
        if path == "core_insert_many":
            conn.execute(t.insert(), new_rows)
        elif path == "core_insert_values":
            conn.execute(t.insert().values(new_rows))
        elif path == "core_insert_without_b":
            conn.execute(t.insert(), [row(m, n + j, with_b=False) for j in range(n)])
        elif path == "core_update_where_body":
            conn.execute(t.update().where(kind_a).values(body="q"))
        elif path == "core_update_where_b":
            conn.execute(t.update().where(kind_a).values(b="q"))
        elif path == "core_delete_where":
            conn.execute(t.delete().where(kind_a))
        elif path in ("insert_or_ignore_many", "spanner_insert_or_update_many"):
            # half the rows at stored keys (other sources), half new
            rows = [row(m, i) | {"b": f"ub{i % 3}", "body": "up"} for i in range(n // 2, n + 2)]
            prefix = "OR IGNORE" if path == "insert_or_ignore_many" else "OR UPDATE"
            conn.execute(t.insert().prefix_with(prefix), rows)
        elif path in ("sqlite_upsert", "sqlite_upsert_sources", "sqlite_upsert_many"):
            rows = [row(m, i) | {"b": f"ub{i % 3}", "body": "up"} for i in range(n // 2, n + 2)]
            stmt = (
                sqlite_insert(t) if path == "sqlite_upsert_many" else sqlite_insert(t).values(rows)
            )
            sets = {"b": stmt.excluded.b, "body": stmt.excluded.body}
            if path != "sqlite_upsert":  # every source from excluded: the shard follows
                sets["src"] = stmt.excluded.src
            stmt = stmt.on_conflict_do_update(
                index_elements=[t.c[k] for k in m.keys]
                + ([t.c.s] if "s" in t.c and t.c.s.primary_key else []),
                set_=sets,
            )
            if path == "sqlite_upsert_many":
                conn.execute(stmt, rows)
            else:
                conn.execute(stmt)
        else:  # pragma: no cover (a path the list has and this function lacks)
            raise AssertionError(f"unknown write path {path}")


def stored(engine: sa.Engine, model: Any, m: Models) -> list[tuple[Any, ...]]:
    """The rows of ``model`` (its shard apart), then its children's (their copy of a
    shard in the key apart), in key order."""
    t = model.__table__
    cols = [t.c[k] for k in [*m.keys, "src", "b", "body", "kind"]]
    child = m.sharded_child if model is m.sharded else m.plain_child
    with engine.connect() as conn:
        out = [tuple(r) for r in conn.execute(sa.select(*cols).order_by(*cols[: len(m.keys)]))]
        if child is not None:
            ccols = [child.__table__.c[f"p_{k}"] for k in m.keys] + [child.__table__.c.c]
            out += [("child", *r) for r in conn.execute(sa.select(*ccols).order_by(*ccols))]
    return out


def run(engine: sa.Engine, model: Any, m: Models) -> tuple[list[Any], Exception | None]:
    """(the rows after the first load, what the write raised)"""
    child = m.sharded_child if model is m.sharded else m.plain_child
    try:
        with engine.begin() as conn:
            conn.execute(model.__table__.insert(), [row(m, i) for i in range(m.ex["batch"])])
            if child is not None:
                conn.execute(child.__table__.insert(), child_rows(m, model))
    except ShardingError as exc:  # the first load refused (the caller checks the reason)
        return stored(engine, model, m), exc
    loaded = stored(engine, model, m)
    try:
        write(engine, model, m)
    except Exception as exc:  # noqa: BLE001 (compared with what the twin does)
        return loaded, exc
    return loaded, None


class Backend:
    """Where an example's writes run: the engines for the twin and the sharded tables,
    and the suffix that makes the example's table names its own."""

    name = "sqlite"

    def engines(self) -> tuple[sa.Engine, sa.Engine]:
        return _sqlite(), _sqlite()

    def release(self, engines: tuple[sa.Engine, sa.Engine]) -> None:
        for e in engines:
            e.dispose()

    def suffix(self) -> str:
        return ""

    def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` where this backend's engines work (the async one: in a greenlet)."""
        return fn(*args)


class SpannerBackend(Backend):
    """One emulator database for a module: every example makes tables of its own names
    there (a DDL batch of ~0.1 s, where a database costs ~0.5 s), through one engine."""

    name = "spanner"

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.made = 0

    def engines(self) -> tuple[sa.Engine, sa.Engine]:
        return self.engine, self.engine

    def release(self, engines: tuple[sa.Engine, sa.Engine]) -> None:
        pass

    def suffix(self) -> str:
        self.made += 1
        return f"_{self.made}"


class AsyncSpannerBackend(SpannerBackend):
    """The module's emulator database through an ``AsyncEngine``: the examples run on its
    ``sync_engine`` in SQLAlchemy's greenlet (``run_through``), tables of their own names."""

    name = "spanner_async"

    def __init__(self, async_engine: Any) -> None:
        super().__init__(async_engine.sync_engine)
        self.async_engine = async_engine

    def suffix(self) -> str:
        self.made += 1
        return f"_a{self.made}"

    def run(self, fn: Callable[..., _T], *args: Any) -> _T:
        from sharded_orm.testing.async_engines import run_through

        return run_through(self.async_engine, lambda _engine: fn(*args))


SQLITE = Backend()
OUTCOMES: dict[str, int] = {}


def check(ex: dict[str, Any], backend: Backend = SQLITE) -> str:
    try:
        m = Models(ex, backend.suffix())
    except ShardingError as exc:  # a declaration refused: must say why
        assert str(exc).strip()
        return f"declaration refused: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    plain_engine, engine = engines = backend.engines()
    try:
        m.plain_meta.create_all(plain_engine)
        m.sharded_meta.create_all(engine)
        _, expected_error = run(plain_engine, m.plain, m)
        loaded, error = run(engine, m.sharded, m)
        if expected_error is not None:
            assert error is not None, f"plain SQLAlchemy refused ({expected_error!r}); we did not"
            return "refused by SQLAlchemy"
        if isinstance(error, ShardingError):
            assert str(error).strip(), "a refusal must say what is wrong"
            assert stored(engine, m.sharded, m) == loaded, "a refused write wrote nothing"
            return f"refused: {type(error).__name__}: {str(error).splitlines()[0][:80]}"
        if error is not None and moves_a_referenced_key(ex) and "FOREIGN KEY" in str(error):
            # a source change moves the shard in the key, which the child's foreign key
            # references: not supported (docs/shard_columns.md, "Supported combinations")
            return "unsupported: a source change moves a key a foreign key references"
        if error is not None:
            raise error
        if not (ex["shard_position"] == "key" and ex["write_path"] in UPSERTS):
            # (a shard in the key is in the conflict target: a row whose shard changes is
            # another row, as it is for any key column; the twin has no such column)
            assert stored(engine, m.sharded, m) == stored(plain_engine, m.plain, m), ex
        shard = get_shard_column(m.sharded, "s")
        t = m.sharded.__table__
        with engine.connect() as conn:
            for src, b, s in conn.execute(sa.select(t.c.src, t.c.b, t.c.s)):
                if ex["source_type"] == "AwareDateTime" and src.tzinfo is None:
                    src = src.replace(tzinfo=dt.timezone.utc)  # SQLite: the UTC wall time
                assert s == shard.compute([src, b]), (src, b, s, ex)
        if m.successor is not None:
            from sharded_orm.load.copy import compare_tables
            from sharded_orm.load.verify import verify

            diff = compare_tables(engine, m.sharded, m.successor)
            assert diff == {"missing_in_target": 0, "missing_in_source": 0, "different": 0}, (
                diff,
                ex,
            )
            report = verify(engine, m.successor, progress_mode="off")
            assert report.ok, report.as_dict()
        return "exact"
    finally:
        backend.release(engines)


def moves_a_referenced_key(ex: dict[str, Any]) -> bool:
    return bool(ex["shard_position"] == "key" and ex.get("child", "none") != "none")


#: the paths whose conflict target is the key (a shard in it makes another row)
UPSERTS = {p for p in WRITE_PATHS if "upsert" in p or "insert_or" in p}


def _sqlite() -> sa.Engine:
    engine = sa.create_engine("sqlite://", poolclass=sa.pool.StaticPool)

    @sa.event.listens_for(engine, "connect")
    def foreign_keys(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute("PRAGMA foreign_keys = ON")  # ON DELETE CASCADE acts

    return engine


def example(backend: str = "sqlite") -> Any:
    """One example, every dimension drawn from the entries ``backend`` has."""
    return st.fixed_dictionaries(
        {
            "backend": st.just(backend),
            "successor": st.sampled_from(SUCCESSOR),
            "shard_side": st.sampled_from(SHARD_SIDE),
            "shard_position": st.sampled_from(SHARD_POSITION),
            "key_columns": st.sampled_from(KEY_COLUMNS),
            "source_type": st.sampled_from(source_types(backend)),
            "onupdate": st.sampled_from(ONUPDATE),
            "default": st.sampled_from(DEFAULT),
            "child": st.sampled_from(CHILD),
            "write_path": st.sampled_from(write_paths(backend)),
            "batch": st.sampled_from(batches(backend)),
        }
    )


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    if OUTCOMES:
        print("\nwrite-pair oracle outcomes:")
        for outcome, n in sorted(OUTCOMES.items(), key=lambda kv: -kv[1]):
            print(f"  {n:5d}  {outcome}")


def _record(outcome: str, backend: Backend = SQLITE) -> None:
    outcome = f"{backend.name}: {outcome}"
    OUTCOMES[outcome] = OUTCOMES.get(outcome, 0) + 1


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(example())
def test_write_pair_oracle(ex: dict[str, Any]) -> None:
    _record(check(ex))


@pytest.mark.slow
@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(example())
def test_write_pair_oracle_wide(ex: dict[str, Any]) -> None:
    _record(check(ex))


BASE = {
    "backend": "sqlite",
    "successor": False,
    "shard_side": "client",
    "shard_position": "column",
    "key_columns": 1,
    "source_type": "String",
    "onupdate": "none",
    "default": "scalar",
    "child": "none",
    "write_path": "core_insert_many",
    "batch": 3,
}


def _pairs() -> Iterator[Any]:
    """Every pair of (successor, shard side, shard position, key columns, onupdate,
    child, write path) values at least once, and every source type and default once,
    the other dimensions at a value the pair leaves free."""
    dims: dict[str, list[Any]] = {
        "successor": SUCCESSOR,
        "shard_side": SHARD_SIDE,
        "shard_position": SHARD_POSITION,
        "key_columns": KEY_COLUMNS,
        "onupdate": ONUPDATE,
        "child": CHILD,
        "write_path": write_paths("sqlite"),
    }
    seen = set()

    def once(ex: dict[str, Any], ident: str) -> Iterator[Any]:
        key = tuple(sorted(ex.items(), key=lambda kv: kv[0]))
        if key not in seen:
            seen.add(key)
            yield pytest.param(ex, id=ident)

    for (d1, v1s), (d2, v2s) in itertools.combinations(dims.items(), 2):
        for v1, v2 in itertools.product(v1s, v2s):
            yield from once(BASE | {d1: v1, d2: v2}, f"{d1}={v1}-{d2}={v2}")
    for t in source_types("sqlite"):
        yield from once(BASE | {"source_type": t, "write_path": "orm_change_b"}, f"type={t}")
    for d in DEFAULT:
        yield from once(BASE | {"default": d, "write_path": "core_insert_without_b"}, f"d={d}")


PAIRS = list(_pairs())


@pytest.mark.parametrize("ex", PAIRS)
def test_every_pair(ex: dict[str, Any]) -> None:
    _record(check(ex))


def test_the_space() -> None:
    assert math.prod(len(entries) for entries in dimensions().values()) > 1_000_000
    assert set(ONLY_ON) <= set(WRITE_PATHS)
    assert {ONLY_ON.get(p) for p in WRITE_PATHS} <= {None, *dimensions()["backend"]}


# ------------------------------------------------------------------------- the emulator


@pytest.fixture(scope="module")
def spanner(request: pytest.FixtureRequest) -> Iterator[SpannerBackend]:
    """One emulator database for the module's Spanner examples (each makes its own
    tables there)."""
    emulator = request.getfixturevalue("spanner_emulator")
    engine = emulator.engine(emulator.create_database())
    yield SpannerBackend(engine)
    engine.dispose()


@pytest.fixture(scope="module")
def spanner_async(request: pytest.FixtureRequest) -> Iterator[AsyncSpannerBackend]:
    """The module's emulator database (``spanner``'s) through an async engine."""
    from sharded_orm.testing.async_engines import dispose

    emulator = request.getfixturevalue("spanner_emulator")
    database_id = request.getfixturevalue("spanner").engine.url.database.rsplit("/", 1)[-1]
    async_engine = emulator.async_engine(database_id)
    yield AsyncSpannerBackend(async_engine)
    dispose(async_engine)


#: the named examples every quick run makes on the emulator: each Spanner-only entry,
#: the server-side shard (a generated column) in the key and beside it, a successor, a
#: child with ON DELETE CASCADE, and batches either side of the 950 parameters
ON_SPANNER = [
    {"write_path": "spanner_insert_or_update_many"},
    {"write_path": "spanner_insert_or_update_many", "shard_side": "server", "successor": True},
    {"write_path": "insert_or_ignore_many", "shard_position": "key"},
    {
        "write_path": "orm_change_b",
        "shard_side": "server",
        "shard_position": "key",
        "expect": "refused: ShardConfigError: this UPDATE changes b, which moves the row's",
    },
    {"write_path": "core_update_where_b", "shard_side": "server", "key_columns": 3},
    {"write_path": "orm_change_b", "successor": True, "batch": 140},
    {"write_path": "core_insert_values", "successor": True, "batch": 120},
    {"write_path": "orm_update_where_fetch", "source_type": "NaiveDateTime"},
    {"write_path": "orm_delete_where_fetch", "child": "on_delete_cascade", "key_columns": 2},
    {"write_path": "orm_delete", "child": "orm_cascade", "shard_position": "key"},
]


def named_example(backend: SpannerBackend, part: dict[str, Any]) -> None:
    part = dict(part)
    expect = part.pop("expect", "exact")
    out = backend.run(check, BASE | {"backend": backend.name} | part, backend)
    _record(out, backend)
    assert out.startswith(expect), out


def _named_id(part: dict[str, Any]) -> str:
    return "-".join(map(str, list(part.values())[:3]))


@pytest.mark.emulator
@pytest.mark.parametrize("part", ON_SPANNER, ids=_named_id)
def test_named_examples_on_spanner(spanner: SpannerBackend, part: dict[str, Any]) -> None:
    named_example(spanner, part)


#: the named example the quick loop runs through the async engine: a Spanner-only path,
#: the generated shard and a successor (dual writes) in one
ASYNC_QUICK = ON_SPANNER[1]


@pytest.mark.emulator
def test_a_named_example_through_the_async_engine(spanner_async: AsyncSpannerBackend) -> None:
    named_example(spanner_async, ASYNC_QUICK)


# async variant; quick loop: test_a_named_example_through_the_async_engine
@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.parametrize("part", [p for p in ON_SPANNER if p is not ASYNC_QUICK], ids=_named_id)
def test_named_examples_through_the_async_engine(
    spanner_async: AsyncSpannerBackend, part: dict[str, Any]
) -> None:
    named_example(spanner_async, part)


# drawn pairs on the emulator; quick loop: test_named_examples_on_spanner, test_write_pair_oracle
@pytest.mark.slow
@pytest.mark.emulator
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(example("spanner"))
def test_write_pair_oracle_on_spanner(spanner: SpannerBackend, ex: dict[str, Any]) -> None:
    _record(check(ex, spanner), spanner)


@pytest.mark.emulator
@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(example("spanner"))
def test_write_pair_oracle_on_spanner_wide(spanner: SpannerBackend, ex: dict[str, Any]) -> None:
    _record(check(ex, spanner), spanner)


# async variant; quick loop: test_a_named_example_through_the_async_engine
@pytest.mark.slow
@pytest.mark.emulator
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(example("spanner_async"))
def test_write_pair_oracle_through_the_async_engine(
    spanner_async: AsyncSpannerBackend, ex: dict[str, Any]
) -> None:
    _record(spanner_async.run(check, ex, spanner_async), spanner_async)


# ------------------------------------------------------- what the oracle found, named

FOUND_BASE = BASE | {"key_columns": 2}


def test_a_multi_values_upsert_that_keeps_a_source_is_refused() -> None:
    """``insert(t).values([...]).on_conflict_do_update(set_={"b": excluded.b})``: the
    multi-VALUES form skipped the DO UPDATE check, so the stored shard stayed the hash
    of the old ``b`` (silent); it is refused as the single-row form is, and writes
    nothing."""
    out = check(FOUND_BASE | {"write_path": "sqlite_upsert"})
    assert out.startswith("refused: ShardConfigError: this upsert's DO UPDATE keeps 'src'")


@pytest.mark.parametrize("side", SHARD_SIDE)
def test_a_multi_values_upsert_moves_the_successor_row(side: str) -> None:
    """With a successor keyed by the shard of (src, b), a multi-VALUES upsert that
    changes ``b`` moves the row in the successor: the row at its old successor key was
    left behind (``missing_in_source``), as it is not for executemany."""
    ex = FOUND_BASE | {"successor": True, "shard_side": side, "write_path": "sqlite_upsert_sources"}
    assert check(ex) == "exact"
