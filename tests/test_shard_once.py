"""Each row's shard is computed once on the write path (issue 45).

The count is read through a public observable, with nothing patched: the shard's source
is a ``TypeDecorator`` whose ``process_bind_param`` is what the library hashes, and the
library asks it about its own hashing dialect (``DefaultDialect``, named ``"default"``),
never the engine's (see docs/hashing.md). So the calls made with a dialect named
``"default"`` are the shard computations, one per hash of a row; the engine's own bind
processing (SQLite, Spanner) is not counted. Every case reads the stored rows back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import compute_shard, shard_column


class Hashes:
    """Calls of the source's conversion made by the library to hash it."""

    n = 0


class Code(sa.types.TypeDecorator[str]):
    """A source stored stripped: the library hashes ``process_bind_param``'s output."""

    impl = sa.String(40)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        if dialect.name == "default":  # the library's hashing dialect, not the engine's
            Hashes.n += 1
        return None if value is None else value.strip()


def make_models() -> tuple[Any, type[Any], type[Any]]:
    class Base(DeclarativeBase):
        pass

    class Entry(Base):
        """A shard outside the primary key, over two sources."""

        __tablename__ = "once_entries"
        id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
        code: Mapped[str] = mapped_column(Code)
        region: Mapped[str] = mapped_column(sa.String(20))
        note: Mapped[str] = mapped_column(sa.String(20), default="")
        shard: Mapped[int] = shard_column("code", "region", count=16)

    class Keyed(Base):
        """A shard in the primary key (the identity map needs it before the flush)."""

        __tablename__ = "once_keyed"
        shard: Mapped[int] = shard_column("code", count=16, primary_key=True)
        code: Mapped[str] = mapped_column(Code, primary_key=True)
        note: Mapped[str] = mapped_column(sa.String(20), default="")

    return Base, Entry, Keyed


@pytest.fixture
def models(engine: sa.Engine) -> Iterator[tuple[sa.Engine, type[Any], type[Any]]]:
    base, entry, keyed = make_models()
    base.metadata.create_all(engine)
    try:
        yield engine, entry, keyed
    finally:
        base.metadata.drop_all(engine)


def want(code: str, region: str | None = None) -> int:
    values = [code.strip()] if region is None else [code.strip(), region]
    return compute_shard(values, 16)


def stored(engine: sa.Engine, table: Any) -> dict[Any, tuple[str, int]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table.c.id, table.c.code, table.c.shard)).all()
    return {r.id: (r.code, r.shard) for r in rows}


def counted(work: Any) -> int:
    Hashes.n = 0
    work()
    return Hashes.n


CODES = [f" c{i} " for i in range(5)]


def test_orm_add_hashes_each_row_once(models: Any) -> None:
    engine, Entry, _ = models
    with Session(engine) as session:
        objs = [Entry(id=i, code=c, region="eu") for i, c in enumerate(CODES)]
        session.add_all(objs)
        assert counted(session.flush) == len(CODES)
        assert [o.shard for o in objs] == [want(c, "eu") for c in CODES]
        session.commit()
    assert stored(engine, Entry.__table__) == {
        i: (c.strip(), want(c, "eu")) for i, c in enumerate(CODES)
    }


def test_orm_add_of_a_key_shard_hashes_each_row_once(models: Any) -> None:
    engine, _, Keyed = models
    with Session(engine) as session:

        def build_and_flush() -> None:
            session.add_all([Keyed(code=c) for c in CODES])
            session.flush()

        assert counted(build_and_flush) == len(CODES)
        session.commit()
    with engine.connect() as conn:
        got = set(conn.execute(sa.select(Keyed.code, Keyed.shard)).all())
    assert got == {(c.strip(), want(c)) for c in CODES}


def test_a_listener_normalising_a_source_leaves_one_hash_per_row(models: Any) -> None:
    """An application's ``before_insert`` that runs after the library's changes a source:
    the shard is computed once, from the row sent, and the object holds it."""
    engine, Entry, _ = models
    sa.orm.configure_mappers()  # the library's listener first, the application's after it

    def upper(mapper: Any, connection: Any, target: Any) -> None:
        target.region = target.region.upper()

    sa.event.listen(Entry, "before_insert", upper)
    try:
        with Session(engine) as session:
            objs = [Entry(id=i, code=c, region="eu") for i, c in enumerate(CODES)]
            session.add_all(objs)
            assert counted(session.flush) == len(CODES)
            assert [o.shard for o in objs] == [want(c, "EU") for c in CODES]
            session.commit()
    finally:
        sa.event.remove(Entry, "before_insert", upper)
    assert stored(engine, Entry.__table__) == {
        i: (c.strip(), want(c, "EU")) for i, c in enumerate(CODES)
    }


