"""The reading and writing side of a backfill: the table's plan, and one writer per backend.

Used by :mod:`alembic_ext.backfill`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import warnings
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from sharded_orm.errors import ShardConfigError, ShardingWarning
from sharded_orm.limits import (
    SPANNER_COMMIT_BYTES,
    SPANNER_KEY_BYTES,
    SPANNER_MUTATIONS,
    row_mutations,
)
from sharded_orm.load.copy import column_value, read_api_value
from sharded_orm.read.order import after_condition, at_or_before_condition
from sharded_orm.retry import Deadline, RetryPolicy, retry_call
from sharded_orm.spanner.key_ranges import KeyRangeSession

#: Each batch: up to 8 attempts within 120 s (sharded_orm.retry's defaults).
BATCH_POLICY = RetryPolicy()

T = TypeVar("T")

Fix = Callable[[list[Any]], list[tuple[Any, int]]]


def utc(value: object) -> object:
    # SQLite gives back naive datetimes: the library stores UTC, so they are UTC.
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=dt.timezone.utc)
    return value


def batch_uppers(
    keys: Iterable[list[Any]], bound: list[Any], batch_size: int, batches: int
) -> tuple[list[list[Any]], bool]:
    """The upper keys of up to ``batches`` ranges of ``batch_size`` rows from a stream of
    the next keys (read with limit ``batch_size * batches``), and whether it reached the
    walk's end (then the last range ends at ``bound``). Keeps one key per batch."""
    uppers: list[list[Any]] = []
    n = 0
    for n, key in enumerate(keys, 1):
        if n % batch_size == 0:
            uppers.append(list(key))
    end = n < batch_size * batches
    if end and n % batch_size:
        uppers.append(bound)
    elif end and uppers:
        uppers[-1] = bound
    return uppers, end


#: the most rows a batch may have where no commit limit bounds it
WALK_ROWS_LIMIT = 1_000_000
#: batches a walk reads at most this many times its batch size (``backfill_walk``: a
#: range grown by concurrent inserts takes 2 batches' rows in one transaction)
WALK_READ_FACTOR = 2


