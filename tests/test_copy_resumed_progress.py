"""Issue 42: ``copy_table`` resumed from its saved cursor reports a total, a percentage and
the time left, as a fresh copy does: it counts the rows past its cursor in key order
(``rows_after``: one ``COUNT(*)`` with the keyset condition), where it gave only rows
and rate (``progress(None, ...)``, no ETA).

SQLite: the count itself, against the order computed in Python (ASC and DESC key parts).
Emulator: a copy stopped after three batches, resumed, and its progress lines.
"""

from __future__ import annotations

import datetime as dt
from functools import cmp_to_key
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from test_adoption_timed_progress import progress_lines

from sharded_orm.load.copy_cursor import rows_after

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


# -- SQLite: the count of the rows past a cursor

_KEYS = st.tuples(st.integers(0, 4), st.text("abc", max_size=3))


def _compare(a: tuple[Any, ...], b: tuple[Any, ...], desc: tuple[bool, ...]) -> int:
    for x, y, d in zip(a, b, desc, strict=True):
        if x != y:
            return (1 if x > y else -1) * (-1 if d else 1)
    return 0


@settings(max_examples=60, deadline=None)
@given(
    keys=st.sets(_KEYS, max_size=25),
    cursor=_KEYS,
    desc=st.tuples(st.booleans(), st.booleans()),
)
def test_sqlite_rows_after_counts_the_rows_past_the_cursor_in_key_order(
    keys: set[tuple[int, str]], cursor: tuple[int, str], desc: tuple[bool, bool]
) -> None:
    engine = sa.create_engine("sqlite://")
    table = sa.Table(
        "Old", sa.MetaData(),
        sa.Column("A", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("B", sa.String(10), primary_key=True),
        sa.Column("V", sa.Integer),
    )  # fmt: skip
    table.create(engine)
    with engine.begin() as conn:
        if keys:
            conn.execute(table.insert(), [{"A": a, "B": b, "V": 1} for a, b in keys])
    key = [(table.c.A, desc[0]), (table.c.B, desc[1])]

    def order(x: tuple[int, str], y: tuple[int, str]) -> int:
        return _compare(x, y, desc)

    ordered = sorted(keys, key=cmp_to_key(order))
    expected = [k for k in ordered if _compare(k, cursor, desc) > 0]
    assert rows_after(engine, table, key, list(cursor), 5.0) == len(expected)
    assert rows_after(engine, table, key, None, 5.0) == len(keys)
    if ordered:  # a cursor on a row: the rows after it, as the walk goes on
        at = len(ordered) // 2
        assert rows_after(engine, table, key, list(ordered[at]), 5.0) == len(ordered) - at - 1
    engine.dispose()


def test_sqlite_a_count_that_fails_gives_no_total() -> None:
    engine = sa.create_engine("sqlite://")
    missing = sa.Table("Missing", sa.MetaData(), sa.Column("A", sa.Integer, primary_key=True))
    assert rows_after(engine, missing, [(missing.c.A, False)], [1], 5.0) is None


# -- the emulator: a resumed copy's progress lines


@pytest.mark.emulator
def test_a_resumed_copy_reports_the_rows_left_and_the_time_left(
    spanner_engine: sa.Engine,
) -> None:
    from reshard_models import events

    from sharded_orm import compute_shard
    from sharded_orm.load.copy import CopyProgress, compare_tables, copy_table, cursor_table_ddl
    from sharded_orm.spanner.mutations import database_of

    metadata = events("both")  # Events keyed (ShardId, Timestamp DESC, EventId)
    old, new = metadata.info["models"]["Event"], metadata.info["models"]["Event16"]
    metadata.create_all(spanner_engine)
    database = database_of(spanner_engine)
    rows = 600
    with database.batch() as batch:
        batch.insert(
            "Events", columns=["ShardId", "Timestamp", "EventId", "Kind"],
            values=[
                [compute_shard((T0 + dt.timedelta(seconds=i // 3),), 8),
                 T0 + dt.timedelta(seconds=i // 3), f"e{i:05d}", "k"]
                for i in range(rows)
            ],
        )  # fmt: skip
    database.update_ddl([cursor_table_ddl("CopyCursors")]).result()

    class Stop(Exception):
        pass

    def stop_after_three(p: CopyProgress) -> None:
        if p.batches == 3:
            raise Stop

    with pytest.raises(Stop):
        copy_table(spanner_engine, old, new, batch_size=50, progress_mode="off",
                   on_batch=stop_after_three, cursor_table="CopyCursors")  # fmt: skip
    left = rows - 150
    assert compare_tables(spanner_engine, old, new)["missing_in_target"] == left
    with progress_lines() as lines:
        result = copy_table(spanner_engine, old, new, batch_size=50, progress_mode="log",
                            cursor_table="CopyCursors")  # fmt: skip
    assert result.resumed and result.rows == left
    assert any(f"{left} rows in all" in line for line in lines), lines
    middle = [line for line in lines if f"/ {left} rows (" in line and "ETA" in line]
    assert middle, lines
    assert any(f"{left} / {left} rows (100.0%)" in line for line in lines), lines
    assert compare_tables(spanner_engine, old, new)["missing_in_target"] == 0
