"""Keyset pagination over a sharded range: rows plus an opaque, encrypted cursor.

A page is the first ``page_size`` rows, in the index's order (then the key), strictly
after the cursor's row. The order is total, so a row is never skipped or repeated,
however many rows share a timestamp across shards. A row inserted between two pages
shows up on a later page if it sorts after the cursor, and never if it sorts before
(it belongs to a page already read).

The cursor carries the last row's sort values, a fingerprint of the query and the rows
served so far, encrypted and authenticated with Fernet (AES-128-CBC and HMAC-SHA256, from
``cryptography``): whoever holds it learns nothing of the sort values, and a cursor from
another query, or an edited one, is refused. Share the secret across processes
(``set_cursor_secret`` or the environment variable ``SHARDED_ORM_CURSOR_SECRET``); by
default each process makes a random one, so cursors are valid only in that process.

The fingerprint is the digest of the statement's SQL (computed once per cache key) and
its bound values, canonicalised (typed; an IN list or set sorted): the same query in
another process, whatever its ``PYTHONHASHSEED``, has the same fingerprint.
"""

from __future__ import annotations

import base64
import datetime as dt
import enum
import hashlib
import json
import os
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, overload

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from sharded_orm.checks import check_positive_int
from sharded_orm.errors import ShardingError
from sharded_orm.read.merge import (
    Bound,
    MergeQuery,
    MergeStats,
    is_async,
    read,
    statement_window,
)
from sharded_orm.read.order import EnumName
from sharded_orm.read.plan import plan_of

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession


class CursorError(ShardingError, ValueError):
    """A cursor that was edited, or issued for another query; or a weak cursor secret."""


ENV_SECRET = "SHARDED_ORM_CURSOR_SECRET"
_MIN_SECRET = 16
_secret: bytes | None = None  # None: taken from the environment (or made) at first use


