"""The first ``limit`` rows of a sharded range, in exact global order, reading few rows.

Each shard is sorted by the index, so the global order is a k-way merge. Reading
``LIMIT k`` from every shard (what CockroachDB does per bucket) transfers ``N*k`` rows.
Here it takes at most three statements, each one ``UNION ALL`` of per-shard branches:

1. every shard sends ``b = ceil(k/N)`` rows. Once ``k`` rows are in hand, the ``k``-th
   smallest of them, ``T``, bounds the answer: ``k`` rows sort at or before ``T``, so no
   row after ``T`` can be among the first ``k``. ``T`` only falls as rows arrive.
2. the shards still in contention (not exhausted, last row before ``T``) send up to
   ``b`` more rows, at or before ``T``. This tightens ``T`` cheaply: with ``b`` small,
   round 1's ``T`` can lie far beyond the ``k``-th row.
3. the shards still in contention send every row after their last one, at or before
   ``T``, and at most ``k - c`` of them, where ``c`` rows in hand sort at or before
   their last row (a row with ``k`` rows ahead of it cannot be in the answer).

A shard that sends fewer rows than asked has no more up to the bound, and is done.
After round 3 every row that can be among the first ``k`` is in hand, so the merge is
exact; usually round 2 already settles it. With hashed shards the rows are spread evenly
and about ``1.1k`` to ``2k`` rows travel (at least ``N``: every shard is asked once).
See docs/queries.md.

The order is the index's ordering followed by the primary key: a total order, so ties
on the timestamp across shards are broken the same way every time. Columns pinned by
``col == value`` in the WHERE clause are constant and left out of it.
"""

from __future__ import annotations

import bisect
import datetime as dt
import heapq
import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, false, or_, select, true, union_all
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import UnaryExpression

from sharded_orm.checks import check_positive_int
from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.read.plan import (
    OPTION,
    ShardPlan,
    expand,
    plan_of,
    point_shard,
)
from sharded_orm.spanner import is_spanner

_MAX_BRANCHES = 256  # per statement (SQLite allows 500 UNION terms)
_TOKEN_BUDGET = 8000  # per statement, on Spanner (its DB-API's sqlparse allows 10,000)
_TOKEN = re.compile(r"`[^`]*`|\w+|\s+|[^\w\s]")  # counts at least as many tokens as sqlparse


@dataclass
class MergeStats:
    """What a merge cost: statements sent and rows transferred (per statement, per shard)."""

    statements: int = 0
    rows_transferred: int = 0
    rounds: list[dict[int, int]] = field(default_factory=list)


# ----------------------------------------------------------------------------- order


class _Desc:
    """Inverts the order of a value inside a sort key."""

    __slots__ = ("v",)

    def __init__(self, v: Any) -> None:
        self.v = v

    def __lt__(self, other: _Desc) -> bool:
        return bool(other.v < self.v)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and bool(self.v == other.v)

    def __hash__(self) -> int:
        return hash(self.v)


def _ascending(v: Any) -> tuple[Any, ...]:
    """A value as the database orders it: NULL first (SQLite and Spanner), then by value."""
    if v is None:
        return (0,)
    if isinstance(v, dt.datetime):
        # Spanner timestamps carry nanoseconds that datetime comparison ignores
        return (1, v, getattr(v, "nanosecond", 0))
    return (1, v)


def sort_key(columns: Sequence[tuple[Any, bool]], values: Sequence[Any]) -> tuple[Any, ...]:
    """A Python key that orders ``values`` the way the database orders ``columns``."""
    return tuple(
        _Desc(_ascending(v)) if desc else _ascending(v)
        for (_, desc), v in zip(columns, values, strict=True)
    )


def _pinned(stmt: Any) -> set[Any]:
    from sharded_orm.write.sql import where_equalities

    return {c._deannotate() for c in where_equalities(stmt.whereclause)}


