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
  committed batch. ``prune=True`` then deletes the new table's rows that have no row in
  the old one (rows old code deleted after they were copied): for a final pass, once
  nothing writes the old table.
* :func:`compare_tables`: row for row, matched on the key columns both tables share
  (every key part but the shard): rows missing on either side and rows whose shared
  columns differ, counted by Spanner.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from sharded_orm.errors import ShardConfigError
from sharded_orm.load.verify import connect, quote
from sharded_orm.progress import progress
from sharded_orm.read.order import after_condition, at_or_before_condition
from sharded_orm.retry import Deadline, RetryPolicy, retry_call
from sharded_orm.schema.columns import shard_columns, table_of
from sharded_orm.schema.keys import is_descending
from sharded_orm.write.successor import plan

__all__ = [
    "CURSOR_COLUMNS",
    "CopyProgress",
    "CopyResult",
    "compare_tables",
    "copy_table",
    "cursor_table_ddl",
    "prune_target",
]

#: columns of a ``cursor_table`` (all ``STRING(MAX)``, key ``(Source, Target)``)
CURSOR_COLUMNS = ("Source", "Target", "Cursor")


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


def cursor_table_ddl(name: str) -> str:
    """The GoogleSQL ``CREATE TABLE IF NOT EXISTS`` of a ``cursor_table``."""
    s, t, c = (quote(n) for n in CURSOR_COLUMNS)
    return (
        f"CREATE TABLE IF NOT EXISTS {quote(name, 'table')} ({s} STRING(MAX) NOT NULL, "
        f"{t} STRING(MAX) NOT NULL, {c} STRING(MAX)) PRIMARY KEY ({s}, {t})"
    )


def _encode(values: Sequence[Any]) -> str:
    out: list[Any] = []
    for v in values:
        if isinstance(v, dt.datetime):
            out.append(["ts", v.isoformat()])
        elif isinstance(v, bytes):
            out.append(["b", base64.b64encode(v).decode()])
        elif v is None or isinstance(v, (bool, int, float, str)):
            out.append(["v", v])
        else:
            raise ShardConfigError(f"cannot save a key cursor holding {type(v).__name__}")
    return json.dumps(out)


def _decode(text: str) -> list[Any]:
    out: list[Any] = []
    for kind, v in json.loads(text):
        if kind == "ts":
            out.append(dt.datetime.fromisoformat(v))
        elif kind == "b":
            out.append(base64.b64decode(v))
        else:
            out.append(v)
    return out


def _timed(conn: Any, seconds: float) -> Any:
    return conn.execution_options(timeout=seconds)


def _saved_cursor(bind: Any, table: str, src: str, dst: str, seconds: float) -> list[Any] | None:
    t = sa.table(table, *[sa.column(c) for c in CURSOR_COLUMNS])
    stmt = sa.select(t.c.Cursor).where(t.c.Source == src, t.c.Target == dst)
    with connect(bind) as conn:
        text = _timed(conn, seconds).execute(stmt).scalar()
    return None if text is None else _decode(text)


