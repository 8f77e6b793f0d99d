"""The modelled Spanner instance: key spaces, their splits, splitting and placement.

The instance is a **model**, not Spanner. Its assumptions, all parameters of
:class:`Instance` (see ``docs/hotspots.md`` for the sources):

* every table and index is its own key space, cut into splits (key ranges); a split is
  served by one node at a time;
* an existing table starts with ``initial_splits_per_node x nodes`` splits at the quantiles
  of its existing rows (``Workload.history``); an empty one starts with one split;
* load-based splitting: a split whose write rate stays above ``load_split_threshold`` of a
  node's capacity for ``load_split_after`` seconds is cut at the median key of its recent
  writes (Spanner calls a split *warm* at 50 % of its server's resources);
* size-based splitting: a split holding more than ``split_size_bytes`` (rows x
  ``row_bytes``) is cut at its median;
* placement is idealised: after every tick the splits are re-packed onto nodes by their
  last tick's load (largest first onto the least-loaded node), so the imbalance reported
  is the part that *no placement can fix*: the part caused by the keys;
* load is offered load: nothing is throttled; a node above ``node_capacity`` writes/s is
  reported as overloaded for that tick.
"""

from __future__ import annotations

import datetime as dt
import json
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from sqlalchemy import Column, Index, Table
from sqlalchemy import types as sqltypes

from sharded_orm.checks import check_seconds
from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.schema.coerce import base_type
from sharded_orm.schema.keys import is_descending
from sharded_orm.tools.lint import index_parts
from sharded_orm.tools.simulate.limits import MAX_BUCKETS, MAX_NODES, MAX_SPLITS
from sharded_orm.tools.simulate.workload import UTC, check_number

GIB = 1 << 30
INVERT = bytes(255 - i for i in range(256))
#: a split at this CPU_USAGE_SCORE or above is reported by Spanner's split statistics
WARM_SCORE = 50


@dataclass(frozen=True)
class Instance:
    """The modelled Spanner instance; the defaults and their sources are in docs/hotspots.md."""

    nodes: int = 3
    #: writes/s one node sustains: Spanner's documented peak for a regional instance, 1 KB rows
    node_capacity: float = 3500.0
    #: seconds per measurement window (the heatmap's time resolution)
    tick: float = 10.0
    initial_splits_per_node: int = 2
    #: a split above this fraction of ``node_capacity`` is warm (Spanner: 50 %)
    load_split_threshold: float = 0.5
    #: seconds a split stays warm before it is cut
    load_split_after: float = 60.0
    #: size-based split threshold ("a few GiB" per the schema design best practices)
    split_size_bytes: int = 4 * GIB
    row_bytes: int = 1024
    #: key-space rows of the heatmap, per table or index
    heatmap_buckets: int = 48

    def __post_init__(self) -> None:
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int):
            raise ShardTypeError(f"nodes must be an int, got {self.nodes!r}")
        if self.nodes < 1:
            raise ShardConfigError(f"an instance needs at least 1 node, got nodes={self.nodes}")
        check_number("node_capacity", self.node_capacity)
        if isinstance(self.tick, bool) or not isinstance(self.tick, (int, float)):
            raise ShardTypeError(f"tick must be a number of seconds, got {self.tick!r}")
        check_seconds(self.tick, "tick")  # the library's one rule for durations
        check_number("initial_splits_per_node", self.initial_splits_per_node, integer=True)
        check_number("load_split_threshold", self.load_split_threshold)
        check_number("load_split_after", self.load_split_after, minimum=-1.0)
        if self.load_split_after:
            check_seconds(self.load_split_after, "load_split_after")
        check_number("split_size_bytes", self.split_size_bytes, integer=True)
        check_number("row_bytes", self.row_bytes, integer=True)
        check_number("heatmap_buckets", self.heatmap_buckets, integer=True)
        for what, value, most in (
            ("nodes", self.nodes, MAX_NODES),
            ("nodes x initial_splits_per_node", self.nodes * self.initial_splits_per_node,
             MAX_SPLITS),
            ("heatmap_buckets", self.heatmap_buckets, MAX_BUCKETS),
        ):  # fmt: skip
            if value > most:
                raise ShardConfigError(
                    f"{what}={value:,} is more than the simulator models ({most:,})"
                )
        if self.node_capacity < 1:
            raise ShardConfigError(
                f"node_capacity must be at least 1 write/s, got {self.node_capacity!r}"
            )
        if self.row_bytes > self.split_size_bytes:
            raise ShardConfigError(
                f"row_bytes={self.row_bytes:,} is more than split_size_bytes="
                f"{self.split_size_bytes:,}: every split would be cut at every tick"
            )


# --------------------------------------------------------------------------- keys


def desc_transform(col: Column[Any]) -> Callable[[Any], Any]:
    """A function turning ascending values into ones that sort in reverse."""
    t = base_type(col.type)
    if isinstance(t, sqltypes.DateTime):
        return lambda v: -v.timestamp()
    if isinstance(t, sqltypes.Date):
        return lambda v: -v.toordinal()
    if isinstance(t, (sqltypes.Integer, sqltypes.Numeric, sqltypes.Boolean)):
        return lambda v: -v
    if isinstance(t, sqltypes.LargeBinary):
        return lambda v: _descending_bytes(bytes(v))
    return lambda v: _descending_bytes(str(v).encode())


