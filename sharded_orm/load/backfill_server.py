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
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import types as sqltypes

from sharded_orm.checks import check_identifier, check_positive_int, check_seconds
from sharded_orm.errors import ShardConfigError, UnsupportedOnDialectError
from sharded_orm.greenlets import refuse_async_bind
from sharded_orm.hashing import FARM_FINGERPRINT, validate_algorithm
from sharded_orm.load.verify import connect, mismatch_sql, quote
from sharded_orm.progress import progress
from sharded_orm.retry import Deadline, RetryPolicy, retry_call
from sharded_orm.schema.columns import get_shard_column, table_of
from sharded_orm.spanner import is_spanner
from sharded_orm.spanner.expressions import shard_sql
from sharded_orm.spanner.pdml import SpannerCalls

__all__ = ["ServerBackfillResult", "backfill_server_side", "backfill_sql"]

T = TypeVar("T")

_log = logging.getLogger("sharded_orm.backfill")

#: Rows per statement on the emulator (see ``backfill_server_side``): 1,000 rows take ~1 s
#: there, 4,000 rows ~35 s.
EMULATOR_ROWS_PER_STATEMENT = 1000

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
    return _update(table, column, sources, count, fix_stale)[0]


def _update(
    table: str, column: str, sources: Sequence[sa.Column[Any]], count: int, fix_stale: bool
) -> tuple[str, str]:
    """``backfill_sql``'s statement and its WHERE condition (which selects the key ranges)."""
    expr = shard_sql(sources, count, quote)
    col = quote(column)
    where = f"({col} IS NULL OR {col} != {expr})" if fix_stale else f"{col} IS NULL"
    return f"UPDATE {quote(table, 'table name')} SET {col} = {expr} WHERE {where}", where


def _key_names(calls: SpannerCalls, table: Any, name: str, timeout: float) -> list[str]:
    """The primary key's column names, from the model or from INFORMATION_SCHEMA."""
    if not isinstance(table, str):
        return [c.name for c in table_of(table).primary_key.columns]
    sql = (
        "SELECT COLUMN_NAME FROM INFORMATION_SCHEMA.INDEX_COLUMNS WHERE TABLE_SCHEMA = '' "
        "AND TABLE_NAME = @t AND INDEX_TYPE = 'PRIMARY_KEY' ORDER BY ORDINAL_POSITION"
    )
    return [str(r[0]) for r in calls.query(sql, timeout, {"t": name})]


def _bound(keys: Sequence[str], at: Sequence[Any], op: str, tag: str) -> tuple[str, dict[str, Any]]:
    """Lexicographic ``(keys) op (at)`` for op ``>=`` or ``<``, as GoogleSQL and params."""
    strict = ">" if op == ">=" else "<"
    params = {f"{tag}{i}": v for i, v in enumerate(at)}
    terms = []
    for i in range(len(keys)):
        eq = [f"{quote(keys[j])} = @{tag}{j}" for j in range(i)]
        last = op if i == len(keys) - 1 else strict
        terms.append("(" + " AND ".join([*eq, f"{quote(keys[i])} {last} @{tag}{i}"]) + ")")
    return "(" + " OR ".join(terms) + ")", params


def key_ranges(
    next_row: Callable[[str, dict[str, Any], int], list[Any] | None],
    table: str, keys: Sequence[str], where: str, rows_per_statement: int,
) -> Iterator[tuple[str, dict[str, Any]]]:  # fmt: skip
    """Key-range predicates (with params) of ``rows_per_statement`` rows matching ``where``
    each, found one at a time as the caller asks for the next: together they cover the
    whole key space. ``next_row(sql, params, offset)`` runs the query for the key of the
    row after the current range's (``None``: the range runs to the end). Nothing but the
    current cut is held in memory, and each cut counts from the previous one, so rows the
    previous statement filled (no longer matching) do not shift it."""
    order = ", ".join(quote(k) for k in keys)
    lo: list[Any] | None = None
    while True:
        pred, params = _bound(keys, lo, ">=", "lo") if lo is not None else ("TRUE", {})
        sql = (
            f"SELECT {order} FROM {quote(table, 'table name')} WHERE {where} AND {pred} "
            f"ORDER BY {order} LIMIT 1 OFFSET @offset"
        )
        hi = next_row(sql, params, rows_per_statement)
        if hi is None:
            yield pred, params
            return
        upper, up = _bound(keys, hi, "<", "hi")
        yield (upper if lo is None else f"{pred} AND {upper}"), {**params, **up}
        lo = hi


