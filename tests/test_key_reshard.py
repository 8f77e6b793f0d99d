"""Resharding a key (docs/migrations.md, 'Resharding a key'): TimestampShardedMixin's
``ShardId`` 8 -> 16 through a new table, ``copy_table`` (stopped half way, run again),
``compare_tables`` and ``verify``; every row then findable through the new key."""

from __future__ import annotations

import datetime as dt
import io
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from reshard_models import events
from sqlalchemy.orm import Session

from alembic_ext import key_reshard, ops
from alembic_ext.errors import MigrationError
from sharded_orm import compute_shard, sharded_select, verify
from sharded_orm.load.copy import CopyProgress, compare_tables, copy_table, cursor_table_ddl
from sharded_orm.spanner.mutations import database_of

pytestmark = pytest.mark.emulator

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


metadata = events("both")  # the old table and the expand's new one
Event8, Event16 = metadata.info["models"]["Event"], metadata.info["models"]["Event16"]


ROWS = [
    {"timestamp": T0 + dt.timedelta(seconds=i // 3), "event_id": f"e{i:05d}", "kind": "k"}
    for i in range(1200)
]


def _old_rows(engine: sa.Engine) -> None:
    metadata.create_all(engine)
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


# resharding journey; quick loop: test_key_reshard_copy_is_resumable_and_complete
@pytest.mark.slow
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
    for buckets in (None, 1, 3):  # split into queries by key hash: the same counts
        assert compare_tables(engine, Event8, Event16, buckets=buckets) == {
            "missing_in_target": 0, "missing_in_source": 2, "different": 1,
        }  # fmt: skip
    final = copy_table(engine, Event8, Event16, progress_mode="off", cursor_table="CopyCursors",
                       prune=True)  # fmt: skip
    assert not final.resumed and final.rows == 1198 and final.pruned == 2
    assert compare_tables(engine, Event8, Event16) == {
        "missing_in_target": 0, "missing_in_source": 0, "different": 0,
    }  # fmt: skip


def _section_blocks() -> list[str]:
    """The Python blocks of docs/migrations.md's 'Resharding a key', in page order."""
    text = (Path(__file__).parent.parent / "docs" / "migrations.md").read_text()
    section = text.split("### Resharding a key\n", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def _ops(conn: Any, metadata: sa.MetaData, **opts: Any) -> Operations:
    ctx = MigrationContext.configure(conn, opts={"target_metadata": metadata, **opts})
    return Operations(ctx)


def test_the_docs_section_runs_as_written(spanner_engine: sa.Engine) -> None:
    """docs/migrations.md, 'Resharding a key': the models, the expand's copy, the Python
    API and the contract, run in page order on the emulator, old writes in between."""
    models, expand, contract, python = _section_blocks()
    ns: dict[str, Any] = {"engine": spanner_engine}
    exec(
        "import sqlalchemy as sa\nfrom sqlalchemy.orm import DeclarativeBase, Mapped, "
        "mapped_column\nfrom sharded_orm import *\nclass Base(DeclarativeBase):\n    pass\n",
        ns,
    )
    module = type(sys)("key_reshard_docs")  # SQLAlchemy resolves annotations in a module
    module.__dict__.update(ns)
    sys.modules[module.__name__] = module
    try:
        exec(models, module.__dict__)
    finally:
        del sys.modules[module.__name__]
    ns = module.__dict__
    Event, Event16 = ns["Event"], ns["Event16"]
    ns["Base"].metadata.create_all(spanner_engine, tables=[Event.__table__])
    with database_of(spanner_engine).batch() as batch:  # old code's rows, before the expand
        batch.insert(
            "Events", columns=["ShardId", "Timestamp", "EventId", "Kind"],
            values=[
                [compute_shard((T0 + dt.timedelta(seconds=i),), 8),
                 T0 + dt.timedelta(seconds=i), f"o{i}", "old"]
                for i in range(700)
            ],
        )  # fmt: skip
    ns["Base"].metadata.create_all(spanner_engine)  # the expand's create_table
    with Session(spanner_engine) as s, s.begin():  # new code: both tables
        s.add(Event(timestamp=T0, event_id="new-1", kind="new"))
    with spanner_engine.connect() as conn:
        ns["op"] = _ops(conn, ns["Base"].metadata)
        exec("def upgrade():\n" + expand, ns)
        ns["upgrade"]()
        conn.commit()
    exec(python, ns)  # copy_table again (idempotent) and compare_tables
    with database_of(spanner_engine).batch() as batch:  # old code: Events only
        batch.insert("Events", columns=["ShardId", "Timestamp", "EventId", "Kind"],
                     values=[[compute_shard((T0,), 8), T0, "late", "old"]])  # fmt: skip
    with spanner_engine.connect() as conn:
        ns["op"] = _ops(conn, ns["Base"].metadata)
        exec("def upgrade():\n" + contract, ns)
        ns["upgrade"]()
        conn.commit()
    with spanner_engine.connect() as c:
        found = {r.EventId for r in c.execute(sharded_select(Event16.__table__))}
    assert len(found) == 702 and {"new-1", "late"} <= found
    assert "Events" not in sa.inspect(spanner_engine).get_table_names()


# resharding journey; quick loop: test_key_reshard_copy_is_resumable_and_complete
@pytest.mark.slow
def test_external_copy_only_checks_and_offline_mode(spanner_engine: sa.Engine) -> None:
    assert key_reshard.PROGRESS_ATTRIBUTE == ops.PROGRESS_ATTRIBUTE  # one callback for both
    _old_rows(spanner_engine)
    with spanner_engine.connect() as conn:
        op = _ops(conn, metadata)
        with pytest.raises(MigrationError, match="1200 rows of Events are not in Events16"):
            op.copy_table_rows("Events", "Events16", engine="external")
    copy_table(spanner_engine, Event8, Event16, progress_mode="off")  # "out of band"
    with spanner_engine.connect() as conn:
        _ops(conn, metadata).copy_table_rows("Events", "Events16", engine="external")
        _ops(conn, metadata).verify_tables("Events", "Events16")
    with database_of(spanner_engine).batch() as batch:  # old code changes a row
        batch.update("Events", columns=["ShardId", "Timestamp", "EventId", "Kind"],
                     values=[[compute_shard((ROWS[5]["timestamp"],), 8), ROWS[5]["timestamp"],
                              "e00005", "changed"]])  # fmt: skip
    with spanner_engine.connect() as conn, pytest.raises(MigrationError, match="'different': 1"):
        _ops(conn, metadata).verify_tables("Events", "Events16")
    copy_table(spanner_engine, Event8, Event16, progress_mode="off")
    out = io.StringIO()
    offline = MigrationContext.configure(
        dialect_name="spanner+spanner",
        opts={"as_sql": True, "output_buffer": out, "target_metadata": metadata},
    )
    Operations(offline).copy_table_rows("Events", "Events16")
    check = [ln.rstrip(";") for ln in out.getvalue().splitlines() if "ERROR(" in ln]
    assert len(check) == 1 and check[0].startswith("SELECT IF") and "NOT EXISTS" in check[0]
    with spanner_engine.connect() as c:  # applied by a DBA: passes now that nothing is missing
        assert c.exec_driver_sql(check[0].strip()).scalar_one() == 0
        c.exec_driver_sql("DELETE FROM Events16 WHERE TRUE")
        c.commit()
    with spanner_engine.connect() as c, pytest.raises(sa.exc.DatabaseError, match="missing"):
        c.exec_driver_sql(check[0].strip()).all()  # ... and stops the script when not
    with pytest.raises(MigrationError, match="online only"):
        Operations(offline).retire_table("Events", successor="Events16")