def spanner_batch_size(plan: Plan) -> int:
    """The largest ``batch_size`` whose batches Spanner commits: a batch's transaction
    writes up to ``WALK_READ_FACTOR * batch_size`` changed rows as one UPDATE mutation,
    each row its key columns and the shard (Spanner's count), each index holding the
    shard its entry re-written (:func:`sharded_orm.limits.row_mutations`), and each row
    at most a key's bytes and the shard's."""
    per_row = row_mutations(
        plan.table, len(plan.key) + 1, replaces=True, changed=[plan.target.name]
    )
    rows = min(SPANNER_MUTATIONS // per_row, SPANNER_COMMIT_BYTES // (SPANNER_KEY_BYTES + 16))
    return max(1, rows // WALK_READ_FACTOR)


class Plan:
    """The table, its key and the statements of one backfill."""

    def __init__(self, conn: Connection, table: str, column: str, sources: list[str]) -> None:
        if not sa.inspect(conn).has_table(table):
            raise ShardConfigError(f"table {table!r} does not exist: nothing to backfill")
        t = sa.Table(table, sa.MetaData(), autoload_with=conn)
        if column not in t.c:
            raise ShardConfigError(
                f"{table}.{column} does not exist: add the column before backfilling it"
            )
        missing = [s for s in sources if s not in t.c]
        if missing:
            raise ShardConfigError(f"shard sources {missing} are not columns of {table}")
        self.table = t
        self.target = t.c[column]
        if self.target.primary_key:
            raise ShardConfigError(
                f"{table}.{column} is a key column: Spanner cannot update a key, so a key "
                "shard column cannot be backfilled (create a new table with the new key)"
            )
        if not isinstance(self.target.type, sa.Integer):
            raise ShardConfigError(
                f"{table}.{column} is {self.target.type}, not an integer: it is a data column, "
                "not a shard column; a backfill would overwrite it"
            )
        self.key = list(t.primary_key.columns)
        if not self.key:
            raise ShardConfigError(f"table {table!r} has no primary key: cannot backfill by key")
        self.sources = [t.c[s] for s in sources]
        seen: dict[str, sa.Column[Any]] = {}
        for c in [*self.key, *self.sources, self.target]:
            seen.setdefault(c.name, c)
        self.read_cols = list(seen.values())  # each column once (a source may be a key part)


class SqlWriter:
    """Elsewhere than Spanner: a keyed executemany UPDATE in the reading transaction.

    Written as SQL text with typed parameters, not as ``update(table)``: the library's
    write hook would check a shard it cannot compute better than the backfill does (and
    refuse the naive datetimes SQLite hands back); its raw-SQL warning is silenced for
    this one statement, which is the backfill's own."""

    def __init__(self, engine: Engine, plan: Plan) -> None:
        self.engine = engine
        self.plan = plan
        q = engine.dialect.identifier_preparer.quote
        self.params = [f"k{i}" for i in range(len(plan.key))]
        where = " AND ".join(
            f"{q(c.name)} = :{p}" for c, p in zip(plan.key, self.params, strict=True)
        )
        self.stmt = (
            sa.text(
                f"UPDATE {q(plan.table.name)} SET {q(plan.target.name)} = :new_shard WHERE {where}"
            )
            .bindparams(
                *[
                    sa.bindparam(p, type_=c.type)
                    for c, p in zip(plan.key, self.params, strict=True)
                ],
                sa.bindparam("new_shard", type_=plan.target.type),
            )
            .execution_options(sharded_orm_raw_sql_ok=True)
        )  # it writes computed shards
        self.order = [(c, False) for c in plan.key]
        #: an UPDATE a row, sent as one executemany: no statement grows with the batch
        self.max_batch_size = WALK_ROWS_LIMIT

    def last_key(self, timeout: float) -> list[Any] | None:
        """The table's last key now: the walk's end (rows added after it are not chased)."""
        p = self.plan
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(*p.key).order_by(*[c.desc() for c in p.key]).limit(1)
            ).first()
        return None if row is None else list(row)

    def plan_batches(
        self, after: list[Any] | None, bound: list[Any], batch_size: int, batches: int,
        timeout: float,
    ) -> tuple[list[list[Any]], bool]:  # fmt: skip
        """The next batches' upper keys after ``after`` (see :func:`batch_uppers`)."""
        p = self.plan
        read = sa.select(*p.key).order_by(*p.key).limit(batch_size * batches)
        read = read.where(at_or_before_condition(self.order, bound))
        if after is not None:
            read = read.where(after_condition(self.order, after))
        with self.engine.connect() as conn:
            return batch_uppers(
                (list(r) for r in conn.execute(read.execution_options(yield_per=batch_size))),
                bound, batch_size, batches,
            )  # fmt: skip

    def batch(
        self, after: list[Any] | None, bound: list[Any], limit: int, fix: Fix, timeout: float
    ) -> list[list[Any]]:
        """Read at most ``limit`` rows after key ``after`` up to ``bound``, write what
        ``fix`` returns; the rows read."""
        p = self.plan
        read = sa.select(*p.read_cols).order_by(*p.key).limit(limit)
        read = read.where(at_or_before_condition(self.order, bound))
        if after is not None:
            read = read.where(after_condition(self.order, after))
        with self.engine.begin() as conn:
            rows = [list(r) for r in conn.execute(read)]
            changes = fix(rows)
            if changes:
                args = [
                    {**dict(zip(self.params, key, strict=True)), "new_shard": value}
                    for key, value in changes
                ]
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ShardingWarning)
                    conn.execute(self.stmt, args)
        return rows

    def count_rows(self, timeout: float) -> int:
        """The table's rows now (the total of the walk's progress lines)."""
        with self.engine.connect() as conn:
            count = sa.select(sa.func.count()).select_from(self.plan.table)
            return int(conn.execute(count).scalar_one())

    def count_null(self, timeout: float) -> int:
        p = self.plan
        with self.engine.connect() as conn:
            return int(
                conn.execute(sa.select(sa.func.count()).where(p.target.is_(None))).scalar_one()
            )

    def close(self) -> None:
        pass


