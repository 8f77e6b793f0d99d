"""The ``sharded-orm`` command: ``lint`` a schema, ``simulate`` its writes, ``doctor`` production.

``sharded-orm lint module:attr [--format json]`` and
``sharded-orm simulate [name=]module:Model ... --rows-per-second R --duration S [...]``,
``sharded-orm doctor SOURCE module:attr [--window minute] [--threshold 10m] [--heatmap PNG]``.

The target is imported from the current directory, like alembic or uvicorn do: a
``MetaData``, a declarative base, or a module holding one. Exit codes: 0 no errors,
1 lint errors found (doctor: a split hot longer than --threshold), 2 the command itself
could not run (bad target, empty metadata, bad workload, unwritable output, no statistics).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from sharded_orm.errors import ShardingError
from sharded_orm.tools.lint import lint


def load_target(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise ShardingError(f"give a module path, like models:Base (got {spec!r})")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ShardingError(f"cannot import {module_name!r}: {exc}") from exc
    if not attr:
        return module
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ShardingError(f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def create_engine(url: str) -> Any:
    """An engine for ``url``, or a ShardingError naming the URL (exit 2, no traceback)."""
    import sqlalchemy as sa

    try:
        return sa.create_engine(url)
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError) as exc:
        raise ShardingError(
            f"{url!r} is not a usable database URL ({exc}); e.g. "
            "spanner+spanner:///projects/P/instances/I/databases/D"
        ) from None


def _output_args(p: argparse.ArgumentParser, *, heatmap: bool = False) -> None:
    """The output options: ``--heatmap PNG`` (simulate, doctor) and ``--format``."""
    if heatmap:
        p.add_argument("--heatmap", default=None, metavar="PNG", help="needs matplotlib")
    p.add_argument("--format", choices=("text", "json"), default="text")


def _emit(
    args: argparse.Namespace,
    as_dict: Callable[[], Any],
    text: Callable[[], str],
    **json_options: Any,
) -> None:
    """Print ``as_dict()`` as JSON (--format json), else ``text()`` and the heatmap's path."""
    if args.format == "json":
        print(json.dumps(as_dict(), indent=2, **json_options))
    else:
        print(text())
        if args.heatmap:
            print(f"heatmap: {args.heatmap}")


def cmd_lint(args: argparse.Namespace) -> int:
    findings = lint(load_target(args.target))
    if args.format == "json":
        print(json.dumps([f.as_dict() for f in findings], indent=2))
    else:
        for f in findings:
            print(f)
        errors = sum(f.severity == "error" for f in findings)
        print(f"{len(findings)} findings, {errors} errors")
    return 1 if any(f.severity == "error" for f in findings) else 0