def test_bulk_inserts_hash_each_row_once(models: Any) -> None:
    engine, Entry, _ = models
    rows: list[dict[str, Any]] = [{"id": i, "code": c, "region": "us"} for i, c in enumerate(CODES)]
    more: list[dict[str, Any]] = [
        {"id": 10 + i, "code": c, "region": "us"} for i, c in enumerate(CODES)
    ]
    with Session(engine) as session:
        assert counted(lambda: session.execute(sa.insert(Entry), rows)) == len(rows)
        assert counted(lambda: session.bulk_insert_mappings(Entry, more)) == len(more)
        session.commit()
    assert stored(engine, Entry.__table__) == {
        r["id"]: (r["code"].strip(), want(r["code"], "us")) for r in rows + more
    }


def test_core_inserts_hash_each_row_once(models: Any) -> None:
    engine, Entry, _ = models
    table = Entry.__table__
    rows: list[dict[str, Any]] = [{"id": i, "code": c, "region": "ap"} for i, c in enumerate(CODES)]
    with engine.begin() as conn:
        assert counted(lambda: conn.execute(table.insert(), rows)) == len(rows)
        one = table.insert().values(id=99, code=" solo ", region="ap")
        assert counted(lambda: conn.execute(one)) == 1
    expected = {r["id"]: (r["code"].strip(), want(r["code"], "ap")) for r in rows}
    expected[99] = ("solo", want("solo", "ap"))
    assert stored(engine, table) == expected


def test_an_orm_update_of_a_source_hashes_each_row_once(models: Any) -> None:
    engine, Entry, _ = models
    with Session(engine) as session:
        session.add_all([Entry(id=i, code=c, region="eu") for i, c in enumerate(CODES)])
        session.commit()
        objs = session.scalars(sa.select(Entry).order_by(Entry.id)).all()
        for o in objs:
            o.code = o.code + "x"
        assert counted(session.flush) == len(objs)
        assert [o.shard for o in objs] == [want(c.strip() + "x", "eu") for c in CODES]
        session.commit()
    assert stored(engine, Entry.__table__) == {
        i: (c.strip() + "x", want(c.strip() + "x", "eu")) for i, c in enumerate(CODES)
    }


def test_a_core_update_of_a_source_hashes_each_row_once(models: Any) -> None:
    engine, Entry, _ = models
    table = Entry.__table__
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"id": i, "code": "a", "region": "eu"} for i in range(3)])
        by_key = (
            table.update()
            .where(table.c.id == sa.bindparam("b_id"))
            .values(code=sa.bindparam("b_code"))
        )
        rows = [{"b_id": i, "b_code": f" n{i}"} for i in range(3)]
        assert counted(lambda: conn.execute(by_key, rows)) == 3
    assert stored(engine, table) == {i: (f"n{i}", want(f"n{i}", "eu")) for i in range(3)}


@pytest.fixture
def sqlite_models() -> Iterator[tuple[sa.Engine, type[Any], type[Any]]]:
    """SQLite only: Spanner refuses to move a row's key (test_write_matrix covers that)."""
    engine = sa.create_engine("sqlite://")
    base, entry, keyed = make_models()
    base.metadata.create_all(engine)
    try:
        yield engine, entry, keyed
    finally:
        engine.dispose()


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(new=st.text("abcXYZ019-_", max_size=12))
def test_an_orm_update_of_a_key_shards_source_hashes_each_row_once(
    sqlite_models: Any, new: str
) -> None:
    engine, _, Keyed = sqlite_models
    with Session(engine) as session:
        session.execute(sa.delete(Keyed))
        session.add_all([Keyed(code=c) for c in CODES])
        session.commit()
        objs = session.scalars(sa.select(Keyed).order_by(Keyed.code)).all()
        codes = [f"{o.code}-{new}" for o in objs]
        for o, c in zip(objs, codes, strict=True):
            o.code = c
        assert counted(session.flush) == len(objs)
        assert [o.shard for o in objs] == [want(c) for c in codes]
        assert all(session.get(Keyed, (want(c), c)) is o for o, c in zip(objs, codes, strict=True))
        session.commit()
    with engine.connect() as conn:
        got = set(conn.execute(sa.select(Keyed.code, Keyed.shard)).all())
    assert got == {(c, want(c)) for c in codes}
