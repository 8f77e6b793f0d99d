"""Issue 42: ``sharded-orm advise`` is never silent for long, and prices only what it needs.

It reports its progress through :mod:`sharded_orm.progress` (lines on stderr when the
output is not a terminal, without the user configuring logging), and runs the page walk
only at the counts that can be the answer: the answer and its stated read cost are the
ones walking every count gives (``full_curve=True``), and the counts not walked show a
floor under their cost.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm.tools.advise import advise
from sharded_orm.tools.simulate import Instance

T0 = dt.datetime(2024, 1, 1, 9, 0)

APP = """
import datetime as dt
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Event(Base):
    __tablename__ = "events"
    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    user_handle: Mapped[str] = mapped_column(sa.String(30))
    kind: Mapped[str] = mapped_column(sa.String(20))
    created_at: Mapped[dt.datetime] = mapped_column(sa.DateTime)
    __table_args__ = (sa.Index("events_by_time", "created_at"),)
"""


class Base(DeclarativeBase):
    pass


class Event(Base):
    __tablename__ = "events"
    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    user_handle: Mapped[str] = mapped_column(sa.String(30))
    kind: Mapped[str] = mapped_column(sa.String(20))
    created_at: Mapped[dt.datetime] = mapped_column(sa.DateTime)
    __table_args__ = (sa.Index("events_by_time", "created_at"),)


def rows(n: int, rate: float = 50.0, users: int = 7) -> list[dict[str, Any]]:
    """``n`` writes evenly at ``rate``/s."""
    return [
        {"id": str(uuid.UUID(int=i)), "user_handle": f"user{i % users}", "kind": "k",
         "created_at": T0 + dt.timedelta(seconds=i / rate)}
        for i in range(n)
    ]  # fmt: skip


def test_advise_prints_progress_lines_when_its_output_is_not_a_terminal(tmp_path: Path) -> None:
    (tmp_path / "progress_app.py").write_text(APP)
    url = f"sqlite:///{tmp_path / 'app.db'}"
    engine = sa.create_engine(url)
    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(Event), rows(3000))
    engine.dispose()
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "SHARDED_ORM_PROGRESS_INTERVAL": "0.05"}
    env.pop("SHARDED_ORM_PROGRESS", None)
    cli = str(Path(sys.executable).parent / "sharded-orm")
    argv = [cli, "advise", "progress_app:Event", "--url", url, "--nodes", "10",
            "--node-capacity", "60", "--candidates", "1,2,4,8,10,16,32,64"]  # fmt: skip
    done = subprocess.run(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=300,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out
    # the size first, then how far it got (of how many), then the closing line
    assert "advise: pricing reads: started (16 read plans)" in out, out
    counted = re.findall(r"^advise: pricing reads: (\d+) / 16 read plans \(", out, re.M)
    assert counted, out
    assert re.search(r"^advise: pricing reads: done, 16 read plans in ", out, re.M), out
    # and the answer after it, unchanged (tests/test_advise_unsharded.py: 2 for this table)
    assert 'in the model: shard_column("created_at", count=2)' in out, out
    assert out.index("advise: pricing reads: done") < out.index("recommended: 2 shards")


def _same_answer(kw: dict[str, Any], data: list[dict[str, Any]]) -> None:
    lean = advise(Event, data, **kw)
    full = advise(Event, data, full_curve=True, **kw)
    assert all(p.exact for p in full.points)
    assert lean.count == full.count
    assert lean.best == full.best  # the answer's stated figures, exact
    for mine, every in zip(lean.points, full.points, strict=True):
        assert (mine.count, mine.peak_split_writes) == (every.count, every.peak_split_writes)
        assert (mine.newest_statements, mine.newest_rows_read) == (
            every.newest_statements,
            every.newest_rows_read,
        )
        if mine.exact:
            assert mine == every
        else:  # a floor under the cost, above the answer's
            assert mine.read_cost <= every.read_cost
            assert mine.as_dict()["read_cost"] is None
            if full.best is not None and mine.peak_split_writes <= full.target:
                assert (mine.read_cost, mine.count) > (full.best.read_cost, full.best.count)


# walks every count at 3 sizes; quick loop:
# test_advise_prints_progress_lines_when_its_output_is_not_a_terminal
@pytest.mark.slow
def test_the_answers_are_those_of_every_count_walked() -> None:
    """The counts of tests/test_advise_unsharded.py, and the page's default candidates."""
    inst = Instance(nodes=10, node_capacity=60)
    lean = advise(Event, rows(3000), instance=inst, candidates=(1, 2, 4, 8, 10, 16, 32))
    assert lean.count == 2 and lean.model_line == 'shard_column("created_at", count=2)'
    _same_answer({"instance": inst, "candidates": (1, 2, 4, 8, 10, 16, 32)}, rows(3000))
    _same_answer({"instance": Instance(nodes=10)}, rows(1500))


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(40, 800),
    rate=st.sampled_from([5.0, 50.0, 400.0]),
    k=st.integers(1, 120),
    page_size=st.integers(1, 60),
    pages=st.integers(1, 4),
    capacity=st.sampled_from([20.0, 60.0, 3500.0]),
)
def test_pruning_never_changes_the_answer(
    n: int, rate: float, k: int, page_size: int, pages: int, capacity: float
) -> None:
    kw = {
        "instance": Instance(nodes=10, node_capacity=capacity),
        "k": k,
        "page_size": page_size,
        "pages": pages,
        "candidates": (1, 2, 4, 8, 16, 32, 64),
    }
    _same_answer(kw, rows(n, rate))