def order_columns(stmt: Any) -> list[tuple[Any, bool]]:
    """(column, descending) that a ``sharded_select`` is merged and paged by.

    The index's ordering, then the primary key, less the columns ``col == value`` pins.
    Raises ``ShardConfigError`` when the statement's ORDER BY is not a prefix of it.
    """
    plan = _plan(stmt, "order_columns")
    pinned = _pinned(stmt)
    wanted = [(c, d) for c, d in plan.sort_columns if c not in pinned]
    given = []
    for clause in stmt._order_by_clauses:
        desc = isinstance(clause, UnaryExpression) and clause.modifier is operators.desc_op
        asc = isinstance(clause, UnaryExpression) and clause.modifier is operators.asc_op
        col = clause.element if desc or asc else clause
        col = col._deannotate() if hasattr(col, "_deannotate") else col
        if col not in pinned:  # a constant orders nothing
            given.append((col, desc))
    served = list(wanted)
    for i, (col, desc) in enumerate(given):
        if i >= len(wanted) or col is not wanted[i][0] or desc != wanted[i][1]:
            text = ", ".join(f"{c.name}{' DESC' if d else ''}" for c, d in served)
            raise ShardConfigError(
                f"ORDER BY cannot be served by {plan.index_name or 'the primary key'} of "
                f"{plan.table.name!r}: it serves ({text}) or a prefix of it. Merging any "
                "other order would mean reading and sorting every matching row; order by "
                "the index, or pass index= naming an index in the order you want."
            )
    return wanted


def _after_one(col: Any, desc: bool, v: Any) -> Any:
    """Strictly after ``v`` in ``col``'s direction (NULL is smallest)."""
    nullable = getattr(col, "nullable", True)
    if not desc:
        return col.is_not(None) if v is None else col > v
    if v is None:
        return false()
    return or_(col < v, col.is_(None)) if nullable else col < v


def _before_one(col: Any, desc: bool, v: Any) -> Any:
    """Strictly before ``v`` in ``col``'s direction (NULL is smallest)."""
    nullable = getattr(col, "nullable", True)
    if desc:
        return col.is_not(None) if v is None else col > v
    if v is None:
        return false()
    return or_(col < v, col.is_(None)) if nullable else col < v


def _equal(col: Any, v: Any) -> Any:
    return col.is_(None) if v is None else col == v


def after_condition(columns: Sequence[tuple[Any, bool]], values: Sequence[Any]) -> Any:
    """Rows strictly after ``values`` in the order of ``columns`` (keyset continuation)."""
    ors = []
    for i, (col, desc) in enumerate(columns):
        eqs = [_equal(c, v) for (c, _), v in zip(columns[:i], values[:i], strict=True)]
        ors.append(and_(*eqs, _after_one(col, desc, values[i])))
    return or_(*ors) if ors else false()


def at_or_before_condition(columns: Sequence[tuple[Any, bool]], values: Sequence[Any]) -> Any:
    """Rows at or before ``values`` in the order of ``columns`` (the merge's upper bound)."""
    ors = []
    for i, (col, desc) in enumerate(columns):
        eqs = [_equal(c, v) for (c, _), v in zip(columns[:i], values[:i], strict=True)]
        ors.append(and_(*eqs, _before_one(col, desc, values[i])))
    ors.append(and_(*(_equal(c, v) for (c, _), v in zip(columns, values, strict=True))))
    return or_(*ors) if ors else true()


# ----------------------------------------------------------------------------- checks


def _plan(stmt: Any, who: str) -> ShardPlan:
    plan = plan_of(stmt)
    if plan is None:
        raise ShardConfigError(f"{who}() needs a statement made by sharded_select(...)")
    return plan


def _check_shape(plan: ShardPlan, stmt: Any) -> None:
    """The merge re-reads the statement's table and WHERE clause only: refuse the rest."""
    for what, present in (
        ("OFFSET", stmt._offset_clause is not None),
        ("GROUP BY", bool(stmt._group_by_clauses)),
        ("HAVING", stmt._having_criteria),
        ("DISTINCT", stmt._distinct),
        ("a join", bool(stmt._setup_joins)),
    ):
        if present:
            raise ShardConfigError(
                f"merged()/page() cannot merge a statement with {what}: they read rows of "
                f"{plan.table.name!r} filtered by the WHERE clause, in index order"
            )
    for frm in stmt.get_final_froms():
        base = frm._deannotate() if hasattr(frm, "_deannotate") else frm
        if base is not plan.table:
            raise ShardConfigError(
                f"merged()/page() read only {plan.table.name!r}; the statement also selects "
                f"from {getattr(base, 'name', base)!r}. Filter with a subquery instead."
            )


