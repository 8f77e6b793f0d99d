"""The load tools refuse an async engine with the way to run them (issue 46).

``verify``, ``presplit``, ``backfill_server_side``, ``copy_table`` and ``bulk_load`` make
blocking calls for their whole run and never await. Given an ``AsyncEngine`` (or an
``AsyncConnection``) they used to fail deep inside (or, on Spanner, start blocking the
event loop); given an async engine's ``sync_engine`` off its greenlet (``asyncio.to_thread``),
SQLAlchemy's ``MissingGreenlet`` said nothing of what to do. One check
(``sharded_orm.greenlets.refuse_async_bind``) now refuses both, naming
``asyncio.to_thread`` with a sync engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import ShardTypeError, shard_column
from sharded_orm.load.backfill_server import backfill_server_side
from sharded_orm.load.bulk import bulk_load
from sharded_orm.load.copy import copy_table
from sharded_orm.load.presplit import presplit
from sharded_orm.load.verify import verify


class Base(DeclarativeBase):
    pass


class Reading(Base):
    __tablename__ = "async_tool_readings"
    id: Mapped[str] = mapped_column(sa.String(20), primary_key=True)
    shard: Mapped[int] = shard_column("id", count=4)


TOOLS: dict[str, Callable[[Any], Any]] = {
    "verify": lambda bind: verify(bind, Reading, progress_mode="off"),
    "presplit": lambda bind: presplit(bind, Reading),
    "backfill_server_side": lambda bind: backfill_server_side(bind, Reading.__table__, "shard"),
    "copy_table": lambda bind: copy_table(bind, Reading.__table__, Reading.__table__),
    "bulk_load": lambda bind: bulk_load(bind, Reading, [{"id": "a"}], progress=False),
}


def refused(error: BaseException, tool: str) -> None:
    text = str(error)
    assert f"{tool}() runs blocking calls for its whole run and cannot await" in text
    assert f"await asyncio.to_thread({tool}, create_engine('spanner+spanner:///" in text


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_a_tool_given_an_async_engine_says_how_to_run_it(tool: str) -> None:
    engine = create_async_engine("sqlite+aiosqlite://")

    async def main() -> None:
        with pytest.raises(ShardTypeError) as caught:
            TOOLS[tool](engine)
        refused(caught.value, tool)
        assert "an AsyncEngine" in str(caught.value)
        async with engine.connect() as conn:
            with pytest.raises(ShardTypeError) as caught:
                TOOLS[tool](conn)
            refused(caught.value, tool)
            assert "an AsyncConnection" in str(caught.value)
        await engine.dispose()

    asyncio.run(main())


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_a_tool_given_an_async_sync_engine_on_a_thread_says_how_to_run_it(tool: str) -> None:
    """``asyncio.to_thread(tool, async_engine.sync_engine)``: its statements could not
    await there; the error says to give a sync engine."""
    engine = create_async_engine("sqlite+aiosqlite://")

    async def main() -> None:
        with pytest.raises(ShardTypeError) as caught:
            await asyncio.to_thread(TOOLS[tool], engine.sync_engine)
        refused(caught.value, tool)
        assert "the sync Engine of an async engine, outside its greenlet" in str(caught.value)
        await engine.dispose()

    asyncio.run(main())


def test_a_sync_engine_on_a_thread_runs_the_tool() -> None:
    """What the error says works: a sync engine, on a thread, from a coroutine."""
    engine = sa.create_engine(
        "sqlite://", poolclass=sa.StaticPool, connect_args={"check_same_thread": False}
    )
    Base.metadata.create_all(engine)

    async def main() -> Any:
        await asyncio.to_thread(TOOLS["bulk_load"], engine)
        return await asyncio.to_thread(TOOLS["verify"], engine)

    try:
        report = asyncio.run(main())
        assert report.rows_checked == 1 and report.ok
    finally:
        engine.dispose()


@pytest.mark.emulator
def test_verify_given_the_spanner_async_engine_says_how_to_run_it(spanner_emulator: Any) -> None:
    database_id = spanner_emulator.create_database()
    sync = spanner_emulator.engine(database_id)
    Base.metadata.create_all(sync)
    engine = create_async_engine(
        spanner_emulator.async_url(database_id), connect_args={"client": spanner_emulator.client}
    )

    async def main() -> Any:
        with pytest.raises(ShardTypeError) as caught:
            TOOLS["verify"](engine)
        refused(caught.value, "verify")
        await asyncio.to_thread(TOOLS["bulk_load"], sync)
        report = await asyncio.to_thread(TOOLS["verify"], sync)
        await engine.dispose()
        return report

    try:
        report = asyncio.run(main())
        assert report.rows_checked == 1 and report.ok
    finally:
        sync.dispose()