def _checked(raw: bytes, where: str) -> bytes:
    if len(raw) < _MIN_SECRET:
        raise CursorError(
            f"{where} holds {len(raw)} bytes; a cursor secret needs at least {_MIN_SECRET} bytes "
            "(a short key can be recovered from one cursor, and cursors forged). Use a random "
            "value, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return raw


def set_cursor_secret(secret: bytes | str | None) -> None:
    """The key cursors are signed with; share it between processes that serve pages.

    ``None`` goes back to the environment variable ``SHARDED_ORM_CURSOR_SECRET`` (read at
    the next use), or to a random key of this process when it is not set.
    """
    global _secret
    if secret is None:
        _secret = None
        return
    if not isinstance(secret, (str, bytes)):
        raise CursorError(f"a cursor secret is str or bytes, got {type(secret).__name__}")
    raw = secret.encode() if isinstance(secret, str) else secret
    _secret = _checked(raw, "the cursor secret")


def _key() -> bytes:
    global _secret
    if _secret is None:
        env = os.environ.get(ENV_SECRET)
        _secret = os.urandom(32) if env is None else _checked(env.encode(), ENV_SECRET)
    return _secret


def _encode_value(v: Any) -> list[Any]:
    if v is None:
        return ["n", None]
    # an Enum member (str and int Enums too) and a name read back from a cursor (a str)
    # are bound again as the column's member (``EnumName``), wherever the value goes next
    if isinstance(v, EnumName):
        return ["e", str(v)]
    if isinstance(v, enum.Enum):
        return ["e", v.name]
    if isinstance(v, bool):
        return ["b", v]
    if isinstance(v, int):
        return ["i", str(v)]
    if isinstance(v, float):
        return ["f", repr(v)]
    if isinstance(v, str):
        return ["s", v]
    if isinstance(v, dt.datetime):
        nanos = getattr(v, "nanosecond", v.microsecond * 1000)
        return ["t", v.isoformat(), nanos]
    if isinstance(v, dt.date):
        return ["d", v.isoformat()]
    if isinstance(v, dt.time):
        return ["h", v.isoformat()]
    if isinstance(v, dt.timedelta):
        return ["r", [v.days, v.seconds, v.microseconds]]
    if isinstance(v, Decimal):
        return ["m", str(v)]
    if isinstance(v, uuid.UUID):
        return ["u", str(v)]
    if isinstance(v, bytes):
        return ["y", base64.b64encode(v).decode()]
    raise CursorError(f"cannot put a {type(v).__name__} into a cursor")


def _decode_value(item: list[Any]) -> Any:
    tag, raw = item[0], item[1]
    if tag == "t":
        value = dt.datetime.fromisoformat(raw)
        nanos = item[2]
        if nanos % 1000:
            from google.api_core.datetime_helpers import DatetimeWithNanoseconds

            return DatetimeWithNanoseconds(  # type: ignore[no-untyped-call]
                value.year,
                value.month,
                value.day,
                value.hour,
                value.minute,
                value.second,
                nanosecond=nanos,
                tzinfo=value.tzinfo,
            )
        return value
    decoders: dict[str, Any] = {
        "n": lambda r: None,
        "b": bool,
        "i": int,
        "f": float,
        "s": str,
        "e": EnumName,
        "d": dt.date.fromisoformat,
        "h": dt.time.fromisoformat,
        "r": lambda r: dt.timedelta(days=r[0], seconds=r[1], microseconds=r[2]),
        "m": Decimal,
        "u": uuid.UUID,
        "y": base64.b64decode,
    }
    return decoders[tag](raw)


_SQL_DIGESTS: dict[Any, str] = {}  # statement cache key -> digest of its SQL
_MAX_DIGESTS = 2048


def _canonical(v: Any) -> Any:
    """A bound value as typed JSON that does not depend on the process (sets sorted)."""
    if isinstance(v, (set, frozenset)):
        return ["S", sorted((_canonical(x) for x in v), key=json.dumps)]
    if isinstance(v, (list, tuple)):
        return ["L", [_canonical(x) for x in v]]
    try:
        return _encode_value(v)
    except CursorError:
        return ["o", f"{type(v).__module__}.{type(v).__qualname__}", str(v)]


def _digest_of(stmt: Any) -> str:
    # compiled from a copy: the ORM's compile stores its options on the statement it
    # compiles, which would change the cache key of everything later built from it
    return hashlib.sha256(str(stmt._generate().compile()).encode()).hexdigest()


def _sql_digest(stmt: Any, key: Any) -> str:
    digest = _SQL_DIGESTS.get(key)
    if digest is None:
        digest = _digest_of(stmt)
        if len(_SQL_DIGESTS) >= _MAX_DIGESTS:
            _SQL_DIGESTS.clear()
        _SQL_DIGESTS[key] = digest
    return digest


def query_fingerprint(stmt: Any) -> str:
    """Identifies a query: its SQL (once per cache key), bound values and shard plan."""
    plan = plan_of(stmt)
    cache_key = stmt._generate_cache_key()
    if cache_key is None:  # an element that opts out of caching: its SQL says it all
        sql, binds = _digest_of(stmt), []
    else:
        sql, binds = _sql_digest(stmt, cache_key.key), list(cache_key.bindparams)
    values = []
    for bind in binds:
        v = _canonical(bind.effective_value)
        if bind.expanding and v[0] == "L":  # IN (...): the order of the values is no part of it
            v = ["S", sorted(v[1], key=json.dumps)]
        values.append(v)
    text = json.dumps([sql, values, plan.index_name if plan else ""], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _fernet() -> Any:
    from cryptography.fernet import Fernet

    key = hashlib.sha256(b"sharded-orm cursor\0" + _key()).digest()
    return Fernet(base64.urlsafe_b64encode(key))


def encode_cursor(
    stmt: Any,
    values: list[Any],
    served: int = 0,
    fingerprint: str | None = None,
    ahead: list[Bound] | None = None,
) -> str:
    """An encrypted cursor after ``values``, ``served`` rows into the statement's LIMIT
    (``fingerprint``: the statement's ``query_fingerprint`` when the caller has it;
    ``ahead``: bounds of the next pages, found by this page's bound round)."""
    q = fingerprint if fingerprint is not None else query_fingerprint(stmt)
    bounds = [[[_encode_value(v) for v in b.values], b.full] for b in ahead or ()]
    body = json.dumps(
        {"q": q, "v": [_encode_value(v) for v in values], "n": served, "h": bounds},
        separators=(",", ":"),
        sort_keys=True,
    ).encode()
    return str(_fernet().encrypt(body).decode())


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
    if not isinstance(cursor, str) or not cursor:
        raise CursorError(f"a cursor is the str a previous page returned, got {cursor!r}")
    from cryptography.fernet import InvalidToken

    try:
        body = _fernet().decrypt(cursor.encode())
    except (InvalidToken, ValueError, TypeError):
        raise CursorError(
            "this cursor was altered, signed with another secret, or is not one sharded-orm "
            "issued; start over"
        ) from None
    try:
        data = json.loads(body)
        data_fingerprint, items, served = data["q"], data["v"], int(data.get("n", 0))
        values = [_decode_value(item) for item in items]
        ahead = [
            Bound([_decode_value(item) for item in vals], int(full))
            for vals, full in data.get("h", [])
        ]
    except (ValueError, KeyError, TypeError, IndexError):
        raise CursorError("this cursor is not one sharded-orm issued (bad body)") from None
    if data_fingerprint != (fingerprint if fingerprint is not None else query_fingerprint(stmt)):
        raise CursorError("this cursor belongs to another query; start that query over")
    return values, served, ahead


def decode_cursor(stmt: Any, cursor: str) -> list[Any]:
    """The sort values of a cursor ``page`` issued for ``stmt``."""
    return decode_cursor_state(stmt, cursor)[0]


#: pages whose upper bound a page's bound round finds too (carried in the cursor): each of
#: those pages then takes one statement instead of two
PAGES_AHEAD = 10


@dataclass
class Page:
    """One page: its rows (or entities), and the cursor of the next page (None at the end)."""

    rows: list[Any]
    next_cursor: str | None
    stats: MergeStats


def _page(conn: Any, stmt: Any, page_size: int, cursor: str | None, timeout: float | None) -> Page:
    if plan_of(stmt) is None:
        raise CursorError("page() needs a statement made by sharded_select(...)")
    check_positive_int(page_size, "page_size")
    query = MergeQuery(conn, stmt, timeout)
    query.keyset = True
    limit, offset = statement_window(stmt)
    after, served, ahead = None, 0, list[Bound]()
    fingerprint = query_fingerprint(stmt)  # once per page: to read the cursor and write one
    if cursor is not None:
        after, served, ahead = decode_cursor_bounds(stmt, cursor, fingerprint)
        offset = 0  # the cursor is past the OFFSET already
        if len(after) != len(query.columns) or any(
            len(b.values) != len(query.columns) for b in ahead
        ):
            raise CursorError("this cursor does not fit this query's order; start over")
    stats = MergeStats()
    size = page_size if limit is None else min(page_size, limit - served)
    if size <= 0:
        return Page([], None, stats)
    # one row more than the page tells whether another page follows
    more = 1 if limit is None or limit - served > size else 0
    rows, keys, ahead = read(
        query,
        offset + size + more,
        size + more,
        offset,
        after,
        stats,
        True,
        ahead,
        size,
        PAGES_AHEAD,
    )
    next_cursor = None
    if len(rows) > size:
        next_cursor = encode_cursor(stmt, keys[size - 1], served + size, fingerprint, ahead)
    return Page(rows[:size], next_cursor, stats)


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
