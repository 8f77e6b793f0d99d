"""Resharding a key (docs/migrations.md, 'Resharding a key'): TimestampShardedMixin's
``ShardId`` 8 -> 16 through a new table, ``copy_table`` (stopped half way, run again),
``compare_tables`` and ``verify``; every row then findable through the new key."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import TimestampShardedMixin, compute_shard, sharded_select, verify
from sharded_orm.load.copy import CopyProgress, compare_tables, copy_table, cursor_table_ddl
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


ROWS = [
    {"timestamp": T0 + dt.timedelta(seconds=i // 3), "event_id": f"e{i:05d}", "kind": "k"}
    for i in range(1200)
]


def _old_rows(engine: sa.Engine) -> None:
    Base.metadata.create_all(engine)
    database = database_of(engine)  # old rows, written fast through the mutation API
    with database.batch() as batch:
        batch.insert(
            "Events", columns=["ShardId", "Timestamp", "EventId", "Kind"],
            values=[
                [compute_shard((r["timestamp"],), 8), r["timestamp"], r["event_id"], "k"]
                for r in ROWS
            ],
        )  # fmt: skip


def test_key_reshard_copy_is_resumable_and_complete(spanner_engine: sa.Engine) -> None:
    engine = spanner_engine
    _old_rows(engine)
    rows = ROWS
    assert compare_tables(engine, Event8, Event16) == {
        "missing_in_target": 1200, "missing_in_source": 0, "different": 0,
    }  # fmt: skip

    class Stop(Exception):
        pass

    def stop_after_two(p: CopyProgress) -> None:  # a kill loses at most the batch in flight
        if p.batches == 2:
            raise Stop

    with pytest.raises(Stop):
        copy_table(engine, Event8, Event16, progress_mode="off", on_batch=stop_after_two)
    assert compare_tables(engine, Event8, Event16)["missing_in_target"] == 200
    result = copy_table(engine, Event8, Event16, progress_mode="off")  # run again: completes
    assert (result.rows, result.batches) == (1200, 3)
    assert compare_tables(engine, Event8, Event16) == {
        "missing_in_target": 0, "missing_in_source": 0, "different": 0,
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


def test_copy_resumes_from_its_saved_cursor_and_prunes(spanner_engine: sa.Engine) -> None:
    """With a cursor table the cursor is committed with each batch: a run stopped after a
    batch resumes after it; ``prune`` deletes copied rows the old table no longer has; a
    changed row is seen by compare_tables and set right by the next copy."""
    engine = spanner_engine
    _old_rows(engine)
    database_of(engine).update_ddl([cursor_table_ddl("CopyCursors")]).result()

    def stop_after_one(p: CopyProgress) -> None:
        raise KeyboardInterrupt  # as abrupt as it gets in-process

    with pytest.raises(KeyboardInterrupt):
        copy_table(engine, Event8, Event16, progress_mode="off", on_batch=stop_after_one,
                   cursor_table="CopyCursors")  # fmt: skip
    again = copy_table(engine, Event8, Event16, progress_mode="off", cursor_table="CopyCursors")
    assert again.resumed and (again.rows, again.batches) == (700, 2)
    with engine.begin() as c:  # old code, unaware of Events16, deletes and changes rows
        c.execute(sa.delete(Event8).where(Event8.event_id.in_(["e00001", "e00700"])))
        c.execute(sa.update(Event8).where(Event8.event_id == "e00002").values(kind="new"))
    assert compare_tables(engine, Event8, Event16) == {
        "missing_in_target": 0, "missing_in_source": 2, "different": 1,
    }  # fmt: skip
    final = copy_table(engine, Event8, Event16, progress_mode="off", cursor_table="CopyCursors",
                       prune=True)  # fmt: skip
    assert not final.resumed and final.rows == 1198 and final.pruned == 2
    assert compare_tables(engine, Event8, Event16) == {
        "missing_in_target": 0, "missing_in_source": 0, "different": 0,
    }  # fmt: skip
