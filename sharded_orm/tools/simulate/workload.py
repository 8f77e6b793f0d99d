"""What is written: the workload, and the rows it makes exactly as the application would.

Rows get their shard columns from ``ShardColumn.compute`` (the function the write hooks
use) and bit-reversed ids from ``sharded_orm.bit_reverse``; other columns get a *role*
(time, tenant, user, ...) guessed from their type and name unless the workload names one.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import uuid
import zlib
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from sqlalchemy import Column, Identity, Table
from sqlalchemy import Sequence as SASequence
from sqlalchemy import types as sqltypes

from sharded_orm.checks import MAX_SECONDS, is_seconds
from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.schema.coerce import base_type
from sharded_orm.schema.columns import ShardColumn, shard_columns
from sharded_orm.tools.lint import counter_reason, default_function, uuid_default_version

ROLES = (
    "time",
    "tenant",
    "user",
    "uuid4",
    "uuid1",
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
#: tenants a workload may name (each has a weight and its own values)
MAX_TENANTS = 1_000_000
#: the shortest duration or history, in seconds: the simulator's clock counts microseconds
#: (the longest: checks.MAX_SECONDS, the library's one rule for durations)
MIN_SECONDS = 1e-6
#: the fastest write rate, rows/s: more than a thousand nodes' worth (3,500 writes/s each)
MAX_RATE = 10_000_000.0
#: the largest Zipf exponent: at 10 the first tenant writes 99.9 % of the rows already,
#: and 10 ** zipf stays a float for every tenant count
MAX_ZIPF = 10.0
UTC = dt.timezone.utc
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
ONE_US = dt.timedelta(microseconds=1)
TENANT_HINTS = ("company", "tenant", "org", "customer", "account")


def check_number(name: str, value: object, *, integer: bool = False, minimum: float = 0.0) -> None:
    """Raise unless ``value`` is a finite number (an int if ``integer``) above ``minimum``."""
    ok_types: tuple[type, ...] = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_types):
        kind = "an int" if integer else "a number"
        raise ShardTypeError(f"{name} must be {kind}, got {value!r}")
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number) or number <= minimum:
        raise ShardConfigError(f"{name} must be > {minimum:g}, got {value!r}")


def _check_seconds(name: str, value: object, none: str = "") -> None:
    """A duration of the simulation: the library's rule (checks.check_seconds: a number
    above 0 and below ``MAX_SECONDS``), and at least ``MIN_SECONDS``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ShardTypeError(f"{name} must be a number of seconds, got {value!r}")
    if not is_seconds(value) or value < MIN_SECONDS:
        raise ShardConfigError(
            f"{name} must be from {MIN_SECONDS:g} to {MAX_SECONDS:g} seconds"
            f"{f' (or {none})' if none else ''}, got {value!r}"
        )


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
    start: dt.datetime = dt.datetime(2024, 1, 1, tzinfo=UTC)

    def __post_init__(self) -> None:
        check_number("rows_per_second", self.rows_per_second)
        if self.rows_per_second > MAX_RATE:
            raise ShardConfigError(
                f"rows_per_second={self.rows_per_second:g} is more than the simulator models "
                f"({MAX_RATE:,.0f}/s, beyond any instance): simulate a part of the traffic"
            )
        _check_seconds("duration", self.duration)
        check_number("tenants", self.tenants, integer=True)
        check_number("users_per_tenant", self.users_per_tenant, integer=True)
        if isinstance(self.zipf, bool) or not isinstance(self.zipf, (int, float)):
            raise ShardTypeError(f"zipf must be a number, got {self.zipf!r}")
        if not 0 <= self.zipf <= MAX_ZIPF:  # NaN fails too
            raise ShardConfigError(
                f"zipf must be from 0 (no skew) to {MAX_ZIPF:g} (the first tenant writes "
                f"99.9 % of the rows), got {self.zipf!r}; tenant_weights gives any split"
            )
        if self.tenant_weights is not None:
            weights = tuple(self.tenant_weights)
            object.__setattr__(self, "tenant_weights", weights)
            if len(weights) != self.tenants:
                raise ShardConfigError(
                    f"tenant_weights has {len(weights)} weights for {self.tenants} tenants: "
                    "give one weight per tenant"
                )
            for w in weights:
                check_number("each tenant weight", w)
            if self.zipf:
                raise ShardConfigError("give tenant_weights or zipf, not both")
        if self.tenants > MAX_TENANTS:
            raise ShardConfigError(
                f"tenants={self.tenants} is more than the simulator models ({MAX_TENANTS:,}); "
                "the busiest tenants decide the hotspots: model the top ones and weight them"
            )
        if self.insert_order not in INSERT_ORDERS:
            raise ShardConfigError(
                f"insert_order must be one of {', '.join(INSERT_ORDERS)}, got {self.insert_order!r}"
            )
        if self.history is not None:
            if isinstance(self.history, bool) or not isinstance(self.history, (int, float)):
                raise ShardTypeError(f"history must be a number of seconds, got {self.history!r}")
            if self.history != 0:
                _check_seconds("history", self.history, none="0 for none")
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
        try:
            self.start - dt.timedelta(seconds=self.history_seconds)
            self.start + dt.timedelta(seconds=self.duration)
        except OverflowError:
            raise ShardConfigError(
                f"start={self.start.isoformat()} with {self.history_seconds:g} s of history "
                f"and {self.duration:g} s of traffic leaves the datetime range: start later "
                "or earlier"
            ) from None

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


