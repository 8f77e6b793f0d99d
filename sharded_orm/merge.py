"""The first ``limit`` rows of a sharded range, in exact global order, reading few rows.

Each shard is sorted by the index, so the global order is a k-way merge. Reading
``LIMIT k`` from every shard (what CockroachDB does per bucket) transfers ``N*k`` rows for
``k``. Here each shard first sends ``ceil(k/N)`` rows, all shards in one ``UNION ALL``
statement, and only a shard whose buffer runs dry while it still holds the next row in
global order is asked for more (its share of the rows still wanted, continuing after its
last row). With
hashed shards the rows are spread evenly, so about ``k + N`` rows travel.

The order is the index's ordering followed by the primary key (a total order, so ties
on the timestamp across shards are broken the same way every time).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, false, literal_column, or_, select, union_all
from sqlalchemy.engine import Connection, Row
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import UnaryExpression

from .errors import ShardConfigError
from .query import OPTION, ShardPlan, check_positive_int, expand, plan_of, point_shard


@dataclass
class MergeStats:
    """What a merge cost: statements sent and rows transferred."""

    statements: int = 0
    rows_transferred: int = 0
    rounds: list[dict[int, int]] = field(default_factory=list)


class _Desc:
    """Inverts the order of a value inside a sort key."""

    __slots__ = ("v",)

    def __init__(self, v: Any) -> None:
        self.v = v

    def __lt__(self, other: _Desc) -> bool:
        return bool(other.v < self.v)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.v == other.v


def _none_first(v: Any) -> tuple[int, Any]:
    return (0, 0) if v is None else (1, v)  # NULL sorts first ascending on SQLite and Spanner


def sort_key_function(plan: ShardPlan) -> Any:
    cols = plan.sort_columns

    def key(row: Any) -> tuple[Any, ...]:
        m = row._mapping
        return tuple(
            _Desc(_none_first(m[c.key])) if desc else _none_first(m[c.key]) for c, desc in cols
        )

    return key


def after_condition(plan: ShardPlan, values: Sequence[Any]) -> Any:
    """Rows strictly after ``values`` in the plan's order (keyset continuation)."""
    ors = []
    cols = plan.sort_columns
    for i, (col, desc) in enumerate(cols):
        eqs = [c == v for (c, _), v in zip(cols[:i], values[:i], strict=True)]
        step = col < values[i] if desc else col > values[i]
        ors.append(and_(*eqs, step))
    return or_(*ors) if ors else false()


def check_order(plan: ShardPlan, stmt: Any) -> None:
    """The statement's ORDER BY must be a prefix of what the index serves."""
    from .execution import where_equalities

    pinned = {c._deannotate() for c in where_equalities(stmt.whereclause)}
    wanted = list(plan.sort_columns)
    while wanted and wanted[0][0] in pinned:  # a column fixed by col == value orders nothing
        wanted.pop(0)
    given = list(stmt._order_by_clauses)
    for i, clause in enumerate(given):
        desc = isinstance(clause, UnaryExpression) and clause.modifier is operators.desc_op
        col = clause.element if isinstance(clause, UnaryExpression) else clause
        if hasattr(col, "_deannotate"):
            col = col._deannotate()
        if i >= len(wanted) or col is not wanted[i][0] or desc != wanted[i][1]:
            served = ", ".join(f"{c.name}{' DESC' if d else ''}" for c, d in wanted)
            raise ShardConfigError(
                f"ORDER BY cannot be served by {plan.index_name or 'the primary key'} of "
                f"{plan.table.name!r}: it serves ({served}) or a prefix of it. Merging any "
                "other order would mean reading and sorting every matching row."
            )


def merged(
    conn: Connection,
    stmt: Any,
    limit: int,
    *,
    after: Sequence[Any] | None = None,
    stats: MergeStats | None = None,
) -> list[Row[Any]]:
    """The first ``limit`` rows of a ``sharded_select`` across its shards, in index order."""
    plan = plan_of(stmt)
    if plan is None:
        raise ShardConfigError("merged() needs a statement made by sharded_select(...)")
    check_positive_int(limit, "limit")
    check_order(plan, stmt)
    stats = stats if stats is not None else MergeStats()
    point = point_shard(plan, stmt)
    shards = [point] if point is not None else list(range(plan.shard.count))
    base = (
        select(plan.table).where(stmt.whereclause)
        if stmt.whereclause is not None
        else select(plan.table)
    )
    base = base.execution_options(**{OPTION: plan})
    order = [c.desc() if d else c.asc() for c, d in plan.sort_columns]
    key = sort_key_function(plan)
    last: dict[int, Sequence[Any] | None] = dict.fromkeys(shards, after)
    size: dict[int, int] = dict.fromkeys(shards, max(1, math.ceil(limit / len(shards))))
    buffers: dict[int, deque[Row[Any]]] = {s: deque() for s in shards}
    done: set[int] = set()

    def fetch(which: list[int], need: int | None = None) -> None:
        if need is not None:  # a refill: about this shard's share of the rows still wanted
            active = max(1, len(shards) - len(done))
            for s in which:
                size[s] = max(1, math.ceil(need / active))
        branches = []
        for s in which:
            q = base.where(plan.shard.column == s)
            if last[s] is not None:
                q = q.where(after_condition(plan, last[s]))  # type: ignore[arg-type]
            q = expand(q, conn.dialect).order_by(*order).limit(size[s])
            branches.append(select(literal_column(str(s)).label("_shard"), q.subquery()))
        stmt_ = branches[0] if len(branches) == 1 else union_all(*branches)
        got: dict[int, int] = dict.fromkeys(which, 0)
        fresh: dict[int, list[Row[Any]]] = {s: [] for s in which}
        for row in conn.execute(stmt_):
            fresh[row[0]].append(row)
        for s in which:
            # UNION ALL promises no order across or within branches: sort each batch
            buffers[s].extend(sorted(fresh[s], key=key))
            got[s] = len(fresh[s])
        stats.statements += 1
        stats.rows_transferred += sum(got.values())
        stats.rounds.append(got)
        for s in which:
            if got[s] < size[s]:
                done.add(s)
            elif buffers[s]:
                last[s] = [buffers[s][-1]._mapping[c.key] for c, _ in plan.sort_columns]

    fetch(shards)
    heap = [(key(buffers[s][0]), s) for s in shards if buffers[s]]
    heapq.heapify(heap)
    out: list[Row[Any]] = []
    while heap and len(out) < limit:
        _, s = heapq.heappop(heap)
        out.append(buffers[s].popleft())
        if not buffers[s] and s not in done:
            # this shard may hold the next row: it is still in contention
            fetch([s], need=limit - len(out))
        if buffers[s]:
            heapq.heappush(heap, (key(buffers[s][0]), s))
    return [_Projected(r) for r in out]  # type: ignore[misc]


class _Projected(tuple):  # type: ignore[type-arg]
    """A row of the table's columns (by position and by ``row.<column key>``)."""

    _fields: tuple[str, ...]

    def __new__(cls, row: Row[Any]) -> _Projected:
        keys = list(row._mapping.keys())[1:]
        self = super().__new__(cls, tuple(row)[1:])
        self._fields = tuple(str(k) for k in keys)
        return self

    def __getattr__(self, name: str) -> Any:
        try:
            return self[self._fields.index(name)]
        except ValueError:
            raise AttributeError(name) from None

    @property
    def _mapping(self) -> dict[str, Any]:
        return dict(zip(self._fields, self, strict=True))
