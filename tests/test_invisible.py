"""The library is invisible where it has nothing to do (issue 22, items 0, 1, 3 and 8).

* An engine, table or column that is not sharded is left exactly as SQLAlchemy made it:
  no ``Engine`` event (SQLAlchemy's no-events fast path), no ``info`` dict created.
* Declaring a sharded class never configures mappers early (a forward string
  ``relationship()`` declared before it still works).
* An INSERT is trusted only when it is the ORM flush's own statement for those rows.
* ``Table.info`` holds plain data only, so Alembic renders it.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

import sharded_orm
from sharded_orm import ShardMismatchError, compute_shard, shard_column
from sharded_orm.schema.columns import ATTR_COLUMNS_KEY
from sharded_orm.write.engine_hook import is_watched

T0 = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)


def make_sharded() -> tuple[type[Any], type[Any]]:
    class Base(DeclarativeBase):
        pass

    class Event(Base):
        __tablename__ = "events"
        id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
        company_id: Mapped[str] = mapped_column(sa.String(20))
        ts: Mapped[dt.datetime] = mapped_column(sa.DateTime(timezone=True))
        shard_id: Mapped[int] = shard_column("company_id", "ts", count=10)

    return Base, Event


@pytest.fixture
def plain_engine() -> Iterator[sa.Engine]:
    eng = sa.create_engine("sqlite://")
    yield eng
    eng.dispose()


# --------------------------------------------------------------------------- item 0


def test_an_engine_that_never_meets_a_sharded_table_stays_on_the_no_events_path(
    plain_engine: sa.Engine,
) -> None:
    base, model = make_sharded()  # a sharded model exists in the process
    md = sa.MetaData()
    t = sa.Table(
        "plain", md, sa.Column("id", sa.Integer, primary_key=True), sa.Column("v", sa.Integer)
    )
    md.create_all(plain_engine)
    with plain_engine.begin() as conn:
        conn.execute(t.insert(), [{"id": 1, "v": 2}])
        conn.execute(t.update().values(v=3))
        conn.execute(sa.text("select 1"))
        assert conn._has_events is False
    assert plain_engine._has_events is False
    # no class-level Engine listener anything could clear (or that every engine would pay)
    assert sa.Engine._has_events is False
    assert sa.create_engine("sqlite://")._has_events is False


def test_an_engine_that_writes_a_sharded_table_is_watched(plain_engine: sa.Engine) -> None:
    base, model = make_sharded()
    base.metadata.create_all(plain_engine)
    with Session(plain_engine) as s:
        s.add(model(id=1, company_id="acme", ts=T0))
        s.commit()
    assert plain_engine._has_events is True
    # a Core write on that engine is checked
    with plain_engine.begin() as conn:
        conn.execute(sa.insert(model.__table__), [{"id": 2, "company_id": "b", "ts": T0}])
        got = conn.execute(sa.select(model.__table__.c.shard_id).where(model.id == 2)).scalar()
    assert got == compute_shard(["b", T0], 10)


def test_a_core_write_on_a_fresh_engine_of_existing_tables_is_checked(tmp_path: Path) -> None:
    """Another process's engine, tables already there: no create_all, no flush first."""
    base, model = make_sharded()
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    first = sa.create_engine(url)
    base.metadata.create_all(first)
    first.dispose()
    fresh = sa.create_engine(url)
    with Session(fresh) as s:  # ORM bulk INSERT: no mapper event runs
        s.execute(sa.insert(model), [{"id": 1, "company_id": "acme", "ts": T0}])
        s.commit()
        assert s.get(model, 1).shard_id == compute_shard(["acme", T0], 10)
    fresh.dispose()


def test_plain_tables_and_columns_get_no_info() -> None:
    base, model = make_sharded()
    md = sa.MetaData()
    col = sa.Column("v", sa.Integer)
    t = sa.Table("plain", md, sa.Column("id", sa.Integer, primary_key=True), col)

    class B(DeclarativeBase):
        pass

    class Plain(B):
        __tablename__ = "plain_orm"
        id: Mapped[int] = mapped_column(primary_key=True)
        name: Mapped[str]

    B.registry.configure()
    for c in (*t.columns, *Plain.__table__.columns):
        assert "info" not in c.__dict__, c
    assert "info" not in t.__dict__
    assert "info" not in Plain.__table__.__dict__
    assert "info" not in md.__dict__
    assert "info" not in B.metadata.__dict__


