"""Writes where two of the library's features meet (issue 41, classes C, D and G).

* C: a shard source's ``default``/``onupdate`` is evaluated as SQLAlchemy evaluates it
  (scalar, plain callable, context-sensitive callable reading the statement's parameters
  or its column) on every write path; the stored source equals what plain SQLAlchemy
  stores, and the stored shard is its hash. What the client cannot evaluate (a SQL
  onupdate of a source whose shard the client computes) is refused with the way out.
* D: the reads that guard a write (the stored sources of a partial-source UPDATE, a
  successor's read of the rows an UPDATE matches) run in the write's transaction on
  SQLite with pysqlite's default (legacy) transaction handling: another connection's
  commit between the read and the write cannot leave a stale shard or successor.
* G: a key reshard of a table whose key shard Spanner computes (``TimestampShardedMixin``,
  ``farm_fingerprint``, ``__shard_server_side__ = True``) takes the statement forms apps
  send: an UPDATE of a non-key column, a multi-row INSERT; the successor equals the old
  table.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import ShardConfigError, compute_shard, shard_column

N = 8

# ------------------------------------------------------------------ C: defaults, onupdates


def _ctx_param(ctx: Any) -> str:
    return "by-" + str(ctx.get_current_parameters().get("b", "none"))


def _ctx_method(ctx: Any) -> str:
    return ctx.get_current_parameters().get("b", "none").upper() + "!"


def _ctx_column(ctx: Any) -> str:
    return f"{ctx.current_column.key}:{ctx.isupdate}:{ctx.current_parameters.get('b')}"


#: (name, default, onupdate) of the source ``tag``: one entry per kind SQLAlchemy knows
#: on the client side
KINDS: list[tuple[str, Any, Any]] = [
    ("scalar", "d0", "u0"),
    ("callable", lambda: "d1", lambda: "u1"),
    ("context-parameter", _ctx_param, _ctx_param),
    ("context-method", _ctx_method, _ctx_method),
    ("context-column", _ctx_column, _ctx_column),
]


class CBase(DeclarativeBase):
    pass


def _models(name: str, default: Any, onupdate: Any) -> tuple[Any, Any]:
    """A sharded model whose source ``tag`` has the default and onupdate, and its plain
    twin (no shard): what plain SQLAlchemy stores."""
    slug = name.replace("-", "_")

    def columns() -> dict[str, Any]:
        return {
            "id": mapped_column(sa.Integer, primary_key=True, autoincrement=False),
            "b": mapped_column(sa.String(40), nullable=True),
            "tag": mapped_column(sa.String(80), default=default, onupdate=onupdate),
        }

    doc = type(
        f"Doc_{slug}",
        (CBase,),
        {"__tablename__": f"wj_doc_{slug}", **columns(), "shard": shard_column("tag", count=N)},
    )
    plain = type(f"Plain_{slug}", (CBase,), {"__tablename__": f"wj_plain_{slug}", **columns()})
    return doc, plain


PAIRS = {name: _models(name, d, u) for name, d, u in KINDS}


def _every_path(engine: sa.Engine, model: Any, b: str = "v") -> None:
    """The same writes through every path: Core insert (parameters, ``.values()``,
    multi-row VALUES), ORM flush, bulk mappings, ORM-enabled insert/update, Core update
    (``.values()``, parameters), ORM flush of a changed object."""
    t = model.__table__
    with engine.begin() as c:
        c.execute(sa.insert(t), [{"id": 1, "b": f"{b}1"}])
        c.execute(sa.insert(t).values(id=2, b=f"{b}2"))
        c.execute(sa.insert(t).values([{"id": 3, "b": f"{b}3"}, {"id": 4, "b": f"{b}4"}]))
    with Session(engine) as s, s.begin():
        s.add(model(id=5, b=f"{b}5"))
        s.flush()
        s.bulk_insert_mappings(model, [{"id": 6, "b": f"{b}6"}])
        s.execute(sa.insert(model).values(id=7, b=f"{b}7"))
        s.execute(sa.insert(model), [{"id": 8, "b": f"{b}8"}])
    with engine.begin() as c:
        c.execute(sa.update(t).where(t.c.id == 1).values(b=f"{b}q"))
        c.execute(sa.update(t).where(t.c.id == sa.bindparam("k")), [{"k": 2, "b": f"{b}r"}])
        c.execute(sa.update(t).where(t.c.b == f"{b}3").values(b=f"{b}s"))
    with Session(engine) as s, s.begin():
        s.execute(sa.update(model).where(model.id == 4).values(b=f"{b}t"))
        s.execute(sa.update(model), [{"id": 6, "b": f"{b}u"}])
        s.bulk_update_mappings(model, [{"id": 7, "b": f"{b}w"}])
        obj = s.get(model, 5)
        assert obj is not None
        obj.b = f"{b}x"
        s.flush()
        if hasattr(obj, "shard"):  # the object holds the row's shard
            assert obj.shard == compute_shard([obj.tag], N)


def _stored(engine: sa.Engine, model: Any) -> dict[int, tuple[Any, Any]]:
    t = model.__table__
    with engine.connect() as c:
        return {r.id: (r.b, r.tag) for r in c.execute(sa.select(t.c.id, t.c.b, t.c.tag))}


def _assert_like_sqlalchemy(engine: sa.Engine, doc: Any, plain: Any) -> None:
    got, want = _stored(engine, doc), _stored(engine, plain)
    assert got == want
    t = doc.__table__
    with engine.connect() as c:
        for r in c.execute(sa.select(t.c.id, t.c.tag, t.c.shard)):
            assert r.shard == compute_shard([r.tag], N), (r.id, r.tag)


@pytest.mark.parametrize("kind", [k for k, _, _ in KINDS])
def test_defaults_and_onupdates_as_sqlalchemy_evaluates_them(engine: sa.Engine, kind: str) -> None:
    doc, plain = PAIRS[kind]
    CBase.metadata.create_all(engine, tables=[doc.__table__, plain.__table__])
    for model in (doc, plain):
        _every_path(engine, model)
    _assert_like_sqlalchemy(engine, doc, plain)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.text(min_size=0, max_size=12))
def test_context_sensitive_onupdate_sees_values_not_binds(b: str) -> None:
    engine = sa.create_engine("sqlite://")
    doc, plain = PAIRS["context-parameter"]
    CBase.metadata.create_all(engine, tables=[doc.__table__, plain.__table__])
    for model in (doc, plain):
        _every_path(engine, model, b)
    _assert_like_sqlalchemy(engine, doc, plain)
    assert _stored(engine, doc)[1] == (f"{b}q", f"by-{b}q")
    engine.dispose()


def test_what_the_context_does_not_offer_is_refused_with_the_reason() -> None:
    class Base(DeclarativeBase):
        pass

    class Odd(Base):
        __tablename__ = "wj_odd"
        id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
        tag: Mapped[str] = mapped_column(
            sa.String(40), default=lambda ctx: str(ctx.compiled_parameters)
        )
        shard: Mapped[int] = shard_column("tag", count=N)

    engine = sa.create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with (
        pytest.raises(ShardConfigError, match="context.compiled_parameters.*give the source"),
        engine.begin() as c,
    ):
        c.execute(sa.insert(Odd.__table__), {"id": 1})


def test_a_sql_onupdate_the_client_cannot_hash_is_refused_with_the_way_out() -> None:
    """A server_side shard is computed by the client off Spanner: a source whose onupdate
    is SQL cannot be hashed there unless the UPDATE sets it."""

    class Base(DeclarativeBase):
        pass

    class Stamp(Base):
        __tablename__ = "wj_stamp"
        id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
        b: Mapped[str | None] = mapped_column(sa.String(40))
        tag: Mapped[str] = mapped_column(sa.String(40), onupdate=sa.func.lower("X"))
        shard: Mapped[int] = shard_column(
            "tag", count=N, algorithm="farm_fingerprint", server_side=True
        )

    engine = sa.create_engine("sqlite://")
    Base.metadata.create_all(engine)
    t = Stamp.__table__
    with engine.begin() as c:
        c.execute(sa.insert(t), {"id": 1, "tag": "a"})
    with (
        pytest.raises(ShardConfigError, match="SQL onupdate.*Set the source's value"),
        engine.begin() as c,
    ):
        c.execute(sa.update(t).where(t.c.id == 1).values(b="x"))
    with engine.begin() as c:  # the source set in the UPDATE: no onupdate runs
        c.execute(sa.update(t).where(t.c.id == 1).values(b="x", tag="b"))
        row = c.execute(sa.select(t)).one()
    assert (row.tag, row.shard) == ("b", compute_shard(["b"], N, "farm_fingerprint"))


# ------------------------------------------------------------------ D: guard reads in the txn


class DBase(DeclarativeBase):
    pass


class Pair(DBase):
    __tablename__ = "wj_pair"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    a: Mapped[str] = mapped_column(sa.String(20))
    b: Mapped[str] = mapped_column(sa.String(20))
    kind: Mapped[str | None] = mapped_column(sa.String(20))
    shard: Mapped[int] = shard_column("a", "b", count=32)


@pytest.fixture(params=["delete", "wal"])
def sqlite_file(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    """A file database (rollback journal or WAL), pysqlite's default transactions."""
    path = tmp_path / "d.sqlite"
    engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 0.2})
    with engine.connect() as c:
        c.exec_driver_sql(f"PRAGMA journal_mode={request.param}")
    yield engine
    engine.dispose()