class SpannerWriter:
    """Spanner: each batch is one read-write transaction that reads the next rows of the
    key range after the cursor (Spanner's Read API with a ``KeyRange``: the table's stored
    order, DESC parts included, one seek, never a rescan) and commits the changed ones as
    one UPDATE mutation. Every RPC is sent with the batch's timeout and no client retry
    (the client's own retries would wait up to an hour on a silent server):
    :mod:`sharded_orm.retry` decides, with the backfill's deadline. The RPCs are the
    gateway's (:class:`sharded_orm.spanner.key_ranges.KeyRangeSession`); values cross it
    as the client hands them out (BYTES base64-encoded), converted here."""

    def __init__(self, engine: Engine, plan: Plan, key_order: list[tuple[str, bool]]) -> None:
        self.spanner = KeyRangeSession(engine)
        self.engine = engine
        self.plan = plan
        self.key_order = key_order
        self.key_names = [c.name for c in plan.key]
        self.columns = [c.name for c in plan.read_cols]
        self.written = [*self.key_names, plan.target.name]
        self.quote = engine.dialect.identifier_preparer.quote
        self.max_batch_size = spanner_batch_size(plan)

    def _query(self, sql: str, timeout: float) -> list[list[Any]]:
        return self.spanner.query(sql, Deadline.after(timeout))

    def last_key(self, timeout: float) -> list[Any] | None:
        """The table's last key now (the walk's end: rows added after it are not chased)."""
        q = self.quote
        order = ", ".join(f"{q(n)}{' ASC' if d else ' DESC'}" for n, d in self.key_order)
        names = ", ".join(q(n) for n, _ in self.key_order)
        rows = self._retried(
            lambda t: self._query(
                f"SELECT {names} FROM {q(self.plan.table.name)} ORDER BY {order} LIMIT 1", t
            ),
            timeout, "read the last key of",
        )  # fmt: skip
        return [column_value(v) for v in rows[0]] if rows else None

    def count_rows(self, timeout: float) -> int:
        """The table's rows now (the total of the walk's progress lines): one attempt of a
        key-only ``COUNT(*)``, bounded by ``timeout``; the caller decides what a failure
        means."""
        try:
            return int(self._query(f"SELECT COUNT(*) FROM {self.quote(self.plan.table.name)}",
                                   timeout)[0][0])  # fmt: skip
        except Exception:
            self.spanner.forget()  # a lost session, a dead server: start afresh
            raise

    def count_null(self, timeout: float) -> int:
        q = self.quote
        sql = (
            f"SELECT COUNT(*) FROM {q(self.plan.table.name)} "
            f"WHERE {q(self.plan.target.name)} IS NULL"
        )
        rows = self._retried(lambda t: self._query(sql, t), timeout, "count unfilled rows of")
        return int(rows[0][0])

    def _retried(self, fn: Callable[[float], T], timeout: float, what: str) -> T:
        p = self.plan
        policy = dataclasses.replace(BATCH_POLICY, call_timeout=timeout, deadline=timeout * 2)

        def attempt(t: float) -> T:
            try:
                return fn(t)
            except Exception:
                self.spanner.forget()  # a lost session, a dead server: start afresh
                raise

        return retry_call(
            attempt, policy, what=f"{what} {p.table.name}", idempotent=True,
            resume="Run the backfill again: it resumes where it stopped.",
        )  # fmt: skip

    def plan_batches(
        self, after: list[Any] | None, bound: list[Any], batch_size: int, batches: int,
        timeout: float,
    ) -> tuple[list[list[Any]], bool]:  # fmt: skip
        """The next batches' upper keys after ``after``, from a key-only strong read
        (see :func:`batch_uppers`); it keeps one key per batch in memory."""
        try:
            found = self.spanner.read_range(
                self.plan.table.name, self.key_names, _client_key(after), _client_values(bound),
                batch_size * batches, Deadline.after(timeout),
            )  # fmt: skip
            keys = ([column_value(v) for v in k] for k in found)
            return batch_uppers(keys, bound, batch_size, batches)
        except Exception:
            self.spanner.forget()  # a lost session, a dead server: the retry starts afresh
            raise

    def batch(
        self, after: list[Any] | None, bound: list[Any], limit: int, fix: Fix, timeout: float
    ) -> list[list[Any]]:
        """One transaction: at most ``limit`` rows after key ``after`` up to ``bound``
        (both in the table's stored order), the changed ones written back."""
        rows: list[list[Any]] = []

        def rewrite(found: list[list[Any]]) -> list[list[Any]]:
            rows[:] = [[column_value(v) for v in r] for r in found]
            return [_client_values([*key, value]) for key, value in fix(rows)]

        try:
            self.spanner.rewrite_range(
                self.plan.table.name, self.columns, _client_key(after), _client_values(bound),
                limit, self.written, rewrite, Deadline.after(timeout),
            )  # fmt: skip
        except Exception:
            self.spanner.forget()  # a lost session, a dead server: the retry starts afresh
            raise
        return rows

    def close(self) -> None:
        """Delete the session (best effort, bounded: a dead server keeps it; it expires)."""
        self.spanner.close()


def _client_values(values: list[Any]) -> list[Any]:
    """Column values (BYTES as bytes: the writer hands them out) as the client takes them
    in a key or a mutation (BYTES base64-encoded)."""
    return [read_api_value(v) for v in values]


def _client_key(values: list[Any] | None) -> list[Any] | None:
    """:func:`_client_values` of a cursor key (None: the walk's start)."""
    return None if values is None else _client_values(values)
