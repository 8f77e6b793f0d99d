"""Rows of split statistics grouped by key space and added one at a time: what doctor's
classification needs of them, in memory bounded by the window's intervals and the keys'
tenants and shards, never by the rows (a 500 MB export streams through)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import Column

from sharded_orm.tools.doctor.findings import MONOTONIC_ROLES, DecodedRow
from sharded_orm.tools.doctor.keys import VALUE_ROLES, Catalog, Key, role_of

#: the share of a key part's values that must show one role for the column to take it
ROLE_SHARE = 0.9
HOT_ROW_REASONS = {"HOT_ROW", "UNISOLATABLE_HOT_ROW"}


class Rows:
    """What classification needs of a group of rows, added one at a time: memory bounded by
    the window's intervals and the keys' tenants and shards, not by the rows."""

    def __init__(self, desc: bool = False) -> None:
        self.desc = desc
        self.n = 0
        self.peak = 0
        self.ends: set[Any] = set()
        self.hot_ends: set[Any] = set()
        self.starts: list[str] = []  # the first 5 distinct split starts
        self.reasons: set[str] = set()
        self.first: DecodedRow | None = None
        self.tenants: Counter[Any] = Counter()
        self.shards: set[Any] = set()
        self.tenant_shard: Counter[tuple[Any, Any]] = Counter()  # score by (tenant, shard)
        self.end_tenant: Counter[tuple[Any, Any]] = Counter()  # score by (end, tenant)
        #: per key position, the roles its values showed (a UUID's version, a ULID...)
        self.part_roles: list[Counter[str]] = []

    def add(self, r: DecodedRow) -> None:
        row = r.row
        self.n += 1
        if self.first is None:
            self.first = r
        self.peak = max(self.peak, row.cpu_usage_score)
        self.ends.add(row.interval_end)
        if row.cpu_usage_score >= 100:
            self.hot_ends.add(row.interval_end)
        if len(self.starts) < 5 and row.split_start not in self.starts:
            self.starts.append(row.split_start)
        self.reasons.update(row.unsplittable_reasons)
        for key in (r.start, r.limit):
            if key.name != r.space.name:
                continue
            for i, part in enumerate(key.parts):
                if part.value is None:
                    continue
                while len(self.part_roles) <= i:
                    self.part_roles.append(Counter())
                self.part_roles[i][part.role] += 1
        # the growing part is the first the values show growing (DESC: new rows go first)
        desc = next((p.descending for p in r.start.parts if p.role in MONOTONIC_ROLES), self.desc)
        tenant = located(r, "tenant", desc)
        shard = located(r, "shard", desc)
        if tenant is not None:
            self.tenants[tenant] += 1
        if shard is not None:
            self.shards.add(shard)
            self.tenant_shard[(tenant, shard)] += row.cpu_usage_score
        self.end_tenant[(row.interval_end, tenant)] += row.cpu_usage_score

    def roles(self, cols: list[tuple[Column[Any], bool]]) -> list[str]:
        """Each key column's role: its declaration's, or what its values in these rows
        showed (``ROLE_SHARE`` of them), for a column whose declaration does not say
        (a UUID or text key filled by an application's helper)."""
        out: list[str] = []
        for i, (col, _) in enumerate(cols):
            declared = role_of(col)
            seen = self.part_roles[i] if i < len(self.part_roles) else Counter()
            total = sum(seen.values())
            if declared in VALUE_ROLES and total:
                role, n = seen.most_common(1)[0]
                if n >= ROLE_SHARE * total:
                    declared = role
            out.append(declared)
        return out


def located(r: DecodedRow, role: str, desc: bool) -> Any:
    """The ``role`` part of the keys a split holds: the start's, or, when the split ends in
    another value and the growing part is descending (new rows go first), the limit's."""
    a, b = value_of(r.start, role), value_of(r.limit, role)
    if r.limit.name != r.space.name:
        return a
    if a is None or (desc and b is not None and a != b):
        return b
    return a


def value_of(key: Key, role: str) -> Any:
    p = key.part(role)
    return None if p is None else p.value


def is_hot_key(r: DecodedRow) -> bool:
    if HOT_ROW_REASONS & set(r.row.unsplittable_reasons):
        return True
    s, lim = r.start, r.limit
    if s.kind not in ("table", "index") or lim.name != s.name or not s.parts:
        return False
    if len(s.parts) != s.full_length or len(lim.parts) != len(s.parts):
        return False
    if s.parts[-1].role in (*MONOTONIC_ROLES, "uuid1"):  # where new rows go, not a hot key
        return False
    return [p.value for p in s.parts[:-1]] == [p.value for p in lim.parts[:-1]]


class Group:
    """One table's or index's rows, sorted into hot keys, scans and the rest as they come."""

    def __init__(self, space: Key, catalog: Catalog) -> None:
        self.space = space
        self.found = (
            catalog.columns_of(space.name) if space.kind not in ("unknown", "boundary") else None
        )
        desc = False
        if self.found is not None:
            cols = self.found[1]
            mono = next((i for i, c in enumerate(cols) if role_of(c[0]) in MONOTONIC_ROLES), None)
            desc = cols[mono][1] if mono is not None else False
        self.all = Rows()
        self.hot_keys: dict[str, Rows] = {}
        self.scans = Rows()
        self.rest = Rows(desc)

    def add(self, r: DecodedRow) -> None:
        if self.found is None:
            self.all.add(r)
        elif is_hot_key(r):
            self.hot_keys.setdefault(r.row.split_start, Rows()).add(r)
        elif "LARGE_SCAN_HOT_SPOT" in r.row.unsplittable_reasons:
            self.scans.add(r)
        else:
            self.rest.add(r)