def copy_table(
    bind: Any,
    source: Any,
    target: Any,
    *,
    batch_size: int = 500,
    deadline: float | None = None,
    call_timeout: float = 60.0,
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
    from sharded_orm.spanner.mutations import RawSpanner, database_of

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
    encoders = [
        src.c[n].type.dialect_impl(bind.dialect).bind_processor(bind.dialect) for n in copied
    ]
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

    start = time.monotonic()
    order = [c.desc() if d else c.asc() for c, d in key]
    newest = sa.select(*[c for c, _ in key]).order_by(*[c.asc() if d else c.desc() for c, d in key])
    last = read(newest.limit(1), "reading the last key")
    after = None
    if cursor_table is not None:
        after = _saved_cursor(bind, cursor_table, src.name, dst.name, call_timeout)
    resumed = after is not None
    rows = batches = 0
    raw = RawSpanner(database_of(bind), per_thread=False)
    try:
        with progress(None, f"copy {src.name} -> {dst.name}", mode=progress_mode) as bar:
            while last:
                stmt = sa.select(*read_cols).where(at_or_before_condition(key, last[0]))
                if after is not None:
                    stmt = stmt.where(after_condition(key, after))
                found = read(stmt.order_by(*order).limit(batch_size), f"after {rows} rows")
                if not found:
                    break
                values = []
                for r in found:
                    shard_values = [
                        sc.compute([r[i] for i in idx])
                        for sc, idx in zip(shards, source_at, strict=True)
                    ]
                    mine = r[: len(copied)]
                    cells = [p(v) if p else v for p, v in zip(encoders, mine, strict=True)]
                    values.append(cells + shard_values)
                after = [found[-1][i] for i in key_at]
                also = []
                if cursor_table is not None:  # saved in the batch's own commit
                    also.append((cursor_table, CURSOR_COLUMNS,
                                 [[src.name, dst.name, _encode(after)]]))  # fmt: skip
                retry_call(
                    functools.partial(
                        raw.commit_mutations, dst.name, columns, values, "insert_or_update",
                        also=also,
                    ),
                    policy, what=f"{what} (after {rows} rows)", idempotent=True,
                    resume=resume, deadline=clock,
                )  # fmt: skip
                rows += len(found)
                batches += 1
                bar.advance(len(found))
                if on_batch is not None:
                    on_batch(CopyProgress(rows, batches, tuple(after)))
                if len(found) < batch_size:
                    break
        pruned = prune_target(bind, src, dst, call_timeout=call_timeout) if prune else 0
        if cursor_table is not None:  # a complete walk: the next run walks it all again
            t = sa.table(cursor_table, *[sa.column(c) for c in CURSOR_COLUMNS])
            with connect(bind) as conn, conn.begin():
                _timed(conn, call_timeout).execute(
                    sa.delete(t).where(t.c.Source == src.name, t.c.Target == dst.name)
                )
    finally:
        raw.close()
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


def prune_target(bind: Any, source: Any, target: Any, *, call_timeout: float = 60.0) -> int:
    """Delete the rows of ``target`` whose shared key has no row in ``source``; returns how
    many. Only for a final pass, when nothing writes ``source`` any more."""
    src, dst = table_of(source), table_of(target)
    shared = _shared_key(src, dst)
    key = list(dst.primary_key.columns)
    on = sa.and_(*[src.c[n] == dst.c[n] for n in shared])
    extra = sa.select(*key).where(~sa.exists().where(on)).limit(1000)
    gone = 0
    while True:
        with connect(bind) as conn, conn.begin():
            conn = _timed(conn, call_timeout)
            found = conn.execute(extra).all()
            if found:
                stmt = sa.delete(dst).where(*[c == sa.bindparam(f"k_{c.key}") for c in key])
                conn.execute(stmt, [{f"k_{c.key}": v for c, v in zip(key, r, strict=True)}
                                    for r in found])  # fmt: skip
        gone += len(found)
        if len(found) < 1000:
            return gone


def _same(a: str, b: str, column: sa.Column[Any]) -> str:
    if isinstance(column.type, (sa.JSON, sa.ARRAY)):
        a, b = f"TO_JSON_STRING({a})", f"TO_JSON_STRING({b})"
    return f"({a} = {b} OR ({a} IS NULL AND {b} IS NULL))"


def compare_tables(
    bind: Any, source: Any, target: Any, *, call_timeout: float = 300.0
) -> dict[str, int]:
    """``{"missing_in_target": n, "missing_in_source": m, "different": d}``: rows of one
    table with no row of the same shared key in the other, and rows of both whose shared
    columns differ (all 0: the tables hold the same rows)."""
    src, dst = table_of(source), table_of(target)
    shared = _shared_key(src, dst)
    on = " AND ".join(f"a.{quote(n)} = b.{quote(n)}" for n in shared)
    new_shards = {sc.name for sc in shard_columns(dst)}
    values = [c for c in dst.c if c.name not in new_shards and c.name not in shared]
    differ = " AND ".join(_same(f"a.{quote(c.name)}", f"b.{quote(c.name)}", c) for c in values)
    a_t, b_t = quote(src.name, "table"), quote(dst.name, "table")
    queries = {
        "missing_in_target": f"SELECT COUNT(*) FROM {a_t} a WHERE NOT EXISTS "
        f"(SELECT 1 FROM {b_t} b WHERE {on})",
        "missing_in_source": f"SELECT COUNT(*) FROM {b_t} b WHERE NOT EXISTS "
        f"(SELECT 1 FROM {a_t} a WHERE {on})",
        "different": f"SELECT COUNT(*) FROM {a_t} a JOIN {b_t} b ON {on} "
        f"WHERE NOT ({differ or 'TRUE'})",
    }
    out = {}
    for name, sql in queries.items():
        with connect(bind) as conn:
            out[name] = int(_timed(conn, call_timeout).execute(sa.text(sql)).scalar_one())
    return out