def _pair(text: str, what: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise ShardingError(f"{what} takes NAME=VALUE, got {text!r}")
    return name, value


def cmd_simulate(args: argparse.Namespace) -> int:
    from sharded_orm.tools.simulate import Instance, Workload, simulate

    schemas: dict[str, Any] = {}
    for spec in args.targets:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = spec.rpartition(":")[2], spec
        if name in schemas:
            raise ShardingError(f"two schemas are named {name!r}: write name=module:attr")
        schemas[name] = load_target(path)
    weights = None
    if args.tenant_weights:
        try:
            weights = tuple(float(x) for x in args.tenant_weights.split(","))
        except ValueError:
            raise ShardingError(
                f"--tenant-weights takes numbers separated by commas, got {args.tenant_weights!r}"
            ) from None
    tenants = args.tenants if args.tenants is not None else len(weights or (1,))
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
    _emit(args, result.as_dict, result.summary)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Exit 0 when every row's shards agree with their sources, 1 when some do not."""
    import logging

    from sharded_orm.load.verify import verify

    target = load_target(args.target)
    if args.format != "json" and not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")  # progress lines
    engine = create_engine(args.url)
    try:
        report = verify(engine, target, progress_mode="off" if args.format == "json" else "auto")
    finally:
        engine.dispose()
    if args.format == "json":
        print(json.dumps(report.as_dict(), indent=2))
    else:
        width = max(len("shard column"), *(len(n) for n in report.mismatched))
        print(f"{'shard column':<{width}}  {'mismatched':>10}  method")
        for name, bad in report.mismatched.items():
            print(f"{name:<{width}}  {bad:>10}  {report.methods.get(name, '')}")
        verdict = "ok" if report.ok else "MISMATCHES FOUND"
        print(f"{report.table}: {report.rows_checked} rows checked, {verdict}")
    return 0 if report.ok else 1


def _duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``10m``, ``2h`` or ``1d``."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    unit = text[-1:].lower()
    number = text[:-1] if unit in units else text
    try:
        return float(number) * units.get(unit, 1)
    except ValueError:
        raise ShardingError(f"expected a duration like 90s, 10m, 2h or 1d, got {text!r}") from None


def _doctor_source(text: str) -> Any:
    if "://" not in text:
        return text  # a CSV or JSON export
    from sharded_orm.tools.doctor import StatisticsUnavailableError

    if not text.startswith("spanner"):
        raise StatisticsUnavailableError(
            f"{text!r} is not a Spanner URL: doctor reads Spanner's split statistics "
            "(spanner+spanner:///projects/P/instances/I/databases/D) or a CSV/JSON export"
        )
    return create_engine(text)


def cmd_doctor(args: argparse.Namespace) -> int:
    import datetime as dt

    from sharded_orm.tools.doctor import EmptyWindowError, doctor

    since = dt.timedelta(seconds=_duration(args.since)) if args.since else None
    try:
        diagnosis = doctor(
            _doctor_source(args.source), load_target(args.models), window=args.window, since=since
        )
    except EmptyWindowError as exc:
        print(f"no hot splits: {exc}")
        return 0
    if args.heatmap:
        diagnosis.heatmap(args.heatmap)
    _emit(args, diagnosis.as_dict, diagnosis.table, default=str)
    return 1 if diagnosis.hot_longer_than(_duration(args.threshold)) else 0


def add_doctor(sub: Any) -> None:
    p = sub.add_parser("doctor", help="read Spanner's hot-split statistics and say what to change")
    p.add_argument(
        "source", help="a spanner+spanner:// URL, or a CSV/JSON export of SPLIT_STATS_TOP_*"
    )
    p.add_argument("models", help="module:attr of a declarative base or MetaData")
    p.add_argument("--window", choices=("minute", "10minute", "hour"), default="minute")
    p.add_argument("--since", default=None, help="how far back, e.g. 2h (default: all / 6h)")
    p.add_argument(
        "--threshold",
        default="10m",
        help="exit 1 when a split was hot (CPU score 100) longer than this (default 10m)",
    )
    _output_args(p, heatmap=True)
    p.set_defaults(func=cmd_doctor)


def add_lint(sub: Any) -> None:
    p = sub.add_parser("lint", help="lint models for hotspots")
    p.add_argument("target", help="module:attr of a MetaData or declarative base, or a module")
    _output_args(p)
    p.set_defaults(func=cmd_lint)


def add_simulate(sub: Any) -> None:
    p = sub.add_parser(
        "simulate", help="replay a workload through the models on a modelled Spanner instance"
    )
    p.add_argument(
        "targets",
        nargs="+",
        metavar="[NAME=]MODULE:ATTR",
        help="a mapped class or Table; give several to compare them side by side",
    )
    p.add_argument("--rows-per-second", type=float, required=True)
    p.add_argument("--duration", type=float, required=True, help="seconds of traffic")
    p.add_argument("--tenants", type=int, default=None, help="default: 1")
    p.add_argument("--zipf", type=float, default=0.0, help="tenant skew exponent")
    p.add_argument("--tenant-weights", default=None, help="e.g. 1,3,1")
    p.add_argument("--users-per-tenant", type=int, default=1000)
    p.add_argument("--insert-order", choices=("time", "key", "random"), default="time")
    p.add_argument("--history", type=float, default=None, help="seconds of existing rows")
    p.add_argument(
        "--role",
        action="append",
        default=[],
        metavar="COLUMN=ROLE",
        help="how a column's values are made (time, tenant, user, uuid4, uuid7, counter, "
        "bit_reversed, random, constant)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--node-capacity", type=float, default=3500.0, help="writes/s per node")
    p.add_argument("--tick", type=float, default=10.0, help="seconds per time step")
    _output_args(p, heatmap=True)
    p.set_defaults(func=cmd_simulate)


def add_verify(sub: Any) -> None:
    p = sub.add_parser("verify", help="count rows whose stored shard disagrees (exit 1)")
    p.add_argument("url", help="SQLAlchemy URL of the database")
    p.add_argument("target", help="module:attr of a mapped class or Table")
    _output_args(p)
    p.set_defaults(func=cmd_verify)


#: one ``add_<name>(subparsers)`` per subcommand, each pointing at its ``cmd_<name>``
SUBCOMMANDS = (add_lint, add_simulate, add_doctor, add_verify)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sharded-orm",
        description="Hotspot checks for Spanner schemas: lint, simulate, doctor, verify.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ShardingError as exc:
        print(f"sharded-orm: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