def _limit(stmt: Any, limit: object, what: str) -> int:
    own = stmt._limit_clause
    if own is not None:
        try:
            own = stmt._limit
        except Exception:  # a SQL expression: SQLAlchemy cannot give its value
            own = None
    if limit is None:
        if own is None:
            raise ShardTypeError(f"give {what}, or .limit(n) on the statement")
        limit = own
    check_positive_int(limit, what)
    if own is not None and own != limit:
        raise ShardConfigError(
            f"{what}={limit} disagrees with the statement's .limit({own}); give only one"
        )
    return limit  # type: ignore[return-value]


# ----------------------------------------------------------------------------- merge


class _Fetcher:
    """Sends the per-shard branches, one statement per round, and keeps each shard's rows."""

    def __init__(self, conn: Any, stmt: Any, plan: ShardPlan, columns: Sequence[Any]) -> None:
        self.conn, self.plan, self.columns = conn, plan, list(columns)
        self.table_columns = list(plan.table.columns)
        where = stmt.whereclause
        self.base = select(*self.table_columns)
        if where is not None:
            self.base = self.base.where(where)
        self.base = self.base.execution_options(**{OPTION: plan})
        self.order = [c.desc() if d else c.asc() for c, d in self.columns]
        self.entity: Any = None
        self.values: Callable[[Any], list[Any]]
        self.shard_of: Callable[[Any], int]
        if isinstance(conn, Session):
            desc = stmt.column_descriptions
            if (
                len(desc) == 1
                and desc[0]["entity"] is not None
                and desc[0]["expr"] is desc[0]["type"]
            ):
                self.entity = desc[0]["entity"]
        if self.entity is not None:
            from sqlalchemy import inspect

            mapper = inspect(self.entity)
            keys = [mapper.get_property_by_column(c).key for c, _ in self.columns]
            shard_key = mapper.get_property_by_column(plan.shard.column).key
            self.values = lambda o: [getattr(o, k) for k in keys]
            self.shard_of = lambda o: getattr(o, shard_key)
        else:
            pos = {c: i for i, c in enumerate(self.table_columns)}
            idx = [pos[c] for c, _ in self.columns]
            shard_pos = pos[plan.shard.column]
            self.values = lambda r: [r[i] for i in idx]
            self.shard_of = lambda r: r[shard_pos]
        self.dialect = conn.get_bind().dialect if isinstance(conn, Session) else conn.dialect

    def branch(
        self, shard: int, lower: Sequence[Any] | None, upper: Sequence[Any] | None, n: int
    ) -> Any:
        q = self.base
        if lower is not None:
            q = q.where(after_condition(self.columns, lower))
        if upper is not None:
            q = q.where(at_or_before_condition(self.columns, upper))
        return expand(q, self.dialect, shard=shard).order_by(*self.order).limit(n)

    def statements(self, branches: list[Any]) -> list[Any]:
        """The branches as few ``UNION ALL`` statements as the client can take.

        The Spanner DB-API runs every statement through sqlparse, which refuses more
        than 10,000 tokens; on Spanner the branches are split to stay well under that.
        """
        per_statement = _MAX_BRANCHES
        if is_spanner(self.dialect) and len(branches) > 1:
            sql = str(select(branches[0].subquery()).compile(dialect=self.dialect))
            tokens = len(_TOKEN.findall(sql)) + 5  # and the UNION ALL between branches
            per_statement = max(1, min(per_statement, _TOKEN_BUDGET // tokens))
        out: list[Any] = []
        for i in range(0, len(branches), per_statement):
            chunk = branches[i : i + per_statement]
            if len(chunk) == 1:
                out.append(chunk[0])
            else:  # SQLite wants ORDER BY / LIMIT of a UNION member inside a subquery
                subs: list[Any] = [select(b.subquery()) for b in chunk]
                out.append(union_all(*subs))
        return out

    def fetch(
        self, asks: dict[int, tuple[Sequence[Any] | None, Sequence[Any] | None, int]]
    ) -> tuple[dict[int, list[tuple[tuple[Any, ...], list[Any], Any]]], int]:
        """{shard: (after, at_or_before, limit)} -> ({shard: [(key, values, row)] sorted},
        statements sent)."""
        branches: list[Any] = [self.branch(s, lo, hi, n) for s, (lo, hi, n) in asks.items()]
        statements = self.statements(branches)
        items: list[Any] = []
        for stmt in statements:
            if self.entity is not None:
                items += self.conn.scalars(select(self.entity).from_statement(stmt))
            else:
                items += self.conn.execute(stmt)
        out: dict[int, list[tuple[tuple[Any, ...], list[Any], Any]]] = {s: [] for s in asks}
        for item in items:
            values = self.values(item)
            out[self.shard_of(item)].append((sort_key(self.columns, values), values, item))
        for rows in out.values():
            rows.sort(key=lambda e: e[0])  # UNION ALL keeps no order: sort each batch
        return out, len(statements)


def merge_rows(
    conn: Any,
    stmt: Any,
    limit: int,
    after: Sequence[Any] | None,
    stats: MergeStats,
) -> list[tuple[list[Any], Any]]:
    """The first ``limit`` (sort values, row) after ``after``; the merge behind
    ``merged`` and ``page``. Arguments are checked by the callers."""
    plan = _plan(stmt, "merged")
    columns = order_columns(stmt)
    _check_shape(plan, stmt)
    if after is not None and len(after) != len(columns):
        raise ShardConfigError(
            f"after= holds {len(after)} values; this query orders by {len(columns)} columns"
        )
    fetcher = _Fetcher(conn, stmt, plan, columns)
    point = point_shard(plan, stmt)
    shards = [point] if point is not None else list(range(plan.shard.count))

    def send(asks: dict[int, tuple[Sequence[Any] | None, Sequence[Any] | None, int]]) -> Any:
        got, sent = fetcher.fetch(asks)
        stats.statements += sent
        stats.rows_transferred += sum(len(v) for v in got.values())
        stats.rounds.append({s: len(v) for s, v in got.items()})
        return got

    # round 1: an even share from every shard
    batch = max(1, math.ceil(limit / len(shards)))
    per = send(dict.fromkeys(shards, (after, None, batch)))
    live = {s for s in shards if len(per[s]) == batch}  # a short answer: nothing more
    for final in (False, True):
        entries = sorted((e for rows in per.values() for e in rows), key=lambda e: e[0])
        keys = [e[0] for e in entries]
        bound = entries[limit - 1] if len(entries) >= limit else None
        asks = {}
        for s in sorted(live):
            last_key, last_values, _ = per[s][-1]
            if bound is not None and not last_key < bound[0]:
                continue  # all it holds up to the bound is in hand
            cap = limit - bisect.bisect_right(keys, last_key)  # rows ahead of its next one
            if cap > 0:
                upper = bound[1] if bound is not None else None
                asks[s] = (last_values, upper, cap if final else min(cap, batch))
        if not asks:
            break
        got = send(asks)
        # short of what was asked: no more rows up to the bound, and the bound only falls
        live = {s for s, (_, _, n) in asks.items() if len(got[s]) == n}
        for s, rows in got.items():
            per[s].extend(rows)
    top = heapq.merge(*per.values(), key=lambda e: e[0])
    return [(values, row) for _, values, row in itertools.islice(top, limit)]


def merged(
    conn: Connection | Session,
    stmt: Any,
    limit: int | None = None,
    *,
    after: Sequence[Any] | None = None,
    stats: MergeStats | None = None,
) -> list[Any]:
    """The first ``limit`` rows of a ``sharded_select`` across its shards, in index order.

    ``conn`` is a Connection (rows of the table's columns come back) or a Session (with
    ``sharded_select(Entity)``, entities come back). ``limit`` defaults to the
    statement's own ``.limit(n)``. ``after`` continues strictly after those sort values
    (see ``order_columns``); ``page`` does this with a signed cursor. ``stats``, if
    given, receives the statements sent and rows transferred.
    """
    n = _limit(stmt, limit, "limit")
    return [row for _, row in merge_rows(conn, stmt, n, after, stats or MergeStats())]
