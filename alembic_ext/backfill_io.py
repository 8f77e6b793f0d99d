"""The reading and writing side of a backfill: the table's plan, and one writer per backend.

Used by :mod:`alembic_ext.backfill`.
"""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from sharded_orm.errors import ShardConfigError, ShardingWarning
from sharded_orm.read.order import after_condition
from sharded_orm.retry import RetryPolicy, retry_call
from sharded_orm.spanner.mutations import database_of

#: Each batch: up to 8 attempts within 120 s (sharded_orm.retry's defaults).
BATCH_POLICY = RetryPolicy()

Fix = Callable[[list[Any]], list[tuple[Any, int]]]


def utc(value: object) -> object:
    # SQLite gives back naive datetimes: the library stores UTC, so they are UTC.
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=dt.timezone.utc)
    return value


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

    def batch(self, null_only: bool, after: list[Any] | None, limit: int, fix: Fix) -> int:
        """Read the next rows (the NULL ones, or those after key ``after``), write what
        ``fix`` returns; the number of rows read (0: done)."""
        p = self.plan
        read = sa.select(*p.read_cols).order_by(*p.key).limit(limit)
        if null_only:
            read = read.where(p.target.is_(None))
        elif after is not None:
            read = read.where(after_condition([(c, False) for c in p.key], after))
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
        self.last = rows[-1] if rows else None
        return len(rows)


class MutationWriter:
    """Spanner: one read-write transaction per batch, reading the rows and writing the
    changed ones back as one UPDATE mutation (a mutation is one write; a batch of row
    UPDATE statements costs a round of DML per row)."""

    def __init__(self, engine: Engine, plan: Plan) -> None:
        self.database: Any = database_of(engine)
        self.engine = engine
        self.plan = plan

    def batch(self, null_only: bool, after: list[Any] | None, limit: int, fix: Fix) -> int:
        plan = self.plan
        q = self.engine.dialect.identifier_preparer.quote
        key_names = [c.name for c in plan.key]
        params: dict[str, Any] = {}
        types: dict[str, Any] = {}
        where = "TRUE"
        if null_only:
            where = f"{q(plan.target.name)} IS NULL"
        elif after is not None:
            terms = []
            for i, col in enumerate(plan.key):
                params[f"k{i}"] = after[i]
                types[f"k{i}"] = param_type(col.type)
                equal = [f"{q(plan.key[j].name)} = @k{j}" for j in range(i)]
                terms.append("(" + " AND ".join([*equal, f"{q(col.name)} > @k{i}"]) + ")")
            where = " OR ".join(terms)
        sql = (
            f"SELECT {', '.join(q(c.name) for c in plan.read_cols)} FROM {q(plan.table.name)} "
            f"WHERE {where} ORDER BY {', '.join(q(k) for k in key_names)} LIMIT {int(limit)}"
        )
        rows: list[Any] = []

        def work(txn: Any) -> None:
            found = txn.execute_sql(sql, params=params or None, param_types=types or None)
            rows[:] = [list(r) for r in found]
            changes = fix(rows)
            if changes:
                values = [[*key, value] for key, value in changes]
                txn.update(
                    table=plan.table.name, columns=[*key_names, plan.target.name], values=values
                )

        def attempt(timeout: float) -> None:
            self.database.run_in_transaction(work, timeout_secs=timeout)

        retry_call(
            attempt, BATCH_POLICY, what=f"backfill batch of {plan.table.name}.{plan.target.name}",
            idempotent=True, resume="Run the backfill again: it resumes where it stopped.",
        )  # fmt: skip
        self.last = rows[-1] if rows else None
        return len(rows)


def param_type(t: Any) -> Any:
    from google.cloud.spanner_v1 import param_types

    if isinstance(t, sa.Integer):
        return param_types.INT64
    if isinstance(t, sa.DateTime):
        return param_types.TIMESTAMP
    if isinstance(t, sa.Boolean):
        return param_types.BOOL
    if isinstance(t, sa.Float):
        return param_types.FLOAT64
    if isinstance(t, sa.LargeBinary):
        return param_types.BYTES
    if isinstance(t, sa.Date):
        return param_types.DATE
    if isinstance(t, sa.Numeric):
        return param_types.NUMERIC
    return param_types.STRING
