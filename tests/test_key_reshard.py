"""Resharding a key (docs/migrations.md, 'Resharding a key'): TimestampShardedMixin's
``ShardId`` 8 -> 16 through a new table, ``copy_table`` (stopped half way, run again),
``compare_tables`` and ``verify``; every row then findable through the new key."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import TimestampShardedMixin, compute_shard, sharded_select, verify
from sharded_orm.load.copy import compare_tables, copy_table
from sharded_orm.spanner.mutations import database_of

pytestmark = pytest.mark.emulator

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


class Base(DeclarativeBase):
    pass


class Event8(TimestampShardedMixin, Base):
    __tablename__ = "Events"
    __shard_count__ = 8
    kind: Mapped[str] = mapped_column("Kind", sa.String(20))


class Event16(TimestampShardedMixin, Base):
    __tablename__ = "Events16"
    __shard_count__ = 16
    kind: Mapped[str] = mapped_column("Kind", sa.String(20))


def test_key_reshard_copy_is_resumable_and_complete(spanner_engine: sa.Engine) -> None:
    engine = spanner_engine
    Base.metadata.create_all(engine)
    rows = [
        {"timestamp": T0 + dt.timedelta(seconds=i // 3), "event_id": f"e{i:05d}", "kind": "k"}
        for i in range(1200)
    ]
    database = database_of(engine)  # old rows, written fast through the mutation API
    with database.batch() as batch:
        batch.insert(
            "Events", columns=["ShardId", "Timestamp", "EventId", "Kind"],
            values=[
                [compute_shard((r["timestamp"],), 8), r["timestamp"], r["event_id"], "k"]
                for r in rows
            ],
        )  # fmt: skip
    assert compare_tables(engine, Event8, Event16) == {
        "missing_in_target": 1200, "missing_in_source": 0,
    }  # fmt: skip

    class Stop(Exception):
        pass

    seen: list[Any] = []
    with pytest.raises(Stop):  # stopped after two batches (a kill loses at most one)
        from sharded_orm import progress as progress_module

        class Counting(progress_module.Progress):
            def advance(self, n: int = 1) -> None:
                seen.append(n)
                if len(seen) == 2:
                    raise Stop

        import sharded_orm.load.copy as copy_module

        original = copy_module.progress
        copy_module.progress = lambda *a, **k: Counting(*a, **k)  # type: ignore[assignment]
        try:
            copy_table(engine, Event8, Event16, progress_mode="off")
        finally:
            copy_module.progress = original
    assert compare_tables(engine, Event8, Event16)["missing_in_target"] == 200
    result = copy_table(engine, Event8, Event16, progress_mode="off")  # run again: completes
    assert (result.rows, result.batches) == (1200, 3)
    assert compare_tables(engine, Event8, Event16) == {
        "missing_in_target": 0, "missing_in_source": 0,
    }  # fmt: skip
    assert verify(engine, Event16, progress_mode="off").ok
    with engine.connect() as c:
        found = c.execute(sharded_select(Event16)).all()
        one = c.execute(
            sharded_select(Event16).where(
                Event16.timestamp == rows[7]["timestamp"], Event16.event_id == "e00007"
            )
        ).all()
    assert len(found) == 1200 and len(one) == 1