def _reflected_sources(bind: Any, table: str, names: Sequence[str]) -> list[sa.Column[Any]]:
    """Source columns with their types read from INFORMATION_SCHEMA (no model needed)."""
    sql = sa.text(
        "SELECT COLUMN_NAME, SPANNER_TYPE FROM INFORMATION_SCHEMA.COLUMNS "
        "WHERE TABLE_SCHEMA = '' AND TABLE_NAME = :t"
    )
    with connect(bind) as conn:
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
    if algorithm != FARM_FINGERPRINT:  # crc32, crc32_concat
        raise ShardConfigError(
            f"{table}.{column} hashes with {algorithm}, and Spanner has no CRC32 function, so it "
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
) -> tuple[str, list[sa.Column[Any]], int]:
    """The table name, source columns and count to backfill; refuses a crc32 column."""
    if isinstance(table, str):
        if sources is None or count is None:
            raise ShardConfigError(
                f"backfilling {table}.{column_name} by table name needs sources=[...] and "
                "count=N (or pass the model or Table that declares the shard column)"
            )
        algo = validate_algorithm(algorithm or FARM_FINGERPRINT)
        _refuse_crc32(table, column_name, algo)
        cols = _reflected_sources(bind, check_identifier(table, "table name"), list(sources))
        return table, cols, check_positive_int(count, "count")
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
    return t.name, list(sc.sources), sc.count


def backfill_server_side(
    bind: Any,
    table: Any,
    column_name: str,
    *,
    sources: Sequence[str] | None = None,
    count: int | None = None,
    algorithm: str | None = None,
    fix_stale: bool = False,
    rows_per_statement: int | None = None,
    verify: bool = True,
    progress_mode: Any = "auto",
    deadline: float | None = None,
    statement_timeout: float = 3600.0,
) -> ServerBackfillResult:
    """Fill ``table.column_name`` with its shard by one Partitioned DML statement.

    ``table`` is a mapped class or ``Table`` declaring the shard column, or a table name
    with ``sources`` (column names, hashing order) and ``count`` (and ``algorithm``,
    default farm_fingerprint), as a migration knows them. ``bind`` is a Spanner Engine or
    Connection. ``fix_stale=True`` also rewrites rows whose value disagrees (one statement
    still). ``rows_per_statement`` splits the work into statements over key ranges of that
    many rows (None: one statement on Spanner, which partitions it itself; on the emulator,
    which runs DML as one transaction that slows down with the square of its size,
    ``EMULATOR_ROWS_PER_STATEMENT``). ``verify=False`` skips the closing count. Every
    RPC is bounded by ``statement_timeout`` (one Partitioned DML over a large table takes
    long: the default is an hour) and the whole run by ``deadline`` seconds (None: no
    overall limit); a statement that fails transiently is retried (it is idempotent).
    Safe to rerun. Raises ``ShardConfigError`` for a crc32 column,
    ``UnsupportedOnDialectError`` off Spanner, ``sharded_orm.retry.RetryError`` (saying
    how to resume) when the server fails or goes silent past the deadline.
    """
    refuse_async_bind(bind, "backfill_server_side")
    if not is_spanner(bind):
        raise UnsupportedOnDialectError(
            "a server-side backfill runs Partitioned DML, which only Spanner has; on "
            f"{getattr(getattr(bind, 'dialect', None), 'name', bind)!r} use the client path "
            "(op.backfill_shard(..., server_side=False))"
        )
    name, cols, n = _target(bind, table, column_name, sources, count, algorithm)
    from sharded_orm.spanner.mutations import database_of

    start = time.monotonic()
    if deadline is not None:
        check_seconds(deadline, "deadline")
    check_seconds(statement_timeout, "statement_timeout")
    if rows_per_statement is None and os.environ.get("SPANNER_EMULATOR_HOST"):
        rows_per_statement = EMULATOR_ROWS_PER_STATEMENT
    if rows_per_statement is not None:
        check_positive_int(rows_per_statement, "rows_per_statement")
    calls = SpannerCalls(database_of(bind))
    try:
        return _run(
            calls, table, name, column_name, cols, n, fix_stale, rows_per_statement, verify,
            progress_mode, Deadline(deadline), statement_timeout, start,
        )  # fmt: skip
    finally:
        calls.close()


