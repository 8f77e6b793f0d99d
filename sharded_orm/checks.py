"""Argument checks shared by every layer: identifiers that reach SQL text, positive counts,
durations; and how a refused value is shown in a message (a URL without its password)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeGuard

from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.limits import SPANNER_NAME_LENGTH

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")

#: Spanner's naming rule for tables, columns, indexes, sequences, constraints: a letter,
#: then letters, digits and underscores, 128 characters at most.
SPANNER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_identifier(name: object, what: str = "index name") -> str:
    """Refuse anything that is not a plain identifier: hints are pasted into SQL text."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ShardConfigError(
            f"{what} {name!r} is not a plain identifier (letters, digits, _; not starting with "
            "a digit; at most 128 characters); it would be written into the SQL as is, so it "
            "is refused"
        )
    return name


def check_spanner_name(name: object, what: str = "name") -> str:
    """A schema object's name as Spanner accepts it; anything else is refused, never quoted.

    Spanner refuses other names anyway; refusing them here, before any DDL is sent, keeps
    a backtick or a semicolon in a name from ever reaching a DDL batch.
    """
    if not isinstance(name, str):
        raise ShardTypeError(f"{what} must be a str, got {name!r}")
    if not SPANNER_NAME.fullmatch(name):
        raise ShardConfigError(
            f"{what} {name!r} is not a valid Spanner name: it must start with a letter and "
            "hold only letters, digits and _ (at most 128 characters). Rename it."
        )
    return name


#: what to do about a name the library made from a given one that came out too long
MADE_FROM = (
    "It is made from {!r}: give that a shorter name, or make this change by hand with a "
    "shorter one (shard_column(name=...), ShardedIndex(name, ...))."
)


def check_name_length(name: str, what: str, fix: str) -> str:
    """A name the library makes (a successor table, a shard column, an index, a sequence),
    refused when it is longer than Spanner's names may be (``SPANNER_NAME_LENGTH``, 128
    characters), here rather than by Spanner when the DDL runs. ``fix`` says which given
    name to shorten, and how."""
    if len(name) > SPANNER_NAME_LENGTH:
        raise ShardConfigError(
            f"{what} {name!r} is {len(name)} characters long; Spanner's "
            f"names hold at most {SPANNER_NAME_LENGTH}. {fix}"
        )
    return name


def quote_identifier(dialect: Any, name: object, what: str = "column name") -> str:
    """``name`` quoted by ``dialect``'s identifier preparer, for SQL built as text.

    Use it wherever a table or column name is pasted into ``sa.text(...)`` (backfills,
    partitioned DML). On Spanner the name must also follow Spanner's naming rule; every
    dialect refuses control characters (no database stores them in a name on purpose).
    """
    if not isinstance(name, str):
        raise ShardTypeError(f"{what} must be a str, got {name!r}")
    if not name or _CONTROL.search(name):
        raise ShardConfigError(f"{what} {name!r} is empty or holds control characters")
    if str(getattr(dialect, "name", "")).startswith("spanner"):
        check_spanner_name(name, what)
    preparer = getattr(dialect, "identifier_preparer", None)
    if preparer is None:
        raise ShardTypeError(f"quote_identifier needs a SQLAlchemy dialect, got {dialect!r}")
    return str(preparer.quote_identifier(name))


#: the longest duration taken, in seconds (about 31 years): beyond it (inf included) the
#: clients' deadlines overflow and end a call at once
MAX_SECONDS = 1e9


def is_seconds(value: object) -> TypeGuard[int | float]:
    """A duration: a number (not a bool) above 0 and below ``MAX_SECONDS``."""
    return (
        not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < MAX_SECONDS
    )


def check_seconds(value: object, what: str) -> float:
    """A duration the caller gave: seconds, a number (not a bool) above 0 and finite."""
    if not is_seconds(value):
        raise ShardConfigError(
            f"{what} must be a positive number of seconds (below {MAX_SECONDS:g}), got {value!r}"
        )
    return float(value)