def guess_role(col: Column[Any]) -> str:
    """The role a column plays when the workload does not name one."""
    t = base_type(col.type)
    name = col.name.lower()
    if isinstance(t, (sqltypes.DateTime, sqltypes.Date)):
        return "time"
    if any(h in name for h in TENANT_HINTS):
        return "tenant"
    if "user" in name:
        return "user"
    if isinstance(t, sqltypes.Integer):
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
    version = uuid_default_version(col)
    if version == 1:
        return "uuid1"
    if version in (6, 7):
        return "uuid7"
    return "uuid4"


class RowMaker:
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
                itemgetter(*sc.sources) if len(sc.sources) > 1 else one_getter(sc.sources[0]),
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
            t = base_type(col.type)
            is_int = isinstance(t, sqltypes.Integer)
            if role == "tenant":
                self.tenant_values[col] = [
                    (k + 1) if is_int else f"tenant-{k + 1:05d}" for k in range(workload.tenants)
                ]
            self.converters.append((col, role, t))
        from sharded_orm.ids.mixins import bit_reverse  # the library's own function

        self.bit_reverse = bit_reverse
        # one writing host's clock sequence and node (a version-1 UUID's last 62 bits)
        self.uuid1_node = (zlib.crc32(table.name.encode()) * 0x9E3779B97F4A7C15) & ((1 << 62) - 1)

    def make(self, rng: random.Random, t_us: int, counter: int) -> dict[Any, Any]:
        """One row written at ``t_us`` (microseconds since the epoch)."""
        rnd = rng.random()
        tenant = bisect_right(self.cum, rnd)
        upt = self.workload.users_per_tenant
        user_n = tenant * upt + int(rng.random() * upt)
        ts = EPOCH + dt.timedelta(microseconds=t_us)
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
            elif role == "uuid1":
                v = uuid1(t_us, self.uuid1_node)
                row[col] = v if isinstance(t, sqltypes.Uuid) else str(v)
            elif role == "uuid7":
                v = uuid7(t_us, rng)
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


def one_getter(col: Column[Any]) -> Callable[[dict[Any, Any]], tuple[Any]]:
    return lambda row: (row[col],)


#: 100-ns intervals from the Gregorian epoch (1582-10-15) to the Unix epoch
GREGORIAN_OFFSET = 0x01B21DD213814000


def uuid1(t_us: int, node: int) -> uuid.UUID:
    """The version-1 UUID of one host (``node``) at ``t_us``, laid out as RFC 9562 says:
    ``time_low`` (the timestamp's low 32 bits, which wrap about every 7.16 minutes) first,
    so consecutive inserts sit together and their point sweeps the key space."""
    ts = GREGORIAN_OFFSET + t_us * 10
    time_low, time_mid, time_hi = ts & 0xFFFFFFFF, (ts >> 32) & 0xFFFF, (ts >> 48) & 0x0FFF
    value = (time_low << 96) | (time_mid << 80) | ((0x1000 | time_hi) << 64)
    return uuid.UUID(
        int=value | (0b10 << 62) | ((node >> 48 & 0x3FFF) << 48) | (node & (1 << 48) - 1)
    )


def uuid7(t_us: int, rng: random.Random) -> uuid.UUID:
    ms = t_us // 1000
    value = (ms << 80) | (0x7 << 76) | (rng.getrandbits(12) << 64) | (0b10 << 62)
    return uuid.UUID(int=value | rng.getrandbits(62))
