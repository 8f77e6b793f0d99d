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
"""

from __future__ import annotations

import datetime as dt
import enum
import itertools
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import DeclarativeBase, Session, mapped_column
from write_features import (
    BATCH,
    DEFAULT,
    KEY_COLUMNS,
    ONUPDATE,
    SHARD_SIDE,
    SOURCE_TYPES,
    SUCCESSOR,
    WRITE_PATHS,
    dimensions,
)

from sharded_orm import UTCDateTime, declare_successor, get_shard_column, shard_column
from sharded_orm.errors import ShardingError

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
D0 = dt.date(2024, 1, 1)
SHARD_POSITION = ["column", "key"]


class Colour(enum.Enum):
    red = 1
    green = 2
    blue = 3


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
        "Date": sa.Date(),
        "Numeric": sa.Numeric(12, 2),
        "Boolean": sa.Boolean(),
        "Enum": sa.Enum(Colour, native_enum=False, length=8),
        "Uuid": sa.Uuid(),
        "LargeBinary": sa.LargeBinary(16),
        "TypeDecorator": Lowered(),
    }[name]


def source_value(name: str, i: int) -> Any:
    j = i % 5
    return {
        "String": f"v{j}",
        "BigInteger": j * 1_000_003,
        "UTCDateTime": T0 + dt.timedelta(seconds=j, microseconds=7),
        "Date": D0 + dt.timedelta(days=j),
        "Numeric": Decimal(f"{j}.25"),
        "Boolean": j % 2 == 0,
        "Enum": list(Colour)[j % 3],
        "Uuid": uuid.UUID(int=j + 1),
        "LargeBinary": bytes([j]) * 3,
        "TypeDecorator": f"V{j}",
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


KEYS = [("id", sa.BigInteger), ("n", sa.String(8)), ("m", sa.BigInteger)]


class Models:
    """The sharded model (and its successor) and the plain twin, for one example."""

    sharded: Any
    successor: Any
    plain: Any

    def __init__(self, ex: dict[str, Any]) -> None:
        self.ex = ex
        self.keys = [k for k, _ in KEYS[: ex["key_columns"]]]
        self.sharded, self.successor, self.sharded_meta = self._build(shard=True)
        self.plain, _, self.plain_meta = self._build(shard=False)

    def _build(self, shard: bool) -> tuple[Any, Any, sa.MetaData]:
        ex = self.ex

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
                attrs["s"] = shard_column(
                    "src",
                    "b",
                    count=count,
                    algorithm="farm_fingerprint" if server else "crc32",
                    server_side=server,
                    primary_key=in_key,
                    sort_order=-10,
                )
            return attrs

        # the twin has a name of its own: the library checks every table of a sharded
        # table's name against it (schema/registry.py)
        old = type(f"W{id(self)}", (Base,), columns(8, "wp") if shard else columns(None, "wpp"))
        new = None
        if shard and ex["successor"]:
            new = type(f"W16{id(self)}", (Base,), columns(16, "wp16"))
            declare_successor(old, new)
        return old, new, Base.metadata


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
                objs = s.scalars(sa.select(model)).all()
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
            elif path.startswith("orm_update_where"):
                sync = {"auto": "auto", "evaluate": "evaluate", "fetch": "fetch", "none": False}
                s.execute(
                    sa.update(model).where(model.kind == "a").values(body="q"),
                    execution_options={"synchronize_session": sync[path.rsplit("_", 1)[1]]},
                )
            elif path == "orm_delete_where":
                s.execute(sa.delete(model).where(model.kind == "a"))
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
    t = model.__table__
    cols = [t.c[k] for k in [*m.keys, "src", "b", "body", "kind"]]
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(*cols).order_by(*cols[: len(m.keys)]))]


def run(engine: sa.Engine, model: Any, m: Models) -> tuple[list[Any], Exception | None]:
    """(the rows after the first load, what the write raised)"""
    with engine.begin() as conn:
        conn.execute(model.__table__.insert(), [row(m, i) for i in range(m.ex["batch"])])
    loaded = stored(engine, model, m)
    try:
        write(engine, model, m)
    except Exception as exc:  # noqa: BLE001 (compared with what the twin does)
        return loaded, exc
    return loaded, None


OUTCOMES: dict[str, int] = {}


def check(ex: dict[str, Any], make_engine: Callable[[], sa.Engine]) -> str:
    try:
        m = Models(ex)
    except ShardingError as exc:  # a declaration refused: must say why
        assert str(exc).strip()
        return f"declaration refused: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    plain_engine, engine = make_engine(), make_engine()
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
        if error is not None:
            raise error
        if not (ex["shard_position"] == "key" and ex["write_path"].startswith("sqlite_upsert")):
            # (a shard in the key is in the conflict target: a row whose shard changes is
            # another row, as it is for any key column; the twin has no such column)
            assert stored(engine, m.sharded, m) == stored(plain_engine, m.plain, m), ex
        shard = get_shard_column(m.sharded, "s")
        t = m.sharded.__table__
        with engine.connect() as conn:
            for src, b, s in conn.execute(sa.select(t.c.src, t.c.b, t.c.s)):
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
        plain_engine.dispose()
        engine.dispose()


def _sqlite() -> sa.Engine:
    return sa.create_engine("sqlite://", poolclass=sa.pool.StaticPool)


def example() -> Any:
    return st.fixed_dictionaries(
        {
            "successor": st.sampled_from(SUCCESSOR),
            "shard_side": st.sampled_from(SHARD_SIDE),
            "shard_position": st.sampled_from(SHARD_POSITION),
            "key_columns": st.sampled_from(KEY_COLUMNS),
            "source_type": st.sampled_from(SOURCE_TYPES),
            "onupdate": st.sampled_from(ONUPDATE),
            "default": st.sampled_from(DEFAULT),
            "write_path": st.sampled_from(WRITE_PATHS),
            "batch": st.sampled_from(BATCH),
        }
    )


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    if OUTCOMES:
        print("\nwrite-pair oracle outcomes:")
        for outcome, n in sorted(OUTCOMES.items(), key=lambda kv: -kv[1]):
            print(f"  {n:5d}  {outcome}")


def _record(outcome: str) -> None:
    OUTCOMES[outcome] = OUTCOMES.get(outcome, 0) + 1


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(example())
def test_write_pair_oracle(ex: dict[str, Any]) -> None:
    _record(check(ex, _sqlite))


@pytest.mark.slow
@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(example())
def test_write_pair_oracle_wide(ex: dict[str, Any]) -> None:
    _record(check(ex, _sqlite))


def _pairs() -> Iterator[Any]:
    """Every pair of (successor, server side, key columns, onupdate, write path) values
    at least once, the other dimensions at a value the pair leaves free."""
    dims = {
        "successor": SUCCESSOR,
        "shard_side": SHARD_SIDE,
        "key_columns": KEY_COLUMNS,
        "onupdate": ONUPDATE,
        "write_path": WRITE_PATHS,
    }
    base = {
        "successor": False,
        "shard_side": "client",
        "shard_position": "column",
        "key_columns": 1,
        "source_type": "String",
        "onupdate": "none",
        "default": "scalar",
        "write_path": "core_insert_many",
        "batch": 3,
    }
    seen = set()
    for (d1, v1s), (d2, v2s) in itertools.combinations(dims.items(), 2):
        for v1, v2 in itertools.product(v1s, v2s):
            ex = base | {d1: v1, d2: v2}
            ident = tuple(sorted(ex.items(), key=lambda kv: kv[0]))
            if ident not in seen:
                seen.add(ident)
                yield pytest.param(ex, id=f"{d1}={v1}-{d2}={v2}")


PAIRS = list(_pairs())


@pytest.mark.parametrize("ex", PAIRS)
def test_every_pair(ex: dict[str, Any]) -> None:
    _record(check(ex, _sqlite))


def test_the_space() -> None:
    assert len(list(itertools.product(*dimensions().values()))) > 100_000


# ------------------------------------------------------- what the oracle found, named

FOUND_BASE = {
    "successor": False,
    "shard_side": "client",
    "shard_position": "column",
    "key_columns": 2,
    "source_type": "String",
    "onupdate": "none",
    "default": "scalar",
    "batch": 3,
}


def test_a_multi_values_upsert_that_keeps_a_source_is_refused() -> None:
    """``insert(t).values([...]).on_conflict_do_update(set_={"b": excluded.b})``: the
    multi-VALUES form skipped the DO UPDATE check, so the stored shard stayed the hash
    of the old ``b`` (silent); it is refused as the single-row form is, and writes
    nothing."""
    out = check(FOUND_BASE | {"write_path": "sqlite_upsert"}, _sqlite)
    assert out.startswith("refused: ShardConfigError: this upsert's DO UPDATE keeps 'src'")


@pytest.mark.parametrize("side", SHARD_SIDE)
def test_a_multi_values_upsert_moves_the_successor_row(side: str) -> None:
    """With a successor keyed by the shard of (src, b), a multi-VALUES upsert that
    changes ``b`` moves the row in the successor: the row at its old successor key was
    left behind (``missing_in_source``), as it is not for executemany."""
    ex = FOUND_BASE | {"successor": True, "shard_side": side, "write_path": "sqlite_upsert_sources"}
    assert check(ex, _sqlite) == "exact"
