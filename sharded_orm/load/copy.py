"""Resharding a key: copy a table into one whose key holds a new shard, and compare them.

A shard column in the primary key (``TimestampShardedMixin``'s ``ShardId``) cannot be
backfilled: Spanner cannot change a key. The way is a new table declared with the new
layout (docs/migrations.md, "Resharding a key"), written beside the old one
(``declare_successor``), and:

* :func:`copy_table`: every row of the old table written into the new one, its shard
  columns computed by the new model's spec. One walk of the old key in its stored order
  (DESC parts included) with a key cursor, up to the last key found when it began; each
  batch one ``insert_or_update`` commit (idempotent: run it again after any stop, or to
  pick up rows written since), every read and commit with a timeout, retried under
  :mod:`sharded_orm.retry`. With ``cursor_table`` the cursor is saved in the same commit
  as each batch, so a run stopped anywhere (even by ``kill -9``) resumes after the last
  committed batch (:mod:`sharded_orm.load.copy_cursor`). Each run counts the rows it has to
  copy first (a resumed one: those past its cursor), so its progress lines give the share
  done and the time left. ``prune=True`` then deletes the new table's rows that have no row in
  the old one (rows old code deleted after they were copied): for a final pass, once
  nothing writes the old table.
* :func:`compare_tables`: row for row, matched on the key columns both tables share
  (every key part but the shard): rows missing on either side and rows whose shared
  columns differ, counted by Spanner.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from sharded_orm.errors import ShardConfigError
from sharded_orm.greenlets import refuse_async_bind
from sharded_orm.limits import (
    SPANNER_KEY_BYTES,
    SPANNER_MUTATIONS,
    commit_chunks,
    row_bytes,
    row_mutations,
)
from sharded_orm.load.copy_cursor import (
    CURSOR_COLUMNS,
    column_value,
    cursor_table_ddl,
    read_api_value,
    rows_after,
    saved_cursor,
)
from sharded_orm.load.verify import connect, quote, row_decoder
from sharded_orm.progress import progress
from sharded_orm.retry import DEFAULTS, Deadline, RetryPolicy, retry_call
from sharded_orm.schema.columns import shard_columns, table_of
from sharded_orm.schema.keys import is_descending
from sharded_orm.schema.value_codec import dumps_key
from sharded_orm.spanner.stock import refuse_stock
from sharded_orm.telemetry import operation
from sharded_orm.write.successor import plan

__all__ = [
    "CURSOR_COLUMNS",
    "CopyProgress",
    "CopyResult",
    "column_value",
    "compare_tables",
    "copy_table",
    "cursor_table_ddl",
    "missing_rows_check_sql",
    "prune_target",
    "read_api_value",
]


@dataclass(frozen=True)
class CopyResult:
    source: str
    target: str
    rows: int
    batches: int
    seconds: float
    pruned: int = 0
    resumed: bool = False


@dataclass(frozen=True)
class CopyProgress:
    """Given to ``on_batch`` after each committed batch: totals of this run, and the old
    key of the batch's last row (the cursor a re-run resumes after)."""

    rows: int
    batches: int
    after: tuple[Any, ...]


def _timed(conn: Any, seconds: float) -> Any:
    return conn.execution_options(timeout=seconds)


def _write(
    bind: Any, stmt: Any, params: Any, policy: RetryPolicy, clock: Deadline | None, what: str
) -> None:
    """One DML statement in its own transaction, with a timeout, retried (ABORTED etc.):
    the statements given here are idempotent deletes."""

    def attempt(timeout: float) -> None:
        with connect(bind) as conn, conn.begin():
            _timed(conn, timeout).execute(stmt, params)

    retry_call(attempt, policy, what=what, idempotent=True, deadline=clock)


