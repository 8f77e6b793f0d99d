"""The ``sharded-orm`` subcommands: one ``add_<name>(subparsers)`` and ``cmd_<name>(args)`` each.

The contract they keep (exit codes, the JSON envelope, targets) is in :mod:`.cli`; the two
that open the user's database, ``verify`` and ``backfill``, are in :mod:`.database`.
"""

from __future__ import annotations

import argparse
from typing import Any

from sharded_orm.checks import shown
from sharded_orm.errors import ShardingError
from sharded_orm.tools.advise_cli import add_advise
from sharded_orm.tools.contract import (
    EXIT_FINDINGS,
    EXIT_OK,
    Formatter,
    emit,
    envelope,
    number,
    output_args,
    tenant_mix,
    zipf_exponent,
)
from sharded_orm.tools.database import add_backfill, add_verify, create_engine
from sharded_orm.tools.fix_cli import add_fix_args, run_fix
from sharded_orm.tools.targets import TARGET_HELP, labelled_tables, load_target

# --- lint -------------------------------------------------------------------------------------


def cmd_lint(args: argparse.Namespace) -> int:
    from sharded_orm.tools.lint import lint

    findings = lint(load_target(args.target))
    counts = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "advice")}
    tables = len({f.table for f in findings})

    def text() -> str:
        lines = [str(f) for f in findings]
        lines.append(f"{len(findings)} findings, {counts['error']} errors")
        return "\n".join(lines)

    summary = {"findings": len(findings), "tables_with_findings": tables, **counts}
    emit(args, lambda: envelope("lint", summary, findings=[f.as_dict() for f in findings]), text)
    return EXIT_FINDINGS if counts["error"] else EXIT_OK


def add_lint(sub: Any) -> None:
    p = sub.add_parser(
        "lint",
        help="lint models for hotspots (exit 1 on errors)",
        description="Read the models (never running their functions) and report keys and "
        "indexes that would be hotspots on Spanner. Exit 1 when a finding is an error.",
        formatter_class=Formatter,
    )
    p.add_argument("target", help=TARGET_HELP)
    output_args(p)
    p.set_defaults(func=cmd_lint)


# --- simulate ---------------------------------------------------------------------------------


