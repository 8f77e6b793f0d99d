"""Run a test's sync body through an async engine, the way SQLAlchemy tests its async
drivers: the body gets ``async_engine.sync_engine`` and runs in a greenlet under an event
loop (``greenlet_spawn``), so every DB-API call it makes goes through the async dialect's
adapter (awaited on the connection's worker). The same body, the same assertions, the
same data as on the sync engine: only the path to Spanner differs.

::

    def body(engine: sa.Engine, n: int) -> None:
        with engine.begin() as conn:
            ...

    body(spanner_engine, 3)  # the sync engine
    run_through(spanner_async_engine, body, 3)  # the same body through the async one
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")


def run_through(async_engine: Any, body: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``body(async_engine.sync_engine, *args, **kwargs)`` in SQLAlchemy's greenlet under
    a new event loop; returns what it returns, raises what it raises. Call it from sync
    code (a test), not from a running event loop."""
    from sqlalchemy.util import greenlet_spawn

    async def main() -> _T:
        result: _T = await greenlet_spawn(body, async_engine.sync_engine, *args, **kwargs)
        return result

    return asyncio.run(main())


def dispose(async_engine: Any) -> None:
    """``await async_engine.dispose()`` from sync code (a fixture's teardown)."""
    asyncio.run(async_engine.dispose())