def copy_table(
    bind: Any,
    source: Any,
    target: Any,
    *,
    batch_size: int = 500,
    deadline: float | None = None,
    call_timeout: float = DEFAULTS["statement"],
    progress_mode: Any = "auto",
    on_batch: Callable[[CopyProgress], None] | None = None,
    cursor_table: str | None = None,
    prune: bool = False,
) -> CopyResult:
    """Copy every row of ``source`` (a model or Table: the old layout) into ``target`` (the
    new model), its shard columns computed; resumable and idempotent (see the module).

    ``on_batch`` is called after each committed batch; ``cursor_table`` (made by
    :func:`cursor_table_ddl`) keeps the cursor between runs; ``deadline`` bounds the whole
    call and ``call_timeout`` each read and commit."""
    refuse_async_bind(bind, "copy_table")
    from sharded_orm.spanner.key_ranges import KeyRangeSession
    from sharded_orm.spanner.mutations import RawSpanner, database_of

    refuse_stock(bind.dialect, "copy_table()")  # its reads' deadlines are our dialect's
    src, dst = table_of(source), table_of(target)
    mp = plan(src, dst)
    copied = [src.c[o].name for o, _ in mp.copied]
    key = [(src.c[c.name], is_descending(c)) for c in src.primary_key.columns]
    read_cols = [src.c[n] for n in copied] + [c for c, _ in key if c.name not in copied]
    at = {c.name: i for i, c in enumerate(read_cols)}
    shards = [sc for sc in mp.shards if not sc.server_side]
    columns = [dst.c[mp.copied[i][1]].name for i in range(len(copied))] + [sc.name for sc in shards]
    source_at = [[at[src.c[k].name] for k in sc.source_keys] for sc in shards]
    key_at = [at[c.name] for c, _ in key]
    decode = row_decoder(read_cols, bind.dialect)  # raw values -> what the shard hashes
    decode_key = row_decoder([c for c, _ in key], bind.dialect)
    policy = RetryPolicy(call_timeout=call_timeout, deadline=deadline)
    clock = Deadline(deadline)
    what = f"copy of {src.name} into {dst.name}"
    resume = f"Run copy_table again: it rewrites what it copied and goes on ({dst.name})."

    def read(stmt: Any, why: str) -> list[Any]:
        def attempt(timeout: float) -> list[Any]:
            with connect(bind) as conn:
                return [list(r) for r in _timed(conn, timeout).execute(stmt)]

        return retry_call(attempt, policy, what=f"{what}: {why}", idempotent=True,
                          resume=resume, deadline=clock)  # fmt: skip

    database = database_of(bind)
    names = [c.name for c in read_cols]
    # what a copied row costs a commit, as Spanner counts it (an insert_or_update may
    # replace a row: each index entry's old one deleted too), and what the cursor adds
    # (row_mutations counts the generated shard columns Spanner writes, note 10)
    per_row = row_mutations(dst, len(columns), replaces=True)
    keys = {c.name: c.key for c in dst.columns}
    sized = row_bytes(dst, [keys[n] for n in columns])  # its bytes, index entries included
    cursor_cells = len(CURSOR_COLUMNS)
    cursor_bytes = 3 * (SPANNER_KEY_BYTES + 8)

    reader = KeyRangeSession(database)  # one session for the copy's reads: closed at the end

    def read_batch(after: list[Any] | None, last: list[Any], timeout: float) -> list[Any]:
        """The next rows after ``after`` up to ``last`` in stored order: the Read API's key
        range seeks there (a SQL keyset condition rescans from the start on the emulator),
        read whole within ``timeout``; after a failure the retry starts a new session."""
        try:
            return list(
                reader.read_range(src.name, names, after, last, batch_size, Deadline.after(timeout))
            )
        except Exception:
            reader.forget()  # a lost session, a dead server: the retry starts afresh
            raise

    start = time.monotonic()
    newest = sa.select(*[c for c, _ in key]).order_by(*[c.asc() if d else c.desc() for c, d in key])
    # the Read API's key range takes keys as it hands them out: BYTES base64-encoded (the
    # dialect decoded them), so a BYTES key part goes back to its wire form
    last = [[read_api_value(v) for v in r] for r in read(newest.limit(1), "reading the last key")]
    after = None
    if cursor_table is not None:
        after = saved_cursor(bind, cursor_table, src.name, dst.name, call_timeout)
    resumed = after is not None
    rows = batches = 0
    raw = RawSpanner(database, per_thread=False)
    try:
        with (
            progress(None, f"copy {src.name} -> {dst.name}", mode=progress_mode) as bar,
            operation("copy", bind, dst.name, source=src.name, resumed=resumed) as traced,
        ):
            # the rows to copy (a resumed copy: those past its cursor), so that each line
            # has a percentage and the time left
            past = None if after is None else decode_key(after)  # as the ORM has them
            bar.set_total(rows_after(bind, src, key, past, min(30.0, call_timeout)))
            while last:
                found = retry_call(
                    functools.partial(read_batch, after, last[0]), policy,
                    what=f"{what}: reading after {rows} rows", idempotent=True,
                    resume=resume, deadline=clock,
                )  # fmt: skip
                if not found:
                    break
                values = []
                for r in found:  # raw values go back as they came; shards from decoded ones
                    d = decode(r)
                    shard_values = [
                        sc.compute([d[i] for i in idx])
                        for sc, idx in zip(shards, source_at, strict=True)
                    ]
                    values.append(r[: len(copied)] + shard_values)
                # one commit per chunk of the batch under Spanner's mutations and bytes a
                # commit (each chunk saving the cursor at its own last row)
                chunks = commit_chunks(
                    [sized(row) for row in values], per_row,
                    fixed=cursor_cells if cursor_table is not None else 0,
                    fixed_bytes=cursor_bytes,
                )  # fmt: skip
                for lo, hi in chunks:
                    after = [found[hi - 1][i] for i in key_at]
                    stood = tuple(column_value(v) for v in after)  # the old key of its last row
                    saved = dumps_key(stood)  # exact and typed: the cursor, and where it stands
                    also = []
                    if cursor_table is not None:  # saved in the chunk's own commit
                        also.append((cursor_table, CURSOR_COLUMNS,
                                     [[src.name, dst.name, saved]]))  # fmt: skip
                    retry_call(
                        functools.partial(
                            raw.commit_mutations, dst.name, columns, values[lo:hi],
                            "insert_or_update", also=also,
                        ),
                        policy, what=f"{what} (after {rows} rows)", idempotent=True,
                        resume=resume, deadline=clock,
                    )  # fmt: skip
                    rows += hi - lo
                    batches += 1
                    bar.advance(hi - lo)
                    traced.progress(rows_done=rows, batches=batches, resume_position=saved)
                    if on_batch is not None:
                        on_batch(CopyProgress(rows, batches, stood))
                if len(found) < batch_size:
                    break
            pruned = prune_target(bind, src, dst, call_timeout=call_timeout) if prune else 0
            traced.set(rows_done=rows, batches=batches, rows_pruned=pruned)
        if cursor_table is not None:  # a complete walk: the next run walks it all again
            t = sa.table(cursor_table, *[sa.column(c) for c in CURSOR_COLUMNS])
            done = sa.delete(t).where(t.c.Source == src.name, t.c.Target == dst.name)
            _write(bind, done, None, policy, clock, f"{what}: clearing its cursor")
    finally:
        raw.close()
        reader.close()
    return CopyResult(src.name, dst.name, rows, batches, time.monotonic() - start, pruned, resumed)


