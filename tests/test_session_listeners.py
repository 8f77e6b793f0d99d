"""What the library adds to Sessions: nothing per statement (issue 33 item 7).

SQLAlchemy builds an ``ORMExecuteState`` for every ``Session.execute`` as soon as one
``do_orm_execute`` listener exists (about 13 % of a small ORM select): the library installs
none. An app with no sharded model gets no Session listener at all; once a sharded mapper
is configured, one ``after_begin`` listener (once per transaction) watches an engine whose
database holds a sharded table the first time it begins a Session transaction, so that an
ORM bulk INSERT or UPDATE (which runs no mapper event) on a fresh engine of existing
tables is still filled and checked by the engine hook. A mapper whose shard sources have a
Python default or onupdate adds one ``after_transaction_end`` listener (once per
transaction), which drops the defaults a flush planned once for all its objects.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import ShardMismatchError, compute_shard, shard_column
from sharded_orm.write.engine_hook import is_watched

T0 = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)


def _models(table: str = "sl_events") -> tuple[type[Any], type[Any]]:
    class Base(DeclarativeBase):
        pass

    class Event(Base):
        __tablename__ = table
        id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
        company_id: Mapped[str] = mapped_column(sa.String(20))
        ts: Mapped[dt.datetime] = mapped_column(sa.DateTime(timezone=True))
        shard_id: Mapped[int] = shard_column("company_id", "ts", count=10)

    return Base, Event


def _session_listeners(code: str) -> dict[str, int]:
    """Session listeners in a fresh interpreter after ``code``."""
    probe = textwrap.dedent(code) + textwrap.dedent(
        """
        import json
        from sqlalchemy.orm import Session
        dispatch = Session().dispatch  # a new Session's: the class-level listeners
        print(json.dumps({name: len(list(getattr(dispatch, name)))
                          for name in ("do_orm_execute", "after_begin")}))
        """
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_an_app_with_no_sharded_model_gets_no_session_listener() -> None:
    plain = """
        import sqlalchemy as sa
        import sharded_orm
        from sqlalchemy.orm import DeclarativeBase, Mapped, Session, configure_mappers
        from sqlalchemy.orm import mapped_column

        class Base(DeclarativeBase):
            pass

        class Item(Base):
            __tablename__ = "items"
            id: Mapped[int] = mapped_column(primary_key=True)

        configure_mappers()
        engine = sa.create_engine("sqlite://")
        Base.metadata.create_all(engine)
        with Session(engine) as s:
            s.add(Item(id=1))
            s.commit()
            s.execute(sa.select(Item)).all()
    """
    assert _session_listeners(plain) == {"do_orm_execute": 0, "after_begin": 0}


def test_sharded_models_add_no_per_statement_session_listener() -> None:
    sharded = """
        import datetime as dt
        import sqlalchemy as sa
        import sharded_orm
        from sqlalchemy.orm import DeclarativeBase, Mapped, Session, configure_mappers
        from sqlalchemy.orm import mapped_column

        class Base(DeclarativeBase):
            pass

        class Event(Base):
            __tablename__ = "events"
            id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
            company_id: Mapped[str] = mapped_column(sa.String(20))
            shard_id: Mapped[int] = sharded_orm.shard_column("company_id", count=10)

        configure_mappers()
    """
    assert _session_listeners(sharded) == {"do_orm_execute": 0, "after_begin": 1}


def test_a_session_on_an_engine_without_sharded_tables_leaves_it_alone() -> None:
    """A sharded model lives on another engine: the app's own engine keeps SQLAlchemy's
    no-events path, and its Session statements run with no ORM execute hook."""
    base, model = _models()
    other = sa.create_engine("sqlite://")
    base.metadata.create_all(other)
    with Session(other) as s:
        s.add(model(id=1, company_id="acme", ts=T0))
        s.commit()

    class Plain(DeclarativeBase):
        pass

    class Item(Plain):
        __tablename__ = "sl_items"
        id: Mapped[int] = mapped_column(primary_key=True)
        qty: Mapped[int]

    engine = sa.create_engine("sqlite://")
    Plain.metadata.create_all(engine)
    with Session(engine) as s:
        s.add(Item(id=1, qty=1))
        s.flush()
        s.execute(sa.update(Item).where(Item.id == 1).values(qty=2))
        s.execute(sa.select(Item)).all()
        assert not s.dispatch.do_orm_execute
        s.commit()
    assert not is_watched(engine)
    assert engine._has_events is False


def test_a_fresh_engine_of_existing_tables_checks_an_orm_bulk_update(tmp_path: Path) -> None:
    """Tables made elsewhere; the engine's first statement is an ORM bulk UPDATE by primary
    key (no mapper event): its shard is computed, and a wrong one refused."""
    base, model = _models("sl_bulk")
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    first = sa.create_engine(url)
    base.metadata.create_all(first)
    with Session(first) as s:
        s.add(model(id=1, company_id="acme", ts=T0))
        s.commit()
    first.dispose()
    fresh = sa.create_engine(url)
    later = T0 + dt.timedelta(days=1)
    with Session(fresh) as s:
        s.execute(sa.update(model), [{"id": 1, "company_id": "globex", "ts": later}])
        s.commit()
    assert is_watched(fresh)
    with fresh.connect() as conn:
        assert conn.execute(sa.select(model.shard_id)).scalar() == compute_shard(
            ["globex", later], 10
        )
    wrong = (compute_shard(["initech", later], 10) + 1) % 10
    with Session(fresh) as s:
        try:
            s.execute(
                sa.update(model),
                [{"id": 1, "company_id": "initech", "ts": later, "shard_id": wrong}],
            )
        except ShardMismatchError:
            pass
        else:
            raise AssertionError("a wrong shard was accepted")
    fresh.dispose()


def test_an_engine_found_clean_is_asked_again_for_a_new_sharded_table(tmp_path: Path) -> None:
    """The database's table was not declared sharded when the engine began its first
    Session transaction; once a model declares it, the next transaction looks again, and
    an ORM bulk INSERT is filled."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    md = sa.MetaData()  # made by a migration: the same columns, no shard information here
    sa.Table(
        "sl_later",
        md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("company_id", sa.String(20)),
        sa.Column("ts", sa.DateTime(timezone=True)),
        sa.Column("shard_id", sa.Integer),
    )
    maker = sa.create_engine(url)
    md.create_all(maker)
    maker.dispose()
    fresh = sa.create_engine(url)
    with Session(fresh) as s:
        s.execute(sa.text("select 1"))
    assert not is_watched(fresh)
    base, model = _models("sl_later")
    with Session(fresh) as s:
        s.execute(sa.insert(model), [{"id": 1, "company_id": "acme", "ts": T0}])
        s.commit()
        assert s.get(model, 1).shard_id == compute_shard(["acme", T0], 10)
    assert is_watched(fresh)
    fresh.dispose()
