"""The Spanner half of ``bulk_load``: rows written through google-cloud-spanner's mutations.

``sharded_orm.load.bulk`` imports this module only when the bind is Spanner, because the
database handle and the stand-in dialect come from google-cloud-spanner.

Mutations bypass SQLAlchemy, so nothing converts values on the way: this module applies
each column type's bind processor for the Spanner dialect, as a DML insert would: a
``Uuid`` becomes the same 32-hex string the ORM writes, an ``Enum`` member its name, a
JSON value the client's ``JsonObject``, a ``TypeDecorator`` runs ``process_bind_param``,
and BYTES are base64-encoded by the DB-API's ``Binary`` (the mutation encoder expects
them encoded; raw bytes that happen to be valid UTF-8 would be stored decoded: garbage).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

#: Failures a new attempt of the same commit can cure. ABORTED is Spanner's "retry me";
#: UNAVAILABLE, DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED are transient; INTERNAL is what
#: the emulator answers when concurrent transactions trip over each other.
TRANSIENT = ("Aborted", "ServiceUnavailable", "DeadlineExceeded", "InternalServerError",
             "ResourceExhausted")  # fmt: skip
#: Of those, the ones after which the commit may have been applied anyway.
AMBIGUOUS = ("ServiceUnavailable", "DeadlineExceeded", "InternalServerError")
_MARKERS = ("transaction not found", "invalid transaction", "aborted")


def database_of(bind: Any) -> Any:
    """The google-cloud-spanner ``Database`` behind an Engine or Connection (or ``bind``
    itself when it already is one)."""
    if not isinstance(bind, (sa.Engine, sa.Connection)):
        return bind
    raw: Any = bind.raw_connection() if isinstance(bind, sa.Engine) else bind.connection
    try:
        return raw.driver_connection.database  # spanner_dbapi.Connection.database
    finally:
        if isinstance(bind, sa.Engine):
            raw.close()


def dialect_of(bind: Any) -> sa.Dialect:
    """The bind's dialect, or sharded-orm's Spanner dialect for a bare ``Database``."""
    dialect = getattr(bind, "dialect", None)
    if isinstance(dialect, sa.Dialect):
        return dialect
    from sharded_orm.spanner.dialect import SpannerDialect

    # with its DB-API, whose Binary base64-encodes BYTES as the mutation encoder wants
    return SpannerDialect(dbapi=SpannerDialect.import_dbapi())


def bind_processors(
    columns: Sequence[sa.Column[Any]], dialect: sa.Dialect
) -> list[Callable[[Any], Any] | None]:
    """Each column's bind processor on ``dialect`` (None where values pass as they are)."""
    return [c.type.dialect_impl(dialect).bind_processor(dialect) for c in columns]


def key_order(value: Any) -> Any:
    """A bound key value as Spanner orders it: BYTES by their decoded bytes."""
    if isinstance(value, bytes):
        return base64.b64decode(value)
    return value


def is_transient(exc: BaseException) -> bool:
    """True when retrying the same commit may succeed."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:  # gRPC errors can form a cycle
        chain.append(current)
        current = current.__cause__ or current.__context__
    return any(
        type(e).__name__ in TRANSIENT or any(m in str(e).lower() for m in _MARKERS) for e in chain
    )


def is_ambiguous(exc: BaseException) -> bool:
    """True when the failed commit may have been applied (its outcome is unknown)."""
    return type(exc).__name__ in AMBIGUOUS


def commit(database: Any, table: str, columns: Sequence[str], values: list[Any], mode: str) -> None:
    """One commit: ``values`` written with ``insert`` or ``insert_or_update``."""
    with database.batch() as batch:
        getattr(batch, mode)(table, columns=list(columns), values=values)
