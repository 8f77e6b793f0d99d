"""The subcommands that open the user's database, ``verify`` and ``backfill``, and the
URL handling every subcommand shares (SQLite files opened, never created; driver and
connection errors in the contract's one line).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sharded_orm.checks import redact, shown
from sharded_orm.errors import ShardingError
from sharded_orm.tools.contract import (
    EXIT_FINDINGS,
    EXIT_OK,
    Formatter,
    emit,
    envelope,
    output_args,
)
from sharded_orm.tools.targets import TARGET_HELP, load_target, tables_of


def check_url(url: str) -> Any:
    """The parsed ``url``, or a ShardingError: a SQLite file must exist (never created)."""
    import sqlalchemy as sa

    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError):  # ValueError: a port that is no number
        raise ShardingError(
            f"{shown(url)} is not a database URL; e.g. sqlite:///app.db or "
            "spanner+spanner:///projects/P/instances/I/databases/D"
        ) from None
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database or ""
        if db not in ("", ":memory:") and not db.startswith("file:"):
            path = Path(db)
            if not path.is_file():
                what = "is a directory" if path.is_dir() else "does not exist"
                raise ShardingError(
                    f"no SQLite database at {db!r}: the path {what} (sharded-orm opens "
                    "existing databases only, it never creates one)"
                )
    return parsed


def create_engine(url: str) -> Any:
    """An engine for ``url``, or a ShardingError naming the URL (exit 2, no traceback)."""
    import sqlalchemy as sa

    parsed = check_url(url)
    try:
        return sa.create_engine(parsed)
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError) as exc:
        raise ShardingError(
            f"{shown(url)} is not a usable database URL ({redact(str(exc), url)}); e.g. "
            "spanner+spanner:///projects/P/instances/I/databases/D"
        ) from None
    except ImportError as exc:
        raise ShardingError(
            f"the driver for {parsed.drivername!r} is not installed ({exc}): install it "
            "(for Spanner: pip install sharded-orm, which brings google-cloud-spanner)"
        ) from None


def database_errors(url: str) -> Any:
    """A context turning a database's own error (cannot open, not a database) into one line
    (the URL without its password, which is blanked out of the driver's words too)."""
    import contextlib

    import sqlalchemy as sa

    @contextlib.contextmanager
    def guard() -> Any:
        try:
            yield
        except sa.exc.DBAPIError as exc:
            reason = " ".join(str(exc.orig).split()) or type(exc.orig).__name__
            raise ShardingError(f"database {shown(url)}: {redact(reason, url)}") from None

    return guard()


# --- verify -----------------------------------------------------------------------------------


def cmd_verify(args: argparse.Namespace) -> int:
    """Exit 0 when every row's shards agree with their sources, 1 when some do not."""
    from sharded_orm.load.verify import verify

    tables = tables_of(load_target(args.target), sharded_only=True)
    engine = create_engine(args.url)
    try:
        with database_errors(args.url):
            reports = [verify(engine, t) for t in tables]
    finally:
        engine.dispose()
    ok = all(r.ok for r in reports)

    def text() -> str:
        lines = []
        for report in reports:
            width = max(len("shard column"), *(len(n) for n in report.mismatched))
            lines.append(f"{'shard column':<{width}}  {'mismatched':>10}  method")
            for name, bad in report.mismatched.items():
                lines.append(f"{name:<{width}}  {bad:>10}  {report.methods.get(name, '')}")
            verdict = "ok" if report.ok else "MISMATCHES FOUND"
            lines.append(f"{report.table}: {report.rows_checked} rows checked, {verdict}")
        return "\n".join(lines)

    findings = [
        {"table": r.table, "shard_column": name, "mismatched": bad, "method": r.methods.get(name)}
        for r in reports
        for name, bad in r.mismatched.items()
        if bad
    ]
    summary = {
        "ok": ok,
        "tables": [r.as_dict() for r in reports],
        "rows_checked": sum(r.rows_checked for r in reports),
        "mismatched": sum(sum(r.mismatched.values()) for r in reports),
    }
    emit(args, lambda: envelope("verify", summary, findings=findings), text)
    return EXIT_OK if ok else EXIT_FINDINGS


def add_verify(sub: Any) -> None:
    p = sub.add_parser(
        "verify",
        help="count rows whose stored shard disagrees with its sources (exit 1)",
        description="Recompute every row's shard columns from their sources and count the "
        "rows that disagree. Exit 1 when one does.",
        formatter_class=Formatter,
    )
    p.add_argument("url", help="SQLAlchemy URL of an existing database")
    p.add_argument("target", help=TARGET_HELP + " (those with shard columns)")
    output_args(p)
    p.set_defaults(func=cmd_verify)


# --- backfill ---------------------------------------------------------------------------------


#: ``alembic_ext.backfill.ENGINES`` (a test keeps them equal; ``--help`` imports no Alembic)
BACKFILL_ENGINES = ("auto", "client", "partitioned_dml", "external")


def cmd_backfill(args: argparse.Namespace) -> int:
    """Runs ``alembic_ext.backfill.run`` (the code ``op.backfill_shard`` runs)."""
    import dataclasses

    create_engine(args.url).dispose()  # the URL's errors, in the contract's words
    run: Callable[..., Any] = importlib.import_module("alembic_ext.backfill").run
    with database_errors(args.url):
        result = run(
            args.url, args.table, args.column, sources=args.sources, count=args.count,
            algorithm=args.algorithm, batch_size=args.batch_size, engine=args.engine,
            deadline=args.deadline,
        )  # fmt: skip

    def text() -> str:
        return (
            f"{result.rows} rows filled, {result.verified} verified, {result.fixed} fixed, "
            f"in {result.batches} batches ({result.method})"
        )

    summary = {
        "table": result.table,
        "column": result.column,
        "rows_filled": result.rows,
        "rows_verified": result.verified,
        "rows_fixed": result.fixed,
        "method": result.method,
    }
    emit(args, lambda: envelope("backfill", summary, results=[dataclasses.asdict(result)]), text)
    return EXIT_OK


def add_backfill(sub: Any) -> None:
    from sharded_orm.hashing import ALGORITHMS

    p = sub.add_parser(
        "backfill",
        help="fill a shard column of existing rows, then verify them",
        description="Fill COLUMN of TABLE's existing rows from its sources and verify every "
        "row (what a migration's op.backfill_shard runs); safe to run again after a failure.",
        formatter_class=Formatter,
    )
    p.add_argument("url", help="SQLAlchemy URL of an existing database")
    p.add_argument("table", help="the table's name in the database")
    p.add_argument("column", help="the shard column to fill")
    p.add_argument(
        "--sources", nargs="+", required=True, help="the shard's source columns, in order"
    )
    p.add_argument("--count", type=int, required=True, help="number of shards")
    p.add_argument("--algorithm", choices=ALGORITHMS, default="crc32", help="the shard hash")
    p.add_argument("--batch-size", type=int, default=500, help="rows per write batch")
    p.add_argument(
        "--engine",
        choices=BACKFILL_ENGINES,
        default="auto",
        help="who fills the column: auto is partitioned_dml for farm_fingerprint on Spanner, "
        "else client; external only checks that no row is left unfilled",
    )
    p.add_argument(
        "--deadline", type=float, default=None, help="seconds for the whole run (no limit)"
    )
    output_args(p)
    p.set_defaults(func=cmd_backfill)
