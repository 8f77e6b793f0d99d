"""Keyset pagination over a sharded range: rows plus an opaque, signed cursor.

A page is the first ``page_size`` rows, in the index's order (then the key), strictly
after the cursor's row. The order is total, so a row is never skipped or repeated,
however many rows share a timestamp across shards. A row inserted between two pages
shows up on a later page if it sorts after the cursor, and never if it sorts before
(it belongs to a page already read).

The cursor carries the last row's sort values, a fingerprint of the query, and an
HMAC-SHA256 signature. A cursor from another query, or an edited one, is refused.
Sign with your own secret across processes (``set_cursor_secret`` or the environment
variable ``SHARDED_ORM_CURSOR_SECRET``); by default each process makes a random one, so
cursors are valid only in the process that issued them.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
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
from sharded_orm.read.merge import MergeQuery, MergeStats, is_async, merge_entries, statement_window
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
        "d": dt.date.fromisoformat,
        "m": Decimal,
        "u": uuid.UUID,
        "y": base64.b64decode,
    }
    return decoders[tag](raw)


def query_fingerprint(stmt: Any) -> str:
    """Identifies a query: its SQL, its bound values, and the shard plan."""
    compiled = stmt.compile()
    plan = plan_of(stmt)
    params = sorted((k, repr(v)) for k, v in compiled.params.items())
    text = f"{compiled}|{params}|{plan.index_name if plan else ''}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def encode_cursor(
    stmt: Any, values: list[Any], served: int = 0, fingerprint: str | None = None
) -> str:
    """A signed cursor after ``values``, ``served`` rows into the statement's LIMIT
    (``fingerprint``: the statement's ``query_fingerprint`` when the caller has it)."""
    q = fingerprint if fingerprint is not None else query_fingerprint(stmt)
    body = json.dumps(
        {"q": q, "v": [_encode_value(v) for v in values], "n": served},
        separators=(",", ":"),
        sort_keys=True,
    ).encode()
    sig = hmac.new(_key(), body, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(sig + body).decode().rstrip("=")


def decode_cursor_state(
    stmt: Any, cursor: object, fingerprint: str | None = None
) -> tuple[list[Any], int]:
    """(sort values, rows served) of a cursor ``page`` issued for ``stmt`` (whose
    ``query_fingerprint`` the caller may pass, to compile the statement once)."""
    if not isinstance(cursor, str) or not cursor:
        raise CursorError(f"a cursor is the str a previous page returned, got {cursor!r}")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (ValueError, TypeError):
        raise CursorError("this cursor is not one sharded-orm issued (bad encoding)") from None
    sig, body = raw[:32], raw[32:]
    if not hmac.compare_digest(sig, hmac.new(_key(), body, hashlib.sha256).digest()):
        raise CursorError("this cursor was altered, or signed with another secret; start over")
    try:
        data = json.loads(body)
        data_fingerprint, items, served = data["q"], data["v"], int(data.get("n", 0))
        values = [_decode_value(item) for item in items]
    except (ValueError, KeyError, TypeError, IndexError):
        raise CursorError("this cursor is not one sharded-orm issued (bad body)") from None
    if data_fingerprint != (fingerprint if fingerprint is not None else query_fingerprint(stmt)):
        raise CursorError("this cursor belongs to another query; start that query over")
    return values, served


def decode_cursor(stmt: Any, cursor: str) -> list[Any]:
    """The sort values of a cursor ``page`` issued for ``stmt``."""
    return decode_cursor_state(stmt, cursor)[0]


@dataclass
class Page:
    """One page: its rows (or entities), and the cursor of the next page (None at the end)."""

    rows: list[Any]
    next_cursor: str | None
    stats: MergeStats


def _page(conn: Any, stmt: Any, page_size: int, cursor: str | None) -> Page:
    if plan_of(stmt) is None:
        raise CursorError("page() needs a statement made by sharded_select(...)")
    check_positive_int(page_size, "page_size")
    query = MergeQuery(conn, stmt)
    limit, offset = statement_window(stmt)
    after, served = None, 0
    fingerprint = None  # compiled once per page, when a cursor is read or written
    if cursor is not None:
        fingerprint = query_fingerprint(stmt)
        after, served = decode_cursor_state(stmt, cursor, fingerprint)
        offset = 0  # the cursor is past the OFFSET already
        if len(after) != len(query.columns):
            raise CursorError("this cursor does not fit this query's order; start over")
    stats = MergeStats()
    size = page_size if limit is None else min(page_size, limit - served)
    if size <= 0:
        return Page([], None, stats)
    # one row more than the page tells whether another page follows
    more = 1 if limit is None or limit - served > size else 0
    entries = merge_entries(query, stmt, offset + size + more, after, stats)[offset:]
    rows = query.rows(entries[:size])
    next_cursor = None
    if len(entries) > size:
        next_cursor = encode_cursor(stmt, entries[size - 1][1], served + size, fingerprint)
    return Page(rows, next_cursor, stats)


@overload
def page(
    conn: AsyncConnection | AsyncSession, stmt: Any, page_size: int, cursor: str | None = None
) -> Awaitable[Page]: ...


@overload
def page(
    conn: Connection | Session, stmt: Any, page_size: int, cursor: str | None = None
) -> Page: ...


def page(conn: Any, stmt: Any, page_size: int, cursor: str | None = None) -> Any:
    """One page of a ``sharded_select``; pass ``next_cursor`` back for the next one.

    The statement runs as written; its OFFSET skips rows before the first page and its
    LIMIT bounds the rows of all pages together. Reads one row more than the page to know
    whether another follows, so ``next_cursor`` is None exactly when no row sorted after
    this page when it was read. With an AsyncConnection or AsyncSession, ``await page(...)``.
    """
    if is_async(conn):
        return conn.run_sync(lambda sync: _page(sync, stmt, page_size, cursor))
    return _page(conn, stmt, page_size, cursor)
