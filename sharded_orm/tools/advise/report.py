"""``advise()``: the curve over candidate counts, the recommendation, its table and picture."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sharded_orm.checks import check_positive_int
from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.tools.advise.cost import Point, busiest_tenant, peak_split, read_cost
from sharded_orm.tools.advise.layout import Layout, layout_of
from sharded_orm.tools.advise.sample import Sample, from_csv, from_engine, from_rows, from_workload

#: the counts tried by default: the rules of thumb (16, one per node, 100, 200) among them
CANDIDATES = (1, 2, 4, 8, 10, 16, 20, 30, 32, 40, 50, 64, 100, 128, 200, 256)


@dataclass
class Advice:
    """The curve (one :class:`Point` per candidate) and the count it recommends."""

    layout: Layout
    sample: Sample
    target: float  # writes/s a split may take
    tenant: Any
    k: int
    page_size: int
    pages: int
    points: list[Point] = field(default_factory=list)

    @property
    def feasible(self) -> list[Point]:
        return [p for p in self.points if p.peak_split_writes <= self.target]

    @property
    def best(self) -> Point | None:
        """The candidate that meets the write target with the least read cost (ties: the
        smaller count); None when no candidate meets it."""
        return min(self.feasible, key=lambda p: (p.read_cost, p.count), default=None)

    @property
    def count(self) -> int | None:
        best = self.best
        return None if best is None else best.count

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.layout.table.name,
            "shard_column": self.layout.shard.name,
            "key_space": self.layout.index or self.layout.table.name,
            "current_count": self.layout.shard.count,
            "sample": self.sample.source,
            "sample_rows": len(self.sample.rows),
            "rows_per_second": round(self.sample.rows_per_second, 2),
            "target_split_writes_per_second": self.target,
            "read": {
                "tenant": _plain(self.tenant),
                "k": self.k,
                "page_size": self.page_size,
                "pages": self.pages,
            },  # fmt: skip
            "recommended_count": self.count,
            "curve": [p.as_dict() for p in self.points],
        }

    def table(self) -> str:
        best = self.best
        top = 3 * self.target  # bars: 0 to 3x the target, '#' at the target
        lines = [
            f"{self.layout.table.name}.{self.layout.shard.name} (now {self.layout.shard.count} "
            f"shards) leading {self.layout.index or 'the key'}: {len(self.sample.rows)} rows "
            f"of {self.sample.source}, {self.sample.rows_per_second:,.0f} rows/s",
            f"reads priced: newest {self.k} and {self.pages} page(s) of {self.page_size}"
            + (f" of {self.layout.tenant} {self.tenant!r}" if self.tenant is not None else "")
            + f"; write target: {self.target:,.0f} writes/s per split",
            f"{'N':>5} {'busiest split w/s':>18} {'meets':>5} {'statements':>10} "
            f"{'rows read':>9} {'read cost':>9}  busiest split (# = target)",
        ]
        for p in self.points:
            bar = ("=" * min(30, round(30 * p.peak_split_writes / top)) + " " * 30)[:30]
            bar = bar[:10] + "#" + bar[11:] if len(bar) > 10 else bar
            ok = "yes" if p.peak_split_writes <= self.target else "no"
            star = " <- recommended" if best is not None and p is best else ""
            lines.append(
                f"{p.count:>5} {p.peak_split_writes:>18,.0f} {ok:>5} {p.statements:>10} "
                f"{p.server_rows_read:>9} {p.read_cost:>9,.0f}  {bar.rstrip()}{star}"
            )
        lines.append(
            "read cost = index entries read + 1024 per statement (the merge's cost rule, "
            "SINGLE_STATEMENT_READS); busiest split = the busiest tail's writes/s"
        )
        if best is None:
            lines.append(
                f"no candidate up to {max(p.count for p in self.points)} meets the target: "
                "the busiest tenant's rate alone is too high for one split per shard; try "
                "larger counts (candidates=...) or spread that tenant's key further"
            )
        else:
            lines.append(f"recommended: {best.count} shards")
        return "\n".join(lines)

    __str__ = table

    def plot(self, path: str | Path) -> Path:
        from sharded_orm.tools.advise.picture import draw_curve

        return draw_curve(self, path)


def _plain(v: Any) -> Any:
    return v if isinstance(v, (int, float, str, type(None))) else str(v)


def _sample(layout: Layout, sample: Any, rows_per_second: float | None, size: int) -> Sample:
    from sharded_orm.tools.simulate import Workload

    if isinstance(sample, Workload):
        return from_workload(layout, sample, size)
    if isinstance(sample, (str, Path)):
        if "://" in str(sample):
            raise ShardConfigError(
                f"{str(sample)!r} is a URL: advise takes an Engine (create_engine(url)) or, on "
                "the command line, --url"
            )
        return from_csv(layout, sample, rows_per_second)
    if hasattr(sample, "connect") and hasattr(sample, "dialect"):
        return from_engine(layout, sample, size, rows_per_second=rows_per_second)
    if isinstance(sample, (list, tuple)) or hasattr(sample, "__iter__"):
        return from_rows(layout, sample, "the rows given", rows_per_second)
    raise ShardTypeError(
        "sample must be a simulate Workload, an Engine, a CSV path or an iterable of dicts "
        f"keyed by column name; got {sample!r}"
    )


def advise(
    model: Any,
    sample: Any,
    *,
    column: str | None = None,
    candidates: Any = CANDIDATES,
    instance: Any = None,
    target: float | None = None,
    k: int = 100,
    page_size: int = 50,
    pages: int = 3,
    tenant: Any = None,
    rows_per_second: float | None = None,
    sample_size: int = 20_000,
) -> Advice:
    """Price each candidate shard count of ``model``'s shard column from ``sample``.

    ``sample``: a ``simulate`` Workload, an Engine (the newest rows of the table), a CSV
    path, or an iterable of dicts by column name. ``target``: the writes/s a split may take
    (default: the instance's ``load_split_threshold x node_capacity``, where a split turns
    warm). ``k``, ``page_size``, ``pages``: the app's newest-k read and page walk; ``tenant``:
    whose (default: the busiest). ``rows_per_second``: the write rate, where the sample's
    time span cannot tell it. ``sample_size``: rows drawn from a Workload or a database.
    """
    from sharded_orm.tools.simulate import Instance

    inst = Instance() if instance is None else instance
    if not isinstance(inst, Instance):
        raise ShardTypeError(f"instance must be a simulate Instance, got {inst!r}")
    for name, value in (("k", k), ("page_size", page_size), ("pages", pages)):
        check_positive_int(value, name)
    counts = sorted({check_positive_int(c, "candidate count") for c in candidates})
    if not counts:
        raise ShardConfigError("give at least one candidate count")
    if counts[-1] > 4096:
        raise ShardConfigError(f"candidate counts go up to 4096, got {counts[-1]}")
    limit = target if target is not None else inst.load_split_threshold * inst.node_capacity
    if not isinstance(limit, (int, float)) or not limit > 0 or limit == float("inf"):
        raise ShardConfigError(f"target must be a positive number of writes/s, got {target!r}")
    layout = layout_of(model, column)
    data = _sample(layout, sample, rows_per_second, check_positive_int(sample_size, "sample_size"))
    who = tenant if tenant is not None else busiest_tenant(layout, data)
    advice = Advice(layout, data, float(limit), who, k, page_size, pages)
    splits = inst.initial_splits_per_node * inst.nodes
    for n in counts:
        newest, walk = read_cost(layout, data, n, k=k, page_size=page_size, pages=pages,
                                 tenant=who)  # fmt: skip
        advice.points.append(
            Point(
                n,
                peak_split(layout, data, n, inst.tick, splits, float(limit)),
                newest.statements + walk.statements,
                newest.server_rows_read + walk.server_rows_read,
                newest.statements,
                newest.server_rows_read,
                walk.statements,
                walk.server_rows_read,
            )  # fmt: skip
        )
    return advice