def check_positive_int(value: object, what: str) -> int:
    """A count the caller gave: an int (not a bool) of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ShardTypeError(f"{what} must be a positive int, got {value!r}")
    if value <= 0:
        raise ShardConfigError(f"{what} must be at least 1, got {value}")
    return value


# a URL as SQLAlchemy splits it: its password runs from the first ':' of the part after
# '://' to the first '@' (sqlalchemy.engine.url's own pattern)
_URL_PASSWORD = re.compile(r"(?P<head>[\w+.-]+://[^:/@]*:)(?P<password>[^@]*)(?=@)")


# a query parameter that can carry a secret (``?password=``, ``&auth_token=``, ...)
_SECRET_KEY = re.compile(r"pass|pwd|secret|token|key|credential|auth", re.IGNORECASE)
# such a parameter in a URL string: its name and value
_QUERY_SECRET = re.compile(r"(?P<head>[?&;](?P<key>[^=&#;]*)=)(?P<value>[^&#;]*)")


def _hidden_query(text: str) -> str:
    """``text`` with the value of every query parameter named like a secret as ``***``."""
    return _QUERY_SECRET.sub(
        lambda m: m["head"] + "***" if _SECRET_KEY.search(m["key"]) else m[0], text
    )


def render_url(url: object) -> str:
    """``url`` (a string or a SQLAlchemy ``URL``) for a message or a log line, its
    passwords hidden: SQLAlchemy's ``render_as_string(hide_password=True)`` for the
    password after the user name, and ``***`` for every query parameter named like a
    secret (``?password=``, ``&token=``, ...). A string SQLAlchemy cannot parse (a bad
    port, say) has the parts it would take as those hidden."""
    from sqlalchemy.engine import URL, make_url

    if not isinstance(url, URL):
        text = str(url)
        try:
            url = make_url(text)
        except Exception:  # not a URL SQLAlchemy reads: hide what would be the passwords
            return _hidden_query(_URL_PASSWORD.sub(r"\g<head>***", text))
    return _hidden_query(url.render_as_string(hide_password=True))


def _query_secrets(url: object) -> set[str]:
    """The values of ``url``'s query parameters named like a secret (as typed and read)."""
    from urllib.parse import unquote, unquote_plus

    found: set[str] = set()
    query = getattr(url, "query", None)
    if isinstance(query, Mapping):
        for key, value in query.items():
            if _SECRET_KEY.search(str(key)):
                found |= {value} if isinstance(value, str) else {str(v) for v in value}
    if isinstance(url, str):
        for m in _QUERY_SECRET.finditer(url):
            if _SECRET_KEY.search(m["key"]):
                found |= {m["value"], unquote(m["value"]), unquote_plus(m["value"])}
    return found


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)`` for a message about a refused argument, at most ``limit`` characters,
    a URL's password hidden (a URL string passed where an Engine belongs is the usual one)."""
    text = repr(render_url(value)) if isinstance(value, str) and "://" in value else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def redact(text: str, *urls: object) -> str:
    """``text`` with the password of each of ``urls`` replaced by ``***`` wherever it
    appears: as SQLAlchemy reads it, as it was typed (%-escaped) and %-escaped again. For a
    driver's message that echoes what it was given; a password shorter than 3 characters is
    left (it would blank out ordinary words and hides nothing)."""
    from urllib.parse import quote, quote_plus, unquote

    secrets: set[str] = set()
    for url in urls:
        password = getattr(url, "password", None)
        if isinstance(password, str):
            secrets.add(password)
        typed = _URL_PASSWORD.match(str(url)) if isinstance(url, str) else None
        if typed:
            secrets |= {typed["password"], unquote(typed["password"])}
        secrets |= _query_secrets(url)
    for secret in list(secrets):
        secrets |= {quote(secret, safe=""), quote_plus(secret), repr(secret)[1:-1]}
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 3:
            text = text.replace(secret, "***")
    return text
