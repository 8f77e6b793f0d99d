"""Long jobs are never silent: a progress line at least every few seconds (issue 42, item 2).

A backfill inside ``alembic upgrade`` printed nothing for minutes (60,000 rows: 39 s of
silence in a test) although the docs promised a line every 10 s. Two causes:

* ``sharded_orm.progress`` wrote a line only from ``advance``, once a batch was done: a
  slow batch, or a job before its first batch, wrote nothing however long it took;
* inside ``alembic upgrade`` its ``sharded_orm.progress`` logger was dropped: the
  ``alembic.ini`` that ``alembic init`` writes shows ``INFO`` of the ``alembic`` loggers
  only, and env.py's ``fileConfig`` disables the loggers it does not name.

Now a clock thread writes a line whenever the interval (5 s, ``SHARDED_ORM_PROGRESS_INTERVAL``)
passes without one, and Alembic's operations log to ``alembic.sharded_orm``, which that
``alembic.ini`` shows. The tests bound the largest gap between two progress lines, with a
small interval and batches made slow on purpose.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from hypothesis import given, settings
from hypothesis import strategies as st

from sharded_orm.errors import ShardConfigError
from sharded_orm.progress import ENV_INTERVAL, log_to, progress


class Times(logging.Handler):
    """Records (monotonic time, message) of each record."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[float, str]] = []
        self.guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self.guard:
            self.seen.append((time.monotonic(), record.getMessage()))


def capture(name: str) -> tuple[logging.Logger, Times]:
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = Times()
    logger.handlers[:] = [handler]
    return logger, handler


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


@settings(max_examples=6, deadline=None)
@given(
    interval=st.sampled_from([0.1, 0.2]),
    batches=st.lists(st.floats(min_value=0.0, max_value=0.9), min_size=1, max_size=3),
)
def test_a_slow_batch_still_gets_a_line_every_interval(
    interval: float, batches: list[float]
) -> None:
    """Each "batch" sleeps up to 0.9 s, much longer than the interval: lines come on time."""
    logger, seen = capture(f"test.progress.slow.{interval}")
    start = time.monotonic()
    with progress(1000, "backfill t.s", mode="log", interval=interval, logger=logger) as bar:
        for pause in batches:
            time.sleep(pause)
            bar.advance(10)
    end = time.monotonic()
    times = [start] + [t for t, _ in seen.seen] + [end]
    assert max(gaps(times)) <= interval + 0.25, (interval, batches, seen.seen)
    lines = [m for _, m in seen.seen]
    assert lines[0].startswith("backfill t.s: started")
    assert lines[-1].startswith("backfill t.s: done")
    middle = [m for m in lines[1:-1]]
    if sum(batches) > 2 * interval:
        assert middle, lines
    for line in middle:  # rows done, rate, time left
        assert "/ 1,000 rows" in line and "rows/s" in line


def test_no_line_after_the_job_ends() -> None:
    logger, seen = capture("test.progress.after")
    with progress(None, "copy a -> b", mode="log", interval=0.05, logger=logger) as bar:
        bar.advance(5)
    count = len(seen.seen)
    time.sleep(0.3)
    assert len(seen.seen) == count
    assert not [t for t in threading.enumerate() if t.name.startswith("progress: copy a")]


def test_interval_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_INTERVAL, "0.1")
    logger, seen = capture("test.progress.env")
    with progress(None, "verify t", mode="log", logger=logger) as bar:
        assert bar.interval == 0.1
        time.sleep(0.45)
    assert len(seen.seen) >= 1 + 3 + 1  # started, >= 3 on the clock, done
    monkeypatch.setenv(ENV_INTERVAL, "soon")
    with pytest.raises(ShardConfigError, match=ENV_INTERVAL + " must be a number of seconds"):
        progress(None, "verify t", mode="log")
    monkeypatch.delenv(ENV_INTERVAL)
    assert progress(None, "verify t", mode="log").interval == 5.0


def test_log_to_routes_the_lines_of_jobs_started_inside_it() -> None:
    logger, seen = capture("test.progress.routed")
    with log_to(logger), progress(None, "backfill t.s", mode="log", interval=1.0) as bar:
        bar.advance(3)
    assert [m.split(":")[1].split(",")[0].strip() for _, m in seen.seen] == ["started", "done"]


# -- inside `alembic upgrade`, with the alembic.ini `alembic init` writes -----------------

ROWS = 240
BATCH = 40  # six batches

REVISION_1 = f'''
"""events"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    t = op.create_table(
        "events",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("kind", sa.String(20), nullable=False),
    )
    op.bulk_insert(t, [{{"id": f"e{{i:05d}}", "kind": "k"}} for i in range({ROWS})])


def downgrade() -> None:
    op.drop_table("events")
'''