def _pair(text: str, what: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise ShardingError(f"{what} takes NAME=VALUE, got {text!r}")
    return name, value


def simulate_schemas(specs: list[str]) -> dict[str, Any]:
    """``[NAME=]MODULE:ATTR`` targets as name -> Table (a base: all its tables; a module:
    those of every MetaData it holds, ``Base.Table`` where two declare one name)."""
    schemas: dict[str, Any] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        obj = load_target(path if sep else spec)
        tables = labelled_tables(obj)
        if sep and len(tables) > 1:
            raise ShardingError(
                f"{spec!r} names {len(tables)} tables: a NAME= goes with one class or Table"
            )
        for label, table in tables:
            key = name if sep else (spec.rpartition(":")[2] if len(tables) == 1 else label)
            if key in schemas:
                raise ShardingError(f"two schemas are named {key!r}: write name=module:attr")
            schemas[key] = table
    return schemas


def cmd_simulate(args: argparse.Namespace) -> int:
    from sharded_orm.tools.simulate import Instance, Workload, simulate

    schemas = simulate_schemas(args.targets)
    tenants, weights = tenant_mix(args)
    workload = Workload(
        rows_per_second=args.rows_per_second,
        duration=args.duration,
        tenants=tenants,
        zipf=args.zipf,
        tenant_weights=weights,
        users_per_tenant=args.users_per_tenant,
        insert_order=args.insert_order,
        history=args.history,
        roles=dict(_pair(r, "--role") for r in args.role),
        seed=args.seed,
    )
    instance = Instance(nodes=args.nodes, node_capacity=args.node_capacity, tick=args.tick)
    result = simulate(schemas, workload, instance, heatmap=args.heatmap)
    rows = result.as_dict()["results"]
    summary = {
        "schemas": len(rows),
        "rows": workload.rows,
        "nodes": instance.nodes,
        "hottest_split_share": {r["name"]: r["hottest_split_share"] for r in rows},
    }
    emit(args, lambda: envelope("simulate", summary, results=rows), result.summary)
    return EXIT_OK


def add_simulate(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="replay a workload through the models on a modelled Spanner instance",
        description="Replay a write workload through the models (keys, shards and ids as the "
        "library writes them) on a modelled instance whose ranges split on size and load, and "
        "compare the schemas side by side.",
        formatter_class=Formatter,
    )
    p.add_argument(
        "targets",
        nargs="+",
        metavar="[NAME=]MODULE:ATTR",
        help="a mapped class or Table (a base or module: each of its tables); give several "
        "to compare them side by side",
    )
    p.add_argument(
        "--rows-per-second", type=number(), required=True, help="rows written per second"
    )
    p.add_argument("--duration", type=number(), required=True, help="seconds of traffic")
    p.add_argument(
        "--tenants",
        type=number(integer=True),
        default=None,
        help="number of tenants (default: 1, or one per --tenant-weights)",
    )
    p.add_argument(
        "--zipf",
        type=zipf_exponent,
        default=0.0,
        help="tenant skew exponent (0: none)",
    )
    p.add_argument("--tenant-weights", default=None, help="one write weight per tenant, e.g. 1,3,1")
    p.add_argument(
        "--users-per-tenant", type=number(integer=True), default=1000, help="users of each tenant"
    )
    p.add_argument(
        "--insert-order",
        choices=("time", "key", "random"),
        default="time",
        help="time: live traffic; key: a bulk load sorted by key; random: shuffled",
    )
    p.add_argument(
        "--history",
        type=number(above=False),
        default=None,
        help="seconds of rows that exist already (default: --duration for live traffic, "
        "0 for a bulk load)",
    )
    p.add_argument(
        "--role",
        action="append",
        default=[],
        metavar="COLUMN=ROLE",
        help="how a column's values are made (time, tenant, user, uuid4, uuid7, counter, "
        "bit_reversed, random, constant); repeat for several columns",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same rows)")
    p.add_argument(
        "--nodes", type=number(integer=True), default=3, help="nodes of the modelled instance"
    )
    p.add_argument("--node-capacity", type=number(), default=3500.0, help="writes/s per node")
    p.add_argument("--tick", type=number(), default=10.0, help="seconds per time step")
    output_args(p, heatmap=True)
    p.set_defaults(func=cmd_simulate)


# --- doctor -----------------------------------------------------------------------------------


def _duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``10m``, ``2h`` or ``1d``."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    unit = text[-1:].lower()
    number = text[:-1] if unit in units else text
    try:
        seconds = float(number) * units.get(unit, 1)
    except ValueError:
        seconds = float("nan")
    if not 0 <= seconds < 1e11:  # NaN fails too
        raise ShardingError(f"expected a duration like 90s, 10m, 2h or 1d, got {text!r}")
    return seconds


def _doctor_source(text: str) -> Any:
    if "://" not in text:
        return text  # a CSV or JSON export
    from sharded_orm.tools.doctor import StatisticsUnavailableError

    if not text.startswith("spanner"):
        raise StatisticsUnavailableError(
            f"{shown(text)} is not a Spanner URL: doctor reads Spanner's split statistics "
            "(spanner+spanner:///projects/P/instances/I/databases/D) or a CSV/JSON export"
        )
    return create_engine(text)


def cmd_doctor(args: argparse.Namespace) -> int:
    import datetime as dt

    from sharded_orm.tools.doctor import EmptyWindowError, doctor

    since = dt.timedelta(seconds=_duration(args.since)) if args.since else None
    threshold = _duration(args.threshold)
    models = load_target(args.models)
    try:
        diagnosis = doctor(_doctor_source(args.source), models, window=args.window, since=since)
    except EmptyWindowError as exc:
        message = f"no hot splits: {exc}"
        summary = {"hot_split_rows": 0, "message": message}
        emit(args, lambda: envelope("doctor", summary, findings=[]), lambda: message)
        return EXIT_OK
    if args.heatmap:
        diagnosis.heatmap(args.heatmap)
    info = diagnosis.as_dict()
    findings = info.pop("findings")
    hot = diagnosis.hot_longer_than(threshold)
    summary = {**info, "threshold_seconds": threshold, "hot_longer_than_threshold": hot}
    if args.fix:
        run_fix(args, diagnosis, models, summary)
    else:
        emit(args, lambda: envelope("doctor", summary, findings=findings), diagnosis.table)
    return EXIT_FINDINGS if hot else EXIT_OK


def add_doctor(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="read Spanner's hot-split statistics and say what to change (exit 1 when hot)",
        description="Map Spanner's hot splits (SPANNER_SYS.SPLIT_STATS_TOP_*) back to the "
        "models and name the fix. Exit 1 when a split stayed hot longer than --threshold.",
        formatter_class=Formatter,
    )
    p.add_argument(
        "source", help="a spanner+spanner:// URL, or a CSV/JSON export of SPLIT_STATS_TOP_*"
    )
    p.add_argument("models", help=TARGET_HELP)
    p.add_argument(
        "--window",
        choices=("minute", "10minute", "hour"),
        default="minute",
        help="which statistics view to read",
    )
    p.add_argument(
        "--since",
        default=None,
        help="how far back, e.g. 2h (default: a whole export; 6h from a database)",
    )
    p.add_argument(
        "--threshold",
        default="10m",
        help="exit 1 when a split was hot (CPU score 100) longer than this",
    )
    add_fix_args(p)
    output_args(p, heatmap=True)
    p.set_defaults(func=cmd_doctor)


#: one ``add_<name>(subparsers)`` per subcommand, each pointing at its ``cmd_<name>``
SUBCOMMANDS = (add_lint, add_simulate, add_doctor, add_verify, add_backfill, add_advise)
