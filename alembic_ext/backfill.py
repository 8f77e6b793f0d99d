"""Filling a new shard column on a table that already has rows: batched, resumable.

A shard column added to a populated table starts NULL. :func:`backfill_shard` fills it:

* **resumable and idempotent**: it only ever touches rows whose column is still NULL,
  one batch per transaction, in key order. Stopped at any point (crash, Ctrl-C, a
  failed batch), running it again carries on where it stopped; run on a complete
  column it finds nothing to do and says so.
* **partitioned DML** when Spanner can compute the value itself (``farm_fingerprint``):
  one ``UPDATE ... SET col = MOD(FARM_FINGERPRINT(...)) WHERE col IS NULL`` that Spanner
  runs partition by partition, without a client round trip per row. ``crc32`` has no
  GoogleSQL twin, so it is computed here and written in client batches: on Spanner one
  read-write transaction per batch reading the next NULL rows and writing them back as
  one UPDATE mutation; elsewhere a keyed executemany UPDATE.
* **progress**: a callback gets a :class:`BackfillProgress` after each batch; the default
  prints a one-line bar to stderr.

The old shard column stays authoritative while this runs: rows are found through it
until the migration's contract step drops it (see docs/migrations.md).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from sharded_orm.errors import ShardConfigError
from sharded_orm.hashing import FARM_FINGERPRINT, shard_function, validate_algorithm
from sharded_orm.spanner import is_spanner


@dataclass(frozen=True)
class BackfillProgress:
    """Where a backfill stands after a batch."""

    table: str
    column: str
    done: int  # rows filled by this run so far
    total: int  # rows that were NULL when this run started
    batches: int
    elapsed: float


@dataclass(frozen=True)
class BackfillResult:
    """What a backfill run did."""

    table: str
    column: str
    rows: int  # rows filled by this run (0: the column was already complete)
    batches: int
    method: str  # "partitioned_dml", "mutations" (Spanner), "client_batches" or "nothing_to_do"
    elapsed: float


ProgressCallback = Callable[[BackfillProgress], None]


def print_progress(p: BackfillProgress) -> None:
    """The default progress display: a bar on stderr, redrawn in place."""
    width = 30
    frac = p.done / p.total if p.total else 1.0
    bar = "#" * int(frac * width)
    end = "\n" if p.done >= p.total else ""
    sys.stderr.write(
        f"\rbackfill {p.table}.{p.column} [{bar:<{width}}] {p.done}/{p.total} "
        f"({p.batches} batches, {p.elapsed:.1f}s){end}"
    )
    sys.stderr.flush()


def _reflect(conn: Connection, table: str) -> sa.Table:
    return sa.Table(table, sa.MetaData(), autoload_with=conn)


def backfill_shard(
    bind: Engine | Connection,
    table: str,
    column: str,
    *,
    sources: Sequence[str],
    count: int,
    algorithm: str = "crc32",
    batch_size: int = 500,
    progress: ProgressCallback | bool = True,
    partitioned_dml: bool | None = None,
) -> BackfillResult:
    """Fill ``table.column`` with ``compute_shard(sources, count, algorithm)`` where NULL.

    ``bind``: an Engine, or a Connection whose engine is used: each batch runs in its
    own transaction on its own connection, so a stop loses at most one batch.
    ``sources`` are SQL column names in hashing order. ``partitioned_dml=None`` uses it
    on Spanner for ``farm_fingerprint`` and client batches otherwise.
    """
    validate_algorithm(algorithm)
    fn = shard_function(count, algorithm)
    if batch_size < 1:
        raise ShardConfigError(f"batch_size must be at least 1, got {batch_size}")
    engine = bind.engine if isinstance(bind, Connection) else bind
    report: ProgressCallback | None
    report = print_progress if progress is True else (progress or None)
    start = time.monotonic()
    with engine.connect() as conn:
        t = _reflect(conn, table)
        if column not in t.c:
            raise ShardConfigError(
                f"{table}.{column} does not exist: add the column before backfilling it"
            )
        missing = [s for s in sources if s not in t.c]
        if missing:
            raise ShardConfigError(f"shard sources {missing} are not columns of {table}")
        target = t.c[column]
        total = conn.execute(sa.select(sa.func.count()).where(target.is_(None))).scalar_one()
        conn.rollback()
    if total == 0:
        if report is not None:
            report(BackfillProgress(table, column, 0, 0, 0, time.monotonic() - start))
        return BackfillResult(table, column, 0, 0, "nothing_to_do", time.monotonic() - start)

    use_pdml = partitioned_dml
    if use_pdml is None:
        use_pdml = is_spanner(engine) and algorithm == FARM_FINGERPRINT
    if use_pdml:
        if algorithm != FARM_FINGERPRINT or not is_spanner(engine):
            raise ShardConfigError(
                "partitioned DML backfill needs Spanner and algorithm='farm_fingerprint': "
                "Spanner has no CRC32 function, so crc32 shards are computed by the client"
            )
        return _partitioned(engine, t, target, sources, count, total, report, start)
    if is_spanner(engine):
        return _mutation_batches(engine, t, target, sources, fn, batch_size, total, report, start)
    return _batches(engine, t, target, sources, fn, batch_size, total, report, start)


def _mutation_batches(
    engine: Engine,
    t: sa.Table,
    target: sa.Column[Any],
    sources: Sequence[str],
    fn: Callable[[Sequence[object]], int],
    batch_size: int,
    total: int,
    report: ProgressCallback | None,
    start: float,
) -> BackfillResult:
    """Spanner: each batch is one read-write transaction that reads the next NULL rows
    and writes them back as one UPDATE mutation (a batch of row UPDATE statements costs
    a round of DML per row on the server; a mutation is one write)."""
    q = engine.dialect.identifier_preparer.quote
    key = [c.name for c in t.primary_key.columns]
    if not key:
        raise ShardConfigError(f"table {t.name!r} has no primary key: cannot backfill by key")
    cols = ", ".join(q(c) for c in [*key, *sources])
    sql = (
        f"SELECT {cols} FROM {q(t.name)} WHERE {q(target.name)} IS NULL "
        f"ORDER BY {', '.join(q(k) for k in key)} LIMIT {int(batch_size)}"
    )
    nkey = len(key)

    def one_batch(txn: Any) -> int:
        rows = [list(r) for r in txn.execute_sql(sql)]
        if rows:
            values = [[*r[:nkey], fn(r[nkey:])] for r in rows]
            txn.update(table=t.name, columns=[*key, target.name], values=values)
        return len(rows)

    with engine.connect() as conn:
        database: Any = conn.connection.dbapi_connection.database  # type: ignore[union-attr]
    done = batches = 0
    while True:
        n = database.run_in_transaction(one_batch)
        if not n:
            break
        done += n
        batches += 1
        if report is not None:
            report(
                BackfillProgress(
                    t.name, target.name, done, max(total, done), batches,
                    time.monotonic() - start,
                )
            )  # fmt: skip
    elapsed = time.monotonic() - start
    return BackfillResult(t.name, target.name, done, batches, "mutations", elapsed)


def _partitioned(
    engine: Engine,
    t: sa.Table,
    target: sa.Column[Any],
    sources: Sequence[str],
    count: int,
    total: int,
    report: ProgressCallback | None,
    start: float,
) -> BackfillResult:
    from sharded_orm.spanner.expressions import shard_sql

    q = engine.dialect.identifier_preparer.quote
    expr = shard_sql([t.c[s] for s in sources], count, q)
    sql = f"UPDATE {q(t.name)} SET {q(target.name)} = {expr} WHERE {q(target.name)} IS NULL"
    with engine.connect() as conn:
        raw: Any = conn.connection.dbapi_connection
        raw.database.execute_partitioned_dml(sql)
    elapsed = time.monotonic() - start
    if report is not None:
        report(BackfillProgress(t.name, target.name, total, total, 1, elapsed))
    return BackfillResult(t.name, target.name, total, 1, "partitioned_dml", elapsed)


def _batches(
    engine: Engine,
    t: sa.Table,
    target: sa.Column[Any],
    sources: Sequence[str],
    fn: Callable[[Sequence[object]], int],
    batch_size: int,
    total: int,
    report: ProgressCallback | None,
    start: float,
) -> BackfillResult:
    key = list(t.primary_key.columns)
    if not key:
        raise ShardConfigError(f"table {t.name!r} has no primary key: cannot backfill by key")
    src = [t.c[s] for s in sources]
    read = sa.select(*key, *src).where(target.is_(None)).order_by(*key).limit(batch_size)
    params = [f"k{i}" for i in range(len(key))]
    write = (
        sa.update(t)
        .where(*[c == sa.bindparam(p) for c, p in zip(key, params, strict=True)])
        .where(target.is_(None))
        .values({target.name: sa.bindparam("new_shard")})
    )
    done = batches = 0
    with engine.connect() as conn:
        while True:
            with conn.begin():
                rows = conn.execute(read).all()
                if not rows:
                    break
                nkey = len(key)
                args = [
                    {
                        **{p: r[i] for i, p in enumerate(params)},
                        "new_shard": fn(list(r[nkey:])),
                    }
                    for r in rows
                ]
                conn.execute(write, args)
            done += len(rows)
            batches += 1
            if report is not None:
                report(
                    BackfillProgress(
                        t.name, target.name, done, max(total, done), batches,
                        time.monotonic() - start,
                    )
                )  # fmt: skip
    elapsed = time.monotonic() - start
    return BackfillResult(t.name, target.name, done, batches, "client_batches", elapsed)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m alembic_ext.backfill URL TABLE COLUMN --sources A B --count N``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m alembic_ext.backfill", description=main.__doc__
    )
    parser.add_argument("url")
    parser.add_argument("table")
    parser.add_argument("column")
    parser.add_argument("--sources", nargs="+", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--algorithm", default="crc32")
    parser.add_argument("--batch-size", type=int, default=500)
    args = parser.parse_args(argv)
    import sharded_orm  # noqa: F401  (registers the Spanner dialect fixes)

    engine = sa.create_engine(args.url)
    try:
        result = backfill_shard(
            engine, args.table, args.column, sources=args.sources, count=args.count,
            algorithm=args.algorithm, batch_size=args.batch_size,
        )  # fmt: skip
    finally:
        engine.dispose()
    print(f"{result.rows} rows filled in {result.batches} batches ({result.method})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
