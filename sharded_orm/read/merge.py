"""The first ``k`` rows of a sharded statement in exact global order: the database orders,
SQLAlchemy executes.

Every shard is sorted by the index, so the first ``K = offset + k`` rows of the whole
range are the first ``K`` of the union of each shard's first rows. With ``N`` shards:

1. **Bound** (sort keys only). One ``UNION ALL`` of per-shard branches, each the user's
   statement restricted to one shard, ordered by the index and limited to
   ``b = ceil(K/N)`` rows, selecting only the sort-key columns and the shard; the
   database orders the union and returns its first ``K`` keys. If ``K`` came back, the
   ``K``-th, ``T``, bounds the answer: no row after ``T`` is needed. Which shards may hold
   more of the answer, and how many rows, follows from positions in that ordered result
   alone (no Python comparison of values): a shard that sent ``b`` keys, the last strictly
   before ``T`` at position ``p``, may hold at most ``K - p - 1`` more.
2. **Rows.** The user's own statement, unchanged (entities, options, joins, execution
   options), with the cursor's and the bound's conditions, joined on its primary key to
   one ``UNION ALL`` of per-shard branches, each limited to what that shard may hold up to
   ``T``, and the merge's ``ORDER BY ... LIMIT k OFFSET offset``. The database orders and
   limits it; SQLAlchemy loads it through the caller's Connection or Session.

When ``N*K <= N*b + K`` (few rows wanted, or few shards) round 1 would save no reads, and
step 2 alone runs with every branch limited to ``K``: one statement. A statement that
pins one shard is step 2 without branches. See docs/queries.md for the cost rule.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

from sqlalchemy import Boolean, and_, literal, or_, select, union_all
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from sharded_orm.checks import check_positive_int
from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.read.order import (
    after_condition,
    at_or_before_condition,
    check_nulls,
    plain,
    require_plan,
    without_options,
)
from sharded_orm.read.order import (
    order_columns as order_columns,  # re-exported: sharded_orm imports it from here
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession


@dataclass
class MergeStats:
    """What a merge cost.

    ``statements``: statements sent. ``rows_transferred``: full rows (the user's rows)
    that came back. ``key_rows_transferred``: sort-key rows of the bound round.
    ``server_rows_read``: the sum of the per-shard branches' LIMITs (each branch is an
    index range read that stops at its LIMIT), an upper bound of the index rows read.
    ``rounds``: per statement, ``{shard: LIMIT of its branch}``.
    """

    statements: int = 0
    rows_transferred: int = 0
    key_rows_transferred: int = 0
    server_rows_read: int = 0
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


def single_statement(shards: int, want: int) -> bool:
    """The cost rule: one statement when the bound round would save no index reads.

    Two rounds read at most ``N*ceil(K/N)`` keys, then (uniform shards) about ``K`` rows;
    one statement reads at most ``N*K``.
    """
    return shards * want <= shards * math.ceil(want / shards) + want


class MergeQuery:
    """The user's statement and the per-shard branches a merge sends with it."""

    def __init__(self, conn: Any, stmt: Any, timeout: float | None = None) -> None:
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
        missing = [c.name for c, _ in self.columns if not any(c is x for x in selected)]
        if stmt._distinct and missing:
            raise ShardConfigError(
                f"merged()/page() of a DISTINCT statement need the order's columns in the "
                f"select list (missing: {', '.join(missing)}): adding them would change what "
                "DISTINCT removes. Select them, or drop DISTINCT."
            )
        self.stmt = stmt.limit(None).offset(None).order_by(None)
        # Spanner resolves a name in ORDER BY against the output first, case-insensitively
        # (`Owner`.name finds an output column `owner`): then the rows statement orders by
        # labels of ours, selected after the user's columns and dropped from the result.
        names = {str(getattr(c, "name", "")).lower() for c in stmt.selected_columns}
        self.shadowed = any(str(c.table.name).lower() in names for c, _ in self.columns)
        # branches select our own labels: their names are ours alone, and ordering by a
        # label keeps Spanner from resolving a table-qualified name against the output
        self.key_labels = [c.label(f"so_k{i}") for i, (c, _) in enumerate(self.columns)]
        self.shard_label = self.plan.shard.column.label("so_s")
        self.pk = list(self.plan.table.primary_key.columns)
        self.pk_labels = [c.label(f"so_p{i}") for i, c in enumerate(self.pk)]
        # loader options belong to the rows' statement, not to key-only branches
        self.bare = without_options(self.stmt)
        self.options = {} if timeout is None else {"timeout": timeout}
        desc = stmt.column_descriptions
        self.scalars = (
            isinstance(conn, Session)
            and len(desc) == 1
            and desc[0]["entity"] is not None
            and desc[0]["expr"] is desc[0]["entity"]
        )

    def _order(self, terms: Sequence[Any]) -> list[Any]:
        return [t.desc() if d else t.asc() for t, (_, d) in zip(terms, self.columns, strict=True)]

    def branch(self, shard: int, labels: list[Any], lower: Any, upper: Any, n: int) -> Any:
        """One shard's first ``n`` rows in (lower, upper], as ``labels`` only (``upper``
        False: no upper condition)."""
        extra = [lbl for lbl in labels if all(lbl is not k for k in self.key_labels)]
        q = self.bare.for_shard(shard).add_columns(*self.key_labels, *extra)
        if lower is not None:
            q = q.where(after_condition(self.columns, lower))
        if upper is not False:
            q = q.where(self.up_to(upper))
        sub = q.order_by(*self._order(self.key_labels)).limit(n).subquery()
        return select(*(sub.c[lbl.name] for lbl in labels))

    def up_to(self, upper: Sequence[Any] | None) -> Any:
        """At or before ``upper`` (None: no bound), in one shape either way: the page
        that finds no bound shares the compiled form of the others."""
        values = [None] * len(self.columns) if upper is None else upper
        unbounded = literal(upper is None, Boolean())
        return or_(unbounded, at_or_before_condition(self.columns, values))

    def _union(self, branches: list[Any], name: str) -> Any:
        union: Any = branches[0] if len(branches) == 1 else union_all(*branches)
        return union.subquery(name)

    def _execute(self, stmt: Any) -> Any:
        return self.conn.execute(stmt, execution_options=self.options)

    def bound(
        self, shards: list[int], after: Any, b: int, want: int, stats: MergeStats
    ) -> list[Any]:
        """Round 1: the first ``want`` (sort key..., shard) rows, as the database orders them."""
        labels = [*self.key_labels, self.shard_label]
        u = self._union([self.branch(s, labels, after, False, b) for s in shards], "so_b")
        keys = [u.c[lbl.name] for lbl in self.key_labels]
        q = select(*keys, u.c.so_s).order_by(*self._order(keys)).limit(want)
        rows = list(self._execute(q))
        stats.statements += 1
        stats.key_rows_transferred += len(rows)
        stats.server_rows_read += b * len(shards)
        stats.rounds.append(dict.fromkeys(shards, b))
        return rows

    def rows_statement(
        self, asks: dict[int, int] | None, after: Any, upper: Any, n: int, offset: int, keys: bool
    ) -> Any:
        """Round 2: the user's statement over the rows the branches ``asks`` ({shard: n})
        allow (every shard's rows when None), ordered and limited by the database."""
        q = self.stmt
        if after is not None:
            q = q.where(after_condition(self.columns, after))
        q = q.where(self.up_to(upper))
        if asks is not None:
            branches = [self.branch(s, self.pk_labels, after, upper, c) for s, c in asks.items()]
            union = self._union(branches, "so_u")
            # joined, each key once (a join in a branch can repeat one): the emulator
            # runs an IN (subquery) again for every row of the outer statement
            u = select(*union.c).distinct().subquery("so_r")
            match = [u.c[lbl.name] == c for lbl, c in zip(self.pk_labels, self.pk, strict=True)]
            q = q.join(u, and_(*match))
        if keys:  # ordered by our labels, which no output name can shadow
            q = q.add_columns(*self.key_labels)
            q = q.order_by(*self._order(self.key_labels)).limit(n)
        else:
            q = q.order_by(*self._order([c for c, _ in self.columns])).limit(n)
        return q.offset(offset) if offset else q

    def run_rows(self, stmt: Any, extra: int) -> tuple[list[Any], list[list[Any]]]:
        """(the user's rows, the trailing ``extra`` columns of each row).

        The statement is the user's own, executed by SQLAlchemy; ``extra`` columns of
        ours (the sort key a page's cursor is made of) are dropped with ``Result.columns``.
        """
        result = self._execute(stmt)
        if getattr(result, "_unique_filter_state", None) is not None:
            result = result.unique()  # joined eager collections: as the ORM requires
        if not extra:
            return (list(result.scalars()) if self.scalars else list(result)), []
        frozen = result.freeze()
        if not frozen.data:
            return [], []
        width = len(frozen.data[0]) - extra  # (an unnamed aliased entity has no key)
        keys = [list(row[width:]) for row in frozen.data]
        users = frozen().columns(*range(width))
        return (list(users.scalars()) if self.scalars else list(users)), keys