def test_importing_the_pytest_plugin_imports_nothing_of_the_library() -> None:
    code = textwrap.dedent(
        """
        import sys
        import sharded_orm_pytest
        assert not [m for m in sys.modules if m == "sharded_orm" or m.startswith("sharded_orm.")]
        import sqlalchemy as sa
        assert sa.Engine._has_events is False
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- item 1


def test_a_forward_string_relationship_before_a_sharded_class_imports() -> None:
    class Base(DeclarativeBase):
        pass

    class Child(Base):
        __tablename__ = "child"
        id: Mapped[int] = mapped_column(primary_key=True)
        parent_id: Mapped[int] = mapped_column(sa.ForeignKey("parent.id"))
        parent: Mapped[Parent] = relationship("Parent")

    class Event(Base):  # used to configure every mapper here, before Parent existed
        __tablename__ = "events"
        id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
        ts: Mapped[dt.datetime] = mapped_column(sa.DateTime(timezone=True))
        shard_id: Mapped[int] = shard_column("ts", count=4)

    class Parent(Base):
        __tablename__ = "parent"
        id: Mapped[int] = mapped_column(primary_key=True)

    eng = sa.create_engine("sqlite://")
    Base.metadata.create_all(eng)
    with Session(eng) as s:
        s.add_all([Event(id=1, ts=T0), Child(id=1, parent=Parent(id=1))])
        s.commit()
        assert s.get(Event, 1).shard_id == compute_shard([T0], 4)
        assert s.get(Child, 1).parent.id == 1
    eng.dispose()


# --------------------------------------------------------------------------- item 3


def test_an_insert_a_listener_sends_during_the_flush_is_checked(plain_engine: sa.Engine) -> None:
    """An outbox row written from ``before_insert`` on the flush's connection, with a
    wrong shard, is refused: only the ORM's own INSERT of those rows is trusted."""
    base, model = make_sharded()
    base.metadata.create_all(plain_engine)
    outbox = model.__table__

    @event.listens_for(model, "before_insert")
    def write_outbox(mapper: Any, connection: Any, target: Any) -> None:
        if target.id == 1:
            connection.execute(
                outbox.insert(),
                [
                    {
                        "id": 100,
                        "company_id": "zzz",
                        "ts": T0,
                        "shard_id": (compute_shard(["zzz", T0], 10) + 1) % 10,
                    }
                ],
            )

    with Session(plain_engine) as s, pytest.raises(ShardMismatchError):
        s.add_all([model(id=1, company_id="a", ts=T0), model(id=2, company_id="b", ts=T0)])
        s.flush()


def test_rows_after_a_failed_flush_are_checked(plain_engine: sa.Engine) -> None:
    """A flush that fails after sharded-orm filled some rows (another ``before_insert``
    listener raises) leaves nothing trusted behind on its connection, even when the
    session is bound to that one connection (the usual test-fixture pattern)."""
    base, model = make_sharded()
    base.metadata.create_all(plain_engine)

    @event.listens_for(model, "before_insert")
    def refuse(mapper: Any, connection: Any, target: Any) -> None:
        if target.id == 2:
            raise RuntimeError("validation failed")

    wrong = (compute_shard(["c", T0], 10) + 1) % 10
    with plain_engine.connect() as conn:
        s = Session(bind=conn)
        s.add_all([model(id=1, company_id="a", ts=T0), model(id=2, company_id="b", ts=T0)])
        with pytest.raises(RuntimeError):
            s.flush()
        s.rollback()
        with pytest.raises(ShardMismatchError):
            s.execute(sa.insert(model), [{"id": 3, "company_id": "c", "ts": T0, "shard_id": wrong}])
        s.rollback()
        s.close()


def test_a_core_insert_with_a_wrong_shard_on_the_flush_connection_is_refused(
    plain_engine: sa.Engine,
) -> None:
    base, model = make_sharded()
    base.metadata.create_all(plain_engine)
    with Session(plain_engine) as s:
        objs = [model(id=i, company_id="a", ts=T0) for i in range(3)]
        s.add_all(objs)
        s.flush()
        wrong = (compute_shard(["q", T0], 10) + 1) % 10
        with pytest.raises(ShardMismatchError):
            s.connection().execute(
                model.__table__.insert(),
                [{"id": 9, "company_id": "q", "ts": T0, "shard_id": wrong}],
            )


# --------------------------------------------------------------------------- item 8


def test_table_info_holds_plain_data_only() -> None:
    base, model = make_sharded()
    info = model.__table__.info[ATTR_COLUMNS_KEY]
    assert info and all(isinstance(k, str) and isinstance(v, str) for k, v in info.items())
    rendered = repr(model.__table__.info)
    assert "Column(" not in rendered
    # sources by ORM attribute name still resolve
    assert [c.name for c in sharded_orm.get_shard_column(model).sources] == ["company_id", "ts"]


def test_autogenerate_without_the_plugin_writes_a_valid_migration(tmp_path: Path) -> None:
    """An env.py whose ``context.configure`` lacks the sharded-orm plugin: Alembic renders
    ``Table.info`` as it is, and the migration must still be Python."""
    from alembic.autogenerate import produce_migrations, render_python_code
    from alembic.migration import MigrationContext

    base, model = make_sharded()
    eng = sa.create_engine("sqlite://")
    with eng.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"target_metadata": base.metadata})
        code = render_python_code(produce_migrations(ctx, base.metadata).upgrade_ops)
    compile("def upgrade():\n    " + code, "migration.py", "exec")
    assert "sharded_orm.attr_columns" in code  # rendered as plain data
    eng.dispose()


