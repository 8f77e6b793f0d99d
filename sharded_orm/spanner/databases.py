"""Each Spanner engine's client ``Database``, noted at its connects: found without a
checkout.

:func:`~sharded_orm.spanner.mutations.database_of` hands the library's own client calls
(id pools' blocks, the load tools) an engine's ``Database``. Checking a connection out to
find it waits for the pool: a flush holding the last pooled connection and asking for its
first ids waited ``pool_timeout``, then failed. A pool ``connect`` event (every engine of
our dialect gets it at ``create_engine``) notes the ``Database`` instead.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import sqlalchemy as sa

#: each engine's client ``Database`` (keyed by its dialect, which its pools and option
#: engines share), noted at each new DB-API connection: found without a checkout
_DATABASES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_WATCHED: weakref.WeakSet[Any] = weakref.WeakSet()
_MEMO_LOCK = threading.Lock()


def remember_database(engine: sa.Engine) -> None:
    """Note ``engine``'s client ``Database`` at each new DB-API connection (a pool
    ``connect`` event), so :func:`~sharded_orm.spanner.mutations.database_of` finds it
    without checking a connection out: a flush holding the pool's last connection can
    still reach the client (an id pool's first block). Called for every engine of our
    dialect at ``create_engine``; idempotent, and cheap: one attribute read per new
    connection."""
    dialect = engine.dialect
    with _MEMO_LOCK:
        if dialect in _WATCHED:
            return
        _WATCHED.add(dialect)

    def noted(dbapi_connection: Any, record: Any) -> None:
        driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
        database = getattr(driver, "database", None)
        if database is not None:
            _DATABASES[dialect] = database

    sa.event.listen(engine, "connect", noted)


def known_database(dialect: Any) -> Any:
    """The ``Database`` noted for the engine of ``dialect``, or None."""
    return _DATABASES.get(dialect)


def note_database(dialect: Any, database: Any) -> None:
    """Note ``database`` for the engine of ``dialect`` unless one is noted already."""
    _DATABASES.setdefault(dialect, database)
