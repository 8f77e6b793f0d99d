"""Reshard backfills inside Spanner: one Partitioned DML ``UPDATE``.

When the new shard column hashes with ``farm_fingerprint``, Spanner can compute it
itself, so instead of reading and rewriting rows in client batches the backfill is::

    UPDATE t SET new = <the generated column's expression> WHERE new IS NULL

run as Partitioned DML: Spanner runs it on every split in parallel, inside the database,
outside the 80,000-mutation limit of a transaction. It is idempotent and resumable by
construction: a rerun (after a crash, a timeout, or with writers that still leave the
column NULL) only touches the rows still NULL. Afterwards one server-side count of rows
whose stored shard differs from the expression says whether every row is findable.

A crc32 column is refused: Spanner has no CRC32 function, so only the client can compute
it (``op.backfill_shard``'s client path, or ``sharded_orm.beam.Backfill`` at scale).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import types as sqltypes

from sharded_orm.checks import check_identifier, check_positive_int
from sharded_orm.errors import ShardConfigError, UnsupportedOnDialectError
from sharded_orm.hashing import CRC32, FARM_FINGERPRINT, validate_algorithm
from sharded_orm.load.verify import mismatch_sql, quote
from sharded_orm.progress import progress
from sharded_orm.schema.columns import get_shard_column, table_of
from sharded_orm.spanner import is_spanner
from sharded_orm.spanner.expressions import shard_sql

__all__ = ["ServerBackfillResult", "backfill_server_side", "backfill_sql"]

_log = logging.getLogger("sharded_orm.backfill")

#: Spanner column types (INFORMATION_SCHEMA.COLUMNS.SPANNER_TYPE prefixes) as SQLAlchemy
#: types, for sources named by a migration that has no model at hand.
_SPANNER_TYPES: tuple[tuple[str, sqltypes.TypeEngine[Any]], ...] = (
    ("STRING", sqltypes.String()),
    ("INT64", sqltypes.BigInteger()),
    ("BOOL", sqltypes.Boolean()),
    ("NUMERIC", sqltypes.Numeric()),
    ("DATE", sqltypes.Date()),
    ("TIMESTAMP", sqltypes.DateTime(timezone=True)),
    ("BYTES", sqltypes.LargeBinary()),
)


@dataclass(frozen=True)
class ServerBackfillResult:
    """What one server-side backfill did.

    ``rows_updated`` is Spanner's count for the Partitioned DML (a lower bound, as Spanner
    documents); ``mismatched`` the rows whose shard still disagrees with its sources
    afterwards (NULL counts), or None when ``verify=False``; ``rpcs`` the statements sent.
    """

    table: str
    column: str
    sql: str
    rows_updated: int
    rows_missing_before: int | None
    mismatched: int | None
    rpcs: int
    seconds: float
    path: str = "partitioned-dml"


def backfill_sql(
    table: str,
    column: str,
    sources: Sequence[sa.Column[Any]],
    count: int,
    *,
    fix_stale: bool = False,
) -> str:
    """The idempotent ``UPDATE ... SET column = <expression> WHERE column IS NULL``.

    ``fix_stale=True`` also rewrites rows whose value differs from the expression (rows a
    writer unaware of the new column changed after they were filled).
    """
    expr = shard_sql(sources, count, quote)
    where = f"{quote(column)} IS NULL"
    if fix_stale:
        where += f" OR {quote(column)} != {expr}"
    return f"UPDATE {quote(table, 'table name')} SET {quote(column)} = {expr} WHERE {where}"


def _reflected_sources(bind: Any, table: str, names: Sequence[str]) -> list[sa.Column[Any]]:
    """Source columns with their types read from INFORMATION_SCHEMA (no model needed)."""
    sql = sa.text(
        "SELECT COLUMN_NAME, SPANNER_TYPE FROM INFORMATION_SCHEMA.COLUMNS "
        "WHERE TABLE_SCHEMA = '' AND TABLE_NAME = :t"
    )
    with bind.connect() as conn:
        found = {name: str(type_) for name, type_ in conn.execute(sql, {"t": table})}
    if not found:
        raise ShardConfigError(f"table {table!r} does not exist in this database")
    out = []
    for name in names:
        spanner_type = found.get(name)
        if spanner_type is None:
            raise ShardConfigError(
                f"shard source {name!r} is not a column of {table!r} "
                f"(columns: {', '.join(sorted(found))})"
            )
        for prefix, type_ in _SPANNER_TYPES:
            if spanner_type.upper().startswith(prefix):
                out.append(sa.Column(name, type_))
                break
        else:
            raise ShardConfigError(
                f"shard source {name!r} of {table!r} has type {spanner_type}, which has no "
                "canonical text for hashing"
            )
    return out


def _refuse_crc32(table: str, column: str, algorithm: str) -> None:
    if algorithm == CRC32:
        raise ShardConfigError(
            f"{table}.{column} hashes with crc32, and Spanner has no CRC32 function, so it "
            "cannot be backfilled server-side; use the client path (op.backfill_shard(..., "
            "server_side=False)) or, at scale, sharded_orm.beam.Backfill; or declare the new "
            "column with algorithm='farm_fingerprint'"
        )


def _target(
    bind: Any,
    table: Any,
    column_name: str,
    sources: Sequence[str] | None,
    count: int | None,
    algorithm: str | None,
) -> tuple[str, list[sa.Column[Any]], int, str]:
    if isinstance(table, str):
        if sources is None or count is None:
            raise ShardConfigError(
                f"backfilling {table}.{column_name} by table name needs sources=[...] and "
                "count=N (or pass the model or Table that declares the shard column)"
            )
        algo = validate_algorithm(algorithm or FARM_FINGERPRINT)
        _refuse_crc32(table, column_name, algo)
        cols = _reflected_sources(bind, check_identifier(table, "table name"), list(sources))
        return table, cols, check_positive_int(count, "count"), algo
    t = table_of(table)
    sc = get_shard_column(t, column_name)
    if sources is not None and tuple(sources) not in (sc.source_keys, sc.spec.sources):
        raise ShardConfigError(
            f"sources {list(sources)} disagree with the model's {list(sc.spec.sources)} "
            f"for {t.name}.{sc.name}"
        )
    if count is not None and count != sc.count:
        raise ShardConfigError(f"count={count} disagrees with the model's count={sc.count}")
    _refuse_crc32(t.name, sc.name, sc.algorithm)
    return t.name, list(sc.sources), sc.count, sc.algorithm


def backfill_server_side(
    bind: Any,
    table: Any,
    column_name: str,
    *,
    sources: Sequence[str] | None = None,
    count: int | None = None,
    algorithm: str | None = None,
    fix_stale: bool = False,
    verify: bool = True,
    progress_mode: Any = "auto",
) -> ServerBackfillResult:
    """Fill ``table.column_name`` with its shard by one Partitioned DML statement.

    ``table`` is a mapped class or ``Table`` declaring the shard column, or a table name
    with ``sources`` (column names, hashing order) and ``count`` (and ``algorithm``,
    default farm_fingerprint), as a migration knows them. ``bind`` is a Spanner Engine or
    Connection. ``fix_stale=True`` also rewrites rows whose value disagrees (one statement
    still). ``verify=False`` skips the closing count. Safe to rerun. Raises
    ``ShardConfigError`` for a crc32 column and ``UnsupportedOnDialectError`` off Spanner.
    """
    if not is_spanner(bind):
        raise UnsupportedOnDialectError(
            "a server-side backfill runs Partitioned DML, which only Spanner has; on "
            f"{getattr(getattr(bind, 'dialect', None), 'name', bind)!r} use the client path "
            "(op.backfill_shard(..., server_side=False))"
        )
    name, cols, n, algo = _target(bind, table, column_name, sources, count, algorithm)
    _refuse_crc32(name, column_name, algo)
    from sharded_orm.spanner.mutations import database_of

    start = time.monotonic()
    col = quote(column_name)
    sql = backfill_sql(name, column_name, cols, n, fix_stale=fix_stale)
    with bind.connect() as conn:
        missing = int(
            conn.exec_driver_sql(
                f"SELECT COUNT(*) FROM {quote(name, 'table name')} WHERE {col} IS NULL"
            ).scalar_one()
        )
    rpcs = 1
    _log.info("backfill %s.%s: Partitioned DML over %s NULL rows", name, column_name, missing)
    with progress(
        missing, f"backfill {name}.{column_name} (partitioned DML)", mode=progress_mode
    ) as bar:
        updated = int(database_of(bind).execute_partitioned_dml(sql))
        rpcs += 1
        bar.advance(updated)
    mismatched = None
    if verify:
        check = (
            f"SELECT COUNTIF({mismatch_sql(column_name, cols, n)}) FROM {quote(name, 'table name')}"
        )
        with bind.connect() as conn:
            mismatched = int(conn.exec_driver_sql(check).scalar_one() or 0)
        rpcs += 1
        if mismatched:
            _log.warning(
                "backfill %s.%s: %s rows still disagree with their sources after the backfill",
                name,
                column_name,
                mismatched,
            )
    return ServerBackfillResult(
        table=name,
        column=column_name,
        sql=sql,
        rows_updated=updated,
        rows_missing_before=missing,
        mismatched=mismatched,
        rpcs=rpcs,
        seconds=time.monotonic() - start,
    )