# --------------------------------------------------------------------------- on Spanner


def test_a_spanner_engine_checks_sharded_writes_from_its_first_statement(
    spanner_emulator: Any,
) -> None:
    """Spanner engines are watched when created (our dialect's ``engine_created``): a Core
    INSERT on a fresh engine of an existing database gets its shard, with no flush or
    ``create_all`` first."""
    base, model = make_sharded()
    db = spanner_emulator.create_database()
    setup = spanner_emulator.engine(db)
    base.metadata.create_all(setup)
    setup.dispose()
    fresh = spanner_emulator.engine(db)
    assert is_watched(fresh)
    with fresh.begin() as conn:
        conn.execute(model.__table__.insert(), [{"id": 1, "company_id": "acme", "ts": T0}])
    with fresh.connect() as conn:
        got = conn.execute(sa.select(model.__table__.c.shard_id)).scalar()
    assert got == compute_shard(["acme", T0], 10)
    fresh.dispose()


def test_a_listener_insert_during_a_flush_is_checked_on_spanner(spanner_engine: sa.Engine) -> None:
    base, model = make_sharded()
    base.metadata.create_all(spanner_engine)
    table = model.__table__

    @event.listens_for(model, "before_insert")
    def write_outbox(mapper: Any, connection: Any, target: Any) -> None:
        wrong = (compute_shard(["zzz", T0], 10) + 1) % 10
        connection.execute(
            table.insert(), [{"id": 100, "company_id": "zzz", "ts": T0, "shard_id": wrong}]
        )

    with Session(spanner_engine) as s, pytest.raises(ShardMismatchError):
        s.add(model(id=1, company_id="a", ts=T0))
        s.flush()


def test_sharded_select_keeps_sqlalchemys_own_params() -> None:
    """SQLAlchemy's test suite checks that no statement class overrides ``params()``; the
    point shard of values given to it is settled at execution instead."""
    from sharded_orm.read.plan import ShardedSelect

    # SQLAlchemy's own (it moved between 2.0 and 2.1; Select inherits it in both)
    assert "params" not in ShardedSelect.__dict__
    assert ShardedSelect.params is sa.Select.params
    base, model = make_sharded()
    model.__table__.append_constraint(sa.Index("ix_ev_shard", "shard_id", "ts"))
    eng = sa.create_engine("sqlite://")
    base.metadata.create_all(eng)
    with Session(eng) as s:
        s.add_all([model(id=i, company_id=f"c{i}", ts=T0) for i in range(4)])
        s.commit()
        stmt = sharded_orm.sharded_select(model, index="ix_ev_shard").where(
            model.company_id == sa.bindparam("c"), model.ts == sa.bindparam("t")
        )
        assert [e.id for e in s.scalars(stmt.params(c="c2", t=T0))] == [2]
        assert [e.id for e in s.scalars(stmt, {"c": "c3", "t": T0})] == [3]
    eng.dispose()
