"""A split simulator: where a schema's writes land, before production does it for you.

Spanner's Key Visualizer shows a hotspot only after real traffic has hit it. This module
replays a described workload through the *real* models: rows get their shard columns from
``ShardColumn.compute`` (the function the write hooks use), bit-reversed ids from
``sharded_orm.bit_reverse``, and every key is ordered as the table's primary key or the
index orders it, descending parts included. Each row is one table write plus one write per
secondary index (indexes are tables of their own on Spanner).

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
  last tick's load (largest first onto the least-loaded node). Real Spanner moves splits
  more slowly, so the imbalance reported is the part that *no placement can fix*: the
  part caused by the keys;
* load is offered load: nothing is throttled; a node above ``node_capacity`` writes/s is
  reported as overloaded for that tick.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import time
import uuid
import zlib
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Identity, Index, Table
from sqlalchemy import Sequence as SASequence
from sqlalchemy import types as sqltypes

from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.schema.columns import ShardColumn, shard_columns, table_of
from sharded_orm.schema.keys import is_descending

ROLES = (
    "time",
    "tenant",
    "user",
    "uuid4",
    "uuid7",
    "counter",
    "bit_reversed",
    "random",
    "constant",
)
INSERT_ORDERS = ("time", "key", "random")
#: Rows above which ``insert_order="key"`` refuses to materialise and sort the data set.
MAX_SORTED_ROWS = 3_000_000
MAX_ROWS = 50_000_000
GIB = 1 << 30
_UTC = dt.timezone.utc
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)
_ONE_US = dt.timedelta(microseconds=1)
_INVERT = bytes(255 - i for i in range(256))
_TENANT_HINTS = ("company", "tenant", "org", "customer", "account")


def _number(name: str, value: object, *, integer: bool = False, minimum: float = 0.0) -> None:
    ok_types: tuple[type, ...] = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_types):
        kind = "an int" if integer else "a number"
        raise ShardTypeError(f"{name} must be {kind}, got {value!r}")
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number) or number <= minimum:
        raise ShardConfigError(f"{name} must be > {minimum:g}, got {value!r}")


@dataclass(frozen=True)
class Workload:
    """What is written: how fast, for how long, by whom, in which order.

    - ``rows_per_second`` x ``duration`` (seconds) rows are written to the table.
    - ``tenants`` tenants; tenant ``k`` (1-based rank) writes in proportion to
      ``1 / k**zipf`` (``zipf=0``: all equal), or to ``tenant_weights`` if given
      (one weight per tenant, e.g. ``(1, 3, 1)``: the second writes 3x the others).
    - ``users_per_tenant`` users per tenant; each row is written by a random user of its
      tenant. User ids are spread over their type's range, as UUIDs or random INT64s are.
    - ``insert_order``: ``"time"`` (live traffic: a row's timestamp is its write time),
      ``"key"`` (a bulk load of the same rows sorted by primary key) or ``"random"``
      (the same rows shuffled).
    - ``history``: seconds of rows that already exist at the same rate (default: as long
      as ``duration`` for live traffic, none for a bulk load). They set the initial splits.
    - ``roles``: column name -> how its values are made (one of ``ROLES``); columns not
      named get a role from their type and name (see ``docs/hotspots.md``).
    """

    rows_per_second: float
    duration: float
    tenants: int = 1
    zipf: float = 0.0
    tenant_weights: tuple[float, ...] | None = None
    users_per_tenant: int = 1000
    insert_order: str = "time"
    history: float | None = None
    roles: Mapping[str, str] = field(default_factory=dict)
    seed: int = 0
    start: dt.datetime = dt.datetime(2024, 1, 1, tzinfo=_UTC)

    def __post_init__(self) -> None:
        _number("rows_per_second", self.rows_per_second)
        _number("duration", self.duration)
        _number("tenants", self.tenants, integer=True)
        _number("users_per_tenant", self.users_per_tenant, integer=True)
        if isinstance(self.zipf, bool) or not isinstance(self.zipf, (int, float)):
            raise ShardTypeError(f"zipf must be a number, got {self.zipf!r}")
        if not math.isfinite(self.zipf) or self.zipf < 0:
            raise ShardConfigError(f"zipf must be >= 0 (0: no skew), got {self.zipf!r}")
        if self.tenant_weights is not None:
            weights = tuple(self.tenant_weights)
            object.__setattr__(self, "tenant_weights", weights)
            if len(weights) != self.tenants:
                raise ShardConfigError(
                    f"tenant_weights has {len(weights)} weights for {self.tenants} tenants: "
                    "give one weight per tenant"
                )
            for w in weights:
                _number("each tenant weight", w)
            if self.zipf:
                raise ShardConfigError("give tenant_weights or zipf, not both")
        if self.insert_order not in INSERT_ORDERS:
            raise ShardConfigError(
                f"insert_order must be one of {', '.join(INSERT_ORDERS)}, got {self.insert_order!r}"
            )
        if self.history is not None:
            if isinstance(self.history, bool) or not isinstance(self.history, (int, float)):
                raise ShardTypeError(f"history must be a number of seconds, got {self.history!r}")
            if not math.isfinite(self.history) or self.history < 0:
                raise ShardConfigError(f"history must be >= 0 seconds, got {self.history!r}")
        rows = self.rows
        if rows < 1:
            raise ShardConfigError(
                f"rows_per_second x duration = {self.rows_per_second * self.duration:g}: "
                "less than one row; raise either"
            )
        if rows > MAX_ROWS:
            raise ShardConfigError(f"{rows} rows is more than the simulator takes ({MAX_ROWS})")
        if self.insert_order == "key" and rows > MAX_SORTED_ROWS:
            raise ShardConfigError(
                f'insert_order="key" sorts all {rows} rows in memory; keep it under '
                f"{MAX_SORTED_ROWS} rows"
            )
        for col, role in dict(self.roles).items():
            if role not in ROLES:
                raise ShardConfigError(
                    f"role {role!r} for column {col!r} is not one of {', '.join(ROLES)}"
                )
        if not isinstance(self.start, dt.datetime) or self.start.utcoffset() is None:
            raise ShardTypeError(f"start must be a timezone-aware datetime, got {self.start!r}")

    @property
    def rows(self) -> int:
        return int(round(self.rows_per_second * self.duration))

    @property
    def history_seconds(self) -> float:
        if self.history is not None:
            return float(self.history)
        return float(self.duration) if self.insert_order == "time" else 0.0

    def weights(self) -> list[float]:
        if self.tenant_weights is not None:
            return [float(w) for w in self.tenant_weights]
        return [1.0 / (k**self.zipf) for k in range(1, self.tenants + 1)]


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
        _number("node_capacity", self.node_capacity)
        _number("tick", self.tick)
        _number("initial_splits_per_node", self.initial_splits_per_node, integer=True)
        _number("load_split_threshold", self.load_split_threshold)
        _number("load_split_after", self.load_split_after, minimum=-1.0)
        _number("split_size_bytes", self.split_size_bytes, integer=True)
        _number("row_bytes", self.row_bytes, integer=True)
        _number("heatmap_buckets", self.heatmap_buckets, integer=True)


# --------------------------------------------------------------------------- keys


def _base_type(col: Column[Any]) -> Any:
    t = col.type
    return t.impl_instance if isinstance(t, sqltypes.TypeDecorator) else t


def _uuid_default_version(col: Column[Any]) -> int | None:
    from sharded_orm.tools.lint import uuid_default_version

    return uuid_default_version(col)


def guess_role(col: Column[Any]) -> str:
    """The role a column plays when the workload does not name one."""
    t = _base_type(col)
    name = col.name.lower()
    if isinstance(t, (sqltypes.DateTime, sqltypes.Date)):
        return "time"
    if any(h in name for h in _TENANT_HINTS):
        return "tenant"
    if "user" in name:
        return "user"
    if isinstance(t, sqltypes.Integer):
        from sharded_orm.tools.lint import counter_reason, default_function

        if counter_reason(col):
            return "counter"
        if isinstance(col.default, SASequence) or isinstance(col.identity, Identity):
            return "bit_reversed"  # Spanner's sequences and IDENTITY are bit_reversed_positive
        if col.primary_key and col.autoincrement is True:
            return "bit_reversed"
        owner = getattr(default_function(col), "__self__", None)
        if type(owner).__name__ == "TableSequence" or (col.primary_key and col.name == "id"):
            return "bit_reversed" if getattr(owner, "bit_reversed", False) else "counter"
        return "random"
    version = _uuid_default_version(col)
    if version in (1, 6, 7):
        return "uuid7"
    return "uuid4"


def _desc_transform(col: Column[Any]) -> Callable[[Any], Any]:
    """A function turning ascending values into ones that sort in reverse."""
    t = _base_type(col)
    if isinstance(t, sqltypes.DateTime):
        return lambda v: -v.timestamp()
    if isinstance(t, sqltypes.Date):
        return lambda v: -v.toordinal()
    if isinstance(t, (sqltypes.Integer, sqltypes.Numeric, sqltypes.Boolean)):
        return lambda v: -v
    if isinstance(t, sqltypes.LargeBinary):
        return lambda v: bytes(v).translate(_INVERT) + b"\xff"
    return lambda v: str(v).encode().translate(_INVERT) + b"\xff"


def _index_parts(index: Index) -> list[tuple[Column[Any], bool]]:
    from sharded_orm.tools.lint import index_parts

    try:
        return index_parts(index)
    except ShardConfigError as exc:
        raise ShardConfigError(f"{exc}; the simulator needs plain columns") from None


class _Space:
    """One key space (a table or an index) and its splits."""

    def __init__(self, name: str, kind: str, parts: list[tuple[Column[Any], bool]]) -> None:
        self.name = name
        self.kind = kind
        self.parts = parts
        self.columns = [c for c, _ in parts]
        getter = itemgetter(*self.columns)
        transforms = [(_desc_transform(c) if d else None) for c, d in parts]
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


# --------------------------------------------------------------------------- row maker


class _RowMaker:
    """Makes row values exactly as the application and the library would write them."""

    def __init__(self, table: Table, workload: Workload, needed: Iterable[Column[Any]]) -> None:
        self.table = table
        self.workload = workload
        shards = {sc.column: sc for sc in shard_columns(table)}
        plan_cols: list[Column[Any]] = []
        shard_plan: list[ShardColumn] = []

        def need(col: Column[Any]) -> None:
            if col in plan_cols:
                return
            sc = shards.get(col)
            if sc is not None:
                for s in sc.sources:
                    need(s)
                if sc not in shard_plan:
                    shard_plan.append(sc)
                return
            plan_cols.append(col)

        for col in needed:
            need(col)
        roles = dict(workload.roles)
        known = {c.name for c in table.columns} | {c.key for c in table.columns}
        for name in roles:
            if name not in known:
                raise ShardConfigError(
                    f"workload role for {name!r}: no such column in table {table.name!r} "
                    f"(columns: {', '.join(c.name for c in table.columns)})"
                )
        self.roles: list[tuple[Column[Any], str]] = []
        for col in plan_cols:
            role = roles.get(col.name) or roles.get(col.key) or guess_role(col)
            self.roles.append((col, role))
        self.shard_plan = [
            (
                sc.column,
                sc.compute,
                itemgetter(*sc.sources) if len(sc.sources) > 1 else _one(sc.sources[0]),
            )
            for sc in shard_plan
        ]
        weights = workload.weights()
        total = sum(weights)
        acc = 0.0
        self.cum: list[float] = []
        for w in weights:
            acc += w / total
            self.cum.append(acc)
        self.cum[-1] = 1.0 + 1e-12
        self.user_cache: dict[int, Any] = {}
        self.tenant_values: dict[Column[Any], list[Any]] = {}
        self.converters: list[tuple[Column[Any], str, Any]] = []
        for col, role in self.roles:
            t = _base_type(col)
            is_int = isinstance(t, sqltypes.Integer)
            if role == "tenant":
                self.tenant_values[col] = [
                    (k + 1) if is_int else f"tenant-{k + 1:05d}" for k in range(workload.tenants)
                ]
            self.converters.append((col, role, t))
        from sharded_orm.ids.mixins import bit_reverse  # the library's own function

        self.bit_reverse = bit_reverse

    def make(self, rng: random.Random, t_us: int, counter: int) -> dict[Any, Any]:
        """One row written at ``t_us`` (microseconds since the epoch)."""
        rnd = rng.random()
        tenant = bisect_right(self.cum, rnd)
        upt = self.workload.users_per_tenant
        user_n = tenant * upt + int(rng.random() * upt)
        ts = _EPOCH + dt.timedelta(microseconds=t_us)
        row: dict[Any, Any] = {}
        for col, role, t in self.converters:
            if role == "time":
                row[col] = ts if isinstance(t, sqltypes.DateTime) else ts.date()
            elif role == "tenant":
                row[col] = self.tenant_values[col][tenant]
            elif role == "user":
                row[col] = self._user(user_n, t)
            elif role == "uuid4":
                v = uuid.UUID(int=rng.getrandbits(128), version=4)
                row[col] = v if isinstance(t, sqltypes.Uuid) else str(v)
            elif role == "uuid7":
                v = _uuid7(t_us, rng)
                row[col] = v if isinstance(t, sqltypes.Uuid) else str(v)
            elif role == "counter":
                row[col] = counter
            elif role == "bit_reversed":
                row[col] = self.bit_reverse(counter)
            elif role == "random":
                if isinstance(t, sqltypes.Integer):
                    row[col] = rng.getrandbits(63)
                else:
                    row[col] = f"{rng.getrandbits(64):016x}"
            else:  # constant
                row[col] = 0 if isinstance(t, sqltypes.Integer) else "constant"
        for col, compute, get in self.shard_plan:
            row[col] = compute(get(row))
        return row

    def _user(self, n: int, t: Any) -> Any:
        key = n if isinstance(t, sqltypes.Integer) else -1 - n
        v = self.user_cache.get(key)
        if v is None:
            h = zlib.crc32(n.to_bytes(8, "big"))
            # spread like random INT64s or UUIDs would be, and still unique
            v = (
                (h << 31) | (n & 0x7FFFFFFF)
                if isinstance(t, sqltypes.Integer)
                else f"{h:08x}-{n:06d}"
            )
            self.user_cache[key] = v
        return v


def _one(col: Column[Any]) -> Callable[[dict[Any, Any]], tuple[Any]]:
    return lambda row: (row[col],)


def _uuid7(t_us: int, rng: random.Random) -> uuid.UUID:
    ms = t_us // 1000
    value = (ms << 80) | (0x7 << 76) | (rng.getrandbits(12) << 64) | (0b10 << 62)
    return uuid.UUID(int=value | rng.getrandbits(62))


# --------------------------------------------------------------------------- results


@dataclass
class SimulationResult:
    """What one schema did under the workload. Shares are fractions of all writes."""

    name: str
    table: str
    spaces: list[str]
    tick: float
    nodes: int
    node_capacity: float
    writes: int
    table_writes: int
    index_writes: int
    node_writes: list[list[int]]  # [tick][node]
    split_writes: list[dict[int, int]]  # [tick] split id -> writes
    split_space: dict[int, str]
    heatmap: list[list[int]]  # [tick][bucket], buckets grouped by space in ``spaces`` order
    space_buckets: list[tuple[str, int, int]]  # (space, first bucket, end bucket)
    splits: int
    elapsed: float

    @property
    def ticks(self) -> int:
        return len(self.node_writes)

    def node_share_over_time(self) -> list[list[float]]:
        """Per tick, each node's share of that tick's writes."""
        return [[w / max(sum(row), 1) for w in row] for row in self.node_writes]

    def split_share_over_time(self) -> list[dict[int, float]]:
        """Per tick, each written split's share of that tick's writes."""
        out = []
        for d in self.split_writes:
            total = max(sum(d.values()), 1)
            out.append({k: v / total for k, v in d.items()})
        return out

    def _hottest_split_shares(self) -> list[float]:
        return [max(d.values()) / sum(d.values()) for d in self.split_writes if d]

    @property
    def hottest_split_share(self) -> float:
        """Mean over ticks of the hottest split's share of the tick's writes."""
        shares = self._hottest_split_shares()
        return sum(shares) / len(shares) if shares else 0.0

    @property
    def peak_split_share(self) -> float:
        return max(self._hottest_split_shares(), default=0.0)

    def _imbalances(self) -> list[float]:
        return [max(r) * len(r) / sum(r) for r in self.node_writes if sum(r)]

    @property
    def imbalance(self) -> float:
        """Mean over ticks of max / mean node writes (1.0: perfectly even)."""
        values = self._imbalances()
        return sum(values) / len(values) if values else 0.0

    @property
    def peak_imbalance(self) -> float:
        return max(self._imbalances(), default=0.0)

    @property
    def overloaded_seconds(self) -> float:
        """How long the hottest node was above ``node_capacity`` writes/s."""
        limit = self.node_capacity * self.tick
        return sum(self.tick for r in self.node_writes if max(r) > limit)

    @property
    def peak_node_rate(self) -> float:
        return max((max(r) for r in self.node_writes), default=0) / self.tick

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "table": self.table,
            "key_spaces": self.spaces,
            "writes": self.writes,
            "table_writes": self.table_writes,
            "index_writes": self.index_writes,
            "hottest_split_share": round(self.hottest_split_share, 4),
            "peak_split_share": round(self.peak_split_share, 4),
            "imbalance": round(self.imbalance, 3),
            "peak_imbalance": round(self.peak_imbalance, 3),
            "overloaded_seconds": self.overloaded_seconds,
            "peak_node_writes_per_second": round(self.peak_node_rate, 1),
            "splits": self.splits,
            "node_share_over_time": [
                [round(s, 4) for s in row] for row in self.node_share_over_time()
            ],
        }


@dataclass
class Comparison:
    """Several schemas under the same workload and instance."""

    workload: Workload
    instance: Instance
    results: list[SimulationResult]

    def __getitem__(self, name: str) -> SimulationResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def summary(self, *, heat: bool = True) -> str:
        """A terminal table (and a small text heatmap per schema)."""
        w, inst = self.workload, self.instance
        lines = [
            f"workload: {w.rows_per_second:g} rows/s for {w.duration:g} s ({w.rows} rows), "
            f"{w.tenants} tenant(s), order={w.insert_order}; instance: {inst.nodes} node(s) "
            f"x {inst.node_capacity:g} writes/s, tick {inst.tick:g} s",
            f"{'schema':24} {'writes':>9} {'hottest split':>13} {'imbalance':>9} "
            f"{'peak node w/s':>13} {'overloaded':>10} {'splits':>6}",
        ]
        for r in self.results:
            lines.append(
                f"{r.name[:24]:24} {r.writes:>9} {r.hottest_split_share:>12.1%} "
                f"{r.imbalance:>9.2f} {r.peak_node_rate:>13.0f} "
                f"{r.overloaded_seconds:>9.0f}s {r.splits:>6}"
            )
        if heat:
            for r in self.results:
                lines.append("")
                lines.append(f"{r.name}: writes by key range (rows) over time (columns)")
                lines.extend(text_heatmap(r))
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"results": [r.as_dict() for r in self.results]}

    def heatmap(self, path: str | Path) -> Path:
        """Draw the key-visualizer heatmaps side by side into a PNG (needs matplotlib)."""
        from sharded_orm.tools.heatmap import save_heatmap

        return save_heatmap(self, path)


_SHADES = " .:-=+*#%@"


def text_heatmap(result: SimulationResult, width: int = 60, height: int = 16) -> list[str]:
    """A coarse text rendering of the heatmap: darker = more writes."""
    if not result.heatmap:
        return []
    nb = len(result.heatmap[0])
    nt = len(result.heatmap)
    cols = min(width, nt)
    rows = min(height, nb)
    grid = [[0] * cols for _ in range(rows)]
    for t, row in enumerate(result.heatmap):
        c = t * cols // nt
        for b, v in enumerate(row):
            grid[b * rows // nb][c] += v
    peak = max(max(r) for r in grid) or 1
    out = []
    for r in reversed(grid):
        line = "".join(_SHADES[min(9, math.ceil(9 * v / peak))] for v in r)
        out.append(f"  |{line}|")
    return out


# --------------------------------------------------------------------------- the engine


def _spaces_of(table: Table) -> list[_Space]:
    pk = list(table.primary_key.columns)
    if not pk:
        raise ShardConfigError(f"table {table.name!r} has no primary key to simulate")
    spaces = [_Space(table.name, "table", [(c, is_descending(c)) for c in pk])]
    for index in sorted(table.indexes, key=lambda i: str(i.name)):
        parts = _index_parts(index)
        opts: Any = index.dialect_options.get("spanner", {})
        parent = opts.get("interleave_in")
        if parent:
            # stored under the parent's rows: the table's leading key columns come first
            lead = [(c, is_descending(c)) for c in pk if c not in {p for p, _ in parts}]
            n_parent = _parent_key_len(table, str(parent))
            parts = lead[:n_parent] + parts
        spaces.append(_Space(f"{table.name}.{index.name}", "index", parts))
    return spaces


def _parent_key_len(table: Table, parent: str) -> int:
    md = table.metadata
    for t in md.tables.values():
        if t.name == parent:
            return len(t.primary_key.columns)
    return 1


def _quantiles(keys: list[Any], n: int) -> list[Any]:
    """``n - 1`` distinct cut points splitting sorted ``keys`` into ``n`` near-equal parts."""
    if n <= 1 or not keys:
        return []
    out: list[Any] = []
    for i in range(1, n):
        k = keys[i * len(keys) // n]
        if (not out or k > out[-1]) and k > keys[0]:
            out.append(k)
    return out


class _Engine:
    def __init__(self, name: str, table: Table, workload: Workload, instance: Instance) -> None:
        self.name = name
        self.table = table
        self.w = workload
        self.inst = instance
        self.spaces = _spaces_of(table)
        needed: list[Column[Any]] = []
        for sp in self.spaces:
            for c in sp.columns:
                if c not in needed:
                    needed.append(c)
        self.maker = _RowMaker(table, workload, needed)
        self.split_node: dict[int, int] = {}
        self.split_space: dict[int, str] = {}
        self.warm: dict[int, float] = {}
        self.next_split = 0

    def _new_split(self, space: _Space, node: int) -> int:
        sid = self.next_split
        self.next_split += 1
        self.split_node[sid] = node
        self.split_space[sid] = space.name
        return sid

    def run(self) -> SimulationResult:
        started = time.perf_counter()
        w, inst = self.w, self.inst
        rng = random.Random(w.seed)
        start_us = (w.start - _EPOCH) // _ONE_US
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
            sp.bounds = _quantiles(hk, n_initial)
            n = len(sp.bounds) + 1
            sp.split_ids = []
            for _ in range(n):
                sp.split_ids.append(self._new_split(sp, node_rr % inst.nodes))
                node_rr += 1
            sp.counts = [0] * n
            sp.rows = [hist_rows / n] * n
            sp.bucket_bounds = _quantiles(sorted(all_keys[j]), inst.heatmap_buckets)
            sp.bucket_offset = offset
            offset += len(sp.bucket_bounds) + 1
        n_buckets = offset

        rows_total = w.rows
        tick_rows = max(1, int(round(rate * inst.tick)))
        node_writes: list[list[int]] = []
        split_writes: list[dict[int, int]] = []
        heat: list[list[int]] = []
        make = self.maker.make
        spaces = self.spaces
        plan = [
            (sp.key, sp.bounds, sp.counts, sp.bucket_bounds, sp.bucket_offset, sp.sample)
            for sp in spaces
        ]
        us_per_row = 1e6 / rate

        def row_source() -> Iterable[dict[Any, Any]]:
            if w.insert_order == "time":
                for i in range(rows_total):
                    yield make(rng, start_us + int(i * us_per_row), hist_rows + 1 + i)
            elif w.insert_order == "random":
                order = list(range(rows_total))
                rng.shuffle(order)
                for i in order:
                    yield make(rng, start_us + int(i * us_per_row), hist_rows + 1 + i)
            else:
                rows = [
                    make(rng, start_us + int(i * us_per_row), hist_rows + 1 + i)
                    for i in range(rows_total)
                ]
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
            seconds = inst.tick * n / tick_rows
            heat.append(hb)
            self._end_tick(node_writes, split_writes, seconds, stride)
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
            split_space=dict(self.split_space),
            heatmap=heat,
            space_buckets=[
                (sp.name, sp.bucket_offset, sp.bucket_offset + len(sp.bucket_bounds) + 1)
                for sp in spaces
            ],
            splits=sum(len(sp.split_ids) for sp in spaces),
            elapsed=time.perf_counter() - started,
        )

    def _end_tick(
        self,
        node_writes: list[list[int]],
        split_writes: list[dict[int, int]],
        seconds: float,
        stride: int,
    ) -> None:
        inst = self.inst
        nodes = [0] * inst.nodes
        per_split: dict[int, int] = {}
        load: dict[int, float] = {}
        for sp in self.spaces:
            for sid, c in zip(sp.split_ids, sp.counts, strict=True):
                if c:
                    per_split[sid] = c
                    nodes[self.split_node[sid]] += c
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
                if cut:
                    lo = sp.bounds[j - 1] if j > 0 else None
                    hi = sp.bounds[j] if j < len(sp.bounds) else None
                    a = 0 if lo is None else bisect_left(sample, lo)
                    b = len(sample) if hi is None else bisect_left(sample, hi)
                    inside = sample[a:b]
                    mid = inside[len(inside) // 2] if inside else None
                    if mid is not None and (lo is None or mid > lo) and (hi is None or mid < hi):
                        frac = bisect_left(inside, mid) / len(inside)
                        new = self._new_split(sp, self.split_node[sid])
                        sp.bounds.insert(j, mid)
                        sp.split_ids.insert(j + 1, new)
                        sp.counts.insert(j + 1, int(c * (1 - frac)))
                        sp.counts[j] = c - sp.counts[j + 1]
                        sp.rows.insert(j + 1, sp.rows[j] * (1 - frac))
                        sp.rows[j] *= frac
                        self.warm.pop(sid, None)
                        load[new] = sp.counts[j + 1]
                        load[sid] = sp.counts[j]
                        j += 2
                        continue
                load[sid] = c
                j += 1
        self._rebalance(load)
        for sp in self.spaces:
            for j in range(len(sp.counts)):
                sp.counts[j] = 0

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


# --------------------------------------------------------------------------- API


def _schema_items(schemas: Any) -> list[tuple[str, Table]]:
    if isinstance(schemas, Mapping):
        items = list(schemas.items())
    elif isinstance(schemas, (list, tuple)):
        items = [(_default_name(s), s) for s in schemas]
    else:
        items = [(_default_name(schemas), schemas)]
    if not items:
        raise ShardConfigError("give at least one model or Table to simulate")
    out = []
    names = set()
    for name, obj in items:
        if not isinstance(name, str) or not name:
            raise ShardTypeError(f"schema names are non-empty strings, got {name!r}")
        if name in names:
            raise ShardConfigError(f"two schemas are named {name!r}: name them in a dict")
        names.add(name)
        try:
            table = table_of(obj)
        except ShardTypeError:
            raise ShardTypeError(
                f"schema {name!r}: expected a mapped class or a Table, got {obj!r}"
            ) from None
        out.append((name, table))
    return out


def _default_name(obj: Any) -> str:
    if isinstance(obj, Table):
        return obj.name
    return str(getattr(obj, "__name__", None) or table_of(obj).name)


def sample_rows(model: Any, workload: Workload, n: int = 10) -> list[dict[str, Any]]:
    """The first ``n`` rows the simulator would write for ``workload``, by column name.

    The values of the key and index columns (and shard sources) as the application and the
    library would write them: see what a workload makes before simulating it.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ShardConfigError(f"n must be a positive int, got {n!r}")
    table = table_of(model)
    spaces = _spaces_of(table)
    needed = [c for sp in spaces for c in sp.columns]
    maker = _RowMaker(table, workload, needed)
    rng = random.Random(workload.seed)
    start_us = (workload.start - _EPOCH) // _ONE_US
    hist_rows = int(workload.rows_per_second * workload.history_seconds)
    step = 1e6 / workload.rows_per_second
    rows = [maker.make(rng, start_us + int(i * step), hist_rows + 1 + i) for i in range(n)]
    return [{c.name: v for c, v in row.items()} for row in rows]


def simulate(
    schemas: Any,
    workload: Workload,
    instance: Instance | None = None,
    *,
    heatmap: str | Path | None = None,
) -> Comparison:
    """Run ``workload`` against each schema and compare them.

    ``schemas``: a mapped class or a ``Table``, a list of them (named after the class or
    table), or a mapping of name -> class/Table to compare side by side. The same rows
    (same seed) go to every schema. ``heatmap``: write a PNG there (needs matplotlib).
    """
    if not isinstance(workload, Workload):
        raise ShardTypeError(f"workload must be a Workload, got {workload!r}")
    instance = Instance() if instance is None else instance
    if not isinstance(instance, Instance):
        raise ShardTypeError(f"instance must be an Instance, got {instance!r}")
    items = _schema_items(schemas)
    if heatmap is not None:
        from sharded_orm.tools.heatmap import require_matplotlib

        require_matplotlib()
        from sharded_orm.tools.heatmap import check_output_path

        check_output_path(heatmap)
    results = [_Engine(name, table, workload, instance).run() for name, table in items]
    comparison = Comparison(workload, instance, results)
    if heatmap is not None:
        comparison.heatmap(heatmap)
    return comparison


__all__: Sequence[str] = (
    "Comparison",
    "Instance",
    "SimulationResult",
    "Workload",
    "sample_rows",
    "simulate",
)