def _shared_key(src: sa.Table, dst: sa.Table) -> list[str]:
    new_shards = {sc.name for sc in shard_columns(dst)}
    shared = [
        c.name
        for c in src.primary_key.columns
        if c.name in dst.c and dst.c[c.name].primary_key and c.name not in new_shards
        and c.name not in {sc.name for sc in shard_columns(src)}
    ]  # fmt: skip
    if not shared:
        raise ShardConfigError(f"{src.name} and {dst.name} share no key column to match on")
    return shared


#: rows per comparison query: the emulator holds an aggregation in 128 MB
ROWS_PER_BUCKET = 25_000


def _bucket_sql(src: sa.Table, shared: Sequence[str], bucket: tuple[int, int]) -> str:
    """`` WHERE <the shared key's hash> mod K = i``: one bucket of K."""
    i, k = bucket
    if k == 1:
        return ""
    parts = [
        f"IFNULL(TO_BASE64({quote(n)}), '')" if isinstance(src.c[n].type, sa.LargeBinary)
        else f"IFNULL(CAST({quote(n)} AS STRING), '')"
        for n in shared
    ]  # fmt: skip
    joined = ", '|', ".join(parts)
    fp = f"FARM_FINGERPRINT(CONCAT({joined}, ''))"
    return f" WHERE MOD(MOD({fp}, {k}) + {k}, {k}) = {i}"


