"""What doctor reports: findings (where, what pattern, which fix) and the diagnosis."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Column

from sharded_orm.errors import ShardingError
from sharded_orm.tools.doctor.keys import Key, role_of
from sharded_orm.tools.doctor.sources import INTERVAL_SECONDS, VIEWS, SplitRow

#: key part roles that grow with time: a timestamp, a plain counter, a time-ordered UUID
#: (version 6, 7), a ULID, text led by a time (not a version-1 UUID, ``uuid1``: its inserts
#: sweep the key space and wrap, see ``keys.UUID1_KEYS``)
MONOTONIC_ROLES = ("time", "counter", "uuid7", "ulid", "time_prefix")


class EmptyWindowError(ShardingError):
    """No split statistics rows in the window: no split was warm or hot then."""


@dataclass
class HotspotFinding:
    """One hotspot: where (table or index, shard, tenant), what pattern, and the fix."""

    table: str  # the table or index, as Spanner names it
    pattern: str
    fix: str
    kind: str = "table"  # "table", "index" or "unknown"
    base_table: str | None = None
    shard: int | None = None
    tenant: Any = None
    column: str | None = None  # the key part that makes it hot
    rule: str | None = None  # the lint rule that would have caught it
    peak_score: int = 0
    hot_seconds: float = 0.0  # time at CPU_USAGE_SCORE 100
    intervals: int = 0
    shards: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # sample split starts
    #: Spanner's UNSPLITTABLE_REASONS over the finding's rows (HOT_ROW, MOVING_HOT_SPOT...)
    reasons: list[str] = field(default_factory=list)
    #: each key column's role as doctor classified it: from its declaration, or from what
    #: the split keys hold (a UUID's version nibble, a ULID, a time-led text)
    roles: dict[str, str] = field(default_factory=dict)

    @property
    def growing_role(self) -> str | None:
        """The role of the growing part (``column``): time, counter, uuid7, ulid..."""
        return self.roles.get(self.column) if self.column else None

    def role_of(self, col: Column[Any]) -> str:
        """``col``'s role as this finding saw it (what its keys held), else as declared:
        what ``--fix`` must use to find the growing part."""
        return self.roles.get(col.name) or role_of(col)

    def as_dict(self) -> dict[str, Any]:
        tenant = (
            self.tenant if isinstance(self.tenant, (int, float, type(None))) else str(self.tenant)
        )
        return {
            "table": self.table,
            "kind": self.kind,
            "base_table": self.base_table,
            "pattern": self.pattern,
            "shard": self.shard,
            "shards": self.shards,
            "tenant": tenant,
            "column": self.column,
            "peak_score": self.peak_score,
            "hot_seconds": self.hot_seconds,
            "intervals": self.intervals,
            "rule": self.rule,
            "fix": self.fix,
            "split_starts": self.keys,
            "unsplittable_reasons": self.reasons,
            "growing_role": self.growing_role,
            "key_roles": dict(self.roles),
        }


@dataclass
class DecodedRow:
    row: SplitRow
    start: Key
    limit: Key

    @property
    def space(self) -> Key:
        return self.start if self.start.kind != "boundary" else self.limit


class HeatSample:
    """What the heatmap and the summary need of every row, in bounded memory: the count,
    the first and last interval, each key space's kind, and at most ``PER_SPACE`` rows of
    each key space (a uniform sample, seeded: the same rows give the same picture)."""

    PER_SPACE = 4096

    def __init__(self) -> None:
        self.count = 0
        self.first_end: Any = None
        self.last_end: Any = None
        self.seen: dict[str, int] = {}
        self.rows: dict[str, list[DecodedRow]] = {}
        self.simulated = True
        self._rng = random.Random(0)

    def add(self, r: DecodedRow) -> None:
        self.count += 1
        end = r.row.interval_end
        self.first_end = end if self.first_end is None else min(self.first_end, end)
        self.last_end = end if self.last_end is None else max(self.last_end, end)
        self.simulated = self.simulated and r.row.source == "simulated"
        name = r.space.name
        n = self.seen[name] = self.seen.get(name, 0) + 1
        kept = self.rows.setdefault(name, [])
        if len(kept) < self.PER_SPACE:
            kept.append(r)
        else:  # reservoir: each of the n rows kept with the same chance
            j = self._rng.randrange(n)
            if j < self.PER_SPACE:
                kept[j] = r


@dataclass
class Diagnosis:
    """What ``doctor`` found over one window of split statistics."""

    window: str
    heat: HeatSample
    findings: list[HotspotFinding]
    #: where the rows came from: "production", "simulated", "exported statistics", ...
    source: str = "split statistics"

    @property
    def interval_seconds(self) -> int:
        return INTERVAL_SECONDS[self.window]

    def hot_longer_than(self, seconds: float) -> list[HotspotFinding]:
        """Findings whose splits were hot (CPU score 100) for more than ``seconds``."""
        return [f for f in self.findings if f.hot_seconds > seconds]

    @property
    def row_count(self) -> int:
        """Rows read (every one classified; the heatmap draws a sample of each key space's)."""
        return self.heat.count

    def as_dict(self) -> dict[str, Any]:
        h = self.heat
        return {
            "view": VIEWS[self.window],
            "rows": h.count,
            "first_interval_end": h.first_end.isoformat() if h.first_end else None,
            "last_interval_end": h.last_end.isoformat() if h.last_end else None,
            "findings": [f.as_dict() for f in self.findings],
        }

    def __str__(self) -> str:
        return self.table()

    def table(self) -> str:
        from sharded_orm.tools.doctor.report import text_report

        return text_report(self)

    def heatmap(self, path: Any) -> Any:
        from sharded_orm.tools.doctor.report import save_doctor_heatmap

        return save_doctor_heatmap(self, path)
