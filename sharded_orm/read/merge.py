"""The first ``k`` rows of a sharded statement, in exact global order, in two statements.

Each shard is sorted by the index, so the global order is a k-way merge; every branch
below is the user's own statement (joins, DISTINCT, WHERE) restricted to one shard, with
the merge's order and a LIMIT. With ``K = offset + k`` rows wanted and ``N`` shards:

1. one ``UNION ALL`` asks every shard for ``b = ceil(K/N) + 1`` rows, and the database
   returns only the first ``K`` of them (an outer ``ORDER BY ... LIMIT K``). If ``K``
   rows came back, the ``K``-th, ``T``, bounds the answer: no row after ``T`` is needed.
2. a shard whose ``b`` rows all came back and whose last row is before ``T`` may hold more
   of the answer. One more ``UNION ALL`` asks each such shard for its rows after its last
   one and at or before ``T``: at most ``K - c_s`` of them (``c_s`` rows in hand sort at
   or before its last row), and the database returns only the first ``K - c`` of the
   union (``c`` rows in hand sort before every row this round can bring).

A shard that sent fewer than ``b`` rows has none left, or none before ``T``. So after
round 2 every row of the answer is in hand: the merge is exact in at most two statements
whatever ``k``, ``N`` and the skew, and transfers at most ``K + (K - c) <= 2K`` rows.
See docs/queries.md for the argument and the figures.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

from sqlalchemy import select, union_all
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, aliased

from sharded_orm.checks import check_positive_int
from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.read.order import (
    after_condition,
    at_or_before_condition,
    check_nulls,
    plain,
    require_plan,
    sort_key,
)
from sharded_orm.read.order import (
    order_columns as order_columns,  # re-exported: sharded_orm imports it from here
)
from sharded_orm.spanner import is_spanner

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

_MAX_BRANCHES = 250  # per statement (SQLite allows 500 UNION terms)
_TOKEN_BUDGET = 9800  # per statement on Spanner: its DB-API's sqlparse refuses 10,000 tokens

Entry = tuple[tuple[Any, ...], list[Any], tuple[Any, ...]]  # (sort key, sort values, row)


@dataclass
class MergeStats:
    """What a merge cost: statements sent and rows transferred (per round, per shard)."""

    statements: int = 0
    rows_transferred: int = 0
    rounds: list[dict[int, int]] = field(default_factory=list)


def is_async(conn: Any) -> bool:
    """An AsyncConnection or AsyncSession (told apart without importing asyncio support)."""
    return hasattr(conn, "run_sync") and (
        hasattr(conn, "sync_connection") or hasattr(conn, "sync_session")
    )


def statement_window(stmt: Any) -> tuple[int | None, int]:
    """(LIMIT, OFFSET) of the statement as ints; refuses SQL expressions there."""
    out: list[int | None] = []
    for what, clause, attr in (
        ("LIMIT", stmt._limit_clause, "_limit"),
        ("OFFSET", stmt._offset_clause, "_offset"),
    ):
        if clause is None:
            out.append(None)
            continue
        try:
            value = getattr(stmt, attr)
        except Exception:  # a SQL expression: SQLAlchemy cannot give its value
            value = None
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ShardConfigError(
                f"merged()/page() need the statement's {what} as a non-negative int, got {clause!r}"
            )
        out.append(value)
    return out[0], out[1] or 0


class MergeQuery:
    """The user's statement, ready to be sent per shard with the merge's extra columns."""

    def __init__(self, conn: Any, stmt: Any) -> None:
        self.plan = require_plan(stmt, "merged")
        if not isinstance(conn, (Connection, Session)):
            raise ShardTypeError(
                f"merged()/page() read through a Connection or Session (or their async "
                f"forms, awaited), got {conn!r}"
            )
        for what, present in (
            ("GROUP BY", bool(stmt._group_by_clauses)),
            ("HAVING", bool(stmt._having_criteria)),
        ):
            if present:
                raise ShardConfigError(
                    f"merged()/page() cannot merge a statement with {what}: a group can hold "
                    "rows of several shards. Run it as one query (the statement itself)."
                )
        self.conn = conn
        self.dialect = conn.get_bind().dialect if isinstance(conn, Session) else conn.dialect
        self.columns = order_columns(stmt)
        check_nulls(self.dialect, self.columns)
        selected = [plain(c) for c in stmt.selected_columns]
        self.n_user = len(selected)
        missing = [c.name for c, _ in self.columns if not any(c is x for x in selected)]
        if stmt._distinct and missing:
            raise ShardConfigError(
                f"merged()/page() of a DISTINCT statement need the order's columns in the "
                f"select list (missing: {', '.join(missing)}): adding them would change what "
                "DISTINCT removes. Select them, or drop DISTINCT."
            )
        # The order's values are read from the row: from the select list where it holds
        # them, else from labels of ours. Spanner resolves a name in ORDER BY against the
        # select list first, case-insensitively (`Owner`.name finds an output `owner`):
        # when a table of the order has such a name, every branch orders by our labels.
        names = {str(getattr(c, "name", "")).lower() for c in stmt.selected_columns}
        clash = any(str(c.table.name).lower() in names for c, _ in self.columns)
        extras: list[Any] = []
        self.key_pos, self.order = [], []
        for col, desc in self.columns:
            pos = [i for i, x in enumerate(selected) if x is col]
            if pos and not clash:
                self.key_pos.append(pos[0])
                term = col
            else:
                term = col.label(f"so_k{len(extras)}")
                extras.append(term)
                self.key_pos.append(self.n_user + len(extras) - 1)
            self.order.append(term.desc() if desc else term)
        shard = [i for i, c in enumerate(selected) if c is self.plan.shard.column]
        if shard:
            self.shard_pos = shard[0]
        else:
            extras.append(self.plan.shard.column.label("so_s"))
            self.shard_pos = self.n_user + len(extras) - 1
        self.base = stmt.limit(None).offset(None).order_by(None)
        if extras:
            self.base = self.base.add_columns(*extras)
        self.targets: list[Any] | None = None  # ORM entities to load (Session only)
        if isinstance(conn, Session):
            desc = stmt.column_descriptions
            if all(d["entity"] is not None and d["expr"] is d["type"] for d in desc):
                self.targets = [d["entity"] for d in desc]
        self.n_out = len(self.targets) if self.targets is not None else self.n_user
        self.frozen: Any = None

    def branch(self, shard: int, lower: Any, upper: Any, n: int) -> Any:
        q = self.base.for_shard(shard)
        if lower is not None:
            q = q.where(after_condition(self.columns, lower))
        if upper is not None:
            q = q.where(at_or_before_condition(self.columns, upper))
        return q.order_by(*self.order).limit(n)

    def _outer(self, branches: list[Any], limit: int | None) -> Any:
        if len(branches) == 1:
            sub = branches[0].subquery("so_u")
        elif is_spanner(self.dialect):  # members in parentheses keep their ORDER BY/LIMIT
            sub = union_all(*branches).subquery("so_u")
        else:  # SQLite wants a member's ORDER BY / LIMIT inside a subquery
            sub = union_all(*(select(b.subquery()) for b in branches)).subquery("so_u")
        cols = list(sub.c)
        if self.targets is not None:
            front: list[Any] = [aliased(e, sub) for e in self.targets]
        else:
            front = cols[: self.n_user]
        keys = [cols[p] for p in self.key_pos]
        outer = select(*front, *keys, cols[self.shard_pos])
        if limit is not None:
            outer = outer.order_by(
                *(k.desc() if d else k.asc() for k, (_, d) in zip(keys, self.columns, strict=True))
            ).limit(limit)
        return outer

    def _per_statement(self, branches: list[Any], limit: int | None) -> int:
        """How many branches one statement can hold (Spanner's DB-API parses each one).

        Its sqlparse refuses a statement of more than 10,000 tokens; the statement is
        measured with sqlparse's own lexer and split evenly when it is too long.
        """
        if not is_spanner(self.dialect):
            return _MAX_BRANCHES
        import sqlparse  # the Spanner DB-API's own dependency

        sql = str(self._outer(branches, limit).compile(dialect=self.dialect))
        tokenize: Any = sqlparse.lexer.tokenize
        tokens = len(list(tokenize(sql)))
        if tokens <= _TOKEN_BUDGET:
            return len(branches)
        parts = math.ceil(tokens / (_TOKEN_BUDGET - 500))
        return max(1, math.ceil(len(branches) / parts))

    def fetch(
        self, asks: dict[int, tuple[Any, Any, int]], limit: int | None, stats: MergeStats
    ) -> dict[int, list[Entry]]:
        """{shard: (after, at_or_before, n)} -> {shard: [entries] in order}, one round."""
        shards = list(asks)
        branches = [self.branch(s, *asks[s]) for s in shards]
        per = self._per_statement(branches, limit) if len(branches) > 1 else 1
        out: dict[int, list[Entry]] = {s: [] for s in shards}
        nk = len(self.columns)
        for i in range(0, len(branches), per):
            chunk = branches[i : i + per]
            # an outer LIMIT only when the branches could send more than it
            asked = sum(asks[s][2] for s in shards[i : i + per])
            cap = limit if limit is not None and asked > limit else None
            result = self.conn.execute(self._outer(chunk, cap))
            frozen = result.freeze()
            if self.frozen is None:
                self.frozen = frozen
            stats.statements += 1
            for row in frozen.data:
                values = list(row[self.n_out : self.n_out + nk])
                out[row[-1]].append((sort_key(self.columns, values), values, tuple(row)))
        for rows in out.values():
            rows.sort(key=lambda e: e[0])  # UNION ALL keeps no order: sort each shard's rows
        stats.rows_transferred += sum(len(v) for v in out.values())
        stats.rounds.append({s: len(v) for s, v in out.items()})
        return out

    def rows(self, entries: list[Entry]) -> list[Any]:
        """The user's rows (or entities) of ``entries``, without the merge's columns."""
        if self.frozen is None or not entries:
            return []
        result = self.frozen.with_new_rows([e[2] for e in entries])()
        result = result.columns(*range(self.n_out))
        if self.targets is not None and len(self.targets) == 1:
            return list(result.scalars().all())
        return list(result.all())


def merge_entries(
    query: MergeQuery, stmt: Any, want: int, after: Sequence[Any] | None, stats: MergeStats
) -> list[Entry]:
    """The first ``want`` entries after ``after``, in order; the two rounds above."""
    if after is not None and len(after) != len(query.columns):
        raise ShardConfigError(
            f"after= holds {len(after)} values; this query orders by {len(query.columns)} columns"
        )
    point = stmt.point_shard
    shards = [point] if point is not None else list(range(query.plan.shard.count))
    batch = min(want, math.ceil(want / len(shards)) + 1)
    per = query.fetch(dict.fromkeys(shards, (after, None, batch)), want, stats)
    entries = sorted((e for rows in per.values() for e in rows), key=lambda e: e[0])
    keys = [e[0] for e in entries]
    bound = entries[want - 1] if len(entries) >= want else None
    asks: dict[int, tuple[Any, Any, int]] = {}
    lasts = []
    for s in shards:
        rows = per[s]
        if len(rows) < batch or (bound is not None and not rows[-1][0] < bound[0]):
            continue  # nothing more up to the bound
        cap = want - bisect.bisect_right(keys, rows[-1][0])  # rows ahead of its next one
        if cap > 0:
            asks[s] = (rows[-1][1], bound[1] if bound is not None else None, cap)
            lasts.append(rows[-1][0])
    if asks:
        ahead = bisect.bisect_right(keys, min(lasts))  # in hand, before all of round 2
        total = want - ahead
        asks = {s: (lo, hi, min(n, total)) for s, (lo, hi, n) in asks.items()}
        got = query.fetch(asks, total, stats)
        for s, rows in got.items():
            per[s].extend(rows)
    top = heapq.merge(*per.values(), key=lambda e: e[0])
    return list(itertools.islice(top, want))


def _limit(stmt: Any, limit: object, what: str) -> int:
    own, _ = statement_window(stmt)
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


def _merged(
    conn: Any, stmt: Any, limit: int | None, after: Sequence[Any] | None, stats: MergeStats
) -> list[Any]:
    query = MergeQuery(conn, stmt)
    n = _limit(stmt, limit, "limit")
    _, offset = statement_window(stmt)
    entries = merge_entries(query, stmt, offset + n, after, stats)
    return query.rows(entries[offset:])


@overload
def merged(
    conn: AsyncConnection | AsyncSession,
    stmt: Any,
    limit: int | None = None,
    *,
    after: Sequence[Any] | None = None,
    stats: MergeStats | None = None,
) -> Awaitable[list[Any]]: ...


@overload
def merged(
    conn: Connection | Session,
    stmt: Any,
    limit: int | None = None,
    *,
    after: Sequence[Any] | None = None,
    stats: MergeStats | None = None,
) -> list[Any]: ...


def merged(
    conn: Any,
    stmt: Any,
    limit: int | None = None,
    *,
    after: Sequence[Any] | None = None,
    stats: MergeStats | None = None,
) -> Any:
    """The first ``limit`` rows of a ``sharded_select`` across its shards, in index order.

    The statement runs as written (joins, DISTINCT, WHERE; its OFFSET skips that many
    rows of the merged order), once per shard, in at most two statements. ``conn`` is a
    Connection (rows come back) or a Session (entities for ``sharded_select(Entity)``);
    with an AsyncConnection or AsyncSession, ``await merged(...)``. ``limit`` defaults to
    the statement's ``.limit(n)``. ``after`` continues strictly after those sort values
    (see ``order_columns``). ``stats``, if given, receives statements and rows transferred.
    """
    st = stats if stats is not None else MergeStats()
    if is_async(conn):
        return conn.run_sync(lambda sync: _merged(sync, stmt, limit, after, st))
    return _merged(conn, stmt, limit, after, st)
