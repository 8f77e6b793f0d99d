"""What the timed adoption journey found in a backfill's progress lines (issue 42).

Inside ``alembic upgrade`` a backfill said ``backfill events.EventShard: started``, then
``2,000 rows, 400 rows/s``: no size, no percentage, no ETA (the walk knew its end key, not
its row count), so how long the step had left was anyone's guess, and the closing line's
``3,152 rows`` did not say that none was filled (the contract's pass only read them). The
walk now counts the rows first (one key-only ``COUNT(*)``) and each line gives ``done /
total (pct), rate, ETA`` and how many rows were filled and fixed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from alembic_ext.backfill import backfill_shard
from sharded_orm import compute_shard
from sharded_orm.progress import ENV_INTERVAL

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def progress_lines() -> Iterator[list[str]]:
    """The ``sharded_orm.progress`` lines of the jobs run inside, one at every advance."""
    logger = logging.getLogger("sharded_orm.progress")
    handler, level, before = Lines(), logger.level, os.environ.get(ENV_INTERVAL)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    os.environ[ENV_INTERVAL] = "0.000001"
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        if before is None:
            del os.environ[ENV_INTERVAL]
        else:
            os.environ[ENV_INTERVAL] = before


def make_table(engine: sa.Engine, rows: int, filled: int) -> sa.Table:
    """``rows`` rows, the first ``filled`` of them with their shard already right."""
    md = sa.MetaData()
    t = sa.Table(
        "Logs", md,
        sa.Column("Id", sa.String(36), primary_key=True),
        sa.Column("Ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("Shard", sa.Integer, nullable=True),
    )  # fmt: skip
    md.create_all(engine)
    values = []
    for i in range(rows):
        ts = T0 + dt.timedelta(seconds=i)
        shard = compute_shard((ts,), 4) if i < filled else None
        values.append({"Id": f"id-{i:05d}", "Ts": ts, "Shard": shard})
    with engine.begin() as c:
        for start in range(0, rows, 100):
            c.execute(t.insert().execution_options(sharded_orm_raw_sql_ok=True),
                      values[start : start + 100])  # fmt: skip
    return t


def check_lines(lines: list[str], rows: int, filled: int, batch: int) -> None:
    assert lines[0] == "backfill Logs.Shard: started", lines
    counted = lines.index(f"backfill Logs.Shard: {rows:,} rows in all")  # said once known
    middle = [m for i, m in enumerate(lines[1:-1], 1) if i != counted]
    assert all(m.startswith("backfill Logs.Shard: 0 ") for m in middle[: counted - 1]), lines
    assert middle, lines
    # every line once the count is in: rows walked of the total, percentage, ETA
    walking = [m for m in middle if not m.startswith("backfill Logs.Shard: 0 ")]
    assert walking, lines
    for line in walking:
        assert f" / {rows:,} rows (" in line and ", ETA " in line, line
        assert " filled, 0 fixed)" in line, line
    assert lines[-1].startswith(f"backfill Logs.Shard: done, {rows:,} rows in "), lines
    assert lines[-1].endswith(f": {rows - filled:,} filled, 0 fixed"), lines


def stored_right(engine: sa.Engine, t: sa.Table) -> None:
    with engine.connect() as c:
        for ts, shard in c.execute(sa.select(t.c.Ts, t.c.Shard)):
            aware = ts if ts.tzinfo else ts.replace(tzinfo=dt.timezone.utc)
            assert shard == compute_shard((aware,), 4), ts


@settings(max_examples=8, deadline=None)
@given(
    rows=st.integers(min_value=1, max_value=150),
    batch=st.integers(min_value=1, max_value=60),
    filled=st.integers(min_value=0, max_value=150),
)
def test_backfill_lines_give_the_total_and_an_eta_sqlite(
    rows: int, batch: int, filled: int
) -> None:
    filled = min(filled, rows)
    engine = sa.create_engine("sqlite://")
    t = make_table(engine, rows, filled)
    with progress_lines() as lines:
        done = backfill_shard(
            engine, "Logs", "Shard", sources=["Ts"], count=4, batch_size=batch, progress="log"
        )
    assert done.rows == rows - filled
    check_lines(lines, rows, filled, batch)
    stored_right(engine, t)


@pytest.mark.emulator
def test_backfill_lines_give_the_total_and_an_eta_emulator(spanner_engine: Any) -> None:
    rows, filled, batch = 90, 25, 20
    t = make_table(spanner_engine, rows, filled)
    with progress_lines() as lines:
        done = backfill_shard(
            spanner_engine, "Logs", "Shard", sources=["Ts"], count=4, batch_size=batch,
            progress="log",
        )  # fmt: skip
    assert done.rows == rows - filled
    check_lines(lines, rows, filled, batch)
    stored_right(spanner_engine, t)


def test_a_count_that_fails_leaves_the_walk_going_and_says_so() -> None:
    """The count is for the lines only: a table whose count fails is still filled, and the
    lines say why they give no ETA."""
    engine = sa.create_engine("sqlite://")
    make_table(engine, 30, 0)

    @sa.event.listens_for(engine, "before_cursor_execute")
    def refuse_count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "count(*)" in statement and "WHERE" not in statement:  # the walk's count
            raise sa.exc.OperationalError(statement, {}, Exception("the count timed out"))

    with progress_lines() as lines:
        done = backfill_shard(
            engine, "Logs", "Shard", sources=["Ts"], count=4, batch_size=10, progress="log"
        )
    assert done.rows == 30
    assert "rows not counted (OperationalError): no ETA" in lines[-1], lines
    assert all("ETA " not in line.replace("no ETA", "") for line in lines), lines


@pytest.mark.emulator
def test_a_partitioned_dml_backfill_is_not_silent(spanner_engine: Any) -> None:
    """The sibling: ``engine="partitioned_dml"`` (what ``auto`` picks for farm_fingerprint on
    Spanner) ran its statements with progress off, whatever ``progress=`` said: inside
    ``alembic upgrade`` nothing was printed until the end, however long the statement."""
    md = sa.MetaData()
    t = sa.Table(
        "Logs", md,
        sa.Column("Id", sa.String(36), primary_key=True),
        sa.Column("Ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("Shard", sa.Integer, nullable=True),
    )  # fmt: skip
    md.create_all(spanner_engine)
    with spanner_engine.begin() as c:
        c.execute(t.insert().execution_options(sharded_orm_raw_sql_ok=True), [
            {"Id": f"id-{i:03d}", "Ts": T0 + dt.timedelta(seconds=i), "Shard": None}
            for i in range(40)
        ])  # fmt: skip
    with progress_lines() as lines:
        done = backfill_shard(
            spanner_engine, "Logs", "Shard", sources=["Ts"], count=4,
            algorithm="farm_fingerprint", engine="partitioned_dml", progress="log",
        )  # fmt: skip
    assert done.rows == 40 and done.method == "partitioned_dml"
    what = "backfill Logs.Shard (partitioned DML)"
    assert lines[0] == f"{what}: started (40 rows)", lines
    assert lines[-1].startswith(f"{what}: done, 40 rows in "), lines
    with progress_lines() as lines:  # a callback gets its report, and no lines
        reports: list[Any] = []
        backfill_shard(
            spanner_engine, "Logs", "Shard", sources=["Ts"], count=4,
            algorithm="farm_fingerprint", engine="partitioned_dml", progress=reports.append,
        )  # fmt: skip
    assert lines == [] and len(reports) == 1


@pytest.mark.emulator
def test_a_copy_reports_a_total_and_time_left(spanner_engine: sa.Engine) -> None:
    """copy_table (the key reshard's copy inside `alembic upgrade`) counts the rows it
    copies first, as the backfill does: its lines give the share done and the time left
    (they gave only rows and rate: ``progress(None, ...)``)."""
    from sqlalchemy.orm import DeclarativeBase

    from sharded_orm import shard_column
    from sharded_orm.load.bulk import bulk_load
    from sharded_orm.load.copy import copy_table

    class Base(DeclarativeBase):
        pass

    class Old(Base):
        __tablename__ = "CopyOld"
        k = sa.Column(sa.String(20), primary_key=True)
        a = sa.Column(sa.Integer, nullable=False)

    class New(Base):
        __tablename__ = "CopyNew"
        shard = shard_column("k", count=8, name="Shard", primary_key=True, sort_order=-10)
        k = sa.Column(sa.String(20), primary_key=True)
        a = sa.Column(sa.Integer, nullable=False)

    Base.metadata.create_all(spanner_engine)
    rows = 120
    bulk_load(spanner_engine, Old, [{"k": f"k{i:04}", "a": i} for i in range(rows)],
              progress=False, workers=1)  # fmt: skip
    with progress_lines() as lines:
        result = copy_table(spanner_engine, Old, New, batch_size=25, progress_mode="log")
    assert result.rows == rows
    assert any(f"{rows} rows in all" in line for line in lines), lines
    assert any(f"/ {rows} rows (" in line and "ETA" in line for line in lines), lines
