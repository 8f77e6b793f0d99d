"""``sharded-orm advise``: the shard count a table needs, from a sample of its data (kept apart
from :mod:`.commands`: one line adds it to the subcommands)."""

from __future__ import annotations

import argparse
from typing import Any

from sharded_orm.errors import ShardingError
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
from sharded_orm.tools.targets import TARGET_HELP, load_target

#: the flags' ranges (argparse checks them: a 0 is refused saying so, not taken as absent)
_POSITIVE = number()
_COUNT = number(integer=True)


def _counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ShardingError(
            f"--candidates takes counts separated by commas, got {text!r}"
        ) from None
    if not counts:
        raise ShardingError("--candidates needs at least one count")
    return counts


def _names(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",")]
    if not all(names):
        raise ShardingError(
            f"--shard-on takes column names separated by commas, like created_at or "
            f"tenant_id,created_at; got {text!r}"
        )
    return names


def _sample(args: argparse.Namespace) -> Any:
    workload = [args.rows_per_second, args.duration]
    given = [x for x in (args.csv, args.url, *workload) if x is not None]
    if len(given) > 1 and (args.csv or args.url):
        raise ShardingError(
            "give one sample: --csv FILE, --url URL, or a workload (--rows-per-second and "
            "--duration)"
        )
    if workload.count(None) == 1:
        missing = "--duration" if args.duration is None else "--rows-per-second"
        raise ShardingError(
            f"a workload sample needs --rows-per-second and --duration: add {missing}"
        )
    if args.csv:
        return args.csv
    if args.url:
        from sharded_orm.tools.database import create_engine

        return create_engine(args.url)
    if not given:
        raise ShardingError(
            "give a sample: --csv FILE (the table's rows), --url URL (read them from the "
            "database), or a workload (--rows-per-second and --duration, as simulate takes)"
        )
    from sharded_orm.tools.simulate import Workload

    tenants, weights = tenant_mix(args)
    return Workload(
        rows_per_second=args.rows_per_second, duration=args.duration, tenants=tenants,
        zipf=args.zipf, tenant_weights=weights, seed=args.seed,
    )  # fmt: skip


def cmd_advise(args: argparse.Namespace) -> int:
    from sharded_orm.tools.advise import CANDIDATES, advise
    from sharded_orm.tools.simulate import Instance

    if args.plot:
        from sharded_orm.tools.simulate.heatmap import check_output_path, require_matplotlib

        require_matplotlib()
        check_output_path(args.plot)
    model = load_target(args.target)
    instance = Instance(nodes=args.nodes, node_capacity=args.node_capacity, tick=args.tick)
    advice = advise(
        model, _sample(args), column=args.column,
        candidates=_counts(args.candidates) if args.candidates else CANDIDATES,
        instance=instance, target=args.target_writes, k=args.k, page_size=args.page_size,
        pages=args.pages, rows_per_second=args.sample_rate,
        shard_on=_names(args.shard_on) if args.shard_on is not None else None, index=args.index,
        full_curve=args.full_curve,
    )  # fmt: skip
    if args.plot:
        advice.plot(args.plot)
    data = advice.as_dict()
    curve = data.pop("curve")
    emit(args, lambda: envelope("advise", data, results=curve), advice.table)
    if args.plot and args.format != "json":
        print(f"curve: {args.plot}")
    return EXIT_OK if advice.count is not None else EXIT_FINDINGS


def add_advise(sub: Any) -> None:
    p = sub.add_parser(
        "advise",
        help="pick a shard count from a sample of the data, with its read cost "
        "(exit 1 when no candidate meets the write target)",
        description="For each candidate shard count: the busiest split's writes/s (the "
        "instance model simulate uses) against a target, and what the newest-k read and a "
        "page walk cost at that count (the merge's own statements and index entries, run "
        "on the sample). Recommends the count that meets the target with the least read "
        "cost, and prints the shard_column(..., count=N) to declare. Exit 1 when none "
        "does. A table without a shard column yet is sized as it would be with one: its "
        "key or index that grows (a timestamp, a counter), led by a shard column over the "
        "growing column and the tenant columns before it (--shard-on, --index to choose). "
        "The rate of a --url/--csv sample is its busiest --tick seconds, so bursts count.",
        formatter_class=Formatter,
    )
    p.add_argument("target", help=TARGET_HELP + " (the model whose shard column is sized)")
    p.add_argument(
        "--column", default=None, help="the shard column to size (default: its only one)"
    )
    p.add_argument(
        "--shard-on",
        default=None,
        metavar="COLUMNS",
        help="a table without a shard column: the columns a new one would hash, e.g. "
        "created_at or tenant_id,created_at (default: the growing column of its growing "
        "key or index, and the tenant columns before it)",
    )
    p.add_argument(
        "--index",
        default=None,
        help="a table without a shard column: the index the new one would lead (the "
        "table's name: its key; default: the one key or index that grows)",
    )
    p.add_argument("--csv", default=None, metavar="FILE", help="a sample: the table's rows as CSV")
    p.add_argument("--url", default=None, help="a sample: the newest rows read from this database")
    p.add_argument(
        "--sample-rate",
        type=_POSITIVE,
        default=None,
        metavar="ROWS_PER_S",
        help="the write rate of a --csv/--url sample (default: its busiest --tick seconds, "
        "at least its mean)",
    )
    p.add_argument(
        "--rows-per-second", type=_POSITIVE, default=None, help="a workload sample: rows/s"
    )
    p.add_argument("--duration", type=_POSITIVE, default=None, help="a workload sample: seconds")
    p.add_argument("--tenants", type=_COUNT, default=None, help="a workload sample: tenants")
    p.add_argument("--zipf", type=zipf_exponent, default=0.0, help="a workload sample: tenant skew")
    p.add_argument(
        "--tenant-weights", default=None, help="a workload sample: weights, e.g. 100,1,1"
    )
    p.add_argument("--seed", type=int, default=0, help="a workload sample: random seed")
    p.add_argument(
        "--candidates", default=None, help="counts to try, e.g. 8,16,32 (default: 1 to 256)"
    )
    p.add_argument("--target-writes", type=_POSITIVE, default=None, metavar="WRITES_PER_S",
                   help="writes/s a split may take (default: the instance's load-split "
                   "threshold x node capacity, where a split turns warm)")  # fmt: skip
    p.add_argument("--k", type=_COUNT, default=100, help="the newest-k read's k")
    p.add_argument("--page-size", type=_COUNT, default=50, help="the page walk's page size")
    p.add_argument("--pages", type=_COUNT, default=3, help="pages walked")
    p.add_argument(
        "--full-curve",
        action="store_true",
        help="run the page walk at every count, for the whole curve (slower; by default it "
        "runs only where the count can be the answer, and the others show the least they cost)",
    )
    p.add_argument("--nodes", type=_COUNT, default=3, help="nodes of the modelled instance")
    p.add_argument("--node-capacity", type=_POSITIVE, default=3500.0, help="writes/s per node")
    p.add_argument(
        "--tick", type=_POSITIVE, default=10.0, help="seconds per time step of the model"
    )
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="also draw the curve into this PNG (needs matplotlib: "
                   "pip install 'sharded-orm[heatmap]')")  # fmt: skip
    output_args(p)
    p.set_defaults(func=cmd_advise)
