"""The statements of a merge: the user's statement, its per-shard branches, what they cost.

``MergeQuery`` holds the user's statement (the one SQLAlchemy executes, with the merge's
conditions and ORDER BY/LIMIT added) and builds the per-shard branches over it: key-only
branches for the bound round, primary-key branches for the rows statement. Every value
of a read (sort values, LIMITs, OFFSET) is a named parameter, so each statement is built
once per (user statement, backend, plan) and reused with the next read's values
(``MergeQuery.shaped``, ``sharded_orm.read.reuse``). See ``sharded_orm.read.merge`` for
the rounds and docs/queries.md for the cost rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import (
    Boolean,
    Integer,
    and_,
    bindparam,
    literal_column,
    or_,
    select,
    union_all,
)
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from sharded_orm.errors import ShardConfigError
from sharded_orm.read.context import ReadContext
from sharded_orm.read.fanout import BOUND_VAR, SHARD_VAR, FanOut, correlated_ok
from sharded_orm.read.joins import without_options
from sharded_orm.read.limits import (
    compound_limit,
    headroom,
    parameter_limit,
    parameters_of,
    too_many,
)
from sharded_orm.read.order import (
    Slot,
    after_condition,
    at_or_before_condition,
    check_nulls,
    froms_and_key,
    joined_columns,
    order_over,
    plain,
    require_plan,
    slot_values,
    slots,
    tables_of,
)
from sharded_orm.read.reuse import (
    BRANCH_BYTES,
    NEW,
    SHAPES,
    UNCACHEABLE,
    Shape,
    Shaped,
    user_key_of,
)
from sharded_orm.read.shapes import check_shape
from sharded_orm.read.stats import FoundBound as FoundBound  # re-exported
from sharded_orm.read.stats import MergeStats
from sharded_orm.retry import Deadline
from sharded_orm.spanner.stock import refuse_stock


def is_async(conn: Any) -> bool:
    """An AsyncConnection or AsyncSession (told apart without importing asyncio support)."""
    return hasattr(conn, "run_sync") and (
        hasattr(conn, "sync_connection") or hasattr(conn, "sync_session")
    )


def statement_window(stmt: Any) -> tuple[int | None, int]:
    """(LIMIT, OFFSET) of the statement as ints; refuses SQL expressions there."""
    if stmt._fetch_clause is not None:  # (FETCH FIRST: a LIMIT the window cannot read)
        raise ShardConfigError(
            "merged()/page() read the statement's LIMIT, not FETCH FIRST: use .limit(n) "
            "instead of .fetch(n)"
        )
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


#: at most this many index entries (N * K) are read by one statement rather than two
SINGLE_STATEMENT_READS = 1024


def single_statement(shards: int, want: int) -> bool:
    """The cost rule: one statement when the bound round would save no index reads, or
    when the one statement reads at most ``SINGLE_STATEMENT_READS`` index entries.

    Two rounds read at most ``N*ceil(K/N)`` keys, then (uniform shards) about ``K`` rows;
    one statement reads at most ``N*K``. Two rounds cost a second statement or (Spanner,
    where they are one) about twice the text, and the Spanner DB-API parses every text on
    the client (about 20 us per token): more than reading a thousand index entries on
    the server (docs/queries.md has the figures).
    """
    n_k = shards * want
    return n_k <= shards * math.ceil(want / shards) + want or n_k <= SINGLE_STATEMENT_READS


#: the probe is used from this share of the first K rows per shard (K/N) on
PROBE_SHARE = 6


def probe_limit(shards: int, want: int) -> int | None:
    """The per-shard LIMIT ``L`` of one statement that is very likely the whole answer,
    or None where two rounds are better.

    ``L = ceil(K/N) + floor(2K/N)``: the branches read ``N*L <= 2K + N*ceil(K/N)`` index
    entries. The answer is proven exact when no shard gave ``L`` of its first ``K`` rows
    (``sharded_orm.read.merge``). With shards of similar rates a shard's share of the
    first ``K`` is about Poisson(K/N); from ``K/N = PROBE_SHARE`` on, ``L >= 3K/N - 1``
    is at least 4 standard deviations above it, so a second statement is needed only for
    a skewed shard.
    """
    if want < PROBE_SHARE * shards:
        return None
    return math.ceil(want / shards) + (2 * want) // shards


#: the parameters' prefixes: the sort values a read starts after, and those it stops at
#: (``Slot``); the fan-outs of the bound round and of the rows statement (their LIMITs
#: are ``<prefix>_l<shard>``, or ``<prefix>_l`` for the correlated form)
AFTER, UPPER, FOUND, ROWS = "so_a", "so_t", "so_b", "so_u"


class MergeQuery:
    """The user's statement and the per-shard branches a merge sends with it.

    ``deadline``: the read's one deadline (``read_deadline``, made where ``timeout=``
    enters), which every statement of the read shares; ``paged``: a ``page()``, whose
    statements have one shape with and without a cursor or bound."""

    def __init__(
        self, conn: Any, stmt: Any, deadline: Deadline | None = None, *, paged: bool = False
    ) -> None:
        self.plan = require_plan(stmt, "merged")
        #: the caller's Session or Connection as the statement meets it (its bind, the
        #: statement's execution options, the read's deadline)
        self.context = ReadContext(conn, stmt, deadline)
        check_shape(stmt)  # the allowlist: before anything else is read of it
        self.conn = conn
        self.user_key = user_key_of(stmt)
        self.bind = self.context.bind
        self.dialect = self.context.dialect
        refuse_stock(self.dialect, "A sharded read (merged(), page())")
        self.compound_limit = compound_limit(self.connection, self.dialect)
        #: what a statement's shape depends on beyond the user's statement
        self.backend = (type(self.dialect), self.dialect.name, self.compound_limit)
        # the FROMs of the branches (compiling the statement to find them costs about a
        # millisecond: once per read)
        froms, key = froms_and_key(stmt)
        self.columns = order_over(stmt, froms)
        #: the order's keys of joined tables: NULL where an outer join matched no row
        self.joined_keys = joined_columns(self.columns, self.plan.table)
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
        # a key column that orders the merge (the id, as a tie-breaker) is selected once:
        # every token of the text costs the Spanner DB-API's parse
        by_key = {id(c): lbl for (c, _), lbl in zip(self.columns, self.key_labels, strict=True)}
        self.pk_labels = [by_key.get(id(c), c.label(f"so_p{i}")) for i, c in enumerate(self.pk)]
        # loader options belong to the rows' statement, not to key-only branches; the
        # other options (loader criteria: what the WHERE selects) to every statement,
        # where the ORM applies them to each statement's branches too
        self.bare = without_options(self.stmt)
        self.criteria = [
            o for o in stmt._with_options if not getattr(o, "_is_strategy_option", False)
        ]
        self.correlated = correlated_ok(self.dialect, froms)
        self.bare_var = self.bare.for_shard_named(SHARD_VAR)
        #: a page: the same statement shapes with and without a cursor or bound (slots
        #: whose ``<prefix>_none`` parameter says there are none), each row's shard read
        self.paged = paged
        #: each row of the statement is one row of the sharded table (no join, no DISTINCT)
        self.one_to_one = not stmt._distinct and all(
            t is self.plan.table for f in froms for t in tables_of(f)
        )
        # the user's statement joined to the branches: they carry the hint and the shard
        # predicate (and, one row of ours per row, the WHERE clause each row passed there)
        self.joined = self.stmt.without_plan(where=not self.one_to_one)
        self._limit_parameters(stmt, key)
        desc = stmt.column_descriptions
        #: the rows are one mapped entity each: returned as the entities (``scalars()``)
        self.scalars = (
            isinstance(conn, Session)
            and len(desc) == 1
            and desc[0]["entity"] is not None
            and desc[0]["expr"] is desc[0]["entity"]
        )

    def _limit_parameters(self, stmt: Any, key: Any) -> None:
        """Refuse a read whose statements cannot fit the backend's parameter limit, and
        say which plans fit (``sharded_orm.read.limits``)."""
        #: the bound round runs inside the rows statement (``Plan.found``): on Spanner,
        #: for ``merged()`` of a statement whose rows are each one row of ours (a page
        #: keeps its own round, whose keys also bound the pages after it), where its
        #: WHERE twice fits the parameter limit (``read`` clears it when, as finally
        #: compiled, it does not)
        self.bound_in_rows = self.correlated and self.one_to_one and not self.paged
        #: the limit each statement's parameters are counted against as it is sent
        #: (``ParameterGuard``); None where the count before sending proves they fit
        self.sent_limit: int | None = None
        self.parameter_limit = parameter_limit(self.connection, self.dialect)
        if self.parameter_limit is None or self.stmt.point_shard is not None:
            return
        params = parameters_of(stmt, key)
        # loader criteria apply wherever their entity appears (each branch, the rows
        # statement's own entity): counted here once each, exactly as they are sent
        crit = parameters_of(stmt, stmt._generate_cache_key()) - params if self.criteria else 0
        ours = headroom(len(self.columns))
        fits = 2 * (params + crit) + crit + ours <= self.parameter_limit
        self.bound_in_rows = self.bound_in_rows and fits
        # the WHERE clause is in every branch (once for the correlated ones), and around
        # them where a row of the statement is not one row of ours
        times = (1 if self.correlated else self.plan.shard.count) + (not self.one_to_one)
        least = times * params + crit
        if least > self.parameter_limit:
            raise too_many(least, self.parameter_limit, "statements", self.dialect)
        # what a do_orm_execute listener adds is known only as the statement is sent
        listened = isinstance(self.conn, Session) and bool(self.conn.dispatch.do_orm_execute)
        if listened or crit > 0 or times * (params + ours) > self.parameter_limit:
            self.sent_limit = self.parameter_limit

    @property
    def connection(self) -> Connection:
        """The Connection the statement runs on (``ReadContext.connection``)."""
        return self.context.connection

    def _order(self, terms: Sequence[Any]) -> list[Any]:
        # ascending is the default: no ASC (every token costs the Spanner DB-API's parse)
        return [t.desc() if d else t for t, (_, d) in zip(terms, self.columns, strict=True)]

    def branch(
        self,
        shard: int | None,
        labels: list[Any],
        lower: Any,
        upper: Any,
        limit: Any,
        unbounded: Any = None,
    ) -> Any:
        """One shard's first ``limit`` rows (a parameter) in (lower, upper], as ``labels``
        only (``upper`` False: no upper condition; ``unbounded``: SQL true where ``upper``
        does not apply; ``shard`` None: the shard the enclosing fan-out names)."""
        extra = [lbl for lbl in labels if all(lbl is not k for k in self.key_labels)]
        pinned = self.bare.for_shard(shard) if shard is not None else self.bare_var
        if self.stmt._distinct:  # DISTINCT decides over the user's columns: keep them
            q = pinned.add_columns(*self.key_labels, *extra)
        else:  # only ours: a short text (the Spanner DB-API parses every statement)
            q = pinned.with_only_columns(*self.key_labels, *extra, maintain_column_froms=True)
        up = None if upper is False else self.up_to(upper)
        if up is not None and unbounded is not None:
            up = or_(unbounded, up)
        for cond in (self.after(lower), up):
            if cond is not None:
                q = q.where(cond)
        q = q.order_by(*self._order(self.key_labels)).limit(limit)
        if shard is None and not self.stmt._distinct:
            return q  # a struct of our labels (its field names are what the fan-out reads)
        sub = q.subquery()
        return select(*(sub.c[lbl.name] for lbl in labels))

    def fan(
        self,
        labels: list[Any],
        lower: Any,
        upper: Any,
        shards: Sequence[int],
        name: str,
        joined: bool = False,
        bound: Any = None,
    ) -> Any:
        """The branches of ``shards`` as one FROM with a column per label, each limited
        by the parameters ``fan_limits(name, ...)`` gives: a correlated fan-out on Spanner
        (every shard, one LIMIT; ``joined``: the right side of a JOIN, after ``bound``,
        see ``found_bound``), a ``UNION ALL`` elsewhere."""
        if self.correlated:
            # a bound found in the statement is NULL where fewer keys than it needs exist
            unbounded = None if bound is None else literal_column(BOUND_VAR).is_(None)
            limit = bindparam(f"{name}_l", type_=Integer())
            inner = self.branch(None, labels, lower, upper, limit, unbounded)
            inner = inner.prefix_with("AS STRUCT")
            names = [lbl.name for lbl in labels]
            return FanOut(name, names, inner, self.plan.shard.count, joined, bound)
        branches = [
            self.branch(s, labels, lower, upper, bindparam(f"{name}_l{s}", type_=Integer()))
            for s in shards
        ]
        return self._union(branches, name)

    def fan_limits(self, name: str, limits: dict[int, int]) -> dict[str, int]:
        """The LIMIT parameters of fan-out ``name`` for ``limits`` ({shard: LIMIT}): the
        correlated form gives every shard the largest."""
        if self.correlated:
            return {f"{name}_l": max(limits.values())}
        return {f"{name}_l{s}": n for s, n in limits.items()}

    def reads(self, limits: dict[int, int], exact: set[int]) -> int:
        """Index entries the branches ``limits`` read at most: a shard in ``exact`` holds
        no more rows up to the bound than its LIMIT; the correlated form gives every shard
        the largest LIMIT."""
        if not self.correlated:
            return sum(limits.values())
        top = max(limits.values(), default=0)
        return sum(limits.get(s, 0) if s in exact else top for s in range(self.plan.shard.count))

    def sort_slots(self, prefix: str, values: Sequence[Any] | None, params: dict[str, Any]) -> Any:
        """Slots ``prefix<i>`` for the sort ``values``, their parameters put in ``params``
        (None, no values, stays None; for pages, one shape either way: slots, and
        ``prefix_none`` says whether there are values)."""
        if values is None and not self.paged:
            return None
        given = values if values is not None else [None] * len(self.columns)
        params.update(slot_values(self.columns, prefix, given))
        if self.paged:
            params[f"{prefix}_none"] = values is None
        return slots(prefix, len(self.columns))

    def after(self, lower: Sequence[Any] | None) -> Any:
        """Strictly after ``lower`` (None: from the start; slots ``AFTER<i>``: for pages,
        after them unless the parameter ``AFTER_none``)."""
        if lower is None:
            return None
        after = after_condition(self.columns, lower, self.joined_keys)
        if not self.paged:
            return after
        return or_(bindparam(f"{AFTER}_none", type_=Boolean()), after)

    def up_to(self, upper: Sequence[Any] | None) -> Any:
        """At or before ``upper`` (None: no bound; slots ``UPPER<i>``: for pages, at or
        before them unless the parameter ``UPPER_none``)."""
        if upper is None:
            return None
        up_to = at_or_before_condition(self.columns, upper, self.joined_keys)
        if not self.paged or not any(isinstance(v, Slot) for v in upper):
            return up_to
        return or_(bindparam(f"{UPPER}_none", type_=Boolean()), up_to)

    def _union(self, branches: list[Any], name: str) -> Any:
        """The branches as one ``UNION ALL``, nested in groups of at most the backend's
        compound-SELECT limit (SQLite's is 500 terms by default: 65,536 shards are two
        levels of at most 500)."""
        most = self.compound_limit if len(branches) > 1 else None
        terms = branches
        while most is not None and len(terms) > most:
            groups = [terms[i : i + most] for i in range(0, len(terms), most)]
            terms = [g[0] if len(g) == 1 else select(*union_all(*g).subquery().c) for g in groups]
        union: Any = terms[0] if len(terms) == 1 else union_all(*terms)
        return union.subquery(name)

    def _execute(self, stmt: Any, params: dict[str, Any]) -> Any:
        """``stmt`` sent with ``params`` as the user's statement is
        (``ReadContext.execute``), counted as it is sent where the parameters may reach
        the limit (``Oversized``: the read takes another plan, or refuses)."""
        return self.context.execute(stmt, self.sent_limit, params)

    def too_many(self, count: int) -> ShardConfigError:
        """The refusal of a statement of ``count`` parameters, over the limit."""
        return too_many(count, self.parameter_limit or 0, "a statement", self.dialect)

    def shaped(
        self,
        structure: tuple[Any, ...],
        build: Callable[[MergeQuery], Any],
        stats: MergeStats,
        shards: int,
    ) -> Shaped:
        """The statement ``build`` makes of a query over the user's statement, for
        ``structure`` (what its shape depends on beyond the user's statement), with the
        user's values of this read as parameters: built once per (the user statement's
        cache key, backend, structure), then taken from ``SHAPES``
        (``MergeStats.shapes_built`` counts the builds). ``shards``: how many branches
        it fans out to (what it weighs in ``SHAPES``)."""
        user = self.user_key
        if user is None:  # SQLAlchemy cannot tell the statement's shape: build each time
            stats.shapes_built += 1
            return Shaped(build(self), {})
        key = (user.key, self.backend, self.paged, structure)
        entry = SHAPES.get(key, NEW)
        if entry is UNCACHEABLE:
            stats.shapes_built += 1
            return Shaped(build(self), {})
        if isinstance(entry, Shape):
            return Shaped(entry.statement, user.params(entry.names))
        # (its own deadline none: it builds, it sends nothing)
        stmt = build(MergeQuery(self.conn, user.named(), paged=self.paged))
        stats.shapes_built += 1
        if user.all_named(stmt):
            branches = 1 if self.correlated else shards
            SHAPES.put(key, Shape(stmt, user.names, branches * BRANCH_BYTES))
        else:  # values SQLAlchemy keeps elsewhere (loader criteria): not reusable
            SHAPES.put(key, UNCACHEABLE)
        return Shaped(stmt, user.params(user.names))

    def found_bound(self, after: Any, shards: int) -> tuple[Any, list[Any]]:
        """Round 1 inside the rows statement (Spanner): the ``so_w``-th (a parameter, the
        number of rows wanted less one) sort key of every shard's first ``so_b_l``, in
        the database's order, as a struct (the fan-out names it ``BOUND_VAR``), and the
        SQL of its values. With fewer keys it is NULL and there is no bound: a shard that
        sent all its keys may hold more of the answer (every shard in one hot shard's
        table, a small table)."""
        u = self.fan(self.key_labels, after, False, range(shards), FOUND)
        # unqualified: the names are ours alone there (every token costs the DB-API parse)
        keys: list[Any] = [literal_column(lbl.name) for lbl in self.key_labels]
        q = select(*keys).select_from(u).order_by(*self._order(keys))
        q = q.limit(bindparam("so_1", 1, type_=Integer()))  # (a name of ours: reusable)
        q = q.offset(bindparam("so_w", type_=Integer())).prefix_with("AS STRUCT")
        values = [
            literal_column(f"{BOUND_VAR}.{lbl.name}", c.type)
            for lbl, (c, _) in zip(self.key_labels, self.columns, strict=True)
        ]
        return q, values

    def bound(
        self, shards: list[int], after: Any, b: int, want: int, stats: MergeStats
    ) -> list[Any]:
        """Round 1: the first ``want`` (sort key..., shard) rows, as the database orders them."""
        params: dict[str, Any] = {}
        lower = self.sort_slots(AFTER, after, params)
        shaped = self.shaped(
            ("bound", tuple(shards), lower is None),
            lambda query: query.bound_statement(shards, lower),
            stats,
            len(shards),
        )
        params.update(shaped.params, so_n=want, **self.fan_limits(FOUND, dict.fromkeys(shards, b)))
        # all(): one DB-API fetchall, not a fetchone (and its retry bookkeeping) per row
        rows: list[Any] = self._execute(shaped.statement, params).all()
        stats.statements += 1
        stats.key_rows_transferred += len(rows)
        stats.add_bound_round(shards, b)
        return rows

    def bound_statement(self, shards: list[int], lower: Any) -> Any:
        """Round 1's statement: the first ``so_n`` (sort key..., shard) of the branches."""
        # the correlated form names the shard itself: the branches need not select it
        labels = self.key_labels if self.correlated else [*self.key_labels, self.shard_label]
        u = self.fan(labels, lower, False, shards, FOUND)
        keys = [u.c[lbl.name] for lbl in self.key_labels]
        shard = literal_column(SHARD_VAR) if self.correlated else u.c.so_s
        q = self.context.mapped(*keys, shard).order_by(*self._order(keys))
        q = q.limit(bindparam("so_n", type_=Integer()))
        return q.options(*self.criteria) if self.criteria else q

    def rows_statement(
        self,
        asks: dict[int, int] | None,
        after: Any,
        upper: Any,
        n: int,
        offset: int,
        keys: bool,
        stats: MergeStats,
        shard: bool = False,
        found: int | None = None,
    ) -> Shaped:
        """Round 2: the user's statement over the rows the branches ``asks`` ({shard: n})
        allow (every shard's rows when None), ordered and limited by the database (with
        ``keys``, each row's sort key after the user's columns; with ``shard``, then its
        shard). With ``found`` (Spanner, one row of ours per row), round 1 is in the
        statement: every shard's first ``found`` keys give the bound (``found_bound``)."""
        params: dict[str, Any] = {"so_n": n, "so_o": offset}
        lower = self.sort_slots(AFTER, after, params)
        found = found if asks is not None else None
        top = None if found is not None else self.sort_slots(UPPER, upper, params)
        if asks is not None:
            params.update(self.fan_limits(ROWS, asks))
        if found is not None:
            params.update(self.fan_limits(FOUND, dict.fromkeys(range(len(asks or ())), found)))
            params["so_w"] = offset + n - 1

        def build(query: MergeQuery) -> Any:
            return query.rows_build(asks, lower, top, offset > 0, keys, shard, found is not None)

        if asks is None:  # the statement itself, one shard: nothing to build per shard
            stats.shapes_built += 1
            return Shaped(build(self), params)
        structure = ("rows", tuple(asks), lower is None, top is None, offset > 0, keys, shard)
        shaped = self.shaped((*structure, found is not None), build, stats, len(asks))
        return Shaped(shaped.statement, {**params, **shaped.params})

    def rows_build(
        self,
        asks: dict[int, int] | None,
        lower: Any,
        upper: Any,
        offset: bool,
        keys: bool,
        shard: bool,
        found: bool,
    ) -> Any:
        """The statement of ``rows_statement``, its values parameters."""
        q = self.stmt if asks is None else self.joined  # by primary key, not the index
        bound = None
        if found and asks is not None:
            bound, upper = self.found_bound(lower, len(asks))
        # a join can repeat a row of ours with other sort keys: those copies are held to
        # the bounds here (the branches hold each key to them)
        if asks is None or not self.one_to_one:
            for cond in (self.after(lower), self.up_to(upper)):
                if cond is not None:
                    q = q.where(cond)
        if asks is not None:
            # joined (the emulator runs an IN (subquery) again for every row of the outer
            # statement), with no subquery around the branches: every token of the text
            # costs the Spanner DB-API's parse
            u = self.fan(self.pk_labels, lower, upper, list(asks), ROWS, True, bound)
            if not self.one_to_one:  # each key once: a join in a branch can repeat one
                u = select(*u.c).distinct().subquery("so_r")
            match = [u.c[lbl.name] == c for lbl, c in zip(self.pk_labels, self.pk, strict=True)]
            q = q.join(u, and_(*match))
        extra = [*(self.key_labels if keys else []), *([self.shard_label] if shard else [])]
        if extra:
            q = q.add_columns(*extra)
        if keys:  # ordered by our labels, which no output name can shadow
            q = q.order_by(*self._order(self.key_labels))
        else:
            q = q.order_by(*self._order([c for c, _ in self.columns]))
        q = q.limit(bindparam("so_n", type_=Integer()))
        return q.offset(bindparam("so_o", type_=Integer())) if offset else q

    def run_rows(self, shaped: Shaped, extra: int) -> tuple[list[Any], list[list[Any]]]:
        """(the user's rows, the trailing ``extra`` columns of each row).

        The statement is the user's own, executed by SQLAlchemy; ``extra`` columns of
        ours (the sort key a page's cursor is made of) are dropped with ``Result.columns``.
        """
        result = self._execute(shaped.statement, shaped.params)
        if getattr(result, "_unique_filter_state", None) is not None:
            result = result.unique()  # joined eager collections: as the ORM requires
        if not extra:
            return (result.scalars().all() if self.scalars else result.all()), []
        frozen = result.freeze()
        if not frozen.data:
            return [], []
        width = len(frozen.data[0]) - extra  # (an unnamed aliased entity has no key)
        keys = [list(row[width:]) for row in frozen.data]
        users = frozen().columns(*range(width))
        return (users.scalars().all() if self.scalars else users.all()), keys
