"""A pooled id's first reservation needs no pool connection (issue 46).

The first reservation of a ``SpannerSequence`` (or a ``TableSequence`` on Spanner) needs
the Spanner client's ``Database``. It used to check a connection out of the engine's
pool to find it: a flush holding the pool's only connection and asking for the first id
waited ``pool_timeout``, then failed (sync engines with threads and async engines
alike). The engine now notes its ``Database`` at each new connection (a pool ``connect``
event), so the reservation checks nothing out.

A ``TableSequence`` off Spanner reserves each block on a connection of its own (a
transaction of its own): a pool the flushes already hold has none to give, and that now
says so, with the remedy, instead of the pool's bare ``QueuePool limit ... reached``.

Each flush runs in a thread joined with a timeout: a deadlock fails, it never hangs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session

from sharded_orm import SpannerSequence, TableSequence
from sharded_orm.ids.sequences import PoolStarved

#: the pool of the brief: one connection, no overflow, a short wait
POOL = {"pool_size": 1, "max_overflow": 0, "pool_timeout": 3}
KINDS = ("spanner_sequence", "table_sequence")


def bounded(fn: Callable[[], Any], limit: float = 60.0) -> Any:
    """``fn()`` in a thread: still running after ``limit`` s fails the test."""
    out: list[Any] = []
    failed: list[BaseException] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"still stuck after {limit} s (deadlock)"
    if failed:
        raise failed[0]
    return out[0]


def item_table(seq: Any) -> tuple[sa.MetaData, sa.Table]:
    metadata = sa.MetaData()
    table = sa.Table(
        "Items",
        metadata,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False, default=seq),
        sa.Column("name", sa.String(20)),
    )
    return metadata, table


def make_sequence(kind: str, engine: Any) -> Any:
    if kind == "spanner_sequence":
        return SpannerSequence(engine, "item_ids", block_size=5, deadline=20)
    return TableSequence(engine, "items", block_size=5, deadline=20)


def prepare(spanner_emulator: Any, kind: str) -> str:
    """A database with the sequence and the Items table (through a setup engine)."""
    ddl = [SpannerSequence.create_ddl("item_ids")] if kind == "spanner_sequence" else []
    database_id: str = spanner_emulator.create_database(ddl)
    setup = spanner_emulator.engine(database_id)
    try:
        metadata, _ = item_table(None)
        metadata.create_all(setup)
        TableSequence(setup, "items").table.create(setup, checkfirst=True)
    finally:
        setup.dispose()
    return database_id


def stored_names(engine: sa.Engine, table: sa.Table) -> dict[int, str]:
    with engine.connect() as conn:
        return {i: n for i, n in conn.execute(sa.select(table.c.id, table.c.name))}


@pytest.mark.emulator
@pytest.mark.parametrize("kind", KINDS)
def test_a_flush_holding_the_only_connection_gets_the_first_block(
    spanner_emulator: Any, kind: str
) -> None:
    """Sync engine: a session in a thread holds the pool's one connection (it has read),
    then flushes rows whose ids need the sequence's first block: stored, no timeout."""
    database_id = prepare(spanner_emulator, kind)
    engine = spanner_emulator.engine(database_id, **POOL)
    seq = make_sequence(kind, engine)
    _, items = item_table(seq)

    def flush() -> list[int]:
        with Session(engine) as session, session.begin():
            session.execute(sa.select(sa.literal(1))).scalar()  # the connection is held
            assert engine.pool.checkedout() == 1
            session.execute(sa.insert(items), [{"name": f"n{i}"} for i in range(3)])
            return list(session.execute(sa.select(items.c.id)).scalars())

    try:
        ids = bounded(flush)
        stored = stored_names(engine, items)
        assert len(set(ids)) == 3 and set(stored) == set(ids)
        assert sorted(stored.values()) == ["n0", "n1", "n2"]
    finally:
        seq.close()
        engine.dispose()


@pytest.mark.emulator
@pytest.mark.parametrize("kind", KINDS)
def test_an_async_flush_holding_the_only_connection_gets_the_first_block(
    spanner_emulator: Any, kind: str
) -> None:
    """AsyncSession: the flush holds the pool's one connection and needs the first
    block; stored, no ``pool_timeout``."""
    database_id = prepare(spanner_emulator, kind)
    url = spanner_emulator.async_url(database_id)

    async def main() -> dict[int, str]:
        engine = create_async_engine(url, connect_args={"client": spanner_emulator.client}, **POOL)
        seq = make_sequence(kind, engine)
        _, items = item_table(seq)
        try:
            async with async_sessionmaker(engine).begin() as session:
                await session.execute(sa.select(sa.literal(1)))  # the connection is held
                await session.execute(sa.insert(items), [{"name": f"a{i}"} for i in range(3)])
            async with engine.connect() as conn:
                rows = await conn.execute(sa.select(items.c.id, items.c.name))
                return {i: n for i, n in rows}
        finally:
            seq.close()
            await engine.dispose()

    stored = bounded(lambda: asyncio.run(main()))
    assert sorted(stored.values()) == ["a0", "a1", "a2"]
    assert len(stored) == 3


def sqlite_engine(path: Path, **kw: Any) -> sa.Engine:
    return sa.create_engine(f"sqlite:///{path}", **kw)


def test_a_table_sequence_on_a_starved_pool_says_how_to_size_it(tmp_path: Path) -> None:
    """Off Spanner each reservation takes a connection of its own: with the pool's one
    connection held by the flush asking for ids, the error names the cause and the
    remedies (not the pool's bare 'QueuePool limit of size 1 overflow 0 reached')."""
    engine = sqlite_engine(tmp_path / "db.sqlite", **POOL)
    seq = TableSequence(engine, "items", block_size=5, deadline=20)
    metadata, items = item_table(seq)
    metadata.create_all(engine)
    seq.create_table()

    def flush() -> None:
        with Session(engine) as session, session.begin():
            session.execute(sa.select(sa.literal(1))).scalar()
            session.execute(sa.insert(items), [{"name": "x"}])

    try:
        with pytest.raises(sa.exc.StatementError) as caught:  # SQLAlchemy wraps a default's
            bounded(flush)
        assert isinstance(caught.value.orig, PoolStarved)
        text = str(caught.value.orig)
        assert "TableSequence('items') found no free connection" in text
        assert "Pool size: 1" in text
        assert "pool_size + max_overflow" in text
        assert "poolclass=NullPool" in text
        assert stored_names(engine, items) == {}
    finally:
        engine.dispose()


def test_a_table_sequence_on_an_engine_of_its_own_serves_a_starved_pool(tmp_path: Path) -> None:
    """The remedy the error names: the sequence on an engine of its own (NullPool) gives
    the flush holding the only connection its ids."""
    path = tmp_path / "db.sqlite"
    engine = sqlite_engine(path, **POOL)
    own = sqlite_engine(path, poolclass=sa.NullPool)
    seq = TableSequence(own, "items", block_size=2, deadline=20)
    metadata, items = item_table(seq)
    metadata.create_all(engine)
    seq.create_table()

    def flush() -> None:
        with Session(engine) as session, session.begin():
            session.execute(sa.select(sa.literal(1))).scalar()
            session.execute(sa.insert(items), [{"name": f"n{i}"} for i in range(5)])

    try:
        bounded(flush)
        assert stored_names(engine, items) == {1: "n0", 2: "n1", 3: "n2", 4: "n3", 5: "n4"}
    finally:
        engine.dispose()
        own.dispose()
