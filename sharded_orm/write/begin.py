"""The reads that guard a write run in the write's own transaction, whatever the driver.

Some writes read first: the stored sources of a partial-source UPDATE
(``sharded_orm.write.stored``), the rows a successor's mirror reads before an UPDATE or
DELETE (``sharded_orm.write.successor``). Those reads must see the rows the write then
changes, so they must run in its transaction. On Spanner and PostgreSQL a transaction
begins with the first statement, a SELECT included. pysqlite in its default (legacy)
transaction handling begins one only right before an INSERT, UPDATE, DELETE or REPLACE:
a read just before the write runs outside any transaction, and another connection's
commit between the two goes unseen (a stored shard that is not the hash of its stored
sources, a successor row that misses an update).

:func:`begin_for_write` emits, before such a read, the ``BEGIN`` pysqlite would have
emitted a moment later for the write itself; with it SQLite's locks keep the read and the
write together (a concurrent writer waits, or one of the two is refused with "database is
locked"). Nothing is emitted where the connection is already in a transaction, or writes
in autocommit (where every statement commits alone, by the application's choice).
"""

from __future__ import annotations

from typing import Any

#: ``sqlite3.LEGACY_TRANSACTION_CONTROL`` (Python 3.12+): the ``autocommit`` of a
#: connection in legacy transaction handling (older Pythons have no such attribute)
_LEGACY = -1


def begin_for_write(conn: Any) -> None:
    """Begin the DB-API transaction of ``conn`` (a SQLAlchemy Connection) now, when its
    driver would begin it only at the write: pysqlite's legacy transaction handling.
    Paid once per statement: a dialect name and, on SQLite, three attributes."""
    if conn.dialect.name != "sqlite":
        return
    dbapi = conn.connection.dbapi_connection
    if getattr(dbapi, "in_transaction", True):
        return
    level = getattr(dbapi, "isolation_level", None)
    if level is None or getattr(dbapi, "autocommit", _LEGACY) != _LEGACY:
        return  # autocommit: the application asked for each statement to commit alone
    mode = str(level).upper()
    dbapi.execute(f"BEGIN {mode}" if mode in ("DEFERRED", "IMMEDIATE", "EXCLUSIVE") else "BEGIN")