def _other_commits_before(
    engine: sa.Engine, table_name: str, sql: str, params: tuple[Any, ...]
) -> Callable[[], list[str]]:
    """An event hook that, just before the first UPDATE of ``table_name`` this engine
    sends (after the reads that guard it), has another connection run ``sql`` and
    commit; returns what happened to it ("committed" or the error)."""
    path = engine.url.database
    happened: list[str] = []

    def hook(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if happened or not statement.lstrip().upper().startswith(f"UPDATE {table_name.upper()}"):
            return
        other = sqlite3.connect(str(path), timeout=0.2)
        try:
            at = 0
            for one in sql.split("; "):
                n = one.count("?")
                other.execute(one, params[at : at + n])
                at += n
            other.commit()
            happened.append("committed")
        except sqlite3.OperationalError as exc:
            happened.append(str(exc))
        finally:
            other.close()

    sa.event.listen(engine, "before_cursor_execute", hook)
    return lambda: happened


def test_stored_source_read_runs_in_the_updates_transaction(sqlite_file: sa.Engine) -> None:
    engine = sqlite_file
    DBase.metadata.create_all(engine)
    t = Pair.__table__
    with engine.begin() as c:
        c.execute(sa.insert(t), {"id": 1, "a": "x", "b": "y"})
    happened = _other_commits_before(
        engine, "wj_pair", "UPDATE wj_pair SET b = ?, shard = ? WHERE id = 1",
        ("z", compute_shard(["x", "z"], 32)),
    )  # fmt: skip
    ours = "committed"
    try:
        with engine.begin() as c:  # sets a alone: b is read from the stored row
            c.execute(sa.update(t).where(t.c.id == 1).values(a="w"))
    except sa.exc.OperationalError as exc:
        ours = str(exc)
    assert happened(), "the other connection's write did not run"
    # never both: the read and the UPDATE are one transaction
    assert "committed" in (happened()[0], ours) and (happened()[0], ours) != (
        "committed",
        "committed",
    ), (happened(), ours)
    with engine.connect() as c:
        row = c.execute(sa.select(t)).one()
    assert row.shard == compute_shard([row.a, row.b], 32), tuple(row)


def test_successor_read_back_runs_in_the_updates_transaction(sqlite_file: sa.Engine) -> None:
    from successor_models import logs

    log, log16, metadata = logs()
    engine = sqlite_file
    metadata.create_all(engine)
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    with Session(engine) as s, s.begin():
        s.add_all([log(id=f"l{i}", company_id="c", ts=t0, body="old") for i in range(3)])
        s.add(log(id="l3", company_id="c", ts=t0, body="older"))
    # the other connection makes l3 match our WHERE, in both tables: between the read of
    # the rows our WHERE matches and our UPDATE, it would make the UPDATE change a row
    # the mirror never copies
    happened = _other_commits_before(
        engine, '"MirrorLogs"',
        'UPDATE "MirrorLogs" SET "Body" = ? WHERE "Id" = ?; '
        'UPDATE "MirrorLogs16" SET "Body" = ? WHERE "Id" = ?',
        ("old", "l3", "old", "l3"),
    )  # fmt: skip
    ours = "committed"
    try:
        with engine.begin() as c:
            c.execute(
                sa.update(log.__table__).where(log.__table__.c.Body == "old").values(Body="new")
            )
    except sa.exc.OperationalError as exc:
        ours = str(exc)
    assert happened()
    assert (happened()[0], ours) != ("committed", "committed"), (happened(), ours)
    with engine.connect() as c:
        old = {r.Id: r.Body for r in c.execute(sa.select(log.__table__))}
        new = {r.Id: r.Body for r in c.execute(sa.select(log16.__table__))}
    assert old == new, (old, new)


def test_no_begin_is_emitted_in_autocommit() -> None:
    """AUTOCOMMIT: each statement commits alone by the application's choice; the guard
    read leaves no transaction open."""
    engine = sa.create_engine("sqlite://", isolation_level="AUTOCOMMIT")
    DBase.metadata.create_all(engine)
    t = Pair.__table__
    with engine.connect() as c:
        c.execute(sa.insert(t), {"id": 1, "a": "x", "b": "y"})
        c.execute(sa.update(t).where(t.c.id == 1).values(a="w"))
        assert not c.connection.dbapi_connection.in_transaction  # type: ignore[union-attr]
        row = c.execute(sa.select(t)).one()
    assert row.shard == compute_shard(["w", "y"], 32)


# ------------------------------------------------------------------ G: server-side key shard


def _server_side_events() -> tuple[Any, Any, sa.MetaData]:
    """The docs' recommended Spanner setup (``farm_fingerprint``, ``server_side``) during
    a key reshard 8 -> 16: both tables' key shards generated by Spanner."""
    from sharded_orm import TimestampShardedMixin, declare_successor

    class Base(DeclarativeBase):
        pass

    class Ev(TimestampShardedMixin, Base):
        __tablename__ = "JointEvents"
        __shard_count__ = 8
        __shard_algorithm__ = "farm_fingerprint"
        __shard_server_side__ = True
        kind: Mapped[str | None] = mapped_column("Kind", sa.String(40))

    class Ev16(TimestampShardedMixin, Base):
        __tablename__ = "JointEvents16"
        __shard_count__ = 16
        __shard_algorithm__ = "farm_fingerprint"
        __shard_server_side__ = True
        kind: Mapped[str | None] = mapped_column("Kind", sa.String(40))

    declare_successor(Ev, Ev16)
    return Ev, Ev16, Base.metadata


def test_a_server_side_key_shard_takes_the_writes_apps_send_during_a_reshard(
    engine: sa.Engine,
) -> None:
    from successor_models import assert_mirrored

    ev, ev16, metadata = _server_side_events()
    metadata.create_all(engine)
    t = ev.__table__
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    with Session(engine) as s, s.begin():  # one flush, several objects: executemany
        s.add_all([ev(timestamp=t0 + dt.timedelta(seconds=i), kind="a") for i in range(3)])
    with engine.begin() as c:
        c.execute(  # a multi-row INSERT
            sa.insert(t),
            [{"Timestamp": t0, "EventId": f"m{i}", "Kind": "m"} for i in range(4)],
        )
        c.execute(  # a multi-row VALUES list
            sa.insert(t).values(
                [{"Timestamp": t0, "EventId": f"v{i}", "Kind": "v"} for i in range(2)]
            )
        )
    with Session(engine) as s, s.begin():
        s.execute(sa.insert(ev), [{"timestamp": t0, "event_id": f"o{i}"} for i in range(2)])
    assert assert_mirrored(engine, ev, ev16) == 11
    with engine.begin() as c:  # an UPDATE of a non-key column, by a non-key WHERE
        c.execute(sa.update(t).where(t.c.Kind == "m").values(Kind="n"))
        c.execute(sa.update(t).where(t.c.EventId == "v0").values(Kind="w"))
    with Session(engine) as s, s.begin():  # the ORM's UPDATE by key
        one = s.scalars(sa.select(ev).where(ev.kind == "a").limit(1)).one()
        one.kind = "orm"
        s.execute(sa.update(ev).where(ev.kind == "v").values(kind="x"))
    with engine.begin() as c:
        c.execute(sa.delete(t).where(t.c.EventId == "m0"))
    assert assert_mirrored(engine, ev, ev16) == 10
    with engine.connect() as c:
        kinds = sorted(r.Kind or "" for r in c.execute(sa.select(ev16.__table__)))
    assert kinds == ["", "", "a", "a", "n", "n", "n", "orm", "w", "x"]


def test_moving_a_generated_key_shards_source_on_sqlite_moves_both_tables() -> None:
    """SQLite: the client fills the generated shard, so moving its source moves both
    tables' rows; the successor still equals the old table."""
    from successor_models import assert_mirrored

    ev, ev16, metadata = _server_side_events()
    engine = sa.create_engine("sqlite://")
    metadata.create_all(engine)
    t = ev.__table__
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    with engine.begin() as c:
        c.execute(sa.insert(t), [{"Timestamp": t0, "EventId": f"k{i}"} for i in range(3)])
        c.execute(
            sa.update(t)
            .where(t.c.EventId == "k1")
            .values(Timestamp=t0 + dt.timedelta(days=3), Kind="moved")
        )
    assert assert_mirrored(engine, ev, ev16) == 3


@pytest.mark.parametrize("sync", ["auto", "evaluate", "fetch"])
def test_orm_update_statement_leaves_loaded_objects_as_the_row(
    engine: sa.Engine, sync: str
) -> None:
    """``session.execute(update(M)...)`` rewrites a source by its onupdate; the objects it
    matched hold what the row holds afterwards, as with plain SQLAlchemy (which copies
    the onupdate's value to them), the shard included."""
    doc, plain = PAIRS["context-parameter"]
    CBase.metadata.create_all(engine, tables=[doc.__table__, plain.__table__])
    seen = {}
    for model in (doc, plain):
        with Session(engine) as s, s.begin():
            s.add(model(id=1, b="x"))
            s.flush()
            obj = s.get(model, 1)
            s.execute(
                sa.update(model).where(model.id == 1).values(b="q"),
                execution_options={"synchronize_session": sync},
            )
            seen[model] = (obj.b, obj.tag)
            if model is doc:
                assert obj.shard == compute_shard([obj.tag], N)
            s.execute(  # the ORM's UPDATE by primary key
                sa.update(model),
                [{"id": 1, "b": "r"}],  # ('fetch' is not offered for it)
                execution_options={"synchronize_session": "auto" if sync == "fetch" else sync},
            )
            if model is doc:
                assert obj.shard == compute_shard([obj.tag], N)
    assert seen[doc] == seen[plain] == ("q", "by-q")
    _assert_like_sqlalchemy(engine, doc, plain)


def test_a_sql_default_of_a_source_is_refused_with_the_way_out() -> None:
    class Base(DeclarativeBase):
        pass

    class Made(Base):
        __tablename__ = "wj_made"
        id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
        tag: Mapped[str] = mapped_column(sa.String(40), default=sa.func.lower("X"))
        shard: Mapped[int] = shard_column("tag", count=N)

    engine = sa.create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with (
        pytest.raises(ShardConfigError, match="default is SQL.*give the value"),
        engine.begin() as c,
    ):
        c.execute(sa.insert(Made.__table__), {"id": 1})
    with Session(engine) as s, s.begin():
        s.add(Made(id=2, tag="y"))
    with engine.connect() as c:
        assert c.execute(sa.select(Made.__table__)).all() == [(2, "y", compute_shard(["y"], N))]


def test_a_source_the_database_rewrites_is_refused_where_the_client_hashes() -> None:
    """server_onupdate on a source of a server_side shard: Spanner recomputes the shard;
    elsewhere the client computes it and cannot see the database's new value."""

    class Base(DeclarativeBase):
        pass

    class Trig(Base):
        __tablename__ = "wj_trig"
        id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
        b: Mapped[str | None] = mapped_column(sa.String(40))
        tag: Mapped[str] = mapped_column(sa.String(40), server_onupdate=sa.FetchedValue())
        shard: Mapped[int] = shard_column(
            "tag", count=N, algorithm="farm_fingerprint", server_side=True
        )

    engine = sa.create_engine("sqlite://")
    Base.metadata.create_all(engine)
    t = Trig.__table__
    with engine.begin() as c:
        c.exec_driver_sql(
            "CREATE TRIGGER wj_trig_up AFTER UPDATE OF b ON wj_trig BEGIN "
            "UPDATE wj_trig SET tag = 'db-' || NEW.b WHERE id = NEW.id; END"
        )
        c.execute(sa.insert(t), {"id": 1, "tag": "a"})
    with (
        pytest.raises(ShardConfigError, match="server_onupdate.*Set 'tag' in the UPDATE"),
        engine.begin() as c,
    ):
        c.execute(sa.update(t).where(t.c.id == 1).values(b="x"))
    with engine.connect() as c:
        row = c.execute(sa.select(t)).one()
    assert row.shard == compute_shard([row.tag], N, "farm_fingerprint")