def plan_rounds(
    query: MergeQuery,
    want: int,
    after: Sequence[Any] | None,
    stats: MergeStats,
) -> tuple[dict[int, int] | None, Any]:
    """({shard: LIMIT} of the rows statement's branches (None: no branches), upper bound)."""
    if after is not None and len(after) != len(query.columns):
        raise ShardConfigError(
            f"after= holds {len(after)} values; this query orders by {len(query.columns)} columns"
        )
    point = query.stmt.point_shard
    if point is not None:
        stats.rounds.append({point: want})
        stats.server_rows_read += want
        return None, None
    shards = list(range(query.plan.shard.count))
    if single_statement(len(shards), want):
        return dict.fromkeys(shards, want), None
    b = math.ceil(want / len(shards))
    rows = query.bound(shards, after, b, want, stats)
    upper = list(rows[-1][:-1]) if len(rows) == want else None
    count: dict[int, int] = {}
    last: dict[int, int] = {}
    for pos, row in enumerate(rows):
        count[row[-1]] = count.get(row[-1], 0) + 1
        last[row[-1]] = pos
    asks: dict[int, int] = {}
    for s in shards:
        c = count.get(s, 0)
        if c == b and last[s] < want - 1:  # its b-th key is before the bound: may hold more
            c += want - last[s] - 1
        asks[s] = c
    return asks, upper


