"""Sync code that SQLAlchemy's asyncio extension runs on the event loop's thread: whether
the code running now is such code, and how it awaits.

An ``AsyncSession`` flush, a ``run_sync`` function and every DB-API call of an async
dialect run as sync code in SQLAlchemy's greenlet on the loop's thread; a call that
blocks there stalls every task of the loop. The async Spanner dialect and the pooled id
generators hand such calls to a thread and await it through :func:`await_here`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy import util as _sa_util
from sqlalchemy.util.concurrency import in_greenlet

__all__ = ["await_here", "on_event_loop"]

_T = TypeVar("_T")

#: SQLAlchemy's "await this from sync code running in its greenlet": ``await_`` since
#: 2.1, ``await_only`` on 2.0 (kept as a deprecated alias in 2.1)
_AWAIT: Callable[[Awaitable[Any]], Any] = (
    vars(_sa_util).get("await_") or vars(_sa_util)["await_only"]
)


def await_here(awaitable: Awaitable[_T]) -> _T:
    """Await ``awaitable`` from sync code in SQLAlchemy's greenlet (the caller's task
    waits, the loop runs others); ``sqlalchemy.exc.MissingGreenlet`` outside one."""
    result: _T = _AWAIT(awaitable)
    return result


def on_event_loop() -> bool:
    """True in SQLAlchemy's greenlet with the event loop running on this thread: blocking
    here would stall every task of the loop."""
    if not in_greenlet():
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def refuse_async_bind(bind: object, tool: str) -> None:
    """The load tools' one check: ``tool`` makes blocking calls for its whole run and
    never awaits, so an ``AsyncEngine``/``AsyncConnection``, or an async engine's
    ``sync_engine`` outside SQLAlchemy's greenlet (where its statements cannot await),
    is refused with the way to run it: on a thread, with a sync engine."""
    import sqlalchemy as sa

    from sharded_orm.errors import ShardTypeError

    name = type(bind).__name__
    if hasattr(bind, "sync_engine") and not isinstance(bind, (sa.Engine, sa.Connection)):
        given = f"an {name}"  # AsyncEngine, AsyncConnection: awaitable, not ours to block
    elif getattr(getattr(bind, "dialect", None), "is_async", False) and not in_greenlet():
        given = f"the sync {name} of an async engine, outside its greenlet"
    else:
        return
    raise ShardTypeError(
        f"{tool}() runs blocking calls for its whole run and cannot await; it was given "
        f"{given}. Run it off the event loop with a sync engine of the same database: "
        f"`await asyncio.to_thread({tool}, create_engine('spanner+spanner:///projects/P/"
        "instances/I/databases/D'), ...)`, or call it from sync code with a sync engine"
    )
