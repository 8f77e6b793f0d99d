"""Resharding a key: copy a table into one whose key holds a new shard, and compare them.

A shard column in the primary key (``TimestampShardedMixin``'s ``ShardId``) cannot be
backfilled: Spanner cannot change a key. The way is a new table declared with the new
layout (docs/migrations.md, "Resharding a key"), and:

* :func:`copy_table`: every row of the old table written into the new one, its shard
  columns computed by the new model's spec. One walk of the old key in its stored order
  (DESC parts included) with a key cursor, up to the last key found when it began; each
  batch one ``insert_or_update`` commit (idempotent: run it again after any stop, or to
  pick up rows written since), with a timeout per RPC under :mod:`sharded_orm.retry`.
* :func:`compare_tables`: the rows of each table missing from the other, matched on
  the key columns both tables share (every key part but the shard), counted by Spanner.
"""

from __future__ import annotations

import functools
import time
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

__all__ = ["CopyResult", "compare_tables", "copy_table"]


@dataclass(frozen=True)
class CopyResult:
    source: str
    target: str
    rows: int
    batches: int
    seconds: float


def _plan(source: sa.Table, target: sa.Table) -> tuple[list[str], list[Any]]:
    shards = {sc.name: sc for sc in shard_columns(target)}
    missing = [c.name for c in target.c if c.name not in shards and c.name not in source.c]
    if missing:
        raise ShardConfigError(
            f"{target.name} has columns {missing} that {source.name} lacks: copy_table copies "
            "the columns both tables have and computes the new shard columns"
        )
    copied = [c.name for c in target.c if c.name not in shards]
    return copied, list(shards.values())


def copy_table(
    bind: Any,
    source: Any,
    target: Any,
    *,
    batch_size: int = 500,
    deadline: float | None = None,
    call_timeout: float = 60.0,
    progress_mode: Any = "auto",
) -> CopyResult:
    """Copy every row of ``source`` (a model or Table: the old layout) into ``target`` (the
    new model), its shard columns computed; resumable and idempotent (see the module)."""
    from sharded_orm.spanner.mutations import RawSpanner, database_of

    src, dst = table_of(source), table_of(target)
    copied, shards = _plan(src, dst)
    key = [(src.c[c.name], is_descending(c)) for c in src.primary_key.columns]
    # the old key's own shard is read for the cursor only
    read_cols = [src.c[n] for n in copied] + [c for c, _ in key if c.name not in copied]
    columns = copied + [sc.name for sc in shards]
    at = {c.name: i for i, c in enumerate(read_cols)}
    source_at = [[at[c.name] for c in sc.sources] for sc in shards]
    key_at = [at[c.name] for c, _ in key]
    encoders = [
        src.c[n].type.dialect_impl(bind.dialect).bind_processor(bind.dialect) for n in copied
    ]
    policy = RetryPolicy(call_timeout=call_timeout, deadline=deadline)
    clock = Deadline(deadline)
    raw = RawSpanner(database_of(bind), per_thread=False)
    what = f"copy of {src.name} into {dst.name}"
    resume = f"Run copy_table again: it rewrites what it copied and goes on ({dst.name})."
    start = time.monotonic()
    order = [c.desc() if d else c.asc() for c, d in key]
    with connect(bind) as conn:
        last = conn.execute(
            sa.select(*[c for c, _ in key])
            .order_by(*[c.asc() if d else c.desc() for c, d in key])
            .limit(1)
        ).first()
    rows = batches = 0
    after: list[Any] | None = None
    try:
        with progress(None, f"copy {src.name} -> {dst.name}", mode=progress_mode) as bar:
            while last is not None:
                stmt = sa.select(*read_cols).where(at_or_before_condition(key, list(last)))
                if after is not None:
                    stmt = stmt.where(after_condition(key, after))
                with connect(bind) as conn:
                    found = [list(r) for r in conn.execute(stmt.order_by(*order).limit(batch_size))]
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
                retry_call(
                    functools.partial(
                        raw.commit_mutations, dst.name, columns, values, "insert_or_update"
                    ),
                    policy, what=f"{what} (after {rows} rows)", idempotent=True,
                    resume=resume, deadline=clock,
                )  # fmt: skip
                rows += len(found)
                batches += 1
                bar.advance(len(found))
                after = [found[-1][i] for i in key_at]
                if len(found) < batch_size:
                    break
    finally:
        raw.close()
    return CopyResult(src.name, dst.name, rows, batches, time.monotonic() - start)


def compare_tables(bind: Any, source: Any, target: Any) -> dict[str, int]:
    """``{"missing_in_target": n, "missing_in_source": m}``: rows of one table with no row
    of the same shared key in the other (0 and 0: the copy is complete)."""
    src, dst = table_of(source), table_of(target)
    shared = [
        c.name
        for c in src.primary_key.columns
        if c.name in dst.c and dst.c[c.name].primary_key
        and c.name not in {sc.name for sc in shard_columns(src)}
    ]  # fmt: skip
    if not shared:
        raise ShardConfigError(f"{src.name} and {dst.name} share no key column to match on")
    on = " AND ".join(f"a.{quote(n)} = b.{quote(n)}" for n in shared)
    out = {}
    for name, a, b in (("missing_in_target", src, dst), ("missing_in_source", dst, src)):
        sql = (
            f"SELECT COUNT(*) FROM {quote(a.name, 'table')} a WHERE NOT EXISTS "
            f"(SELECT 1 FROM {quote(b.name, 'table')} b WHERE {on})"
        )
        with connect(bind) as conn:
            out[name] = int(conn.execute(sa.text(sql)).scalar_one())
    return out
