"""Keyset pagination over a sharded range: rows plus an opaque, encrypted cursor.

A page is the first ``page_size`` rows, in the index's order (then the key), strictly
after the cursor's row. The order is total, so a row is never skipped or repeated,
however many rows share a timestamp across shards. A row inserted between two pages
shows up on a later page if it sorts after the cursor, and never if it sorts before
(it belongs to a page already read).

The cursor (``sharded_orm.read.cursors``) carries the last row's sort values, a
fingerprint of the query and the rows served so far, encrypted and authenticated: a
cursor from another query, an edited one or an expired one is refused with a
``CursorError``.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from sharded_orm.checks import check_positive_int
from sharded_orm.errors import ShardConfigError
from sharded_orm.read.context import read_deadline
from sharded_orm.read.cursors import (
    CursorError,
    encode_cursor,
    query_fingerprint,
    read_cursor,
    set_cursor_secret,
    value_fits,
)
from sharded_orm.read.merge import (
    Bound,
    MergeQuery,
    MergeStats,
    is_async,
    read,
    statement_window,
)
from sharded_orm.read.plan import plan_of
from sharded_orm.read.recorded import operation_target
from sharded_orm.telemetry import operation

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

__all__ = [
    "CursorError",
    "Page",
    "decode_cursor",
    "decode_cursor_state",
    "encode_cursor",
    "page",
    "query_fingerprint",
    "set_cursor_secret",
]


def decode_cursor_state(
    stmt: Any, cursor: object, fingerprint: str | None = None
) -> tuple[list[Any], int]:
    """(sort values, rows served) of a cursor ``page`` issued for ``stmt`` (whose
    ``query_fingerprint`` the caller may pass, to compile the statement once)."""
    values, served, _ = decode_cursor_bounds(stmt, cursor, fingerprint)
    return values, served


def decode_cursor_bounds(
    stmt: Any, cursor: object, fingerprint: str | None = None
) -> tuple[list[Any], int, list[Bound]]:
    """(sort values, rows served, bounds of the next pages) of a cursor."""
    state = read_cursor(cursor)
    if state.fingerprint != (fingerprint or query_fingerprint(stmt)):
        raise CursorError("this cursor belongs to another query; start that query over")
    return state.values, state.served, [Bound(v, full) for v, full in state.ahead]


def decode_cursor(stmt: Any, cursor: str) -> list[Any]:
    """The sort values of a cursor ``page`` issued for ``stmt``."""
    return decode_cursor_state(stmt, cursor)[0]


#: pages whose upper bound a page's bound round finds too (carried in the cursor): each of
#: those pages then takes one statement instead of two
PAGES_AHEAD = 10


class ListenerOptions:
    """The options ``do_orm_execute`` listeners of a Session add to the statements sent
    while it is entered (a tenant's loader criteria): listened to only where a listener
    is (nothing is paid elsewhere), after every other listener."""

    def __init__(self, conn: Any, stmt: Any) -> None:
        self.session = conn if isinstance(conn, Session) and conn.dispatch.do_orm_execute else None
        self.own = stmt._with_options
        self.added: tuple[Any, ...] = ()

    def __enter__(self) -> ListenerOptions:
        if self.session is not None:
            event.listen(self.session, "do_orm_execute", self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.session is not None:
            event.remove(self.session, "do_orm_execute", self._seen)

    def _seen(self, state: Any) -> None:
        final = state.statement._with_options
        self.added = tuple(o for o in final if not any(o is x for x in self.own))


@dataclass
class Page:
    """One page: its rows (or entities), and the cursor of the next page (None at the end)."""

    rows: list[Any]
    next_cursor: str | None
    stats: MergeStats


def _page(conn: Any, stmt: Any, page_size: int, cursor: str | None, timeout: float | None) -> Page:
    # the span covers the checks too: a refused page (a tampered, foreign or expired
    # cursor, a statement not sharded_select's) is a span with its error.type
    with operation("page", *operation_target(conn, stmt)) as traced:
        return _read_page(conn, stmt, page_size, cursor, timeout, traced)


def _read_page(
    conn: Any, stmt: Any, page_size: int, cursor: str | None, timeout: float | None, traced: Any
) -> Page:
    if plan_of(stmt) is None:  # (a union of them too: run it as one query)
        raise ShardConfigError("page() needs a statement made by sharded_select(...)")
    check_positive_int(page_size, "page_size")
    query = MergeQuery(conn, stmt, read_deadline(timeout), paged=True)
    limit, offset = statement_window(stmt)
    after, served, ahead = None, 0, list[Bound]()
    fingerprint = query_fingerprint(stmt)  # once per page: to read the cursor and write one
    listened = ListenerOptions(conn, stmt)
    state = None
    traced.set(cursor_given=cursor is not None)
    if cursor is not None:
        state = read_cursor(cursor)
        # with do_orm_execute listeners, what they add is known once a statement is sent
        if listened.session is None and state.fingerprint != fingerprint:
            raise CursorError("this cursor belongs to another query; start that query over")
        after, served = state.values, state.served
        ahead = [Bound(v, full) for v, full in state.ahead]
        offset = 0  # the cursor is past the OFFSET already
        _check_fit(query, [after, *(b.values for b in ahead)], served, limit)
    stats = MergeStats()
    size = page_size if limit is None else min(page_size, limit - served)
    if size <= 0:
        return Page([], None, stats)
    # one row more than the page tells whether another page follows
    more = 1 if limit is None or limit - served > size else 0
    traced.set(shards=query.plan.shard.count, page_size=size)
    with listened:
        try:
            rows, keys, ahead = read(
                query, offset + size + more, size + more, offset, after, stats, True, ahead,
                size, PAGES_AHEAD,
            )  # fmt: skip
        finally:
            traced.set_all(stats.figures())
        traced.set(has_next=len(rows) > size)
    if listened.added:  # a tenant's criteria from a listener shape what the query reads
        fingerprint = query_fingerprint(stmt, listened.added)
    if state is not None and state.fingerprint != fingerprint:
        raise CursorError("this cursor belongs to another query; start that query over")
    next_cursor = None
    if len(rows) > size:
        next_cursor = encode_cursor(stmt, keys[size - 1], served + size, fingerprint, ahead)
    return Page(rows[:size], next_cursor, stats)


def _check_fit(query: MergeQuery, rows: list[list[Any]], served: int, limit: int | None) -> None:
    """Refuse a cursor whose values are not the order's (or served more than the LIMIT)."""
    n = len(query.columns)
    if (
        any(len(values) != n for values in rows)
        or not all(
            value_fits(col, v)
            for values in rows
            for (col, _), v in zip(query.columns, values, strict=True)
        )
        or (limit is not None and served > limit)
    ):
        raise CursorError("this cursor does not fit this query's order; start over")


@overload
def page(
    conn: AsyncConnection | AsyncSession,
    stmt: Any,
    page_size: int,
    cursor: str | None = None,
    *,
    timeout: float | None = None,
) -> Awaitable[Page]: ...


@overload
def page(
    conn: Connection | Session,
    stmt: Any,
    page_size: int,
    cursor: str | None = None,
    *,
    timeout: float | None = None,
) -> Page: ...


def page(
    conn: Any,
    stmt: Any,
    page_size: int,
    cursor: str | None = None,
    *,
    timeout: float | None = None,
) -> Any:
    """One page of a ``sharded_select``; pass ``next_cursor`` back for the next one.

    The rows come from the statement itself through ``conn``, ordered and limited by the
    database (see ``merged``); its OFFSET skips rows before the first page and its LIMIT
    bounds the rows of all pages together. Reads one row more than the page to know
    whether another follows, so ``next_cursor`` is None exactly when no row sorted after
    this page when it was read. With an AsyncConnection or AsyncSession,
    ``await page(...)``. ``timeout`` (seconds) bounds the whole read: each statement
    gets what is left of it (the ``timeout`` execution option).
    """
    if is_async(conn):
        return conn.run_sync(lambda sync: _page(sync, stmt, page_size, cursor, timeout))
    return _page(conn, stmt, page_size, cursor, timeout)