def _run(
    calls: SpannerCalls, table: Any, name: str, column_name: str, cols: list[sa.Column[Any]],
    n: int, fix_stale: bool, rows_per_statement: int | None, verify: bool, progress_mode: Any,
    clock: Deadline, statement_timeout: float, start: float,
) -> ServerBackfillResult:  # fmt: skip
    policy = RetryPolicy(deadline=None, call_timeout=statement_timeout)
    what = f"backfill {name}.{column_name} (partitioned DML)"
    updated = 0
    resume = (
        f"Rows updated so far stay filled ({{updated}} by this run): run the backfill again "
        f"(alembic upgrade head, or sharded-orm backfill <url> {name} {column_name} ...); "
        "it touches only the rows still to fill."
    )

    def call(fn: Callable[[float], T], step: str) -> T:
        return retry_call(
            fn, policy, what=f"{what}: {step}", idempotent=True,
            resume=resume.format(updated=updated), deadline=clock,
        )  # fmt: skip

    col = quote(column_name)
    sql, where = _update(name, column_name, cols, n, fix_stale)
    count_sql = f"SELECT COUNT(*) FROM {quote(name, 'table name')} WHERE {col} IS NULL"
    missing = int(call(lambda t: calls.query(count_sql, t), "count NULL rows")[0][0])
    rpcs = 1
    ranges: Iterator[tuple[str, dict[str, Any]]] = iter([("TRUE", {})])
    if rows_per_statement is not None:
        keys = call(lambda t: _key_names(calls, table, name, t), "read the key")

        def next_row(q: str, params: dict[str, Any], offset: int) -> list[Any] | None:
            nonlocal rpcs
            rpcs += 1
            found = call(
                lambda t: calls.query(q, t, {**params, "offset": offset}),
                f"find the next key range after {updated} rows",
            )  # fmt: skip
            return found[0] if found else None

        ranges = key_ranges(next_row, name, keys, where, rows_per_statement)
    _log.info(
        "backfill %s.%s: Partitioned DML over %s NULL rows (%s rows per statement)",
        name, column_name, missing, rows_per_statement or "all",
    )  # fmt: skip
    statements = 0
    with progress(missing, what, mode=progress_mode) as bar:
        for pred, params in ranges:
            stmt = sql if pred == "TRUE" else f"{sql} AND {pred}"
            done = call(
                lambda t, s=stmt, p=params: calls.partitioned_update(s, t, p),  # type: ignore[misc]
                f"statement {statements + 1}",
            )  # fmt: skip
            statements += 1
            rpcs += 1
            updated += done
            bar.advance(done)
    mismatched = None
    if verify:
        check = (
            f"SELECT COUNTIF({mismatch_sql(column_name, cols, n)}) FROM {quote(name, 'table name')}"
        )
        mismatched = int(call(lambda t: calls.query(check, t), "count mismatches")[0][0] or 0)
        rpcs += 1
        if mismatched:
            _log.warning(
                "backfill %s.%s: %s rows still disagree with their sources after the backfill",
                name, column_name, mismatched,
            )  # fmt: skip
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