def _descending_bytes(b: bytes) -> bytes:
    """Bytes that sort in reverse: escape 0x00, end with 00 00, invert every byte.

    The terminator sorts below any escaped byte, so no encoding is a prefix of another and
    inverting the bytes reverses the order exactly (a plain invert + terminator put '' after
    '\\x00')."""
    return (b.replace(b"\x00", b"\x00\xff") + b"\x00\x00").translate(INVERT)


def space_index_parts(index: Index) -> list[tuple[Column[Any], bool]]:
    try:
        return index_parts(index)
    except ShardConfigError as exc:
        raise ShardConfigError(f"{exc}; the simulator needs plain columns") from None


class KeySpace:
    """One key space (a table or an index) and its splits."""

    def __init__(self, name: str, kind: str, parts: list[tuple[Column[Any], bool]]) -> None:
        self.name = name
        #: the name Spanner gives the key space in split keys: the table's or the index's
        self.spanner_name = name.split(".", 1)[-1]
        self.kind = kind
        self.parts = parts
        self.columns = [c for c, _ in parts]
        getter = itemgetter(*self.columns)
        transforms = [(desc_transform(c) if d else None) for c, d in parts]
        key: Callable[[dict[Any, Any]], Any]
        if not any(transforms):
            key = (lambda row: (getter(row),)) if len(parts) == 1 else getter
        else:

            def key(row: dict[Any, Any]) -> Any:
                vals = (getter(row),) if len(parts) == 1 else getter(row)
                return tuple(
                    v if f is None else f(v) for v, f in zip(vals, transforms, strict=True)
                )

        self.key = key
        self.bounds: list[Any] = []  # lower bounds of splits 1..n-1 (split 0 is unbounded)
        self.split_ids: list[int] = []
        self.counts: list[int] = []
        self.rows: list[float] = []
        self.sample: list[Any] = []
        self.bucket_bounds: list[Any] = []
        self.bucket_offset = 0


def spaces_of(table: Table) -> list[KeySpace]:
    pk = list(table.primary_key.columns)
    if not pk:
        raise ShardConfigError(f"table {table.name!r} has no primary key to simulate")
    spaces = [KeySpace(table.name, "table", [(c, is_descending(c)) for c in pk])]
    for index in sorted(table.indexes, key=lambda i: str(i.name)):
        parts = space_index_parts(index)
        opts: Any = index.dialect_options.get("spanner", {})
        parent = opts.get("interleave_in")
        if parent:
            # stored under the parent's rows: the table's leading key columns come first
            lead = [(c, is_descending(c)) for c in pk if c not in {p for p, _ in parts}]
            n_parent = parent_key_len(table, str(parent))
            parts = lead[:n_parent] + parts
        spaces.append(KeySpace(f"{table.name}.{index.name}", "index", parts))
    return spaces


def parent_key_len(table: Table, parent: str) -> int:
    md = table.metadata
    for t in md.tables.values():
        if t.name == parent:
            return len(t.primary_key.columns)
    return 1


