"""``advise()``: the curve over candidate counts, the recommendation, its table and picture."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sharded_orm.checks import check_positive_int
from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.progress import progress
from sharded_orm.read.branches import SINGLE_STATEMENT_READS
from sharded_orm.read.stats import MergeStats
from sharded_orm.schema.columns import table_of
from sharded_orm.tools.advise.cost import (
    DOUBT,
    SIMULATED,
    Point,
    Reads,
    busiest_tenant,
    peak_split,
    simulated_peak,
    walk_statements,
)
from sharded_orm.tools.advise.layout import Layout, SeveralGrow, held_roles, layout_of
from sharded_orm.tools.advise.sample import Sample, SampleReader, source, without_flat_counters

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

    def share(self, point: Point) -> float:
        """The busiest split's share of the table's writes at ``point`` (at most 1)."""
        rate = self.sample.rows_per_second
        return min(1.0, point.peak_split_writes / rate) if rate > 0 else 1.0

    @property
    def naive_sources(self) -> bool:
        """A source of the shard column came as naive datetimes (read as UTC)."""
        return bool(set(self.sample.naive) & {c.name for c in self.layout.shard.sources})

    @property
    def model_line(self) -> str | None:
        """The recommended shard column as the model declares it (None: no count fits)."""
        return None if self.count is None else self.layout.model_line(self.count)

    @property
    def window_text(self) -> str | None:
        """The busiest window, in words (None: the rate was given or the sample is short)."""
        data = self.sample
        start, end = data.window_start, data.window_end
        if start is None or end is None or data.window is None or data.window_rows is None:
            return None
        mean = data.mean_rows_per_second or 0.0
        sized = (
            f"sized for it: {data.rows_per_second:,.1f} rows/s (its rows less their "
            f"noise), not the mean {mean:,.1f}"
            if data.rows_per_second > mean
            else f"no burst above the mean {mean:,.1f} rows/s: sized for the mean"
        )
        return (
            f"busiest window: {data.window:g} s from {_when(start)} to {_when(end)}, "
            f"{data.window_rows:,} rows ({data.window_rows / data.window:,.1f} rows/s); {sized}"
        )

    @property
    def naive_text(self) -> str | None:
        """What advise did with naive datetimes (None: none came)."""
        if not self.sample.naive:
            return None
        text = (
            f"{', '.join(self.sample.naive)}: datetimes without a timezone, read as UTC "
            "(as Spanner stores a naive datetime); if they are local times, the busiest "
            "window's times above are off by the zone's offset"
        )
        if self.naive_sources and self.layout.proposed and not self.layout.naive_utc:
            text += (
                "; the shard column refuses naive values unless told they mean UTC: "
                'sharded_orm.set_naive_datetimes(Base, "utc") once (docs/adopting.md), or '
                'naive_datetimes="utc" in the line below'
            )
        return text

    def as_dict(self) -> dict[str, Any]:
        mean = self.sample.mean_rows_per_second
        proposed = self.layout.proposed
        return {
            "table": self.layout.table.name,
            "shard_column": None if proposed else self.layout.shard.name,
            "shard_sources": list(self.layout.source_names),
            "key_space": self.layout.index or self.layout.table.name,
            "current_count": None if proposed else self.layout.shard.count,
            "sample": self.sample.source,
            "sample_rows": len(self.sample.rows),
            "rows_per_second": round(self.sample.rows_per_second, 2),
            "mean_rows_per_second": None if mean is None else round(mean, 2),
            "busiest_window_seconds": self.sample.window,
            "busiest_window": None if self.sample.window_start is None else {
                "start": _when(self.sample.window_start),
                "end": _when(self.sample.window_end),
                "rows": self.sample.window_rows,
            },
            "naive_datetimes_read_as_utc": list(self.sample.naive),
            "not_growing": {name: why for name, why in self.layout.flat},
            "held_by_values": {
                h.column: {"role": h.role, "growing": h.growing, "why": h.why}
                for h in self.layout.held
            },
            "target_split_writes_per_second": self.target,
            "read": {
                "tenant": _plain(self.tenant),
                "k": self.k,
                "page_size": self.page_size,
                "pages": self.pages,
            },  # fmt: skip
            "recommended_count": self.count,
            "model": self.model_line,
            "busiest_split_share": None if self.best is None else round(self.share(self.best), 4),
            "curve": [{**p.as_dict(), "busiest_split_share": round(self.share(p), 4)}
                      for p in self.points],
        }  # fmt: skip

    def table(self) -> str:
        best = self.best
        top = 3 * self.target  # bars: 0 to 3x the target, '#' at the target
        lay, data = self.layout, self.sample
        what = (
            f"{lay.table.name} (no shard column yet): a shard column over "
            f"{', '.join(lay.source_names)}"
            if lay.proposed
            else f"{lay.table.name}.{lay.shard.name} (now {lay.shard.count} shards)"
        )
        rate = f"{data.rows_per_second:,.0f} rows/s"
        mean = data.mean_rows_per_second
        if data.window is not None and mean is not None and data.rows_per_second > mean:
            rate += f" in the busiest {data.window:g} s (mean {mean:,.1f}): sized for the bursts"
        lines = [
            f"{what} leading {lay.index or 'the key'}: {len(data.rows)} rows of "
            f"{data.source}, {rate}",
            *(f"{note}" for note in (self.window_text, self.naive_text) if note),
            *(
                f"{name}: an integer key named like a counter, but not one: {why}; "
                "not a key space that grows"
                for name, why in lay.flat
            ),
            *(h.text for h in lay.held),
            f"reads priced: newest {self.k} and {self.pages} page(s) of {self.page_size}"
            + (f" of {self.layout.tenant} {self.tenant!r}" if self.tenant is not None else "")
            + f"; write target: {self.target:,.0f} writes/s per split",
            f"{'N':>5} {'busiest split w/s':>18} {'share':>6} {'meets':>9} {'statements':>10} "
            f"{'rows read':>9} {'read cost':>9}  busiest split (# = target)",
        ]
        for p in self.points:
            bar = ("=" * min(30, round(30 * p.peak_split_writes / top)) + " " * 30)[:30]
            bar = bar[:10] + "#" + bar[11:] if len(bar) > 10 else bar
            ok = "yes" if p.peak_split_writes <= self.target else "no"
            ok = ("sim " if p.model_split_writes is not None else "") + ok
            star = " <- recommended" if best is not None and p is best else ""
            at_least = "" if p.exact else ">="
            lines.append(
                f"{p.count:>5} {p.peak_split_writes:>18,.0f} {self.share(p):>6.1%} {ok:>9} "
                f"{at_least + str(p.statements):>10} "
                f"{at_least + str(p.server_rows_read):>9} "
                f"{at_least + f'{p.read_cost:,.0f}':>9}  {bar.rstrip()}{star}"
            )
        lines.append(
            "read cost = index entries read + 1024 per statement (the merge's cost rule, "
            "SINGLE_STATEMENT_READS); busiest split = the busiest tail's writes/s, share = "
            "its part of the table's writes"
        )
        sims = [p for p in self.points if p.model_split_writes is not None]
        if sims:
            lines.append(
                "sim : the model's figure was within "
                f"{DOUBT:.0%} of the target, so that count was simulated (the workload run "
                "through simulate) and its busiest split is simulate's worst tick: "
                + ", ".join(
                    f"{p.count} shards {p.peak_split_writes:,.0f} w/s (the model: "
                    f"{p.model_split_writes:,.0f})"
                    for p in sims
                )
            )
        if not all(p.exact for p in self.points):
            lines.append(
                ">= : the page walk was not run at that count (it cannot be the answer: it "
                "meets no target, or its newest read and a statement per page already cost "
                "more); the figures are the least it costs (--full-curve runs every walk)"
            )
        if best is None:
            lines.append(
                f"no candidate up to {max(p.count for p in self.points)} meets the target: "
                "the busiest tenant's rate alone is too high for one split per shard; try "
                "larger counts (candidates=...) or spread that tenant's key further"
            )
        else:
            lines.append(
                f"recommended: {best.count} shards: the busiest split takes "
                f"{self.share(best):.1%} of the writes ({best.peak_split_writes:,.0f}/s), a "
                f"newest-{self.k} read {best.newest_statements} statement(s) and "
                f"{best.newest_rows_read} index entries"
            )
            lines.append(f"in the model: {self.model_line}")
        return "\n".join(lines)

    __str__ = table

    def plot(self, path: str | Path) -> Path:
        from sharded_orm.tools.advise.picture import draw_curve

        return draw_curve(self, path)


def _when(v: Any) -> str | None:
    """A window's edge as text (ISO 8601)."""
    return None if v is None else str(v.isoformat())


