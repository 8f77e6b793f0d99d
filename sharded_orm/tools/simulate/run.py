"""The run loop: one workload through one table's key spaces, tick by tick."""

from __future__ import annotations

import random
import time
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from typing import Any

from sqlalchemy import Column, Table

from sharded_orm.progress import Mode, Progress, progress
from sharded_orm.tools.simulate.instance import Instance, KeySpace, SplitModel, quantiles, spaces_of
from sharded_orm.tools.simulate.results import SimulationResult
from sharded_orm.tools.simulate.workload import EPOCH, ONE_US, RowMaker, Workload


def key_columns(spaces: list[KeySpace]) -> list[Column[Any]]:
    """The columns of every key space, once each: what a RowMaker must fill."""
    needed: list[Column[Any]] = []
    for sp in spaces:
        for c in sp.columns:
            if c not in needed:
                needed.append(c)
    return needed


def rows_at(
    maker: RowMaker, w: Workload, rng: random.Random, numbers: Iterable[int]
) -> Iterator[dict[Any, Any]]:
    """The ``i``-th new row of ``w`` for each ``i`` of ``numbers``: written at its time, with
    the counter value after the history's rows."""
    start_us = (w.start - EPOCH) // ONE_US
    rate = float(w.rows_per_second)
    us_per_row = 1e6 / rate
    first = int(rate * w.history_seconds) + 1
    for i in numbers:
        yield maker.make(rng, start_us + int(i * us_per_row), first + i)


class Run:
    """One schema under one workload on one modelled instance."""

    def __init__(self, name: str, table: Table, workload: Workload, instance: Instance) -> None:
        self.name = name
        self.table = table
        self.w = workload
        self.inst = instance
        self.spaces = spaces_of(table)
        self.maker = RowMaker(table, workload, key_columns(self.spaces))
        self.model = SplitModel(self.spaces, instance)

    def run(self, progress_mode: Mode = "auto") -> SimulationResult:
        """Write the workload's rows tick by tick, reporting through :mod:`sharded_orm.progress`."""
        with progress(self.w.rows, f"simulate {self.name}", mode=progress_mode) as bar:
            return self._run(bar)

    def _run(self, bar: Progress) -> SimulationResult:
        started = time.perf_counter()
        w, inst = self.w, self.inst
        rng = random.Random(w.seed)
        start_us = (w.start - EPOCH) // ONE_US
        rate = float(w.rows_per_second)
        hist_s = w.history_seconds
        hist_rows = int(rate * hist_s)
        end_us = start_us + int(w.duration * 1e6)
        # a sample of the data that exists (initial splits) and will exist (heatmap rows)
        n_sample = 4000
        hist_keys: list[list[Any]] = [[] for _ in self.spaces]
        all_keys: list[list[Any]] = [[] for _ in self.spaces]
        srng = random.Random(w.seed + 1)
        hist_start_us = start_us - int(hist_s * 1e6)
        for i in range(n_sample):
            in_history = hist_rows > 0 and i % 2 == 0
            if in_history:
                t_us = srng.randrange(hist_start_us, start_us)
                counter = 1 + int((t_us - hist_start_us) * rate / 1e6)
            else:
                t_us = srng.randrange(start_us, end_us)
                counter = hist_rows + 1 + int((t_us - start_us) * rate / 1e6)
            row = self.maker.make(srng, t_us, counter)
            for j, sp in enumerate(self.spaces):
                k = sp.key(row)
                all_keys[j].append(k)
                if in_history:
                    hist_keys[j].append(k)
        n_initial = inst.nodes * inst.initial_splits_per_node if hist_rows else 1
        node_rr = 0
        offset = 0
        for j, sp in enumerate(self.spaces):
            hk = sorted(hist_keys[j])
            sp.bounds = quantiles(hk, n_initial)
            n = len(sp.bounds) + 1
            sp.split_ids = []
            for _ in range(n):
                sp.split_ids.append(self.model.new_split(sp, node_rr % inst.nodes))
                node_rr += 1
            sp.counts = [0] * n
            sp.rows = [hist_rows / n] * n
            sp.bucket_bounds = quantiles(sorted(all_keys[j]), inst.heatmap_buckets)
            sp.bucket_offset = offset
            offset += len(sp.bucket_bounds) + 1
        n_buckets = offset

        rows_total = w.rows
        tick_rows = max(1, int(round(rate * inst.tick)))
        node_writes: list[list[int]] = []
        split_writes: list[dict[int, int]] = []
        heat: list[list[int]] = []
        spaces = self.spaces
        plan = [
            (sp.key, sp.bounds, sp.counts, sp.bucket_bounds, sp.bucket_offset, sp.sample)
            for sp in spaces
        ]

        def row_source() -> Iterable[dict[Any, Any]]:
            if w.insert_order == "time":
                yield from rows_at(self.maker, w, rng, range(rows_total))
            elif w.insert_order == "random":
                order = list(range(rows_total))
                rng.shuffle(order)
                yield from rows_at(self.maker, w, rng, order)
            else:
                rows = list(rows_at(self.maker, w, rng, range(rows_total)))
                rows.sort(key=spaces[0].key)
                yield from rows

        source = iter(row_source())
        done = 0
        n_spaces = len(spaces)
        while done < rows_total:
            n = min(tick_rows, rows_total - done)
            hb = [0] * n_buckets
            stride = 8 if n >= 2048 else 1
            for i in range(n):
                row = next(source)
                sample_it = i % stride == 0
                for key_of, bounds, counts, bbounds, boff, sample in plan:
                    k = key_of(row)
                    counts[bisect_right(bounds, k)] += 1
                    hb[boff + bisect_right(bbounds, k)] += 1
                    if sample_it:
                        sample.append(k)
            done += n
            bar.advance(n)
            seconds = inst.tick * n / tick_rows
            heat.append(hb)
            self.model.end_tick(node_writes, split_writes, seconds)
        table_writes = done
        return SimulationResult(
            name=self.name,
            table=self.table.name,
            spaces=[sp.name for sp in spaces],
            tick=inst.tick,
            nodes=inst.nodes,
            node_capacity=inst.node_capacity,
            writes=table_writes * n_spaces,
            table_writes=table_writes,
            index_writes=table_writes * (n_spaces - 1),
            node_writes=node_writes,
            split_writes=split_writes,
            split_space=dict(self.model.split_space),
            heatmap=heat,
            space_buckets=[
                (sp.name, sp.bucket_offset, sp.bucket_offset + len(sp.bucket_bounds) + 1)
                for sp in spaces
            ],
            splits=sum(len(sp.split_ids) for sp in spaces),
            elapsed=time.perf_counter() - started,
            start=w.start,
            hot_splits=list(self.model.hot),
        )