def quantiles(keys: list[Any], n: int) -> list[Any]:
    """``n - 1`` distinct cut points splitting sorted ``keys`` into ``n`` near-equal parts."""
    if n <= 1 or not keys:
        return []
    out: list[Any] = []
    for i in range(1, n):
        k = keys[i * len(keys) // n]
        if (not out or k > out[-1]) and k > keys[0]:
            out.append(k)
    return out


def desc_inverse(col: Column[Any]) -> Callable[[Any], Any]:
    """The inverse of :func:`desc_transform`: a stored descending value back to the value."""
    t = base_type(col.type)
    if isinstance(t, sqltypes.DateTime):
        return lambda v: dt.datetime.fromtimestamp(-v, UTC)
    if isinstance(t, sqltypes.Date):
        return lambda v: dt.date.fromordinal(-v)
    if isinstance(t, (sqltypes.Integer, sqltypes.Numeric, sqltypes.Boolean)):
        return lambda v: -v
    if isinstance(t, sqltypes.LargeBinary):
        return _ascending_bytes
    return lambda v: _ascending_bytes(v).decode()


def _ascending_bytes(v: bytes) -> bytes:
    """The inverse of :func:`_descending_bytes`."""
    return bytes(v).translate(INVERT)[:-2].replace(b"\x00\xff", b"\x00")


def key_part_text(value: Any) -> str:
    """One key part as the split statistics print it: numbers bare, strings quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, dt.datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return "b" + json.dumps(value.decode("latin-1"))
    return json.dumps(str(value))


def key_text(space: KeySpace, key: Any) -> str:
    """A key of ``space`` in the split statistics' format, e.g. ``Users(7,"abc")``."""
    parts = []
    for (col, desc), value in zip(space.parts, key, strict=True):
        parts.append(key_part_text(desc_inverse(col)(value) if desc else value))
    return f"{space.spanner_name}({','.join(parts)})"


@dataclass(frozen=True)
class HotSplit:
    """One split above ``WARM_SCORE`` in one tick, its keys in the statistics' format."""

    tick: int
    space: str
    start: str
    limit: str
    score: int
    writes: int


class SplitModel:
    """The key spaces of one table, their splits, and the nodes serving them."""

    def __init__(self, spaces: list[KeySpace], instance: Instance) -> None:
        self.spaces = spaces
        self.inst = instance
        self.split_node: dict[int, int] = {}
        self.split_space: dict[int, str] = {}
        self.warm: dict[int, float] = {}
        self.next_split = 0
        self.hot: list[HotSplit] = []

    def new_split(self, space: KeySpace, node: int) -> int:
        sid = self.next_split
        self.next_split += 1
        self.split_node[sid] = node
        self.split_space[sid] = space.name
        return sid

    def _record_hot(self, tick: int, seconds: float) -> None:
        """Splits Spanner would report in SPLIT_STATS_TOP_*: CPU score >= 50 this tick."""
        capacity = self.inst.node_capacity
        for n, sp in enumerate(self.spaces):
            after = f"{self.spaces[n + 1].spanner_name}()" if n + 1 < len(self.spaces) else "<end>"
            for j, c in enumerate(sp.counts):
                score = 100.0 * c / seconds / capacity
                if score < WARM_SCORE:
                    continue
                start = key_text(sp, sp.bounds[j - 1]) if j else f"{sp.spanner_name}()"
                limit = key_text(sp, sp.bounds[j]) if j < len(sp.bounds) else after
                hot = HotSplit(tick, sp.name, start, limit, min(100, int(score)), c)
                self.hot.append(hot)

    def end_tick(
        self,
        node_writes: list[list[int]],
        split_writes: list[dict[int, int]],
        seconds: float,
    ) -> None:
        """Count the tick's writes per node, cut warm or big splits, re-place the splits."""
        inst = self.inst
        nodes = [0] * inst.nodes
        per_split: dict[int, int] = {}
        load: dict[int, float] = {}
        for sp in self.spaces:
            for sid, c in zip(sp.split_ids, sp.counts, strict=True):
                if c:
                    per_split[sid] = c
                    nodes[self.split_node[sid]] += c
        self._record_hot(len(node_writes), seconds)
        node_writes.append(nodes)
        split_writes.append(per_split)
        warm_rate = inst.load_split_threshold * inst.node_capacity
        max_rows = inst.split_size_bytes / inst.row_bytes
        for sp in self.spaces:
            sample = sorted(sp.sample)
            sp.sample.clear()
            j = 0
            while j < len(sp.split_ids):
                sid = sp.split_ids[j]
                c = sp.counts[j]
                sp.rows[j] += c
                rate = c / seconds
                if rate > warm_rate:
                    self.warm[sid] = self.warm.get(sid, 0.0) + seconds
                else:
                    self.warm.pop(sid, None)
                cut = self.warm.get(sid, 0.0) >= inst.load_split_after or sp.rows[j] > max_rows
                if cut and self._cut(sp, j, sid, c, sample, load):
                    j += 2
                    continue
                load[sid] = c
                j += 1
        self._rebalance(load)
        for sp in self.spaces:
            for j in range(len(sp.counts)):
                sp.counts[j] = 0

    def _cut(
        self, sp: KeySpace, j: int, sid: int, c: int, sample: list[Any], load: dict[int, float]
    ) -> bool:
        """Cut split ``j`` of ``sp`` at the median of its sampled keys, if it has one."""
        lo = sp.bounds[j - 1] if j > 0 else None
        hi = sp.bounds[j] if j < len(sp.bounds) else None
        a = 0 if lo is None else bisect_left(sample, lo)
        b = len(sample) if hi is None else bisect_left(sample, hi)
        inside = sample[a:b]
        mid = inside[len(inside) // 2] if inside else None
        if mid is None or (lo is not None and mid <= lo) or (hi is not None and mid >= hi):
            return False
        frac = bisect_left(inside, mid) / len(inside)
        new = self.new_split(sp, self.split_node[sid])
        sp.bounds.insert(j, mid)
        sp.split_ids.insert(j + 1, new)
        sp.counts.insert(j + 1, int(c * (1 - frac)))
        sp.counts[j] = c - sp.counts[j + 1]
        sp.rows.insert(j + 1, sp.rows[j] * (1 - frac))
        sp.rows[j] *= frac
        self.warm.pop(sid, None)
        load[new] = sp.counts[j + 1]
        load[sid] = sp.counts[j]
        return True

    def _rebalance(self, load: dict[int, float]) -> None:
        """Idealised placement: largest loaded split first onto the least-loaded node."""
        busy = sorted((v, sid) for sid, v in load.items() if v > 0)
        if not busy:
            return
        node_load = [0.0] * self.inst.nodes
        for v, sid in reversed(busy):
            n = min(range(len(node_load)), key=node_load.__getitem__)
            self.split_node[sid] = n
            node_load[n] += v