def read(
    query: MergeQuery,
    want: int,
    n: int,
    offset: int,
    after: Sequence[Any] | None,
    stats: MergeStats,
    keys: bool = False,
) -> tuple[list[Any], list[list[Any]]]:
    """Rows ``offset`` to ``offset + n`` of the first ``want`` after ``after`` (and, with
    ``keys``, each row's sort key), in at most two statements."""
    asks, upper = plan_rounds(query, want, after, stats)
    keys = keys or query.shadowed
    stmt = query.rows_statement(asks, after, upper, n, offset, keys)
    rows, key_rows = query.run_rows(stmt, len(query.key_labels) if keys else 0)
    stats.statements += 1
    stats.rows_transferred += len(rows)
    if asks is not None:
        stats.rounds.append({s: c for s, c in asks.items() if c})
        stats.server_rows_read += sum(asks.values())
    return rows, key_rows


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
    conn: Any,
    stmt: Any,
    limit: int | None,
    after: Sequence[Any] | None,
    stats: MergeStats,
    timeout: float | None,
) -> list[Any]:
    query = MergeQuery(conn, stmt, timeout)
    n = _limit(stmt, limit, "limit")
    _, offset = statement_window(stmt)
    return read(query, offset + n, n, offset, after, stats)[0]


@overload
def merged(
    conn: AsyncConnection | AsyncSession,
    stmt: Any,
    limit: int | None = None,
    *,
    after: Sequence[Any] | None = None,
    stats: MergeStats | None = None,
    timeout: float | None = None,
) -> Awaitable[list[Any]]: ...


@overload
def merged(
    conn: Connection | Session,
    stmt: Any,
    limit: int | None = None,
    *,
    after: Sequence[Any] | None = None,
    stats: MergeStats | None = None,
    timeout: float | None = None,
) -> list[Any]: ...


def merged(
    conn: Any,
    stmt: Any,
    limit: int | None = None,
    *,
    after: Sequence[Any] | None = None,
    stats: MergeStats | None = None,
    timeout: float | None = None,
) -> Any:
    """The first ``limit`` rows of a ``sharded_select`` across its shards, in index order.

    The rows come from the statement itself, executed through ``conn`` (a Connection:
    rows; a Session: what the statement gives there, entities for
    ``sharded_select(Entity)``; with an AsyncConnection or AsyncSession,
    ``await merged(...)``), with its ORDER BY, LIMIT and OFFSET applied by the database
    over per-shard branches, in at most two statements. ``limit`` defaults to the
    statement's ``.limit(n)``; its OFFSET skips that many rows of the merged order.
    ``after`` continues strictly after those sort values (see ``order_columns``).
    ``stats``, if given, receives what the read cost. ``timeout`` (seconds) is passed
    to every statement as the ``timeout`` execution option.
    """
    st = stats if stats is not None else MergeStats()
    if is_async(conn):
        return conn.run_sync(lambda sync: _merged(sync, stmt, limit, after, st, timeout))
    return _merged(conn, stmt, limit, after, st, timeout)
