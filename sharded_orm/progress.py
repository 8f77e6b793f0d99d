"""Progress for long jobs (bulk loads, backfills, verify) that people and log files can read.

On a terminal it draws a real bar (``rich``, imported only then); anywhere else (a log file,
CI, a pipe) it writes a plain line through :mod:`logging` every ``interval`` seconds (5 by
default, ``SHARDED_ORM_PROGRESS_INTERVAL`` to change it) with rows done, rate and ETA, and one
closing line. The lines are timed, not counted: a clock thread writes one when the interval
passes without one, so a single slow batch (or a job that has not finished its first) is
not silent. It never writes a ``\\r``-redrawn line to a log.

:func:`log_to` sends the lines of the jobs started inside it to another logger: Alembic's
operations use it, so their progress goes where ``alembic.ini`` sends Alembic's own lines.

    with progress(total=len(rows), description="backfill LogEntries.NewShard") as bar:
        for batch in batches:
            ...
            bar.advance(len(batch))

``advance`` is thread-safe (bulk loads advance from worker threads).
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import IO, Any, Literal

from sharded_orm.errors import ShardConfigError, ShardTypeError

__all__ = ["Progress", "log_to", "progress"]

Mode = Literal["auto", "bar", "log", "off"]

_log = logging.getLogger("sharded_orm.progress")

#: Environment override of the ``auto`` choice (``bar``, ``log`` or ``off``), e.g. for a cron job
#: run from a terminal multiplexer.
ENV_MODE = "SHARDED_ORM_PROGRESS"
#: Environment override of the default seconds between two log lines (e.g. ``2``).
ENV_INTERVAL = "SHARDED_ORM_PROGRESS_INTERVAL"
#: Seconds between two log lines unless told otherwise.
DEFAULT_INTERVAL = 5.0

_logger_override: contextvars.ContextVar[logging.Logger | None] = contextvars.ContextVar(
    "sharded_orm_progress_logger", default=None
)


@contextmanager
def log_to(logger: logging.Logger) -> Iterator[None]:
    """Jobs started inside the ``with`` block log their lines to ``logger`` (unless given one).

    Inside ``alembic upgrade``, env.py's ``fileConfig`` (the ``alembic.ini`` that ``alembic
    init`` writes) shows ``INFO`` lines of the ``alembic`` loggers only, and disables every
    logger created before it that it does not name: ``sharded_orm.progress`` lines were
    dropped there. Alembic's operations log to ``alembic.sharded_orm`` through this.
    """
    token = _logger_override.set(logger)
    try:
        yield
    finally:
        _logger_override.reset(token)


def default_interval() -> float:
    """``SHARDED_ORM_PROGRESS_INTERVAL`` (seconds), or :data:`DEFAULT_INTERVAL`."""
    raw = os.environ.get(ENV_INTERVAL, "").strip()
    if not raw:
        return DEFAULT_INTERVAL
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ShardConfigError(
            f"{ENV_INTERVAL} must be a number of seconds above 0, got {raw!r}; unset it for "
            f"the default ({DEFAULT_INTERVAL:g} s)"
        )
    return value


def _rich_available() -> bool:
    try:
        import rich.progress  # noqa: F401
    except ImportError:  # pragma: no cover - rich is a dependency; kept for trimmed installs
        return False
    return True


_MODES = ("auto", "bar", "log", "off")


def _choose_mode(mode: Mode, stream: IO[str]) -> Mode:
    if mode not in _MODES:
        raise ShardConfigError(
            f"progress mode must be one of {', '.join(map(repr, _MODES))}, got {mode!r}"
        )
    if mode != "auto":
        return mode
    forced = os.environ.get(ENV_MODE, "").strip().lower()
    if forced in ("bar", "log", "off"):
        return forced  # type: ignore[return-value]
    isatty = getattr(stream, "isatty", None)
    if callable(isatty) and isatty() and os.environ.get("TERM") != "dumb" and _rich_available():
        return "bar"
    return "log"


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class Progress:
    """One job's progress; use it through :func:`progress` (a context manager)."""

    def __init__(
        self,
        total: int | None,
        description: str,
        *,
        unit: str = "rows",
        mode: Mode = "auto",
        interval: float | None = None,
        logger: logging.Logger | None = None,
        stream: IO[str] | None = None,
    ) -> None:
        if total is not None and (isinstance(total, bool) or not isinstance(total, int)):
            raise ShardTypeError(f"total must be an int or None, got {total!r}")
        self.total = total
        self.description = description
        self.unit = unit
        self.done = 0
        self.detail = ""
        self.interval = interval if interval is not None else default_interval()
        if not self.interval >= 0:  # 0: a line at every advance
            raise ShardConfigError(f"interval must be seconds (0 or more), got {interval!r}")
        self._logger = logger or _logger_override.get() or _log
        self._stream = stream if stream is not None else sys.stderr
        self.mode: Mode = _choose_mode(mode, self._stream)
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._last_log = self._start
        self._bar: Any = None
        self._task: Any = None
        self._stop = threading.Event()
        self._clock: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> Progress:
        self._start = self._last_log = time.monotonic()
        if self.mode == "bar":
            import rich.console
            import rich.progress as rp

            self._bar = rp.Progress(
                rp.TextColumn("{task.description}"),
                rp.BarColumn(),
                rp.MofNCompleteColumn(),
                rp.TaskProgressColumn(),
                rp.TimeElapsedColumn(),
                rp.TimeRemainingColumn(),
                console=rich.console.Console(file=self._stream),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.description, total=self.total)
        elif self.mode == "log":
            size = f" ({self.total:,} {self.unit})" if self.total is not None else ""
            self._logger.info("%s: started%s", self.description, size)
            self._stop.clear()
            if self.interval > 0:  # else a line at every advance: no clock needed
                self._clock = threading.Thread(
                    target=self._tick, name=f"progress: {self.description}", daemon=True
                )
                self._clock.start()
        return self

    def _tick(self) -> None:
        """The clock: a line whenever ``interval`` passes without one (slow batches too)."""
        wait = self.interval
        while not self._stop.wait(wait):
            with self._lock:
                now = time.monotonic()
                due = self._last_log + self.interval
                if now < due:
                    wait = due - now
                    continue
                self._last_log = now
                line = self.status_line(now)
            wait = self.interval
            self._logger.info("%s", line)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if self._clock is not None:
            self._stop.set()
            self._clock.join()
            self._clock = None
        if self.mode == "log":
            elapsed = time.monotonic() - self._start
            rate = self.done / elapsed if elapsed > 0 else 0.0
            outcome = "failed" if exc_type is not None else "done"
            self._logger.info(
                "%s: %s, %s %s in %s (%s %s/s)%s",
                self.description,
                outcome,
                f"{self.done:,}",
                self.unit,
                _duration(elapsed),
                f"{rate:,.0f}",
                self.unit,
                f": {self.detail}" if self.detail else "",
            )

    # -- updates -----------------------------------------------------------------------------
    def set_total(self, total: int | None) -> None:
        """The job's size, once known (a job that counts its rows after it started): one
        line says it, and the lines from then on give the percentage and the ETA."""
        if total is not None and (isinstance(total, bool) or not isinstance(total, int)):
            raise ShardTypeError(f"total must be an int or None, got {total!r}")
        with self._lock:
            counted = total is not None and self.total is None
            self.total = total
            if self._bar is not None:
                self._bar.update(self._task, total=total)
        if counted and self.mode == "log":
            self._logger.info("%s: %s %s in all", self.description, f"{total:,}", self.unit)

    def set_detail(self, detail: str) -> None:
        """Words added to every line from then on, and to the closing one (what the rows
        done were: ``84 filled, 0 fixed``)."""
        with self._lock:
            self.detail = detail

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more units done (from any thread)."""
        with self._lock:
            self.done += n
            if self._bar is not None:
                self._bar.update(self._task, advance=n)
                return
            if self.mode != "log":
                return
            now = time.monotonic()
            if now - self._last_log < self.interval:
                return
            self._last_log = now
            line = self.status_line(now)
        self._logger.info("%s", line)

    def status_line(self, now: float | None = None) -> str:
        """``description: 12,000 / 100,000 rows (12.0%), 3,100 rows/s, ETA 25s``."""
        elapsed = (now if now is not None else time.monotonic()) - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.description}: {self.done:,}"]
        if self.total:
            parts.append(f" / {self.total:,} {self.unit} ({100.0 * self.done / self.total:.1f}%)")
        else:
            parts.append(f" {self.unit}")
        parts.append(f", {rate:,.0f} {self.unit}/s")
        if self.total and rate > 0:
            parts.append(f", ETA {_duration(max(0, self.total - self.done) / rate)}")
        if self.detail:
            parts.append(f" ({self.detail})")
        return "".join(parts)


def progress(
    total: int | None,
    description: str,
    *,
    unit: str = "rows",
    mode: Mode = "auto",
    interval: float | None = None,
    logger: logging.Logger | None = None,
    stream: IO[str] | None = None,
) -> Progress:
    """A context manager reporting a job's progress: a bar on a terminal, log lines elsewhere.

    ``total`` may be None when unknown (no percentage or ETA then). ``mode`` forces ``"bar"``,
    ``"log"`` or ``"off"``; ``"auto"`` (default) picks the bar only when ``stream`` (stderr) is a
    terminal, unless the ``SHARDED_ORM_PROGRESS`` environment variable says otherwise.
    ``interval`` is the number of seconds between two log lines (``SHARDED_ORM_PROGRESS_INTERVAL``
    or 5 s when None), written on time even when no ``advance`` comes; ``logger`` defaults
    to the one :func:`log_to` set, else ``sharded_orm.progress``.
    """
    return Progress(
        total,
        description,
        unit=unit,
        mode=mode,
        interval=interval,
        logger=logger,
        stream=stream,
    )
