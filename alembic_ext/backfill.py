"""Filling a new shard column on a table that already has rows: one resumable walk.

A shard column added to a populated table starts NULL. :func:`backfill_shard` fills it
by walking the table's key once, in the order Spanner stores it (DESC parts included),
with a key cursor: each batch reads the next rows after the last key seen (Spanner's Read
API with a ``KeyRange``; elsewhere ``WHERE key > cursor ORDER BY key``), recomputes the
shard from each row's current sources and writes back the rows whose stored value is NULL
or differs (a row old code changed after a fill), in the same transaction. Nothing is
rescanned, nothing but one batch is held in memory, and the walk ends at the table's last
key as it was when the walk began (rows added later are not chased: their writers fill
the column, or are fenced, below), so it ends in time proportional to the table.

Stopped at any point (crash, kill -9, Ctrl-C, a batch that failed within its deadline),
running it again completes it: filled rows are only read again, never lost.

``require_complete=True`` (the contract of a reshard, which runs after old writers are
fenced by the drop of the old column) then counts the rows still NULL and fails loudly
if there is any.

Engines (``engine=``): ``"client"`` (above), ``"partitioned_dml"`` (``farm_fingerprint``
on Spanner: one Partitioned DML statement computed by Spanner), ``"external"`` (the rows
were filled out of band, e.g. by the Beam pipeline ``sharded_orm.beam.Backfill`` on
Dataflow: this only checks that no row is left NULL, and fails with the command to run if
one is). ``"auto"``: Partitioned DML for ``farm_fingerprint`` on Spanner, else the client.

Every RPC has a timeout (``batch_timeout``), each batch is retried under
:mod:`sharded_orm.retry`, and ``deadline`` bounds the whole run: a silent server ends it
with an error saying how to resume. Progress goes through :mod:`sharded_orm.progress`
(a bar on a terminal, log lines elsewhere), or to a callback.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from sharded_orm import telemetry
from sharded_orm.checks import check_identifier, check_positive_int, shown
from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.hashing import FARM_FINGERPRINT, shard_function, validate_algorithm
from sharded_orm.progress import Mode
from sharded_orm.retry import DEFAULTS, Deadline
from sharded_orm.spanner import is_spanner

from . import reflection
from .backfill_io import Plan, SpannerWriter, SqlWriter
from .backfill_walk import (
    BackfillProgress,
    BackfillResult,
    ProgressCallback,
    Walk,
    callback_of,
    mode_of,
)
from .markers import find_marker, spec_digest

__all__ = [
    "DEADLINE_ATTRIBUTE",
    "ENGINES",
    "BackfillIncomplete",
    "BackfillProgress",
    "BackfillResult",
    "backfill_shard",
    "check_backfill_args",
    "run",
]

#: ``alembic.config.Config.attributes`` key: seconds for each ``op.backfill_shard`` of a
#: migration (None, the default: each batch and statement is still bounded).
DEADLINE_ATTRIBUTE = "sharded_orm.backfill_deadline"

#: What ``engine=`` accepts.
ENGINES = ("auto", "client", "partitioned_dml", "external")


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


class BackfillIncomplete(ShardConfigError):
    """Rows are still unfilled where the step needs none (a contract, an external fill)."""


def _backfill_target(bind: Any, table: str, *args: Any, **kwargs: Any) -> tuple[Any, str]:
    return bind, table


def _backfill_figures(result: BackfillResult) -> dict[str, Any]:
    return {
        "shard_column": result.column, "rows_done": result.rows, "batches": result.batches,
        "engine": result.method, "rows_read": result.verified, "rows_fixed": result.fixed,
    }  # fmt: skip


@telemetry.traced("backfill", _backfill_target, _backfill_figures)
def backfill_shard(
    bind: Engine | Connection,
    table: str,
    column: str,
    *,
    sources: Sequence[str],
    count: int,
    algorithm: str = "crc32",
    batch_size: int = 500,
    progress: ProgressCallback | bool | Mode | None = True,
    partitioned_dml: bool | None = None,
    verify: bool = True,
    engine: str = "auto",
    require_complete: bool = False,
    deadline: float | None = None,
    batch_timeout: float = DEFAULTS["pdml"],
) -> BackfillResult:
    """Fill ``table.column`` with ``compute_shard(sources, count, algorithm)`` where NULL
    and fix rows whose value is stale (``verify=False``: NULL rows only), in one walk.

    ``bind``: an Engine, or a Connection whose engine is used: each batch runs in its
    own transaction, so a stop loses at most one batch. ``sources`` are SQL column names
    in hashing order. ``engine``: see the module docstring (``partitioned_dml=True/False``
    is the older spelling of ``engine="partitioned_dml"/"client"``). ``require_complete``:
    afterwards, fail if any row is still NULL. ``deadline``: seconds for the whole run
    (None: each batch is still bounded by its retry policy); ``batch_timeout``: the most
    one RPC may take. ``progress``: True (``sharded_orm.progress``, auto mode), a mode
    (``"bar"``, ``"log"``, ``"off"``), False or None (off), or a callback given a
    :class:`BackfillProgress` after each batch.
    """
    if not isinstance(bind, (Engine, Connection)):
        raise ShardTypeError(
            f"bind must be a SQLAlchemy Engine or Connection, got {shown(bind)} "
            "(for a URL: sqlalchemy.create_engine(url))"
        )
    srcs = check_backfill_args(table, column, sources, batch_size)
    validate_algorithm(algorithm)
    fn = shard_function(count, algorithm)
    engine = _engine_choice(engine, partitioned_dml)
    if deadline is not None:
        check_positive_float(deadline, "deadline")
    check_positive_float(batch_timeout, "batch_timeout")
    sa_engine = bind.engine if isinstance(bind, Connection) else bind
    start = time.monotonic()
    clock = Deadline.after(deadline)  # the whole run's, from here
    spanner = is_spanner(sa_engine)
    if engine == "auto":
        engine = "partitioned_dml" if spanner and algorithm == FARM_FINGERPRINT else "client"
    with sa_engine.connect() as conn:
        plan = Plan(conn, table, column, srcs)
        key_order = reflection.read_primary_key(conn, table) if spanner else []
        _check_marker(conn, table, column, srcs, count, algorithm)
        _check_range(conn, plan, count)
        conn.rollback()
    if engine == "partitioned_dml":
        if algorithm != FARM_FINGERPRINT or not spanner:
            raise ShardConfigError(
                "partitioned DML backfill needs Spanner and algorithm='farm_fingerprint': "
                "Spanner has no CRC32 function, so crc32 shards are computed by the client"
            )
        return _partitioned(sa_engine, plan, count, progress, start, require_complete, clock)
    writer: SpannerWriter | SqlWriter
    writer = SpannerWriter(sa_engine, plan, key_order) if spanner else SqlWriter(sa_engine, plan)
    try:
        if engine == "external":
            return _external(writer, plan, count, algorithm, start, batch_timeout)
        run = Walk(
            plan, fn, min(batch_size, writer.max_batch_size), writer, progress, start, verify
        )
        run.walk(clock, batch_timeout)
        if require_complete:
            _require_complete(writer, plan, clock.cap(600.0) if deadline else 600.0)
    finally:
        writer.close()
    method = "mutations" if spanner else "client_batches"
    if run.done == 0 and run.fixed == 0:
        method = "nothing_to_do"
    return BackfillResult(
        table, column, run.done, run.batches, method, time.monotonic() - start,
        run.verified, run.fixed,
    )  # fmt: skip


def check_positive_float(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
        raise ShardConfigError(f"{what} must be a positive number of seconds, got {value!r}")
    return float(value)


def _engine_choice(engine: object, partitioned_dml: bool | None) -> str:
    if engine not in ENGINES:
        raise ShardConfigError(
            f"engine must be one of {', '.join(map(repr, ENGINES))}, got {engine!r}"
        )
    if partitioned_dml is not None and engine == "auto":
        return "partitioned_dml" if partitioned_dml else "client"
    return str(engine)


def _check_range(conn: Connection, plan: Plan, count: int) -> None:
    target = plan.target
    out_of_range = conn.execute(
        sa.select(sa.func.count()).where(target.is_not(None), sa.or_(target < 0, target >= count))
    ).scalar_one()
    if out_of_range:
        raise ShardConfigError(
            f"{plan.table.name}.{target.name} holds {out_of_range} value(s) outside "
            f"0..{count - 1}: it is not a shard column of count {count} (a data column, or "
            "another count?). Refusing to overwrite it."
        )


def _require_complete(writer: SpannerWriter | SqlWriter, plan: Plan, timeout: float) -> None:
    """After the walk of a fenced step: a NULL row left means a writer that does not fill
    the column is still running (old code is fenced by then)."""
    left = writer.count_null(max(1.0, timeout))
    if left:
        raise BackfillIncomplete(
            f"{plan.table.name}.{plan.target.name}: {left} row(s) are still NULL after the "
            "backfill, written during it by a writer that neither fills the column nor "
            "names the dropped old one (raw SQL, another service?). Stop or fix that writer "
            "(docs/migrations.md, 'Writers'), then run the step again: it fills them."
        )


def _external(
    writer: SpannerWriter | SqlWriter, plan: Plan, count: int, algorithm: str, start: float,
    timeout: float,
) -> BackfillResult:  # fmt: skip
    """``engine="external"``: the fill ran out of band; check that no row is left NULL."""
    left = writer.count_null(max(600.0, timeout))
    if left:
        t, c = plan.table.name, plan.target.name
        srcs = " ".join(s.name for s in plan.sources)
        raise BackfillIncomplete(
            f"{t}.{c}: {left} row(s) are still NULL; this revision expects them filled out "
            f"of band (engine='external'). Run the Beam backfill (docs/migrations.md, "
            f"'Choosing the engine'), or on the client: sharded-orm backfill <url> {t} {c} "
            f"--sources {srcs} --count {count} --algorithm {algorithm}; then upgrade again."
        )
    return BackfillResult(
        plan.table.name, plan.target.name, 0, 1, "external", time.monotonic() - start
    )


def _partitioned(
    engine: Engine,
    plan: Plan,
    count: int,
    progress: ProgressCallback | bool | Mode | None,
    start: float,
    require_complete: bool,
    clock: Deadline,
) -> BackfillResult:
    """In Spanner: ``sharded_orm.load.backfill_server`` with ``fix_stale`` (``WHERE col IS
    NULL OR col != <expr>``), then its closing count of mismatches. Those are an error
    only where the step needs none (``require_complete``: old writers are fenced by
    then); in an expand, rows old writers add meanwhile are theirs to leave NULL. Its
    progress lines are the backfill's (one statement can run for minutes: a silent
    ``alembic upgrade`` meanwhile looked hung); a callback gets one report at the end."""
    from sharded_orm.load.backfill_server import backfill_server_side

    report = callback_of(progress)
    res = backfill_server_side(
        engine, plan.table.name, plan.target.name, sources=[c.name for c in plan.sources],
        count=count, algorithm=FARM_FINGERPRINT, fix_stale=True, progress_mode=mode_of(progress),
        deadline=None if clock.seconds == math.inf else clock.call_timeout(),
    )  # fmt: skip
    if res.mismatched and require_complete:
        raise BackfillIncomplete(
            f"{plan.table.name}.{plan.target.name}: {res.mismatched} row(s) still disagree "
            "with their sources after the backfill, written meanwhile by a writer that does "
            "not fill the column (raw SQL, another service?). Stop or fix that writer, then "
            "run the step again."
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


def run(
    url: str,
    table: str,
    column: str,
    *,
    sources: Sequence[str],
    count: int,
    algorithm: str = "crc32",
    batch_size: int = 500,
    engine: str = "auto",
    deadline: float | None = None,
    batch_timeout: float = DEFAULTS["pdml"],
    require_complete: bool = False,
    progress: ProgressCallback | bool | Mode | None = True,
) -> BackfillResult:
    """The backfill of one shard column of the database at ``url``: the entry point of
    ``sharded-orm backfill`` and ``python -m alembic_ext.backfill`` (the same code as
    ``op.backfill_shard``). Opens and disposes its own engine."""
    if not isinstance(url, str):
        raise ShardTypeError(f"url must be a database URL string, got {url!r}")
    import sharded_orm  # noqa: F401  (registers the Spanner dialect fixes)

    sa_engine = sa.create_engine(url)
    try:
        return backfill_shard(
            sa_engine, table, column, sources=sources, count=count, algorithm=algorithm,
            batch_size=batch_size, progress=progress, engine=engine,
            require_complete=require_complete, deadline=deadline, batch_timeout=batch_timeout,
        )  # fmt: skip
    finally:
        sa_engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m alembic_ext.backfill URL TABLE COLUMN --sources A B --count N``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m alembic_ext.backfill", description=main.__doc__
    )
    parser.add_argument("url", help="SQLAlchemy URL of the database")
    parser.add_argument("table", help="the table to backfill")
    parser.add_argument("column", help="the shard column to fill")
    parser.add_argument("--sources", nargs="+", required=True, help="source columns, in order")
    parser.add_argument("--count", type=int, required=True, help="shard count")
    parser.add_argument("--algorithm", default="crc32", help="crc32 (default) or farm_fingerprint")
    parser.add_argument("--batch-size", type=int, default=500, help="rows per batch (500)")
    parser.add_argument("--engine", default="auto", choices=ENGINES, help="auto (default)")
    parser.add_argument("--deadline", type=float, default=None, help="seconds for the run")
    args = parser.parse_args(argv)
    result = run(
        args.url, args.table, args.column, sources=args.sources, count=args.count,
        algorithm=args.algorithm, batch_size=args.batch_size, engine=args.engine,
        deadline=args.deadline,
    )  # fmt: skip
    print(
        f"{result.rows} rows filled, {result.verified} verified, {result.fixed} fixed, "
        f"in {result.batches} batches ({result.method})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
