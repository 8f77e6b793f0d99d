"""``advise`` sizes a CSV sample from its newest records, in whatever order the file is.

advise sizes a table for its current and recent writes (the busiest window of the
sample). A CSV of more records than a sample keeps (``MAX_ROWS``) is cut to the records
with the greatest times by the layout's time column, the file streamed with at most that
many kept: an export written oldest first is not sized from its oldest rows. The output
says the sample was cut, to how many of how many. A time that is not one is refused with
its line (the physical line, past a quoted field that spans lines).
"""

from __future__ import annotations

import csv
import datetime as dt
import random
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm.errors import ShardValueError
from sharded_orm.tools.advise import advise
from sharded_orm.tools.advise.layout import layout_of
from sharded_orm.tools.advise.sample import MAX_ROWS, from_csv
from sharded_orm.tools.simulate import Instance

T0 = dt.datetime(2024, 5, 1, 8, 0, tzinfo=dt.timezone.utc)
WINDOW = 1.0  # seconds: the burst (2 to 3 s) fills a window
#: a split is warm above 175 writes/s: 5 rows/s needs 1 shard, a 600 rows/s burst 4
INSTANCE = Instance(nodes=6, node_capacity=350.0, tick=10)
COUNTS = (1, 2, 4, 8)


class Base(DeclarativeBase):
    pass


class Event(Base):  # no shard column yet: its time index grows
    __tablename__ = "csvn_events"
    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    created_at: Mapped[dt.datetime] = mapped_column(sa.DateTime(timezone=True))
    __table_args__ = (sa.Index("csvn_events_by_time", "created_at"),)


def records(old: int, old_rate: float, burst: int, burst_rate: float) -> list[dict[str, Any]]:
    """``old`` records at ``old_rate`` rows/s, then ``burst`` at ``burst_rate``: oldest first."""
    times = [T0 + dt.timedelta(seconds=i / old_rate) for i in range(old)]
    end = times[-1] if times else T0
    times += [end + dt.timedelta(seconds=(i + 1) / burst_rate) for i in range(burst)]
    return [{"id": f"e{i}", "created_at": t} for i, t in enumerate(times)]


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "created_at"])
        w.writerows([r["id"], r["created_at"].isoformat()] for r in rows)
    return path


def ordered(rows: list[dict[str, Any]], order: str, seed: int) -> list[dict[str, Any]]:
    if order == "newest first":
        return rows[::-1]
    if order == "shuffled":
        out = list(rows)
        random.Random(seed).shuffle(out)
        return out
    return rows


@settings(max_examples=20, deadline=None, derandomize=True)
@given(
    limit=st.integers(300, 900),
    extra=st.integers(1, 800),
    burst=st.integers(200, 300),
    order=st.sampled_from(["oldest first", "newest first", "shuffled"]),
    seed=st.integers(0, 2**32),
)
def test_a_csv_is_sized_from_its_newest_records_in_any_order(
    tmp_path_factory: pytest.TempPathFactory,
    limit: int,
    extra: int,
    burst: int,
    order: str,
    seed: int,
) -> None:
    """More old records (2 rows/s) than the sample keeps, then a burst (100 rows/s): the
    sample is the newest ``limit`` records, the burst among them, and is sized for it;
    the file oldest first, newest first or shuffled gives the same sample."""
    rows = records(limit + extra, 2.0, burst, 100.0)
    path = write(tmp_path_factory.mktemp("csv") / "events.csv", ordered(rows, order, seed))
    got = from_csv(layout_of(Event), path, window=WINDOW, limit=limit)
    newest = rows[-limit:]
    assert [r["id"] for r in got.rows] == [r["id"] for r in newest]  # oldest first
    assert [r["created_at"] for r in got.rows] == [r["created_at"] for r in newest]
    last_calm = rows[-burst - 1]["created_at"]  # the busiest window opens on it or later
    assert got.window_start is not None and got.window_start >= last_calm
    assert got.rows_per_second > 50  # the burst's 100 rows/s less its noise, not the 2 before
    total = len(rows)
    assert got.source == (
        f"{str(path)!r} (cut to its newest {limit:,} of {total:,} records, by created_at)"
    )


def test_a_csv_no_bigger_than_the_sample_is_not_said_to_be_cut(tmp_path: Path) -> None:
    rows = records(300, 2.0, 100, 100.0)
    path = write(tmp_path / "events.csv", ordered(rows, "shuffled", 1))
    got = from_csv(layout_of(Event), path, window=WINDOW, limit=len(rows))
    assert got.source == repr(str(path))
    assert [r["id"] for r in got.rows] == [r["id"] for r in rows]


@pytest.mark.parametrize("where", ["old", "new"])
def test_a_bad_time_is_refused_with_its_line(tmp_path: Path, where: str) -> None:
    """Wherever it is (among the records cut or those kept), with its physical line:
    a quoted id before it spans two lines."""
    rows = records(400, 2.0, 100, 100.0)
    path = write(tmp_path / "events.csv", rows)
    lines = path.read_text().splitlines()
    lines[1] = '"e0\nsecond line",' + lines[1].split(",", 1)[1]  # record 1 spans lines 2-3
    at = 10 if where == "old" else 450  # the list index of the line, so its line is at + 2
    lines[at] = lines[at].split(",")[0] + ",yesterday"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        ShardValueError, match=f"line {at + 2}: 'yesterday' is not a DateTime for column created_at"
    ):
        from_csv(layout_of(Event), path, window=WINDOW, limit=200)


def test_a_limit_that_is_not_a_count_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "events.csv", records(10, 2.0, 0, 1.0))
    with pytest.raises(Exception, match="limit"):
        from_csv(layout_of(Event), path, limit=0)


@pytest.mark.slow
@pytest.mark.parametrize("order", ["oldest first", "shuffled"])
def test_advise_sizes_a_big_oldest_first_export_for_its_recent_burst(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, order: str
) -> None:
    """``MAX_ROWS`` records at 5 rows/s, then a 20 s burst at 600 rows/s: its first
    ``MAX_ROWS`` records (what was read before) need 1 shard; the newest need 4."""
    monkeypatch.setenv("SHARDED_ORM_PROGRESS", "off")
    rows = records(MAX_ROWS, 5.0, 20 * 600, 600.0)
    path = write(tmp_path / "events.csv", ordered(rows, order, 3))
    a = advise(Event, str(path), instance=INSTANCE, candidates=COUNTS)
    assert a.best is not None and a.best.count == 4
    assert a.sample.window_start is not None
    assert a.sample.window_start >= rows[-20 * 600 - 1]["created_at"]  # the last calm one
    cut = f"(cut to its newest {MAX_ROWS:,} of {len(rows):,} records, by created_at)"
    assert cut in a.table()
    assert cut in a.as_dict()["sample"]
