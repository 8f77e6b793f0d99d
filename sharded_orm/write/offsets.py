"""Where the write layer says that the rows it fills go to a database that drops a
timestamp's offset (SQLite), so an offset other than UTC is refused while their shards
are computed (``sharded_orm.schema.timestamps``): once per statement in the engine hook,
once per object in the flush's mapper events of a model with a timestamp source."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sharded_orm.schema.timestamps import OFFSETS_DROPPED, drops_offsets


def offsets_checked(fn: Callable[..., Any], dialect_of: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, run with :data:`OFFSETS_DROPPED` set when ``dialect_of(*args)`` drops
    offsets."""

    def run(*args: Any) -> Any:
        if not drops_offsets(dialect_of(*args)):
            return fn(*args)
        token = OFFSETS_DROPPED.set(True)
        try:
            return fn(*args)
        finally:
            OFFSETS_DROPPED.reset(token)

    return run
