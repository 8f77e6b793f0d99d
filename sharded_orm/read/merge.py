"""The first ``k`` rows of a sharded statement in exact global order: the database orders,
SQLAlchemy executes.

Every shard is sorted by the index, so the first ``K = offset + k`` rows of the whole
range are the first ``K`` of the union of each shard's first rows. With ``N`` shards:

1. **Bound** (sort keys only). The per-shard branches (the user's statement restricted
   to one shard, ordered by the index), each limited to ``b = ceil(K/N) + floor(K/N)``
   rows, selecting only the sort-key columns and the shard; the database orders them and
   returns the first ``K`` keys. If ``K`` came back, the ``K``-th, ``T``, bounds the
   answer: no row after ``T`` is needed. Which shards may hold more of the answer, and
   how many rows, follows from positions in that ordered result alone (no Python
   comparison of values): a shard that sent ``b`` keys, the last strictly before ``T``
   at position ``p``, may hold at most ``K - p - 1`` more.
2. **Rows.** The user's own statement, unchanged (entities, options, joins, execution
   options), joined on its primary key to the keys of the per-shard branches up to
   ``T``, each limited to what that shard may hold, with the merge's ``ORDER BY ...
   LIMIT k OFFSET offset``. The database orders and limits it; SQLAlchemy loads it
   through the caller's Connection or Session.

The branches are one correlated subquery on Spanner, a ``UNION ALL`` elsewhere
(``sharded_orm.read.fanout``). On Spanner, for a statement whose rows are each one row
of the sharded table, step 1 runs inside step 2 (``Plan.found``): one statement, every
branch of step 2 ``LIMIT K``, stopping at ``T``. One statement (step 2 alone, every
branch limited to ``K``) when it reads few index entries (``single_statement``). Where
``K/N`` is large enough, the probe (``probe_limit``): step 2 alone, every branch limited
to about twice its share, with each row's shard; exact when no shard gave its whole
LIMIT, otherwise the two rounds follow (elsewhere than on Spanner its rows, with their
keys, serve as step 1). A statement that pins one shard is step 2 without branches. A
page's bound round also finds the bounds of the next pages, which then take step 2
alone. See docs/queries.md for the cost rule.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

from sharded_orm.checks import check_positive_int
from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.read.branches import (
    MergeQuery,
    is_async,
    probe_limit,
    single_statement,
    statement_window,
)
from sharded_orm.read.consistency import RowsChanged, read_again, rows_are_whole
from sharded_orm.read.context import read_deadline
from sharded_orm.read.limits import Oversized
from sharded_orm.read.order import (
    order_columns as order_columns,  # re-exported: sharded_orm imports it from here
)
from sharded_orm.read.recorded import add_stats, operation_target
from sharded_orm.read.stats import FoundBound, MergeStats
from sharded_orm.telemetry import operation

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

__all__ = [
    "FoundBound",
    "MergeQuery",
    "MergeStats",
    "is_async",
    "statement_window",
    "merged",
    "read",
]


@dataclass
class Bound:
    """An upper bound for a later page, found by an earlier page's bound round: at least
    that page's rows sort at or before ``values``. ``full`` shards may hold rows up to it
    that the round did not see (each read up to the page's LIMIT)."""

    values: list[Any]
    full: int


@dataclass
class Plan:
    """What the rows statement reads: ``asks`` ({shard: LIMIT}; None: the statement pins
    one shard), ``upper`` (None: no bound), ``exact`` shards (they hold no more rows up to
    ``upper`` than their LIMIT), and bounds for later pages."""

    asks: dict[int, int] | None
    upper: list[Any] | None = None
    exact: set[int] = field(default_factory=set)
    ahead: list[Bound] = field(default_factory=list)
    #: made from a bound round's rows (its rows statement is then checked against them)
    from_round: bool = False
    #: the bound round is in the rows statement, every shard sending this many keys
    found: int | None = None


def _full(
    rows: Sequence[Any], upto: int, b: int
) -> tuple[dict[int, int], dict[int, int], set[int]]:
    """(count, last position, full shards) over ``rows[:upto + 1]``: a shard is full when it
    sent its ``b`` keys there, the last strictly before position ``upto`` (the bound's: a
    shard whose ``b``-th key is the bound holds nothing more before it). With fewer rows
    than that there is no bound, and every shard that sent ``b`` keys may hold more."""
    count: dict[int, int] = {}
    last: dict[int, int] = {}
    for pos, row in enumerate(rows[: upto + 1]):
        count[row[-1]] = count.get(row[-1], 0) + 1
        last[row[-1]] = pos
    full = {s for s, c in count.items() if c == b and last[s] < upto}
    return count, last, full


def plan_rounds(
    query: MergeQuery,
    want: int,
    after: Sequence[Any] | None,
    stats: MergeStats,
    step: int = 0,
    pages: int = 0,
) -> Plan:
    """The rows statement's plan for the first ``want`` rows after ``after``, and (with
    ``pages``) bounds for that many later pages of ``step`` rows, from one bound round
    (run here, or on Spanner for ``merged()`` inside the rows statement)."""
    if after is not None and len(after) != len(query.columns):
        raise ShardConfigError(
            f"after= holds {len(after)} values; this query orders by {len(query.columns)} columns"
        )
    point = query.stmt.point_shard
    if point is not None:
        stats.plan = "point"
        stats.rounds.append({point: want})
        stats.bounds.append(None)
        stats.server_rows_read += want
        return Plan(None)
    shards = list(range(query.plan.shard.count))
    if single_statement(len(shards), want):
        stats.plan = "one statement"
        return Plan(dict.fromkeys(shards, want))
    keys_wanted = want + pages * step
    # each shard sends K/N keys more than its share: then a shard rarely holds more of
    # the answer than round 1 saw of it, and round 2 reads about K rows; round 1 reads at
    # most N*ceil(K/N) + K index entries
    b = math.ceil(keys_wanted / len(shards)) + want // len(shards)
    if query.bound_in_rows:  # one snapshot, one round trip, one parse (sends nothing here)
        stats.plan = "two rounds in one statement"
        return Plan(dict.fromkeys(shards, want), found=b)
    stats.plan = "two rounds"
    rows = query.bound(shards, after, b, keys_wanted, stats)
    return plan_from(rows, shards, want, b, step, pages)


def plan_from(
    rows: Sequence[Any], shards: list[int], want: int, b: int, step: int = 0, pages: int = 0
) -> Plan:
    """The rows statement's plan from a bound round's ``rows`` (sort key..., shard), the
    first of every shard's first ``b``, in the database's order."""
    upper = list(rows[want - 1][:-1]) if len(rows) >= want else None
    count, last, full = _full(rows, want - 1, b)
    asks: dict[int, int] = {}
    for s in shards:
        c = count.get(s, 0)
        if s in full:  # its b-th key is before the bound: it may hold more
            c += want - last[s] - 1
        asks[s] = c
    ahead = []
    for i in range(1, pages + 1):
        pos = want - 1 + i * step
        if pos >= len(rows):
            break
        ahead.append(Bound(list(rows[pos][:-1]), len(_full(rows, pos, b)[2])))
    return Plan(asks, upper, set(shards) - full, ahead, from_round=True)


def _run(
    query: MergeQuery,
    plan: Plan,
    n: int,
    offset: int,
    after: Sequence[Any] | None,
    stats: MergeStats,
    keys: bool,
    reads: int | None = None,
    shard: bool = False,
) -> tuple[list[Any], list[list[Any]]]:
    """The rows statement of ``plan``, run, and what it cost in ``stats`` (with ``keys``,
    each row's sort key too; with ``shard``, then its shard).

    A plan from a bound round, which may have seen other rows (no common snapshot), is
    checked: ``RowsChanged`` is raised when fewer than ``n`` rows came back up to its
    bound (rows went since), or when, with every branch allowed one row more than the
    round saw and each row's shard returned, the rows are not provably the first ``n``
    (``rows_are_whole``). Past an OFFSET the skipped rows' shards are not seen: only the
    first check runs. DISTINCT is checked: the order's columns are selected, the primary
    key among them, so the shard column removes nothing.
    """
    keys = keys or query.shadowed
    by_position = plan.from_round and offset == 0
    asks = plan.asks
    if by_position and asks is not None:
        asks = {s: c + 1 for s, c in asks.items()}
    # a page's rows statements have one shape, checked or not (one compiled form)
    with_shard = shard or by_position or query.paged
    shaped = query.rows_statement(
        asks, after, plan.upper, n, offset, keys, stats, with_shard, plan.found
    )
    width = (len(query.key_labels) if keys else 0) + with_shard
    rows, key_rows = query.run_rows(shaped, width)
    stats.statements += 1
    stats.rows_transferred += len(rows)
    if plan.found is not None and asks is not None:
        reads = _found_reads(stats, len(asks), plan.found, n + offset)
    if asks is not None:
        stats.rounds.append({s: c for s, c in asks.items() if c})
        stats.bounds.append(plan.upper if plan.found is None else FoundBound(n + offset))
        if reads is None:  # a shard known to hold ``c`` rows up to the bound reads ``c``
            reads = query.reads(asks, plan.exact) - len(plan.exact & asks.keys()) * by_position
        stats.server_rows_read += reads
    if plan.from_round and plan.upper is not None and len(rows) < n:
        raise RowsChanged
    if by_position and asks is not None:
        top = max(asks.values(), default=0) if query.correlated else None
        if not rows_are_whole([k[-1] for k in key_rows], asks, top, n):
            raise RowsChanged
    if with_shard and not shard:
        key_rows = [k[:-1] for k in key_rows]
    return rows, key_rows


def _found_reads(stats: MergeStats, shards: int, b: int, want: int) -> int:
    """Records the bound round inside a statement (every shard's first ``b`` keys) and
    returns the most index entries the rows' branches then read: a shard whose ``b``
    keys were not all before the bound (most) reads only the keys it sent up to it
    (``want`` in all, less ``b`` for each full shard), and at most ``(want - 1) // b``
    full ones read up to their LIMIT, ``want``."""
    stats.add_bound_round(range(shards), b)
    full = min(shards, (want - 1) // b)
    return min(shards * want, want + full * (want - b))


def read(
    query: MergeQuery,
    want: int,
    n: int,
    offset: int,
    after: Sequence[Any] | None,
    stats: MergeStats,
    keys: bool = False,
    ahead: Sequence[Bound] = (),
    step: int = 0,
    pages: int = 0,
) -> tuple[list[Any], list[list[Any]], list[Bound]]:
    """``read_plans``, under the backend's parameter limit as the statements are finally
    compiled (``sharded_orm.read.limits``): where the statement that holds the bound
    round does not fit, the bound round runs on its own; where no plan fits, a
    ``ShardConfigError`` says what to do."""
    try:
        return read_plans(query, want, n, offset, after, stats, keys, ahead, step, pages)
    except Oversized as e:
        if not query.bound_in_rows:
            raise query.too_many(e.count) from None
    query.bound_in_rows = False  # the bound round in the rows statement did not fit
    try:
        return read_plans(query, want, n, offset, after, stats, keys, ahead, step, pages)
    except Oversized as e:
        raise query.too_many(e.count) from None


def read_plans(
    query: MergeQuery,
    want: int,
    n: int,
    offset: int,
    after: Sequence[Any] | None,
    stats: MergeStats,
    keys: bool = False,
    ahead: Sequence[Bound] = (),
    step: int = 0,
    pages: int = 0,
) -> tuple[list[Any], list[list[Any]], list[Bound]]:
    """Rows ``offset`` to ``offset + n`` of the first ``want`` after ``after`` (and, with
    ``keys``, each row's sort key), and bounds for later pages.

    With a bound from an earlier page (``ahead[0]``, offset 0), one statement: every
    shard's first ``want`` rows up to the bound. If ``want`` rows came back they are the
    answer (any row after the bound sorts after them); fewer mean rows were deleted since,
    and the two-round plan runs. Otherwise the two-round plan, its bound round also
    finding bounds for ``pages`` later pages of ``step`` rows (at most two statements),
    read again when the rows changed between its statements (``read_again``).
    """
    if not ahead and not pages and offset == 0 and query.stmt.point_shard is None:
        limit = probe_limit(query.plan.shard.count, want) if query.one_to_one else None
        if limit is not None:
            return read_again(lambda: probe(query, want, limit, after, stats, keys), stats)
    if ahead and query.stmt.point_shard is None and offset == 0:
        shards = range(query.plan.shard.count)
        bounded = Plan(dict.fromkeys(shards, want), ahead[0].values)
        stats.plan = "page bound"
        # up to the bound, the shards hold ``want`` rows but for those of full shards
        reads = min(want + ahead[0].full * want, len(shards) * want)
        rows, key_rows = _run(query, bounded, n, offset, after, stats, keys, reads)
        if len(rows) == n:
            return rows, key_rows, list(ahead[1:])

    def two_rounds() -> tuple[list[Any], list[list[Any]], list[Bound]]:
        plan = plan_rounds(query, want, after, stats, step, pages)
        rows, key_rows = _run(query, plan, n, offset, after, stats, keys)
        return rows, key_rows, plan.ahead

    return read_again(two_rounds, stats)


def probe(
    query: MergeQuery,
    want: int,
    limit: int,
    after: Sequence[Any] | None,
    stats: MergeStats,
    keys: bool,
) -> tuple[list[Any], list[list[Any]], list[Bound]]:
    """The first ``want`` rows in one statement, every shard's branch ``LIMIT limit``,
    with each row's shard; exact when no shard gave ``limit`` of them (a shard that gave
    fewer gave all it holds up to the last row, or its next row would be among them).
    Otherwise the two-round plan follows: on Spanner one statement that finds its own
    bound; elsewhere the probe's rows, with their sort keys, are its bound round."""
    shards = list(range(query.plan.shard.count))
    own = plan_rounds(query, want, after, stats) if query.bound_in_rows else None
    stats.plan = "probe"
    sort_keys = keys or own is None
    first = Plan(dict.fromkeys(shards, limit))
    rows, extra = _run(query, first, want, 0, after, stats, sort_keys, shard=True)
    if all(c < limit for c in Counter(row[-1] for row in extra).values()):
        return rows, [k[:-1] for k in extra] if keys else [], []
    plan = own or plan_from(extra, shards, want, limit)
    stats.plan = "probe, then two rounds"
    rows, key_rows = _run(query, plan, want, 0, after, stats, keys)
    return rows, key_rows, []


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
    # the span covers the checks too: a refused read is a span with its error.type
    with operation("merged", *operation_target(conn, stmt)) as traced:
        query = MergeQuery(conn, stmt, read_deadline(timeout))
        n = _limit(stmt, limit, "limit")
        _, offset = statement_window(stmt)
        traced.set(shards=query.plan.shard.count, limit=n)
        own = MergeStats()  # this read's figures: the caller's stats may hold others'
        try:
            return read(query, offset + n, n, offset, after, own)[0]
        finally:
            traced.set_all(own.figures())
            add_stats(stats, own)


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
    ``stats``, if given, receives what the read cost. ``timeout`` (seconds) bounds
    the whole read: each statement gets what is left of it (the ``timeout`` execution
    option).

    Two statements that did not see the same rows (AUTOCOMMIT, READ COMMITTED, with a
    write between them) are read again, ``CONSISTENT_ATTEMPTS`` times in all; then
    ``ShardReadError``. In one transaction they always agree.
    """
    st = stats if stats is not None else MergeStats()
    if is_async(conn):
        return conn.run_sync(lambda sync: _merged(sync, stmt, limit, after, st, timeout))
    return _merged(conn, stmt, limit, after, st, timeout)
