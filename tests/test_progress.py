"""sharded_orm.progress: log lines (never \\r) off a terminal, a bar on one."""

from __future__ import annotations

import io
import logging
import threading
import uuid

import pytest

from sharded_orm.errors import ShardConfigError
from sharded_orm.progress import progress


def _logger() -> logging.Logger:
    """A fresh logger: one made at import time may have been disabled by another test's
    logging.config.fileConfig (Alembic's env.py does that to every existing logger)."""
    return logging.getLogger(f"tests.progress.{uuid.uuid4().hex}")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_mode_off_a_terminal_writes_plain_lines(caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    log = _logger()
    with (
        caplog.at_level(logging.INFO, logger=log.name),
        progress(1000, "backfill T.S", interval=0.0, stream=stream, logger=log) as bar,
    ):
        assert bar.mode == "log"
        for _ in range(10):
            bar.advance(100)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "backfill T.S: started (1,000 rows)"
    assert any("500 / 1,000 rows (50.0%)" in line and "ETA" in line for line in lines)
    assert lines[-1].startswith("backfill T.S: done, 1,000 rows in ")
    assert stream.getvalue() == ""  # nothing drawn on the stream
    assert not any("\r" in line for line in lines)


def test_log_lines_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    log = _logger()
    with (
        caplog.at_level(logging.INFO, logger=log.name),
        progress(None, "load", interval=3600.0, stream=io.StringIO(), logger=log) as bar,
    ):
        for _ in range(1000):
            bar.advance()
    assert len(caplog.records) == 2  # started, done
    assert "1,000 rows" in caplog.records[-1].getMessage()


def test_failure_is_reported_as_failed(caplog: pytest.LogCaptureFixture) -> None:
    log = _logger()
    with (
        caplog.at_level(logging.INFO, logger=log.name),
        pytest.raises(RuntimeError),
        progress(10, "verify", stream=io.StringIO(), logger=log) as bar,
    ):
        bar.advance(3)
        raise RuntimeError("boom")
    assert caplog.records[-1].getMessage().startswith("verify: failed, 3 rows")


def test_bar_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHARDED_ORM_PROGRESS", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    stream = _Tty()
    with progress(10, "presplit", stream=stream) as bar:
        assert bar.mode == "bar"
        bar.advance(10)
    assert "presplit" in stream.getvalue()


def test_environment_forces_log_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDED_ORM_PROGRESS", "log")
    with progress(10, "x", stream=_Tty()) as bar:
        assert bar.mode == "log"


def test_advance_is_thread_safe() -> None:
    with progress(40_000, "threads", mode="off") as bar:
        workers = [
            threading.Thread(target=lambda: [bar.advance() for _ in range(10_000)])
            for _ in range(4)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert bar.done == 40_000


def test_status_line_without_total() -> None:
    bar = progress(None, "scan", mode="off")
    bar.advance(5)
    assert bar.status_line().startswith("scan: 5 rows, ")
    assert "ETA" not in bar.status_line()


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ShardConfigError, match="'loud'"):
        progress(10, "x", mode="loud")  # type: ignore[arg-type]
