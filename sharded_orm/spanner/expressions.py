"""GoogleSQL twins of ``sharded_orm.hashing``: the shard as a Spanner expression.

``shard_sql`` renders, for given source columns, the expression whose value equals
``compute_shard(values, count, "farm_fingerprint")`` for every row. It backs
``server_side=True`` shard columns (``AS (...) STORED``) and can be used in
partitioned DML backfills. Importing this module does not import the Spanner client:
``@compiles`` is keyed by dialect name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import types as sqltypes
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import Column

from sharded_orm.checks import check_spanner_name
from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.hashing import validate_count
from sharded_orm.schema.columns import ShardComputed, get_shard_column

#: ``FORMAT_TIMESTAMP`` pattern matching ``hashing._text_datetime``: 4-digit year,
#: microseconds (nanoseconds truncated, as ``%E6S`` does), literal Z, in UTC.
TIMESTAMP_FORMAT = "%E4Y-%m-%dT%H:%M:%E6SZ"


def text_sql(col_sql: str, type_: sqltypes.TypeEngine[Any]) -> str:
    """GoogleSQL for the canonical text of a column holding values of ``type_``."""
    t = type_
    if isinstance(t, sqltypes.TypeDecorator):
        t = t.impl_instance
    if isinstance(t, sqltypes.Boolean):
        return f"CAST({col_sql} AS STRING)"
    if isinstance(t, sqltypes.Integer):
        return f"CAST({col_sql} AS STRING)"
    if isinstance(t, sqltypes.Uuid):
        # the client hashes str(uuid); the column holds whatever text was sent (SQLAlchemy
        # sends 32 hex digits, others may send dashes or upper case): rebuild str(uuid)
        hexed = f"LOWER(REPLACE(CAST({col_sql} AS STRING), '-', ''))"
        groups = ((1, 8), (9, 4), (13, 4), (17, 4), (21, 12))
        parts = [f"SUBSTR({hexed}, {a}, {n})" for a, n in groups]
        return "CONCAT(" + ", '-', ".join(parts) + ")"
    if isinstance(t, (sqltypes.String, sqltypes.Enum)):
        return col_sql
    if isinstance(t, sqltypes.Numeric) and not isinstance(t, sqltypes.Float):
        return f"CAST({col_sql} AS STRING)"
    if isinstance(t, sqltypes.DateTime):
        return f"FORMAT_TIMESTAMP('{TIMESTAMP_FORMAT}', {col_sql}, 'UTC')"
    if isinstance(t, sqltypes.Date):
        return f"CAST({col_sql} AS STRING)"
    if isinstance(t, sqltypes._Binary):
        return f"TO_BASE64({col_sql})"
    raise ShardTypeError(
        f"no GoogleSQL canonical text for column type {type_!r}: server-side shards support "
        "STRING, INT64, BOOL, NUMERIC, DATE, TIMESTAMP, BYTES and UUID sources"
    )


def canonical_string_sql(parts: Sequence[str]) -> str:
    """The length-prefixed join of canonical-text expressions."""
    pieces = []
    for p in parts:
        pieces.append(f"CAST(BYTE_LENGTH({p}) AS STRING), ':', {p}")
    return f"CONCAT({', '.join(pieces)})"


def backtick(name: str) -> str:
    """A column name in backticks, checked first: it is pasted into SQL text."""
    return f"`{check_spanner_name(name, 'column name')}`"


def shard_sql(
    sources: Sequence[Column[Any]], count: int, quote: Callable[[str], str] = backtick
) -> str:
    """``MOD(MOD(FARM_FINGERPRINT(<canonical>), N) + N, N)`` for the given source columns.

    ``quote`` quotes a column name (a dialect's ``identifier_preparer.quote``, or the
    checking default); ``count`` is checked, as it is written into the SQL as a number.
    """
    count = validate_count(count)
    if not sources:
        raise ShardConfigError("a shard expression needs at least one source column")
    canon = canonical_string_sql([text_sql(quote(c.name), c.type) for c in sources])
    return f"MOD(MOD(FARM_FINGERPRINT({canon}), {count}) + {count}, {count})"


@compiles(ShardComputed, "spanner+spanner")
@compiles(ShardComputed, "spanner")
def _render_spanner(element: ShardComputed, compiler: Any, **kw: Any) -> str:
    column = element.column
    assert column is not None, "ShardComputed renders only as part of its column"
    sc = get_shard_column(column.table, column.key)
    return f"AS ({shard_sql(sc.sources, sc.count, compiler.preparer.quote)}) STORED"


@compiles(ShardComputed)
def _render_elsewhere(element: ShardComputed, compiler: Any, **kw: Any) -> str:
    # Only Spanner has FARM_FINGERPRINT: elsewhere the column is a plain one the client fills.
    return ""
