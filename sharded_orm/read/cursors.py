"""The cursors of ``page()``: what they carry, how they are sealed, what they are bound to.

A cursor carries the last row's sort values, the rows served so far, bounds of the next
pages and a fingerprint of the query, encrypted and authenticated with Fernet
(AES-128-CBC and HMAC-SHA256, from ``cryptography``), which also stamps the time it was
issued: whoever holds it learns nothing of the sort values, and a cursor from another
query, an edited one or (with ``max_age``) an expired one is refused with a
``CursorError``. Share the secret across processes (``set_cursor_secret`` or the
environment variable ``SHARDED_ORM_CURSOR_SECRET``); by default each process makes a
random one, so cursors are valid only in that process. Rotate it with ``previous=``:
cursors signed with a previous secret stay valid (for ``grace`` seconds after they were
issued, if given), new ones are signed with the new secret.

The fingerprint is the digest of everything that shapes what the statement reads: its
SQL (computed once per cache key) and its bound values, canonicalised (typed; an IN list
or set sorted), so the same query in another process, whatever its ``PYTHONHASHSEED``,
has the same fingerprint; the options ``do_orm_execute`` listeners add to the
statements of a page (loader criteria: a tenant's filter); for a statement SQLAlchemy
cannot cache (a construct without a cache key), its compiled SQL and parameters.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import json
import os
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import Enum

from sharded_orm.checks import check_seconds
from sharded_orm.errors import ShardingError, ShardTypeError
from sharded_orm.memo import Memo
from sharded_orm.read.order import EnumName
from sharded_orm.read.plan import plan_of
from sharded_orm.schema.value_codec import decode_value, encode_value


class CursorError(ShardingError, ValueError):
    """A cursor that was edited, issued for another query, expired or not a cursor at
    all; or a weak cursor secret."""


ENV_SECRET = "SHARDED_ORM_CURSOR_SECRET"
_MIN_SECRET = 16


@dataclass(frozen=True)
class Secrets:
    """The cursor secret, the previous ones still accepted, and the ages allowed."""

    current: bytes
    previous: tuple[bytes, ...] = ()
    max_age: float | None = None
    grace: float | None = None


_secrets: Secrets | None = None  # None: taken from the environment (or made) at first use
_fernets: tuple[Any, ...] = ()  # (Secrets, Fernet of each secret), built at first use


def _checked(raw: object, where: str) -> bytes:
    if not isinstance(raw, (str, bytes)):
        raise CursorError(f"a cursor secret is str or bytes, got {type(raw).__name__}")
    raw = raw.encode() if isinstance(raw, str) else raw
    if len(raw) < _MIN_SECRET:
        raise CursorError(
            f"{where} holds {len(raw)} bytes; a cursor secret needs at least {_MIN_SECRET} bytes "
            "(a short key can be recovered from one cursor, and cursors forged). Use a random "
            "value, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return raw


def set_cursor_secret(
    secret: bytes | str | None,
    *,
    previous: tuple[bytes | str, ...] | list[bytes | str] = (),
    max_age: float | None = None,
    grace: float | None = None,
) -> None:
    """The key cursors are signed with; share it between processes that serve pages.

    ``previous``: secrets cursors were signed with before a rotation, still accepted
    (new cursors are signed with ``secret``); ``grace`` (seconds): a cursor signed with
    one of them is accepted only while younger than that (None: while it is listed).
    ``max_age`` (seconds): every cursor expires that long after it was issued (None:
    never). ``None`` goes back to the environment variable ``SHARDED_ORM_CURSOR_SECRET``
    (read at the next use), or to a random key of this process when it is not set.
    """
    global _secrets
    for value, name in ((max_age, "max_age"), (grace, "grace")):
        if value is not None:
            check_seconds(value, name)
    if secret is None:
        if previous or max_age is not None or grace is not None:
            raise CursorError("give the secret with previous=, max_age= or grace=")
        _secrets = None
        return
    if isinstance(previous, (str, bytes)):
        raise CursorError("previous= is a list of secrets, got one str or bytes")
    _secrets = Secrets(
        _checked(secret, "the cursor secret"),
        tuple(_checked(p, "a previous cursor secret") for p in previous),
        None if max_age is None else float(max_age),
        None if grace is None else float(grace),
    )


def _current() -> tuple[Secrets, list[Any]]:
    """The secrets in force and a Fernet for each (the current one first)."""
    global _secrets, _fernets
    if _secrets is None:
        env = os.environ.get(ENV_SECRET)
        _secrets = Secrets(os.urandom(32) if env is None else _checked(env, ENV_SECRET))
    if not _fernets or _fernets[0] is not _secrets:
        from cryptography.fernet import Fernet

        def fernet(raw: bytes) -> Any:
            key = hashlib.sha256(b"sharded-orm cursor\0" + raw).digest()
            return Fernet(base64.urlsafe_b64encode(key))

        _fernets = (_secrets, *(fernet(s) for s in (_secrets.current, *_secrets.previous)))
    return _fernets[0], list(_fernets[1:])


def seal(body: bytes) -> str:
    """``body`` encrypted and signed with the current secret (Fernet stamps the time)."""
    return str(_current()[1][0].encrypt(body).decode())


def unseal(cursor: str) -> bytes:
    """The body of a cursor, checked: signed with a secret in force, not expired."""
    from cryptography.fernet import InvalidToken

    secrets, fernets = _current()
    token = cursor.encode()
    for i, f in enumerate(fernets):
        try:
            body = f.decrypt(token)
        except (InvalidToken, ValueError, TypeError):
            continue
        age = time.time() - f.extract_timestamp(token)
        if secrets.max_age is not None and age > secrets.max_age:
            raise CursorError(
                f"this cursor expired: it was issued {age:.0f} s ago, and cursors live "
                f"{secrets.max_age:g} s (set_cursor_secret(max_age=...)); start over"
            )
        if i and secrets.grace is not None and age > secrets.grace:
            raise CursorError(
                f"this cursor was signed with a previous cursor secret {age:.0f} s ago, past "
                f"its grace period of {secrets.grace:g} s (set_cursor_secret(grace=...)); "
                "start over"
            )
        return bytes(body)
    raise CursorError(
        "this cursor was altered, signed with another secret, or is not one sharded-orm "
        "issued; start over"
    )


def _encode_value(v: Any) -> list[Any]:
    # a name read back from a cursor (an ``EnumName``, a str) stays an Enum member's name,
    # bound again as the column's member wherever the value goes next
    if isinstance(v, EnumName):
        return ["e", str(v)]
    try:
        return encode_value(v)
    except ShardTypeError as e:
        raise CursorError(str(e)) from None


def _decode_value(item: Any) -> Any:
    """A value of a cursor's body (an Enum member's name as an ``EnumName``);
    ValueCodecError when the item is not one ``_encode_value`` makes."""
    return decode_value(item, enum_name=EnumName)


def value_fits(col: Any, value: Any) -> bool:
    """Whether a cursor's ``value`` is one ``col`` holds (a cursor made for another
    order, edited by someone holding the secret, binds none that is not)."""
    if value is None:
        return True
    t = col.type
    if isinstance(value, EnumName):
        return isinstance(t, Enum) or isinstance(getattr(t, "impl_instance", None), Enum)
    try:
        want = t.python_type  # (a TypeDecorator's, e.g. Interval's: timedelta)
    except NotImplementedError:  # a type that does not say: the database will
        return True
    if want in (int, float, Decimal) and isinstance(value, bool):
        return False
    if want is float:
        return isinstance(value, (float, int))
    if want is Decimal:
        return isinstance(value, (Decimal, int, float))
    if isinstance(want, type) and issubclass(want, (enum.Enum, bytes, uuid.UUID)):
        # (a key the bound round read raw: the stored value, or text, is one too)
        return isinstance(value, (want, str))
    return isinstance(value, want) if isinstance(want, type) else True


_SQL_DIGESTS: Memo[Any, str] = Memo("read.sql_digests", 2048)  # cache key -> digest of its SQL


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


def _compiled(stmt: Any) -> Any:
    # compiled from a copy: the ORM's compile stores its options on the statement it
    # compiles, which would change the cache key of everything later built from it
    return stmt._generate().compile()


def _sql_digest(stmt: Any, key: Any) -> str:
    digest = _SQL_DIGESTS.get(key)
    if digest is None:
        digest = hashlib.sha256(str(_compiled(stmt)).encode()).hexdigest()
        _SQL_DIGESTS.put(key, digest)
    return digest


def _value(v: Any, expanding: bool) -> Any:
    c = _canonical(v)
    if expanding and c[0] == "L":  # IN (...): the order of the values is no part of it
        return ["S", sorted(c[1], key=json.dumps)]
    return c


def query_fingerprint(stmt: Any, options: tuple[Any, ...] = ()) -> str:
    """Identifies a query: its SQL (once per cache key), bound values and shard plan,
    with ``options`` (those ``do_orm_execute`` listeners added to its statements).

    A statement SQLAlchemy cannot cache (a construct that opts out: no cache key) is
    identified by its compiled SQL and the values of its parameters."""
    if options:
        stmt = stmt.options(*options)
    plan = plan_of(stmt)
    cache_key = stmt._generate_cache_key()
    if cache_key is None:  # compiled every time anyway: its SQL and parameters say it all
        compiled = _compiled(stmt)
        sql = hashlib.sha256(str(compiled).encode()).hexdigest()
        binds = compiled.binds
        values = [
            [name, _value(v, bool(getattr(binds.get(name), "expanding", False)))]
            for name, v in sorted(compiled.params.items())
        ]
    else:
        sql = _sql_digest(stmt, cache_key.key)
        values = [_value(b.effective_value, b.expanding) for b in cache_key.bindparams]
    text = json.dumps([sql, values, plan.index_name if plan else ""], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def encode_cursor(
    stmt: Any,
    values: list[Any],
    served: int = 0,
    fingerprint: str | None = None,
    ahead: list[Any] | None = None,
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
    return seal(body)


@dataclass
class CursorState:
    """What a cursor holds: the fingerprint of its query, the sort values it is after,
    the rows served, and (values, full shards) bounds of the next pages."""

    fingerprint: str
    values: list[Any]
    served: int
    ahead: list[tuple[list[Any], int]]


def _count(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise ValueError(raw)
    return raw


def read_cursor(cursor: object) -> CursorState:
    """A cursor's state, its seal and body checked (not yet against a query)."""
    if not isinstance(cursor, str) or not cursor:
        raise CursorError(f"a cursor is the str a previous page returned, got {cursor!r}")
    body = unseal(cursor)
    try:
        data = json.loads(body)
        if not isinstance(data, dict) or not isinstance(data["q"], str):
            raise TypeError(data)
        items, bounds = data["v"], data.get("h", [])
        if not isinstance(items, list) or not isinstance(bounds, list):
            raise TypeError(data)
        values = [_decode_value(item) for item in items]
        ahead = []
        for bound in bounds:
            vals, full = bound
            if not isinstance(vals, list):
                raise TypeError(bound)
            ahead.append(([_decode_value(item) for item in vals], _count(full)))
        return CursorState(data["q"], values, _count(data.get("n", 0)), ahead)
    except (ValueError, TypeError, KeyError, IndexError, ArithmeticError, RecursionError):
        # (ValueCodecError is a ValueError: a value the codec did not write)
        raise CursorError("this cursor is not one sharded-orm issued (bad body)") from None