def _plain(v: Any) -> Any:
    return v if isinstance(v, (int, float, str, type(None))) else str(v)


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
    shard_on: Any = None,
    index: str | None = None,
    full_curve: bool = False,
) -> Advice:
    """Price each candidate shard count of ``model``'s shard column from ``sample``.

    ``sample``: a ``simulate`` Workload, an Engine (the newest rows of the table), a CSV
    path, or an iterable of dicts by column name. ``target``: the writes/s a split may take
    (default: the instance's ``load_split_threshold x node_capacity``, where a split turns
    warm). ``k``, ``page_size``, ``pages``: the app's newest-k read and page walk; ``tenant``:
    whose (default: the busiest). ``rows_per_second``: the write rate, where the sample's
    time span cannot tell it (else the busiest ``instance.tick`` seconds of the sample's
    rows: see :mod:`.sample`). ``sample_size``: rows drawn from a Workload or a database.

    A table without a shard column yet is sized as it would be with one: the key or index
    that grows (``index=``: name it where several do) led by a shard column over its
    growing part and the tenant parts before it (``shard_on=``: the columns to hash
    instead). ``Advice.model_line`` is then the ``shard_column(...)`` to declare.

    The page walk is run only at the counts that can be the answer (``Point.exact``; see
    :mod:`.cost`): ``full_curve=True`` runs it at every count, for the whole curve. It
    reports its progress through :mod:`sharded_orm.progress` (a line every few seconds in
    a log, a bar on a terminal).
    """
    from sharded_orm.tools.simulate import Instance, Workload

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
    size = check_positive_int(sample_size, "sample_size")
    kind, sample = source(sample)
    # the key columns whose role their values decide (an app's UUIDv7 helper): as doctor does,
    # on the newest rows, read by the time column of the layout the model declares
    table = table_of(model)
    try:
        declared: Layout | None = layout_of(model, column, shard_on=shard_on, index=index)
    except ShardConfigError:  # several or no key spaces grow as declared: the values decide
        declared = None
    # the probe and the sample from one read where they can be (SampleReader)
    reader = SampleReader(table, kind, sample, declared, rows_per_second, size, float(inst.tick))
    held = held_roles(table, reader.probe())
    try:
        layout = layout_of(model, column, shard_on=shard_on, index=index, held=held)
        data = reader.read(layout)
    except SeveralGrow as several:
        found = without_flat_counters(several, model, shard_on, index, reader.read, held)
        if found is None:
            raise
        layout, data = found
    who = tenant if tenant is not None else busiest_tenant(layout, data)
    advice = Advice(layout, data, float(limit), who, k, page_size, pages)
    splits = inst.initial_splits_per_node * inst.nodes
    peaks = {n: peak_split(layout, data, n, inst.tick, splits, float(limit)) for n in counts}
    modelled = dict(peaks)
    simulated: dict[int, float] = {}
    newest: dict[int, MergeStats] = {}
    walks: dict[int, MergeStats] = {}
    # a line every few seconds while it works (a bar on a terminal): one plan per read
    with progress(2 * len(counts), "advise: pricing reads", unit="read plans") as bar:
        rows = 0
        for n in counts:
            with Reads(layout, data, n, who) as reads:
                newest[n] = reads.newest(k)
                rows = reads.rows
            bar.advance()
        # the floor under each count's cost: its newest read, and a statement per page
        least = SINGLE_STATEMENT_READS * walk_statements(rows, page_size, pages)
        floor = {n: _cost(newest[n]) + least for n in counts}

        def cost(n: int) -> float:
            if n not in walks:
                with Reads(layout, data, n, who) as reads:
                    walks[n] = reads.walk(page_size, pages)
                bar.advance()
            return _cost(newest[n]) + _cost(walks[n])

        def known(n: int) -> float:
            """A count's cost where walked, else its floor."""
            return _cost(newest[n]) + _cost(walks[n]) if n in walks else floor[n]

        def choose() -> tuple[float, int] | None:
            """(cost, count) of the answer at the peaks known: the feasible counts walked
            cheapest floor first, until no floor is below the answer found."""
            best: tuple[float, int] | None = None
            feasible = sorted((n for n in counts if peaks[n] <= limit), key=lambda n: (floor[n], n))
            for n in feasible:
                if best is not None and (floor[n], n) > best:
                    break  # neither it nor any after it can cost less than the answer found
                best = min(best or (math.inf, n), (cost(n), n))
            return best

        best = choose()
        workload = sample if isinstance(sample, Workload) else None
        while workload is not None and len(simulated) < SIMULATED:
            # the counts the model is unsure of that could be the answer: simulate the
            # cheapest, then choose again (its peak may make it feasible, or the answer not)
            doubtful = [
                n for n in counts
                if n not in simulated and abs(peaks[n] / limit - 1) <= DOUBT
                and (best is None or (known(n), n) <= best)
            ]  # fmt: skip
            if not doubtful:
                break
            n = min(doubtful, key=lambda n: (floor[n], n))
            simulated[n] = simulated_peak(layout, workload, inst, n)
            peaks[n] = simulated[n]
            best = choose()
        if full_curve:
            for n in counts:
                cost(n)
        bar.advance(max(0, len(counts) - len(walks)))  # the walks not needed
    for n in counts:
        one, walk = newest[n], walks.get(n)
        page_statements = walk.statements if walk else least // SINGLE_STATEMENT_READS
        page_rows = walk.server_rows_read if walk else 0
        advice.points.append(
            Point(
                n,
                peaks[n],
                one.statements + page_statements,
                one.server_rows_read + page_rows,
                one.statements,
                one.server_rows_read,
                page_statements,
                page_rows,
                exact=walk is not None,
                model_split_writes=modelled[n] if n in simulated else None,
            )  # fmt: skip
        )
    return advice


def _cost(stats: MergeStats) -> float:
    """A read's cost by the rule ``Point.read_cost`` applies."""
    return float(stats.server_rows_read + SINGLE_STATEMENT_READS * stats.statements)
