"""``sharded-orm doctor --fix``: its options and what it prints (kept apart from
:mod:`.commands` so that doctor's own parser and body change in one line each)."""

from __future__ import annotations

import argparse
from typing import Any

from sharded_orm.errors import ShardingError
from sharded_orm.tools.contract import emit, envelope


def add_fix_args(p: argparse.ArgumentParser) -> None:
    """doctor's ``--fix``, ``--alembic-ini`` and ``--count``."""
    p.add_argument(
        "--fix",
        action="store_true",
        help="write the Alembic revision(s) that remove each finding a schema change can "
        "fix into the project of --alembic-ini (with the model change each assumes beside "
        "it, <revision>.model.txt) and print them for review; nothing is applied. A "
        "finding whose revisions an earlier --fix wrote (pending or applied) is said, not "
        "written again; a schema the revisions cannot carry (interleaved, foreign keys, "
        "named schema, a nullable or commit-timestamp source) is refused with the manual path",
    )
    p.add_argument(
        "--alembic-ini",
        default="alembic.ini",
        metavar="PATH",
        help="the Alembic project's configuration (with --fix)",
    )
    p.add_argument(
        "--count",
        type=int,
        default=None,
        help="with --fix: the shard count of the new layout (default: 10 for a new shard "
        "column, 16 for a new key shard, about twice the old count for a reshard; "
        "`sharded-orm advise` picks one from the data)",
    )


def run_fix(args: argparse.Namespace, diagnosis: Any, models: Any, summary: dict[str, Any]) -> None:
    """Plan, write and print the fixes of ``diagnosis`` (``--fix``)."""
    from sharded_orm.tools.doctor.fix import fix

    if args.count is not None and args.count < 2:
        raise ShardingError(f"--count takes a shard count of 2 or more, got {args.count}")
    report = fix(diagnosis, models, alembic=args.alembic_ini, count=args.count)
    fixes = report.as_dict()["fixes"]
    written = [r["path"] for f in fixes for r in f.get("revisions", ()) if r["path"]]
    before = [r["path"] for f in fixes for r in f.get("already_written", ())]
    summary = {
        **summary,
        "revisions_written": written,
        "already_written": before,
        "no_migration": len(report.refusals),
    }
    emit(args, lambda: envelope("doctor", summary, findings=fixes), report.text)
