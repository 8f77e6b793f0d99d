"""What a count costs: the busiest split's writes, and the app's reads priced by the merge.

**Writes** (the instance model ``simulate`` uses): each shard and each value of the part
before the growing one (a tenant) has its own tail, where all of its new rows land. From
the sample: each row's shard at ``N`` (the shard column's own function), rows per tail,
scaled to the write rate (:func:`peak_split`).

**Reads**: the newest ``k`` rows, and ``pages`` pages of ``page_size``, of the busiest
tenant (or of everything), read by the library's own ``merged()`` over the sample loaded
into an in-memory SQLite table with ``N`` shards: its ``MergeStats`` (statements, index
entries read) are the cost, by the rule ``sharded_orm.read.merge`` applies. A statement is
priced at ``SINGLE_STATEMENT_READS`` index entries (the figure that rule weighs a second
statement against). On Spanner the two rounds of a read are one statement where SQLite
sends two: the entries read are the same.

The newest-``k`` read is run at every count; the page walk only where the count can still
be the answer. A walk sends a statement per page at the least, at any count (the pages it
reads are the same at every count: the merge is exact), so the newest read's cost plus
those statements is a floor under a count's cost; a count whose floor is above the cost of
the answer found is not walked (``Point.exact`` False: its figures are that floor). The
answer and its stated cost are the ones walking every count gives.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa

from sharded_orm.read.branches import SINGLE_STATEMENT_READS
from sharded_orm.read.merge import merged, order_columns
from sharded_orm.read.plan import sharded_select
from sharded_orm.read.stats import MergeStats
from sharded_orm.schema.columns import shard_columns
from sharded_orm.tools.advise.layout import Layout
from sharded_orm.tools.advise.sample import Sample

#: standard deviations of a tick's Poisson noise added to a split's mean rate: the busiest
#: tick of a run is about that far above it (simulate's worst tick, measured: 0.9 to 1.05x
#: the mean + 2 sigma on the scenarios of examples/advise_sweep.py)
NOISE = 2.0
#: rows of the read's tenant loaded to price the reads (the newest: what they read)
READ_ROWS = 5000
#: the model is unsure of a count whose busiest split is within this share of the target
#: (under heavy skew it was 8-19 % above simulate's figure: issue 43), and of the few such
#: counts that could be the answer, up to ``SIMULATED`` are simulated before choosing
DOUBT = 0.25
SIMULATED = 3
#: the most rows of a workload simulated for one count (a longer one is cut to this many:
#: its busiest tick is found within it, as the rate is steady)
SIMULATED_ROWS = 400_000


@dataclass(frozen=True)
class Point:
    """One candidate count: its busiest split, and its reads."""

    count: int
    peak_split_writes: float  # writes/s of the busiest split
    statements: int  # of one newest-k read and the page walk together
    server_rows_read: int
    newest_statements: int
    newest_rows_read: int
    page_statements: int
    page_rows_read: int
    #: False: the page walk was not run (this count cannot be the answer: see the module's
    #: docstring); its figures are then the least it can cost (``page_statements`` one per
    #: page, ``page_rows_read`` 0), and so are ``statements``, ``server_rows_read`` and
    #: ``read_cost``
    exact: bool = True
    #: where the count was simulated: the model's figure (``peak_split_writes`` is then
    #: simulate's); None where the model's figure stands
    model_split_writes: float | None = None

    @property
    def read_cost(self) -> float:
        """Index entries read, each statement priced at ``SINGLE_STATEMENT_READS`` (where
        not ``exact``: the least it can be)."""
        return float(self.server_rows_read + SINGLE_STATEMENT_READS * self.statements)

    def as_dict(self) -> dict[str, Any]:
        exact = self.exact
        return {
            "count": self.count,
            "peak_split_writes_per_second": round(self.peak_split_writes, 1),
            "statements": self.statements if exact else None,
            "server_rows_read": self.server_rows_read if exact else None,
            "newest": {"statements": self.newest_statements, "rows_read": self.newest_rows_read},
            "pages": {
                "statements": self.page_statements if exact else None,
                "rows_read": self.page_rows_read if exact else None,
            },
            "read_cost": self.read_cost if exact else None,
            "read_cost_at_least": self.read_cost,
            "simulated": self.model_split_writes is not None,
            "model_peak_split_writes_per_second": (
                None if self.model_split_writes is None else round(self.model_split_writes, 1)
            ),
        }


def busiest_tenant(layout: Layout, sample: Sample) -> Any:
    if layout.tenant is None:
        return None
    return Counter(r[layout.tenant] for r in sample.rows).most_common(1)[0][0]


def _order(value: Any, desc: bool) -> Any:
    if value is None:
        return (0, "")
    text = value if isinstance(value, str) else f"{value!r:>40}"
    return (1, "".join(chr(0x10FFFF - ord(c)) for c in text) if desc else text)


def peak_split(
    layout: Layout, sample: Sample, count: int, tick: float = 10.0, splits: int = 0,
    target: float = float("inf"),
) -> float:  # fmt: skip
    """Writes/s of the busiest split at ``count`` shards, as the instance model has it.

    Each tail takes ``rate x (its rows in the sample) / (rows)``. A split holding a tail
    also holds the smaller tails next to it on the side its new rows go (the tails after
    an ascending one, before a descending one) whose ranges are small (each less than half
    its rate, together less than a split's share of the writes, ``rate / splits``: their
    history fits in one split, so no split boundary falls among them): a
    load-based cut at the median of the split's recent writes falls among the big tail's
    new keys and leaves them beside those small tails, so the split keeps them while
    together they carry less than the tail. Plus the tick's Poisson noise (3 standard
    deviations), which the busiest tick of a run shows. And a floor: ``splits`` splits
    (the instance's initial ones) share the key space's writes, and load-based splitting
    cuts only those above the ``target``, so one of them takes at least its share (up to
    the target).
    """
    variant = layout.variant(count)
    sc = shard_columns(variant)[0]
    names = [c.name for c in sc.sources]
    tails: Counter[Any] = Counter()
    for r in sample.rows:
        shard = sc.compute([r[n] for n in names])
        tails[(shard, r[layout.tenant] if layout.tenant else None)] += 1
    if not tails:
        return 0.0
    scale = sample.rows_per_second / len(sample.rows)
    parts = dict(layout.parts)
    desc_tenant = parts.get(layout.tenant or "", False)
    keys = sorted(tails, key=lambda k: (k[0], _order(k[1], desc_tenant)))
    rates = [tails[k] * scale for k in keys]
    step = -1 if parts.get(layout.growing or "", False) else 1
    share = min(sample.rows_per_second / splits, target) if splits else 0.0
    room = sample.rows_per_second / splits if splits else float("inf")
    peak = share + NOISE * math.sqrt(share / tick)
    for i, rate in enumerate(rates):
        acc, j = 0.0, i + step
        while 0 <= j < len(rates) and rates[j] < rate / 2 and acc + rates[j] < min(rate, room):
            acc += rates[j]
            j += step
        load = rate + acc
        peak = max(peak, load + NOISE * math.sqrt(load / tick))
    return peak


def simulated_peak(layout: Layout, workload: Any, instance: Any, count: int) -> float:
    """The busiest split of the sized key space at ``count`` shards, writes/s, as
    ``simulate`` measures it: ``workload`` run on ``instance`` (its worst tick), cut to
    ``SIMULATED_ROWS`` rows, its history kept."""
    from sharded_orm.tools.simulate import simulate

    w = workload
    if w.rows > SIMULATED_ROWS:
        w = replace(w, duration=SIMULATED_ROWS / w.rows_per_second, history=w.history_seconds)
    variant = layout.variant(count)
    space = variant.name + (f".{layout.index}" if layout.index else "")
    name = f"advise: {count} shards"
    run = simulate({name: variant}, w, instance, progress_mode="auto").results[0]
    ids = {i for i, s in run.split_space.items() if s == space}
    worst = max(
        (max((v for i, v in d.items() if i in ids), default=0) for d in run.split_writes),
        default=0,
    )
    return float(worst) / run.tick


class Reads:
    """The sample's rows read by ``merged()`` at one count: the table with ``count`` shards
    in an in-memory SQLite database, loaded once; :meth:`newest` and :meth:`walk` price the
    two reads on it (a context manager: the database goes with it)."""

    def __init__(self, layout: Layout, sample: Sample, count: int, tenant: Any = None) -> None:
        table = layout.variant(count)
        rows = sample.rows
        if tenant is not None and layout.tenant is not None:
            rows = [r for r in rows if r[layout.tenant] == tenant]
        rows = rows[-READ_ROWS:]  # the newest: what the reads see (the sample is oldest first)
        #: rows the reads can see (how many pages a walk reads does not depend on the count)
        self.rows = len(rows)
        self._engine = sa.create_engine("sqlite://")
        try:
            table.metadata.create_all(self._engine)
            with self._engine.begin() as conn:
                conn.execute(table.insert(), rows)
        except BaseException:
            self._engine.dispose()
            raise
        stmt = sharded_select(table, index=layout.index)
        if tenant is not None and layout.tenant is not None:
            stmt = stmt.where(table.c[layout.tenant] == tenant)
        self._stmt = stmt

    def __enter__(self) -> Reads:
        return self

    def __exit__(self, *exc: object) -> None:
        self._engine.dispose()

    def newest(self, k: int) -> MergeStats:
        """The newest-``k`` read's stats."""
        stats = MergeStats()
        with self._engine.connect() as conn:
            merged(conn, self._stmt, k, stats=stats)
        return stats

    def walk(self, page_size: int, pages: int) -> MergeStats:
        """The walk of ``pages`` pages of ``page_size``, each after the last row of the one
        before (it stops at a short page), as one stats."""
        stats = MergeStats()
        after: Sequence[Any] | None = None
        order = [c for c, _ in order_columns(self._stmt)]
        with self._engine.connect() as conn:
            for _ in range(pages):
                got = merged(conn, self._stmt, page_size, after=after, stats=stats)
                if len(got) < page_size:
                    break
                after = [getattr(got[-1], c.key) for c in order]
        return stats


def walk_statements(rows: int, page_size: int, pages: int) -> int:
    """Statements a walk over ``rows`` rows sends at the least, at any count: one per page
    it reads (every ``merged()`` sends one at least), and it reads a page more while the
    pages are full. The rows are the same at every count (the merge is exact): so is this."""
    return min(pages, rows // page_size + 1)


def read_cost(
    layout: Layout, sample: Sample, count: int, *, k: int, page_size: int, pages: int,
    tenant: Any = None,
) -> tuple[MergeStats, MergeStats]:  # fmt: skip
    """Run the reads on the sample with ``count`` shards: (newest-k stats, page walk stats)."""
    with Reads(layout, sample, count, tenant) as reads:
        return reads.newest(k), reads.walk(page_size, pages)
