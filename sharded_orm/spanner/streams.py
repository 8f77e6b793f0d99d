"""Streaming reads bounded as a whole: the client's restarts of a cut stream included.

``Snapshot.read`` / ``execute_sql`` stream their result, and the client restarts a stream
cut with UNAVAILABLE (``_restart_on_unavailable``), each restart a new call under the
caller's ``timeout`` again, with no overall bound and no wait between restarts. With the
connection refused and reset mid-read, ``copy_table(deadline=10)`` ran 18.9-49 s (each
restart refused at once, then blocked until the server came back). The library reads the
Read API through :func:`sharded_orm.spanner.mutations.database_of`, which hands out a
:class:`ReadBoundedDatabase`: there ``timeout=<seconds>`` bounds the whole read.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sharded_orm.retry import Deadline
from sharded_orm.spanner.deadlines import StatementDeadline, Through


class StreamDeadline(StatementDeadline):
    """A streaming read's ``timeout`` for the whole read, its restarts included: the
    client-facing adapter of the one :class:`~sharded_orm.retry.Deadline` for
    ``Snapshot.read`` / ``execute_sql`` streams (it adds the wait between restarts).

    The client restarts a stream cut with UNAVAILABLE (``_restart_on_unavailable``), each
    restart a new call under the caller's ``timeout`` again, with no overall bound and no
    wait: with the connection refused, ``copy_table(deadline=10)`` ran 18.9-49 s. Under
    this decorator each call gets the time left, a restart waits a backoff (within that
    time), and once the time is up the next restart fails with DEADLINE_EXCEEDED."""

    def __init__(self, deadline: Deadline | float, what: str = "its timeout") -> None:
        super().__init__(deadline, what)
        #: calls made so far (the first, then each restart)
        self.calls = 0

    def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
        bounded = super().__call__(func)

        @functools.wraps(func)
        def restart_after_backoff(*args: Any, **kwargs: Any) -> Any:
            if self.calls:
                time.sleep(min(STREAM_RESTART_WAIT * 2 ** min(self.calls - 1, 5), self.left))
            self.calls += 1
            return bounded(*args, **kwargs)

        return restart_after_backoff


#: The first wait before restarting a cut stream (doubling, at most 32 times this).
STREAM_RESTART_WAIT = 0.05


def _whole_read(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A read's keyword arguments with ``timeout`` (seconds, or a
    :class:`~sharded_orm.retry.Deadline`) made a :class:`StreamDeadline` (None or another
    timeout object is left as given)."""
    seconds = kwargs.get("timeout")
    if isinstance(seconds, Deadline) or (
        isinstance(seconds, int | float) and not isinstance(seconds, bool)
    ):
        kwargs = {**kwargs, "timeout": StreamDeadline(seconds)}
    return kwargs


class _WholeReads(Through):
    """A Snapshot whose streaming reads end within their ``timeout``, restarts included."""

    def execute_sql(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.execute_sql(*args, **_whole_read(kwargs))

    def read(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.read(*args, **_whole_read(kwargs))


class ReadBoundedDatabase(Through):
    """A google-cloud-spanner ``Database`` (everything passed through) whose snapshots'
    ``read`` and ``execute_sql`` take ``timeout=<seconds>`` as the time the whole read may
    take, the client's restarts of its stream included (see :class:`StreamDeadline`)."""

    @contextmanager
    def snapshot(self, **kwargs: Any) -> Iterator[Any]:
        with self._inner.snapshot(**kwargs) as snapshot:
            yield _WholeReads(snapshot)