REVISION_2 = f'''
"""events: shard column"""
import sqlalchemy as sa
from alembic import op

import alembic_ext  # noqa: F401  (op.backfill_shard off Spanner)
import alembic_ext.ops  # noqa: F401

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("events", sa.Column("EventShard", sa.BigInteger(), nullable=True))
    op.backfill_shard("events", "EventShard", sources=["id"], count=4, batch_size={BATCH})


def downgrade() -> None:
    op.drop_column("events", "EventShard")
'''

#: env.py: each backfill batch made slow, as a big batch on a busy database is, through a
#: public SQLAlchemy event (on every engine: the batches' own too)
SLOW = """
import sharded_orm  # noqa: F401  (the library's features need its dialect: docs/migrations.md)
import time as _time

from sqlalchemy import event as _event
from sqlalchemy.engine import Engine as _Engine


@_event.listens_for(_Engine, "before_cursor_execute")
def _slow_batch(conn, cursor, statement, parameters, context, executemany):
    # the batch's statements (on Spanner it writes by mutations: its reads are slowed)
    if "EventShard" in statement and not statement.lstrip().upper().startswith(_DDL):
        _time.sleep({pause})


_DDL = ("ALTER", "CREATE", "DROP")
"""


def write_project(root: Path, url: str, pause: float) -> None:
    command.init(Config(str(root / "alembic.ini"), stdout=io.StringIO()), str(root / "migrations"))
    ini = root / "alembic.ini"
    ini.write_text(ini.read_text().replace("driver://user:pass@localhost/dbname", url))
    env_py = root / "migrations" / "env.py"
    env = env_py.read_text()
    assert "fileConfig(config.config_file_name)" in env  # the stock logging setup stays
    env_py.write_text(SLOW.format(pause=pause) + env)  # before the migrations run
    (root / "migrations" / "versions" / "0001_events.py").write_text(REVISION_1)
    (root / "migrations" / "versions" / "0002_shard.py").write_text(REVISION_2)


def upgrade_with_line_times(root: Path, env: dict[str, str]) -> list[tuple[float, str]]:
    """Runs ``alembic upgrade head``; each stderr line with the time it arrived."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    assert proc.stderr is not None
    lines = [(time.monotonic(), line.rstrip("\n")) for line in proc.stderr]
    assert proc.wait(timeout=600) == 0, "\n".join(m for _, m in lines)[-3000:]
    return lines


def check_gaps(lines: list[tuple[float, str]], interval: float, pause: float) -> None:
    mine = [(t, m) for t, m in lines if "[alembic.sharded_orm]" in m]
    text = "\n".join(m for _, m in lines)
    assert mine, text  # shown by the alembic.ini `alembic init` writes
    assert "started" in mine[0][1] and "done" in mine[-1][1], text
    assert f"{ROWS:,} rows" in mine[-1][1], text
    assert any("rows/s" in m and "started" not in m for _, m in mine[1:-1]), text
    # every batch takes `pause` (> 3 intervals): the lines still come on time
    assert max(gaps([t for t, _ in mine])) <= interval + 1.0, text


INTERVAL = 0.3
PAUSE = 1.2


# alembic upgrade journey; quick loop: test_a_slow_batch_still_gets_a_line_every_interval
@pytest.mark.slow
def test_backfill_in_alembic_upgrade_reports_on_time_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    write_project(tmp_path, url, PAUSE)
    env = {**os.environ, ENV_INTERVAL: str(INTERVAL), "SHARDED_ORM_PROGRESS": "log"}
    lines = upgrade_with_line_times(tmp_path, env)
    check_gaps(lines, INTERVAL, PAUSE)


# alembic upgrade journey; quick loop: test_a_slow_batch_still_gets_a_line_every_interval
@pytest.mark.slow
def test_backfill_in_alembic_upgrade_reports_on_time_emulator(
    tmp_path: Path, spanner_emulator: Any, spanner_faults: Any
) -> None:
    """On Spanner the backfill reads and writes through the client (no SQL to slow): its
    first reads hang ``PAUSE`` seconds each, then fail and are retried (a slow server)."""
    url = spanner_emulator.url(spanner_emulator.create_database())
    write_project(tmp_path, url, PAUSE)
    env = {
        **os.environ,
        ENV_INTERVAL: str(INTERVAL),
        "SHARDED_ORM_PROGRESS": "log",
        "SPANNER_EMULATOR_HOST": spanner_faults.host,
    }
    spanner_faults.hang("StreamingRead", PAUSE, times=3)  # the backfill's reads only
    lines = upgrade_with_line_times(tmp_path, env)
    assert spanner_faults.count("StreamingRead") > 3
    check_gaps(lines, INTERVAL, PAUSE)
