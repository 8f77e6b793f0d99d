"""Filling a new shard column on a table that already has rows: batched, resumable, verified.

A shard column added to a populated table starts NULL. :func:`backfill_shard` fills it in
two passes:

1. **fill**: rows whose column is still NULL, one batch per transaction, in key order.
   Stopped at any point (crash, Ctrl-C, a failed batch), running it again carries on
   where it stopped.
2. **verify**: every row, in key order, recomputing the shard from the row's current
   sources and rewriting the rows whose stored value differs. A row that code unaware of
   the new column updated after the fill passed it (a source changed, the new shard kept
   its old value) is fixed here, so no row is stale when the backfill returns. From that
   point on, every writer must fill the new column itself: the library does once the
   models declare it; other writers must compute it (docs/migrations.md, "Writers").

``farm_fingerprint`` on Spanner runs both passes as one Partitioned DML statement
(``SET col = <shard expr> WHERE col IS NULL OR col != <shard expr>``). ``crc32`` has no
GoogleSQL twin: batches are computed here, written on Spanner as one UPDATE mutation per
batch, elsewhere as a keyed executemany UPDATE. Each batch is retried under
:mod:`sharded_orm.retry` (a batch is idempotent: it recomputes from current values).

A progress callback gets a :class:`BackfillProgress` after each batch (default: a bar on
stderr).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from sharded_orm.checks import check_identifier, check_positive_int
from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.hashing import FARM_FINGERPRINT, shard_function, validate_algorithm
from sharded_orm.spanner import is_spanner

from . import reflection
from .backfill_io import MutationWriter, Plan, SqlWriter, utc
from .markers import find_marker, spec_digest


@dataclass(frozen=True)
class BackfillProgress:
    """Where a backfill stands after a batch."""

    table: str
    column: str
    done: int  # rows filled by this run so far
    total: int  # rows that were NULL when this run started
    batches: int
    elapsed: float
    phase: str = "fill"  # "fill", then "verify"
    fixed: int = 0  # stale rows rewritten by the verify pass so far


@dataclass(frozen=True)
class BackfillResult:
    """What a backfill run did."""

    table: str
    column: str
    rows: int  # rows filled by this run (0: the column was already complete)
    batches: int
    method: str  # "partitioned_dml", "mutations" (Spanner), "client_batches" or "nothing_to_do"
    elapsed: float
    verified: int = 0  # rows checked by the verify pass
    fixed: int = 0  # stale rows it rewrote


ProgressCallback = Callable[[BackfillProgress], None]


def print_progress(p: BackfillProgress) -> None:
    """The default progress display: a bar on stderr, redrawn in place."""
    width = 30
    frac = p.done / p.total if p.total else 1.0
    bar = "#" * int(frac * width)
    end = "\n" if p.phase == "verify" or p.done >= p.total else ""
    sys.stderr.write(
        f"\rbackfill {p.table}.{p.column} {p.phase} [{bar:<{width}}] {p.done}/{p.total} "
        f"({p.batches} batches, {p.fixed} fixed, {p.elapsed:.1f}s){end}"
    )
    sys.stderr.flush()


def check_backfill_args(
    table: object, column: object, sources: object, batch_size: object
) -> list[str]:
    """The checks every backfill entry point makes before touching a database."""
    check_identifier(table, "backfill table")
    check_identifier(column, "backfill column")
    if isinstance(sources, (str, bytes)) or not isinstance(sources, Sequence):
        raise ShardTypeError(f"sources must be a list of column names, got {sources!r}")
    if not sources:
        raise ShardConfigError(
            "sources=[] would give every row shard 0: name the columns the shard is computed "
            "from, as the model's shard_column declares them"
        )
    for s in sources:
        check_identifier(s, "shard source")
    if len(set(sources)) != len(sources):
        raise ShardConfigError(f"shard sources {list(sources)} name a column twice")
    if column in sources:
        raise ShardConfigError(f"{table}.{column} cannot be a source of its own shard")
    check_positive_int(batch_size, "batch_size")
    return list(sources)


def _check_marker(
    conn: Connection, table: str, column: str, sources: list[str], count: int, algorithm: str
) -> None:
    """Refuse a spec that differs from the one the database records for the column."""
    marker = find_marker(table, column, reflection.check_names(conn, table))
    if marker is not None and marker.digest != spec_digest(algorithm, count, tuple(sources)):
        raise ShardConfigError(
            f"{table}.{column} is recorded as a shard of count={marker.count} with another "
            f"spec (marker {marker.name}), but this backfill asks for count={count}, "
            f"algorithm={algorithm!r}, sources={sources}: rows filled so would be unfindable"
        )


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
    verify: bool = True,
) -> BackfillResult:
    """Fill ``table.column`` with ``compute_shard(sources, count, algorithm)`` where NULL,
    then verify every row and fix stale ones (``verify=False`` skips that pass).

    ``bind``: an Engine, or a Connection whose engine is used: each batch runs in its
    own transaction on its own connection, so a stop loses at most one batch.
    ``sources`` are SQL column names in hashing order. ``partitioned_dml=None`` uses it
    on Spanner for ``farm_fingerprint`` and client batches otherwise.
    """
    if not isinstance(bind, (Engine, Connection)):
        raise ShardTypeError(
            f"bind must be a SQLAlchemy Engine or Connection, got {bind!r} "
            "(for a URL: sqlalchemy.create_engine(url))"
        )
    srcs = check_backfill_args(table, column, sources, batch_size)
    validate_algorithm(algorithm)
    fn = shard_function(count, algorithm)
    engine = bind.engine if isinstance(bind, Connection) else bind
    report: ProgressCallback | None
    report = print_progress if progress is True else (progress or None)
    start = time.monotonic()
    spanner = is_spanner(engine)
    use_pdml = partitioned_dml
    if use_pdml is None:
        use_pdml = spanner and algorithm == FARM_FINGERPRINT
    with engine.connect() as conn:
        plan = Plan(conn, table, column, srcs)
        target = plan.target
        _check_marker(conn, table, column, srcs, count, algorithm)
        out_of_range = conn.execute(
            sa.select(sa.func.count()).where(
                target.is_not(None), sa.or_(target < 0, target >= count)
            )
        ).scalar_one()
        if out_of_range:
            raise ShardConfigError(
                f"{table}.{column} holds {out_of_range} value(s) outside 0..{count - 1}: it is "
                f"not a shard column of count {count} (a data column, or another count?). "
                "Refusing to overwrite it."
            )
        total = 0  # the partitioned path counts them itself, right before its update
        if not use_pdml:
            total = conn.execute(sa.select(sa.func.count()).where(target.is_(None))).scalar_one()
        conn.rollback()
    if use_pdml:
        if algorithm != FARM_FINGERPRINT or not spanner:
            raise ShardConfigError(
                "partitioned DML backfill needs Spanner and algorithm='farm_fingerprint': "
                "Spanner has no CRC32 function, so crc32 shards are computed by the client"
            )
        return _partitioned(engine, plan, count, report, start)
    writer = MutationWriter(engine, plan) if spanner else SqlWriter(engine, plan)
    run = _Run(plan, fn, batch_size, writer, report, start, total)
    run.fill()
    if verify:
        run.verify()
    method = "mutations" if spanner else "client_batches"
    if run.done == 0 and run.fixed == 0:
        method = "nothing_to_do"
    return BackfillResult(
        table, column, run.done, run.batches, method, time.monotonic() - start,
        run.verified, run.fixed,
    )  # fmt: skip


class _Run:
    def __init__(
        self, plan: Plan, fn: Callable[[Sequence[object]], int],
        batch_size: int, writer: SqlWriter | MutationWriter,
        report: ProgressCallback | None, start: float, total: int,
    ) -> None:  # fmt: skip
        self.plan = plan
        self.fn = fn
        self.batch_size = batch_size
        self.writer = writer
        self.report = report
        self.start = start
        self.total = total
        self.done = self.batches = self.verified = self.fixed = 0
        names = [c.name for c in plan.read_cols]
        self.key_at = [names.index(c.name) for c in plan.key]
        self.src_at = [names.index(c.name) for c in plan.sources]
        self.target_at = names.index(plan.target.name)

    def _changes(self, rows: list[Any], only_stale: bool) -> list[tuple[Any, int]]:
        out = []
        for r in rows:
            value = self.fn([utc(r[i]) for i in self.src_at])
            if not only_stale or r[self.target_at] != value:
                out.append(([r[i] for i in self.key_at], value))
        return out

    def _tell(self, phase: str) -> None:
        if self.report is not None:
            self.report(
                BackfillProgress(
                    self.plan.table.name, self.plan.target.name, self.done,
                    max(self.total, self.done), self.batches, time.monotonic() - self.start,
                    phase, self.fixed,
                )
            )  # fmt: skip

    def fill(self) -> None:
        while True:
            n = self.writer.batch(True, None, self.batch_size, lambda r: self._changes(r, False))
            if not n:
                break
            self.done += n
            self.batches += 1
            self._tell("fill")

    def verify(self) -> None:
        after: list[Any] | None = None
        fixed: list[int] = [0]

        def fix(rows: list[Any]) -> list[tuple[Any, int]]:
            changes = self._changes(rows, True)
            fixed[0] = len(changes)
            return changes

        while True:
            n = self.writer.batch(False, after, self.batch_size, fix)
            if not n:
                break
            last = self.writer.last
            assert last is not None
            after = [last[i] for i in self.key_at]
            self.verified += n
            self.fixed += fixed[0]
            self.batches += 1
            self._tell("verify")


def _partitioned(
    engine: Engine,
    plan: Plan,
    count: int,
    report: ProgressCallback | None,
    start: float,
) -> BackfillResult:
    """Both passes in Spanner: ``sharded_orm.load.backfill_server`` with ``fix_stale``
    (``WHERE col IS NULL OR col != <expr>``), then its closing count of mismatches."""
    from sharded_orm.load.backfill_server import backfill_server_side

    res = backfill_server_side(
        engine, plan.table.name, plan.target.name, sources=[c.name for c in plan.sources],
        count=count, algorithm=FARM_FINGERPRINT, fix_stale=True, progress_mode="off",
    )  # fmt: skip
    if res.mismatched:
        raise ShardConfigError(
            f"{plan.table.name}.{plan.target.name}: {res.mismatched} row(s) still disagree "
            "with their sources after the backfill (written meanwhile by code that does not "
            "fill the column?): run the backfill again"
        )
    elapsed = time.monotonic() - start
    total = res.rows_missing_before or 0  # the NULL rows it found before its update
    fixed = max(0, res.rows_updated - total)
    if report is not None:
        report(
            BackfillProgress(
                plan.table.name, plan.target.name, total, total, res.rpcs, elapsed, "verify", fixed
            )
        )
    return BackfillResult(
        plan.table.name, plan.target.name, total, res.rpcs, "partitioned_dml", elapsed, 0, fixed
    )


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
    print(
        f"{result.rows} rows filled, {result.verified} verified, {result.fixed} fixed, "
        f"in {result.batches} batches ({result.method})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
