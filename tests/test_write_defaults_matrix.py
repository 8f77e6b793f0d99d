"""Defaults and onupdates of shard sources as SQLAlchemy evaluates them (issue 41 class C,
brief H5), on every write path, against plain SQLAlchemy on a plain engine.

The same writes go to a sharded table (SQLite, the emulator) and to its twin without the
shard on a plain SQLite engine the library never watches; the stored rows must be equal,
and the stored shard the hash of the stored source. The source ``tag`` has each kind of
client-side default/onupdate; a context-sensitive one shows what it saw: the statement's
parameters as SQLAlchemy's context gives them (an UPDATE's WHERE values under their
compiled names, the columns still to be evaluated as None) and the value of ``pre``, a
non-source column whose own default/onupdate SQLAlchemy evaluates first (table order).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session

from sharded_orm import compute_shard, shard_column

N = 8
SHARD = "shard"


def _seen(ctx: Any) -> str:
    """What a context-sensitive callable saw (the shard, which the twin lacks, left out)."""
    params = ctx.get_current_parameters()
    shown = sorted((k, repr(v)) for k, v in params.items() if k != SHARD)
    # (SQLAlchemy names the column of a multi-row VALUES list's later rows ``<key>_m<n>``,
    # an internal stand-in; sharded-orm's context shows the column itself: not compared)
    key = re.sub(r"_m\d+$", "", ctx.current_column.key)
    return f"{key}|{ctx.isupdate}|{shown}"[:380]


def _pre(ctx: Any) -> str:
    return "pre-" + str(ctx.get_current_parameters().get("b"))


def _reads_pre(ctx: Any) -> str:
    return "saw-" + str(ctx.get_current_parameters().get("pre"))


#: (name, default, onupdate) of the source ``tag``; ``pre`` always has _pre for both
KINDS: dict[str, tuple[Any, Any]] = {
    "scalar": ("d0", "u0"),
    "callable": (lambda: "d1", lambda: "u1"),
    "context-everything": (_seen, _seen),
    "context-earlier-column": (_reads_pre, _reads_pre),
}


def _table(metadata: sa.MetaData, kind: str, sharded: bool) -> sa.Table:
    default, onupdate = KINDS[kind]
    cols: list[Any] = [
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("b", sa.String(40), nullable=True),
        sa.Column("pre", sa.String(60), default=_pre, onupdate=_pre),
        sa.Column("tag", sa.String(400), default=default, onupdate=onupdate),
        sa.Column("late", sa.String(60), default=_reads_pre, onupdate=_reads_pre),
    ]
    name = "wdm_" + kind.replace("-", "_")
    if sharded:
        cols.append(shard_column("tag", count=N, name=SHARD).column)
    return sa.Table(name, metadata, *cols)


def _model(table: sa.Table) -> Any:
    from sqlalchemy.orm import registry

    class Row:
        pass

    registry().map_imperatively(Row, table)
    return Row


#: every write path, by name: (path, statement runner) in order; each writes its own ids
PathFn = Callable[[sa.Engine, sa.Table, Any], None]


def _insert_paths() -> list[tuple[str, PathFn]]:
    def core_one(e: sa.Engine, t: sa.Table, m: Any) -> None:
        with e.begin() as c:
            c.execute(sa.insert(t), {"id": 1, "b": "b1"})

    def core_many(e: sa.Engine, t: sa.Table, m: Any) -> None:
        with e.begin() as c:
            c.execute(sa.insert(t), [{"id": 2, "b": "b2"}, {"id": 3, "b": "b3"}])

    def core_values(e: sa.Engine, t: sa.Table, m: Any) -> None:
        with e.begin() as c:
            c.execute(sa.insert(t).values(id=4, b="b4"))

    def core_multi_values(e: sa.Engine, t: sa.Table, m: Any) -> None:
        with e.begin() as c:
            c.execute(sa.insert(t).values([{"id": 5, "b": "b5"}, {"id": 6, "b": "b6"}]))

    def orm_add(e: sa.Engine, t: sa.Table, m: Any) -> None:
        with Session(e) as s, s.begin():
            o = m()
            o.id, o.b = 7, "b7"
            s.add(o)

    def bulk_insert(e: sa.Engine, t: sa.Table, m: Any) -> None:
        with Session(e) as s, s.begin():
            s.bulk_insert_mappings(m, [{"id": 8, "b": "b8"}, {"id": 9, "b": "b9"}])

    def orm_insert(e: sa.Engine, t: sa.Table, m: Any) -> None:
        with Session(e) as s, s.begin():
            s.execute(sa.insert(m).values(id=10, b="b10"))
            s.execute(sa.insert(m), [{"id": 11, "b": "b11"}, {"id": 12, "b": "b12"}])

    return [
        ("core insert", core_one),
        ("core insert executemany", core_many),
        ("core insert values", core_values),
        ("core insert multi-VALUES", core_multi_values),
        ("orm add", orm_add),
        ("bulk_insert_mappings", bulk_insert),
        ("orm insert", orm_insert),
    ]


def _update_paths() -> list[tuple[str, PathFn]]:
    def core_values(e: sa.Engine, t: sa.Table, m: Any) -> None:
        with e.begin() as c:
            c.execute(sa.update(t).where(t.c.id == 1).values(b="q1"))

    def core_many(e: sa.Engine, t: sa.Table, m: Any) -> None:
        with e.begin() as c:
            stmt = sa.update(t).where(t.c.id == sa.bindparam("k"))
            c.execute(stmt, [{"k": 2, "b": "q2"}, {"k": 3, "b": "q3"}])

    def core_where_b(e: sa.Engine, t: sa.Table, m: Any) -> None:
        with e.begin() as c:
            c.execute(sa.update(t).where(t.c.b == "b4", t.c.id > 0).values(b="q4"))

    def orm_flush(e: sa.Engine, t: sa.Table, m: Any) -> None:
        with Session(e) as s, s.begin():
            o = s.get(m, 5)
            o.b = "q5"

    def bulk_update(e: sa.Engine, t: sa.Table, m: Any) -> None:
        with Session(e) as s, s.begin():
            s.bulk_update_mappings(m, [{"id": 6, "b": "q6"}])

    def orm_update_by_pk(e: sa.Engine, t: sa.Table, m: Any) -> None:
        with Session(e) as s, s.begin():
            s.execute(sa.update(m), [{"id": 7, "b": "q7"}])

    def orm_update_sync(e: sa.Engine, t: sa.Table, m: Any) -> None:
        with Session(e) as s, s.begin():
            for i, sync in zip((8, 9, 10, 11), ("auto", "evaluate", "fetch", False), strict=True):
                s.get(m, i)  # in the session: synchronize_session has an object to sync
                stmt = sa.update(m).where(m.id == i).values(b=f"q{i}")
                s.execute(stmt.execution_options(synchronize_session=sync))

    return [
        ("core update values", core_values),
        ("core update executemany", core_many),
        ("core update where non-key", core_where_b),
        ("orm flush", orm_flush),
        ("bulk_update_mappings", bulk_update),
        ("orm update by pk", orm_update_by_pk),
        ("orm update synchronize_session", orm_update_sync),
    ]


def _rows(engine: sa.Engine, t: sa.Table) -> dict[int, tuple[Any, ...]]:
    with engine.connect() as c:
        return {r.id: (r.b, r.pre, r.tag, r.late) for r in c.execute(sa.select(t))}


@pytest.fixture
def plain() -> Iterator[sa.Engine]:
    eng = sa.create_engine("sqlite://")
    yield eng
    eng.dispose()


def _run(engine: sa.Engine, plain: sa.Engine, kind: str) -> None:
    sharded_t = _table(sa.MetaData(), kind, sharded=True)
    plain_t = _table(sa.MetaData(), kind, sharded=False)
    sharded_t.create(engine)
    plain_t.create(plain)
    sharded_m, plain_m = _model(sharded_t), _model(plain_t)
    for phase in (_insert_paths(), _update_paths()):
        for _name, fn in phase:
            fn(engine, sharded_t, sharded_m)
            fn(plain, plain_t, plain_m)
        got, want = _rows(engine, sharded_t), _rows(plain, plain_t)
        diff = {i: (got.get(i), want.get(i)) for i in want if got.get(i) != want.get(i)}
        assert not diff, f"{kind}: stored rows differ from plain SQLAlchemy's: {diff}"
    with engine.connect() as c:
        for r in c.execute(sa.select(sharded_t)):
            assert r.shard == compute_shard([r.tag], N), (r.id, r.tag, r.shard)


@pytest.mark.parametrize("kind", list(KINDS))
def test_sources_store_what_plain_sqlalchemy_stores(
    engine: sa.Engine, plain: sa.Engine, kind: str
) -> None:
    _run(engine, plain, kind)


def test_multi_values_rows_giving_their_sources_keep_sqlalchemys_own_defaults(
    engine: sa.Engine, plain: sa.Engine
) -> None:
    """A multi-row VALUES list that gives every source leaves the other columns' defaults
    to SQLAlchemy, whose context of a later row reads that row's values by their per-row
    names (the rewritten list once carried anonymous literals there: a KeyError)."""
    tables = []
    for eng, sharded in ((engine, True), (plain, False)):
        t = _table(sa.MetaData(), "scalar", sharded=sharded)
        t.create(eng)
        rows = [{"id": i, "b": f"b{i}", "tag": f"t{i}"} for i in (1, 2, 3)]
        with eng.begin() as c:
            c.execute(sa.insert(t).values(rows))
        tables.append(t)
    assert _rows(engine, tables[0]) == _rows(plain, tables[1])
    with engine.connect() as c:
        assert {r.id: r.shard for r in c.execute(sa.select(tables[0]))} == {
            i: compute_shard([f"t{i}"], N) for i in (1, 2, 3)
        }


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    b=st.text(alphabet="abcxyz-", min_size=0, max_size=8),
    key=st.integers(min_value=1, max_value=10**6),
)
def test_where_values_reach_the_onupdate_context(plain: sa.Engine, b: str, key: int) -> None:
    """Any UPDATE ... WHERE id = <key> AND b = <b>: the onupdate sees those values under
    SQLAlchemy's names (``id_1``, ``b_1``), as plain SQLAlchemy's does (SQLite)."""
    got = []
    for sharded in (True, False):
        eng = sa.create_engine("sqlite://")
        t = _table(sa.MetaData(), "context-everything", sharded=sharded)
        t.create(eng)
        with eng.begin() as c:
            c.execute(sa.insert(t), {"id": key, "b": b, "tag": "t0"})
            c.execute(sa.update(t).where(t.c.id == key, t.c.b == b).values(b=b + "!"))
        got.append(_rows(eng, t))
        eng.dispose()
    assert got[0] == got[1]
    assert "id_1" in got[0][key][2]


# ------------------------------------------- values the database makes, and upserts (H1)

#: a source whose default the database evaluates (column keyword arguments)
DB_KINDS: dict[str, dict[str, Any]] = {
    "sql-expression": {"default": sa.func.lower("DX")},
    "sql-literal": {"default": sa.literal("dl")},
}

#: a source whose onupdate (or any value) the database makes: refused as declared (a
#: client-computed shard)
DB_ONUPDATES: dict[str, dict[str, Any]] = {
    "sql-expression onupdate": {"onupdate": sa.func.lower("UX")},
    "sql-literal onupdate": {"onupdate": sa.literal("ul")},
    "server_onupdate": {"server_onupdate": sa.FetchedValue()},
    "server_default": {"server_default": "sd"},
}


@pytest.mark.parametrize("kind", list(DB_ONUPDATES))
def test_database_made_onupdates_are_refused_when_declared(kind: str) -> None:
    """The database makes the source's value (on every UPDATE, or as its default) where
    the client cannot see it: the shard column is refused as declared, saying what to use
    instead."""
    from sharded_orm.errors import ShardConfigError

    md = sa.MetaData()
    with pytest.raises(ShardConfigError) as err:
        t = sa.Table(
            "wdm_dbu_" + re.sub(r"\W", "_", kind),
            md,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("tag", sa.String(40), **DB_ONUPDATES[kind]),
            shard_column("tag", count=N, name=SHARD).column,
        )
        from sharded_orm import get_shard_column

        get_shard_column(t, SHARD)
    text = str(err.value)
    assert kind.split(" ")[-1].split("-")[0] in text and "tag" in text, text


def _db_table(metadata: sa.MetaData, kind: str, sharded: bool) -> sa.Table:
    cols: list[Any] = [
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("b", sa.String(40), nullable=True),
        sa.Column("pre", sa.String(60), default=_pre, onupdate=_pre),
        sa.Column("tag", sa.String(400), **DB_KINDS[kind]),
        sa.Column("late", sa.String(60), default=_reads_pre, onupdate=_reads_pre),
    ]
    if sharded:
        cols.append(shard_column("tag", count=N, name=SHARD).column)
    return sa.Table("wdm_db_" + kind.replace("-", "_"), metadata, *cols)


def _exact_or_refused(
    engine: sa.Engine,
    plain: sa.Engine,
    tables: tuple[sa.Table, sa.Table],
    models: tuple[Any, Any],
    name: str,
    fn: PathFn,
) -> str:
    """One path on both: the rows it changed equal plain SQLAlchemy's, or the library
    refused it with a reason and changed nothing."""
    from sharded_orm.errors import ShardingError

    before_sharded, before_plain = _rows(engine, tables[0]), _rows(plain, tables[1])
    fn(plain, tables[1], models[1])
    after_plain = _rows(plain, tables[1])
    changed = {i for i, r in after_plain.items() if before_plain.get(i) != r}
    assert changed, f"{name}: the path changed nothing on the plain engine"
    try:
        fn(engine, tables[0], models[0])
    except ShardingError as exc:
        assert str(exc).strip(), f"{name}: a refusal must say why"
        assert _rows(engine, tables[0]) == before_sharded, f"{name}: a refusal wrote"
        return f"refused: {exc}"
    got = _rows(engine, tables[0])
    assert {i: got.get(i) for i in changed} == {i: after_plain[i] for i in changed}, name
    with engine.connect() as c:
        for r in c.execute(sa.select(tables[0])):
            assert r.shard == compute_shard([r.tag], N), (name, r.id, r.tag, r.shard)
    return "exact"


def _seed_rows(engine: sa.Engine, t: sa.Table) -> None:
    with engine.begin() as c:
        c.execute(sa.delete(t))
        c.execute(sa.insert(t), [{"id": i, "b": f"b{i}", "tag": f"t{i}"} for i in range(1, 13)])


@pytest.mark.parametrize("kind", list(DB_KINDS))
def test_database_made_sources_are_exact_or_refused(
    engine: sa.Engine, plain: sa.Engine, kind: str
) -> None:
    """A SQL-expression or server-side default of the source: the client cannot know the
    value before the database makes it, so an INSERT that leaves it to the database is
    refused, saying which default and what to do; writes that give the source, and
    UPDATEs of other columns, are exact."""
    tables = (_db_table(sa.MetaData(), kind, True), _db_table(sa.MetaData(), kind, False))
    tables[0].create(engine)
    tables[1].create(plain)
    models = (_model(tables[0]), _model(tables[1]))
    outcomes = {}
    for name, fn in _insert_paths():
        outcomes[name] = _exact_or_refused(engine, plain, tables, models, name, fn)
        assert outcomes[name].startswith("refused"), (name, outcomes[name])
        assert "default" in outcomes[name], outcomes[name]
    _seed_rows(engine, tables[0])  # the sources given: exact
    _seed_rows(plain, tables[1])
    for name, fn in _update_paths():
        outcomes[name] = _exact_or_refused(engine, plain, tables, models, name, fn)
        assert outcomes[name] == "exact", (name, outcomes[name])


def _upsert_paths() -> list[tuple[str, PathFn]]:
    """An upsert of rows 1 and 13 (one stored, one new), leaving ``tag`` to its default
    or setting it, as the backend spells an upsert: SQLite's ON CONFLICT DO UPDATE (the
    plain twin's too), Spanner's INSERT OR UPDATE (every column sent is written)."""
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    def upsert(set_tag: bool, give_tag: bool) -> PathFn:
        def run(e: sa.Engine, t: sa.Table, m: Any) -> None:
            rows = [
                {"id": i, "b": f"u{i}", **({"tag": f"ut{i}"} if give_tag else {})} for i in (1, 13)
            ]
            with e.begin() as c:
                if is_spanner(e.dialect):
                    c.execute(t.insert().prefix_with("OR UPDATE"), rows)
                    return
                stmt = sqlite_insert(t)
                sets = {"b": stmt.excluded.b}
                if set_tag:
                    sets["tag"] = stmt.excluded.tag
                if is_spanner(_BACKEND.get("dialect")):  # the twin of OR UPDATE: all sent
                    sets = {c.key: stmt.excluded[c.key] for c in t.c if c.key != "id"}
                c.execute(stmt.on_conflict_do_update(index_elements=[t.c.id], set_=sets), rows)

        return run

    return [
        ("upsert keeping tag", upsert(False, False)),
        ("upsert setting tag from excluded (its default)", upsert(True, False)),
        ("upsert setting tag given", upsert(True, True)),
    ]


#: the backend of the sharded table's current test (its plain twin upserts as it does)
_BACKEND: dict[str, Any] = {}


def is_spanner(dialect: Any) -> bool:
    from sharded_orm.spanner import is_spanner as spanner

    return dialect is not None and spanner(dialect)


@pytest.mark.parametrize("kind", list(KINDS))
def test_upserts_store_what_plain_sqlalchemy_stores(
    engine: sa.Engine, plain: sa.Engine, kind: str
) -> None:
    """Upserts of a source with each kind of client-side default: exact (the stored shard
    the hash of the stored source, the stored rows plain SQLAlchemy's) or refused with the
    reason."""
    _BACKEND["dialect"] = engine.dialect
    sharded_t = _table(sa.MetaData(), kind, sharded=True)
    plain_t = _table(sa.MetaData(), kind, sharded=False)
    sharded_t.create(engine)
    plain_t.create(plain)
    tables, models = (sharded_t, plain_t), (_model(sharded_t), _model(plain_t))
    for name, fn in _upsert_paths():
        _seed_rows(engine, sharded_t)
        _seed_rows(plain, plain_t)
        out = _exact_or_refused(engine, plain, tables, models, name, fn)
        if kind != "context-everything":  # (its text shows the statement's own parameters)
            assert out == "exact", (name, out)
