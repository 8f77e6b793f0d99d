"""The backend's limits on one statement, and the rule that keeps a merge's statements
under them.

A merge repeats the statement's WHERE clause, with its parameters: in every branch of a
``UNION ALL`` (one per shard: SQLite), once in the correlated branches (Spanner), again
where the bound round runs inside the rows statement (Spanner), and once more around the
branches of a statement with joins or DISTINCT. The rule (docs/queries.md):

- the branches of a ``UNION ALL`` are nested in groups of at most the backend's
  compound-SELECT limit (SQLite: 500 terms by default);
- the bound round runs inside the rows statement only when twice the statement's
  parameters, and ours, fit the backend's parameter limit (Spanner: 950); otherwise it
  is a statement of its own, which carries them once;
- a read whose statements would carry more parameters than the limit (counted from the
  statement's bound values, an IN list counting each value) is refused before any
  statement runs;
- what the statement carries beyond its WHERE clause (loader criteria, which apply
  wherever their entity appears: in every branch and around them; what a
  ``do_orm_execute`` listener adds) is known exactly only as finally compiled: where
  it may reach the limit, each statement's parameters are counted as they are handed
  to the DB-API (``ParameterGuard``), before the database sees them. A statement over
  the limit is not sent: the bound round inside the rows statement then runs as a
  statement of its own, and where no plan fits the read is refused (``too_many``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from sharded_orm import limits
from sharded_orm.errors import ShardConfigError
from sharded_orm.limits import SQLITE_COMPOUND_SELECT

# Spanner's limit on query parameters per statement, SQLite's default limits (a build may
# set others; Python 3.11 asks the connection): ``sharded_orm.limits`` holds them all


def _driver_connection(conn: Any) -> Any:
    # (a Session bound per mapper or table: the caller passes the Connection it resolved)
    return (conn.connection() if isinstance(conn, Session) else conn).connection.driver_connection


def _sqlite_limit(conn: Any, dialect: Any, which: str, default: int) -> int:
    raw = _driver_connection(conn)
    getlimit = getattr(raw, "getlimit", None)
    if getlimit is None:
        return default
    return int(getlimit(getattr(dialect.dbapi, which)))


def compound_limit(conn: Any, dialect: Any) -> int | None:
    """The most terms a compound SELECT may have on this connection (None: no limit
    known): SQLite's ``SQLITE_LIMIT_COMPOUND_SELECT``."""
    if getattr(dialect, "name", "") != "sqlite":
        return None
    return _sqlite_limit(conn, dialect, "SQLITE_LIMIT_COMPOUND_SELECT", SQLITE_COMPOUND_SELECT)


def parameter_limit(conn: Any, dialect: Any) -> int | None:
    """The most parameters one statement may carry (None: no limit known), as
    ``sharded_orm.limits`` knows it, SQLite's asked of this connection."""
    raw = _driver_connection(conn) if getattr(dialect, "name", "") == "sqlite" else None
    return limits.parameter_limit(dialect, raw)


def parameters_of(stmt: Any, key: Any) -> int:
    """The parameters ``stmt`` sends (its cache key ``key``: an IN list counts each value;
    a value rendered in the text, none)."""
    if key is None:
        return compiled_parameters(stmt._generate().compile())
    return sum(_count(b, b.effective_value) for b in key.bindparams)


def _count(bind: Any, value: Any) -> int:
    if getattr(bind, "literal_execute", False):
        return 0
    if bind.expanding:
        return len(value) if isinstance(value, (list, tuple, set, frozenset)) else 1
    return 1


def compiled_parameters(compiled: Any) -> int:
    """The parameters a compiled statement sends."""
    params = compiled.params
    names = compiled.positiontup if compiled.positiontup is not None else list(params)
    return sum(
        _count(compiled.binds[n], params.get(n)) if n in compiled.binds else 1 for n in names
    )


def headroom(columns: int) -> int:
    """Parameters of ours a statement of a merge carries beside the statement's, at most
    about: the shard, LIMIT and OFFSET, and the cursor's and the bound's values and flags."""
    return 8 + 8 * columns


def too_many(count: int, limit: int, where: str, dialect: Any) -> ShardConfigError:
    backend = "Spanner" if str(dialect.name).startswith("spanner") else str(dialect.name)
    return ShardConfigError(
        f"merged()/page() would send {where} with {count:,} parameters; {backend} accepts "
        f"at most {limit:,} in a statement. A merge repeats the statement's WHERE clause "
        "(in each shard's branch of a UNION ALL, or around the branches of a join), and "
        "loader criteria (with_loader_criteria, also those a do_orm_execute listener "
        "adds) wherever their entity appears. Bind fewer values: split a long IN list "
        "into several reads, or filter through a join to a table of the values"
    )


class Oversized(Exception):
    """A statement of a merge would carry ``count`` parameters, over the backend's limit:
    raised before the DB-API sees it (``ParameterGuard``)."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.count = count


class ParameterGuard:
    """While entered, every statement handed to the DB-API on ``connection`` with more
    than ``limit`` parameters raises ``Oversized`` instead of being sent: the statement
    as finally compiled (loader criteria, ``do_orm_execute`` additions, expanded IN
    lists), counted for the cost of a ``len``."""

    def __init__(self, connection: Any, limit: int) -> None:
        self.connection = connection
        self.limit = limit

    def __enter__(self) -> ParameterGuard:
        # a Connection's own listeners run before its Engine's: before any that records
        event.listen(self.connection, "before_cursor_execute", self._check)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.connection, "before_cursor_execute", self._check)

    def _check(self, conn: Any, cursor: Any, sql: str, params: Any, *rest: Any) -> None:
        count = len(params) if params else 0
        if count > self.limit:
            raise Oversized(count)
