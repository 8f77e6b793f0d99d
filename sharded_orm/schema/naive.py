"""Naive datetimes as shard sources: refused, unless the app says they mean UTC.

A shard is the hash of an instant, and a naive datetime is no instant. But the stock
sqlalchemy-spanner dialect and Spanner store a naive datetime as UTC (the client sends it
with ``Z``), so an app that writes ``datetime.utcnow()`` into a plain ``DateTime``
column has UTC instants in its database, and reads them back aware. Such an app opts in,
per shard column or once for all the tables of a Base (or MetaData)::

    shard_column("created_at", count=16, naive_datetimes="utc")
    sharded_orm.set_naive_datetimes(Base, "utc")  # before or after the models

and a naive source is then hashed as that UTC instant: the row written naive, read back
aware (Spanner) or naive (SQLite's ``DateTime``), hashes to the same shard. The value is
still written as given (a naive datetime stays naive on the object); an aware one is
written as its UTC instant, as without the opt-in, so SQLite's ``DateTime`` (which keeps
the wall time and drops the zone) holds the instant hashed. Without the opt-in a naive
source is refused, and the error names both ways in.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from typing import Any

from sqlalchemy import MetaData

from sharded_orm.errors import ShardConfigError, ShardTypeError

#: the policies a shard column or a Base may name (None: the Base's, else refused)
UTC = "utc"
REFUSE = "refuse"
POLICIES = (UTC, REFUSE)
#: ``MetaData.info`` key of a Base-wide policy
INFO_KEY = "sharded_orm.naive_datetimes"

_UTC = _dt.timezone.utc

OPT_IN = (
    "if the app writes naive datetimes meaning UTC (Spanner stores them so), opt in: "
    'shard_column(..., naive_datetimes="utc"), or once for the models '
    'sharded_orm.set_naive_datetimes(Base, "utc")'
)


def check_policy(policy: Any, *, allow_none: bool = True) -> str | None:
    """``policy`` if it is one of :data:`POLICIES` (or None where inherited)."""
    if policy is None and allow_none:
        return None
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ShardConfigError(
            f"naive_datetimes must be one of {', '.join(map(repr, POLICIES))}, got {policy!r}"
        )
    return policy


def _metadata_of(target: Any) -> MetaData:
    if isinstance(target, MetaData):
        return target
    md = getattr(target, "metadata", None)  # a DeclarativeBase subclass, a registry
    if isinstance(md, MetaData):
        return md
    raise ShardTypeError(
        f"set_naive_datetimes takes a declarative Base, a registry or a MetaData, got {target!r}"
    )


def set_naive_datetimes(target: Any, policy: str) -> None:
    """Say once, for every shard column of ``target``'s tables (a declarative Base, its
    registry, or a MetaData), what a naive datetime source means: ``"utc"`` (hashed as the
    UTC instant Spanner stores) or ``"refuse"`` (the default). A shard column's own
    ``naive_datetimes=`` wins. Read when a naive value comes, so it holds for the models
    declared before the call too."""
    _metadata_of(target).info[INFO_KEY] = check_policy(policy, allow_none=False)


def naive_policy(spec: Any, table: Any) -> Callable[[], bool] | None:
    """For a shard column of ``spec`` in ``table``: a function saying, when a naive
    datetime comes, whether it means UTC (None where the column refuses them itself)."""
    own = spec.naive_datetimes
    if own is not None:
        return (lambda: True) if own == UTC else None
    md = table.metadata if isinstance(getattr(table, "metadata", None), MetaData) else None
    if md is None:
        return None
    info = md.info

    def base_says() -> bool:
        return bool(info.get(INFO_KEY) == UTC)

    return base_says


def hashed_as_utc(coerce: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``coerce`` (which lets a naive datetime through as stored) then, for the hash, a
    naive datetime as that UTC instant."""

    def coerce_utc(v: Any) -> Any:
        v = coerce(v)
        if isinstance(v, _dt.datetime) and v.tzinfo is None:
            return v.replace(tzinfo=_UTC)
        return v

    return coerce_utc
