"""The timed adoption journey's waits on its writers say what they wait for (issue 42).

At 50,000 rows ``tests/test_adoption_timed.py`` printed ``4. deploy the new code: 72.6 s``
after more than a minute without a line: the new code's first write, then the old code's
stop, were waited for in silence. Timed call by call (H9), the stall is the emulator's:
it runs one read-write transaction at a time, both apps' clients re-run an insert aborted
by the other at once (google-cloud-spanner's DB-API replays nothing for a first statement
and loops), and each insert holds the emulator ~0.35 s on a 50,000-row table (0.03 s at
3,000). Two writers of the stock dialect, neither importing sharded-orm, stalled the same
way (writes of 28 and 36 s, ~630 aborts each); real Spanner locks rows, and inserts of
different rows do not wait for each other there. So the journey now says what it waits
for every ``report_every`` seconds, with the writers' counts, and why while two writers
run, instead of staying silent; it still fails after its bound.

The writers here are the journey's own (its ``WRITER`` script) on SQLite, each held at
will by a file, so a wait of any length is made in a second or two.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_adoption_timed import CONTENDED, Journey

#: the journey's models for its writer script, on SQLite: a write waits while the file
#: ``hold_<kind>`` exists in the journey's root (and says so: ``held_<kind>``)
MODELS = """\
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ROOT = Path(os.environ["PYTHONPATH"])
KIND = Path(sys.argv[1]).name.rsplit("_", 1)[0]


class Base(DeclarativeBase):
    pass


class Event(Base):
    __tablename__ = "events"
    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    user_handle: Mapped[str] = mapped_column(sa.String(30))
    kind: Mapped[str] = mapped_column(sa.String(20))
    payload: Mapped[dict | None] = mapped_column(sa.JSON)
    created_at: Mapped[dt.datetime] = mapped_column(sa.DateTime)


engine = sa.create_engine(f"sqlite:///{ROOT / 'app.db'}", connect_args={"timeout": 30})
Base.metadata.create_all(engine)


@sa.event.listens_for(Event, "before_insert")
def held(mapper, connection, target):
    while (ROOT / f"hold_{KIND}").exists():
        (ROOT / f"held_{KIND}").touch()
        time.sleep(0.02)
"""

#: seconds between two lines of a wait, here
EVERY = 0.3
#: seconds a writer is held
HELD = 1.5


@pytest.fixture
def journey(tmp_path: Path, capsys: Any) -> Iterator[Journey]:
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    j = Journey(tmp_path, env, capsys)
    j.report_every = EVERY
    try:
        yield j
    finally:
        for w in j.writers:
            for hold in tmp_path.glob("hold_*"):
                hold.unlink()
            if w.proc.poll() is None:
                (w.out / "stop").touch()
                try:
                    w.proc.wait(30)
                except Exception:
                    w.proc.kill()
            w.log.close()


def hold(j: Journey, kind: str, seconds: float) -> None:
    """The ``kind`` writer's writes wait ``seconds`` from now."""
    path = j.root / f"hold_{kind}"
    path.touch()
    threading.Timer(seconds, lambda: path.unlink(missing_ok=True)).start()


def waits(j: Journey, what: str) -> list[tuple[float, str]]:
    """The lines of the waits for ``what``: (seconds into the wait, line)."""
    out = []
    for line in j.said:
        m = re.match(r"    waiting \+\s*([\d.]+)s \| (.*)", line)
        if m and m.group(2).startswith(what):
            out.append((float(m.group(1)), line))
    return out


def assert_reported(lines: list[tuple[float, str]], seconds: float) -> None:
    """A line at least every 2 x EVERY s through a wait of ``seconds``."""
    assert lines, "the wait said nothing"
    at = [0.0] + [t for t, _ in lines]
    assert max(b - a for a, b in zip(at, at[1:], strict=False)) <= 2 * EVERY, lines
    assert at[-1] >= seconds - 3 * EVERY, lines


def test_a_first_write_held_by_another_writer_is_reported(journey: Journey) -> None:
    j = journey
    old = j.start_writer("old", MODELS)
    hold(j, "new", HELD)
    new = j.start_writer("new", MODELS)
    assert new.stats()["ok"] >= 1 and new.first_write >= HELD - 0.2
    lines = waits(j, "the new code's first write")
    assert_reported(lines, HELD)
    first = lines[0][1]
    # what it waits for, both writers' counts, and why (two writers: the emulator's one
    # transaction at a time), said once per wait
    assert re.search(r"old code \d+ rows, 0 failed; new code 0 rows, 0 failed", first), first
    assert CONTENDED.format(rows=0).split(":")[0] in first
    assert "Spanner locks rows" in first
    assert all("Spanner locks rows" not in line for _, line in lines[1:])
    assert old.stats()["ok"] >= 1


def test_a_lone_first_write_says_no_contention(journey: Journey) -> None:
    j = journey
    hold(j, "old", HELD)
    j.start_writer("old", MODELS)
    lines = waits(j, "the old code's first write")
    assert_reported(lines, HELD)
    assert all("one read-write transaction" not in line for _, line in lines)


def test_a_stop_behind_a_slow_write_is_reported(journey: Journey) -> None:
    j = journey
    old = j.start_writer("old", MODELS)
    hold(j, "old", HELD)
    j.wait("the old code's write to be held", (j.root / "held_old").exists, 5)
    text = j.stop_writer(old)
    assert "old code done:" in text and old.proc.returncode == 0
    lines = waits(j, "the old code to stop")
    assert_reported(lines, HELD - 0.5)


def test_a_wait_past_its_bound_fails_saying_what_it_waited_for(journey: Journey) -> None:
    j = journey
    w = j.start_writer("old", MODELS)
    with pytest.raises(pytest.fail.Exception) as failed:
        j.wait("a row that never comes", lambda: False, 2 * EVERY)
    message = str(failed.value)
    assert "timed out after 0.6 s waiting for a row that never comes" in message
    assert re.search(r"\(old code \d+ rows, 0 failed\)", message), message
    assert w.proc.poll() is None  # the writer was left running (the fixture stops it)
    assert sys.executable  # the writers ran on this interpreter