def _buckets(bind: Any, src: sa.Table, buckets: int | None, call_timeout: float) -> int:
    if buckets is not None:
        return max(1, int(buckets))
    if bind.dialect.name == "sqlite":
        return 1  # buckets hash with FARM_FINGERPRINT, a Spanner function
    with connect(bind) as conn:
        n = _timed(conn, call_timeout).execute(sa.select(sa.func.count()).select_from(src))
        return max(1, -(-int(n.scalar_one()) // ROWS_PER_BUCKET))


def _union(
    src: sa.Table, dst: sa.Table, extra: Sequence[str] = (), bucket: tuple[int, int] = (0, 1)
) -> tuple[str, list[str]]:
    """Both tables' rows as one list tagged with their side (1: source, 2: target), by the
    shared key then the shared value columns: grouping it compares the tables in one
    aggregation (an anti-join is a nested loop on the emulator). ``extra`` target columns
    ride along (NULL on the source side); ``bucket`` (i, K) keeps the rows whose shared
    key hashes to i of K, so each query's aggregation stays small."""
    shared = _shared_key(src, dst)
    where = _bucket_sql(src, shared, bucket)
    new_shards = {sc.name for sc in shard_columns(dst)}
    values = [c for c in dst.c if c.name not in new_shards and c.name not in shared]
    cols = [quote(n) for n in shared] + [
        f"TO_JSON_STRING({quote(c.name)})" if isinstance(c.type, (sa.JSON, sa.ARRAY))
        else quote(c.name)
        for c in values
    ]  # fmt: skip
    names = [f"c{i}" for i in range(len(cols))]
    picked = ", ".join(f"{c} AS {n}" for c, n in zip(cols, names, strict=True))
    more_src = "".join(f", NULL AS x{i}" for i in range(len(extra)))
    more_dst = "".join(f", {quote(n)} AS x{i}" for i, n in enumerate(extra))
    sql = (
        f"SELECT {picked}{more_src}, 1 AS side FROM {quote(src.name, 'table')}{where} "
        f"UNION ALL SELECT {picked}{more_dst}, 2 AS side FROM {quote(dst.name, 'table')}{where}"
    )
    return sql, names[: len(shared)] + ["|"] + names[len(shared) :]


def prune_target(
    bind: Any, source: Any, target: Any, *, call_timeout: float = 300.0, buckets: int | None = None
) -> int:
    """Delete the rows of ``target`` whose shared key has no row in ``source``; returns how
    many. Only for a final pass, when nothing writes ``source`` any more. ``buckets``: how
    many queries the comparison is split into (None: one per 25,000 rows)."""
    src, dst = table_of(source), table_of(target)
    policy = RetryPolicy(call_timeout=call_timeout)
    key = list(dst.primary_key.columns)
    shared = _shared_key(src, dst)
    rest = [c.name for c in key if c.name not in shared]
    found: list[list[Any]] = []
    n = _buckets(bind, src, buckets, call_timeout)
    for b in range(n):
        union, names = _union(src, dst, rest, (b, n))
        k = names[: names.index("|")]
        sql = (
            f"SELECT {', '.join(k)}{''.join(f', MAX(x{i})' for i in range(len(rest)))} "
            f"FROM ({union}) GROUP BY {', '.join(k)} HAVING MIN(side) = 2"
        )
        with connect(bind) as conn:
            found += [list(r) for r in _timed(conn, call_timeout).execute(sa.text(sql))]
    order = shared + rest
    stmt = sa.delete(dst).where(*[c == sa.bindparam(f"k_{c.key}") for c in key])
    # a delete costs one mutation and one for each index entry (Spanner's count)
    per = max(1, min(1000, SPANNER_MUTATIONS // (1 + len(dst.indexes))))
    for i in range(0, len(found), per):
        chunk = [dict(zip(order, r, strict=True)) for r in found[i : i + per]]
        params = [{f"k_{c.key}": r[c.name] for c in key} for r in chunk]
        _write(bind, stmt, params, policy, None, f"pruning {dst.name}")
    return len(found)


def missing_rows_check_sql(source: Any, target: Any, message: str) -> str:
    """A GoogleSQL query that fails with ``message`` while a row of ``source`` has no row
    in ``target`` (for offline scripts: it stops a script applied without the copy)."""
    src, dst = table_of(source), table_of(target)
    on = " AND ".join(f"a.{quote(n)} = b.{quote(n)}" for n in _shared_key(src, dst))
    text = "'" + message.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return (
        f"SELECT IF(COUNT(*) = 0, 0, ERROR({text})) FROM {quote(src.name, 'table')} a "
        f"WHERE NOT EXISTS (SELECT 1 FROM {quote(dst.name, 'table')} b WHERE {on})"
    )


def _count_if(condition: str) -> str:
    """COUNTIF in SQL that Spanner and SQLite both run (SQLite has no COUNTIF)."""
    return f"SUM(CASE WHEN {condition} THEN 1 ELSE 0 END)"


def compare_tables(
    bind: Any,
    source: Any,
    target: Any,
    *,
    call_timeout: float = 300.0,
    buckets: int | None = None,
) -> dict[str, int]:
    """``{"missing_in_target": n, "missing_in_source": m, "different": d}``: rows of one
    table with no row of the same shared key in the other, and rows of both whose shared
    columns differ (all 0: the tables hold the same rows). ``buckets`` queries (None: one
    per 25,000 source rows), each scanning both tables for its share of the keys. Runs on
    Spanner, and on SQLite in one bucket (JSON and ARRAY columns aside)."""
    src, dst = table_of(source), table_of(target)
    out = {"missing_in_target": 0, "missing_in_source": 0, "different": 0}
    n = _buckets(bind, src, buckets, call_timeout)
    for b in range(n):
        union, names = _union(src, dst, (), (b, n))
        k = names[: names.index("|")]
        everything = ", ".join(x for x in names if x != "|")
        sql = (
            f"SELECT {_count_if('n = 1 AND side = 1')}, {_count_if('n = 1 AND side = 2')}, "
            f"{_count_if('n > 1')} "
            f"FROM (SELECT COUNT(*) AS n, MIN(side) AS side FROM (SELECT {', '.join(k)}, "
            f"MIN(side) AS side FROM ({union}) GROUP BY {everything} HAVING COUNT(*) = 1) "
            f"GROUP BY {', '.join(k)})"
        )
        with connect(bind) as conn:
            row = _timed(conn, call_timeout).execute(sa.text(sql)).one()
        for name, v in zip(out, row, strict=True):
            out[name] += int(v or 0)
    return out
