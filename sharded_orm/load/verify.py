"""``verify``: count the rows whose stored shard disagrees with its sources.

A row whose shard is wrong is invisible to every sharded query, so after a backfill, a
reshard, or when adopting the library on a table sharded by hand, check the whole table:

* farm_fingerprint columns on Spanner: one server-side ``SELECT COUNT(*), COUNTIF(...)``
  comparing each stored shard with the same expression the generated column uses;
* crc32 columns on Spanner (Spanner has no CRC32): a partitioned scan (a batch read-only
  transaction, ``PartitionQuery``) of the sources and shards, ``workers`` partitions at a
  time, hashed by the client with the library's own ``ShardColumn.compute``;
* any other database: one streamed ``SELECT`` hashed by the client; on SQLite, a row
  whose timestamp source is stored as a text other than the one the column binds (so no
  ``==`` lookup finds it, e.g. ``2018-05-01 15:16:03`` written at 0 microseconds by
  Python's sqlite3 adapter) counts as a mismatch too.

A NULL shard counts as a mismatch (a row the backfill has not reached yet).

Every statement of one verify reads the table as it was at one moment, so a write while
it runs cannot make its report mix two states: on Spanner the row count is a strong read
whose read timestamp the others reuse (the server-side counts, several statements when
their tests pass Spanner's 1,000 function calls, as single-use reads at that timestamp;
the partitioned scan in a batch snapshot at it); elsewhere the count and the scan run in
one transaction (on SQLite the ``BEGIN`` pysqlite leaves out before a SELECT is emitted).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from sharded_orm.checks import check_identifier, check_positive_int, shown
from sharded_orm.errors import ShardConfigError, ShardingError, ShardTypeError
from sharded_orm.greenlets import refuse_async_bind
from sharded_orm.hashing import FARM_FINGERPRINT
from sharded_orm.limits import SPANNER_FUNCTIONS
from sharded_orm.progress import progress
from sharded_orm.retry import DEFAULTS, Deadline
from sharded_orm.schema.coerce import base_type
from sharded_orm.schema.columns import ShardColumn, shard_columns, table_of
from sharded_orm.spanner import is_spanner, snapshots
from sharded_orm.spanner.expressions import shard_sql
from sharded_orm.telemetry import carried, traced
from sharded_orm.write.begin import begin_for_write

__all__ = ["VerifyReport", "connect", "function_calls", "mismatch_sql", "quote", "verify"]


def quote(name: str, what: str = "column name") -> str:
    """A checked identifier in GoogleSQL backticks: no name reaches SQL text unchecked."""
    return f"`{check_identifier(name, what)}`"


def mismatch_sql(column: str, sources: Sequence[sa.Column[Any]], count: int) -> str:
    """GoogleSQL true when the stored ``column`` is NULL or differs from its expression."""
    expr = shard_sql(sources, count, quote)
    col = quote(column)
    return f"COALESCE({col} != {expr}, {col} IS NOT NULL OR ({expr}) IS NOT NULL)"


@dataclass
class VerifyReport:
    """What :func:`verify` found: ``mismatched`` maps each shard column to its bad rows."""

    table: str
    rows_checked: int = 0
    mismatched: dict[str, int] = field(default_factory=dict)
    methods: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(self.mismatched.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "rows_checked": self.rows_checked,
            "mismatched": dict(self.mismatched),
            "methods": dict(self.methods),
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
        }


def connect(bind: Any) -> Any:
    """A context giving a Connection: a new one from an Engine, or the Connection given."""
    if isinstance(bind, sa.Connection):
        return contextlib.nullcontext(bind)
    return bind.connect()


def _decoders(columns: Sequence[sa.Column[Any]], dialect: sa.Dialect) -> list[Any]:
    """Each column's result processor: raw client values become what the ORM would hold."""
    return [c.type.dialect_impl(dialect).result_processor(dialect, None) for c in columns]


def row_decoder(
    columns: Sequence[sa.Column[Any]], dialect: sa.Dialect
) -> Callable[[Sequence[Any]], list[Any]]:
    """A function turning a raw Spanner row of ``columns`` into ORM-side values."""
    procs = _decoders(columns, dialect)

    def decode(row: Sequence[Any]) -> list[Any]:
        return [p(v) if p is not None else v for p, v in zip(procs, row, strict=True)]

    return decode


#: (shard column index, position of the decoded value, position of the stored text,
#: the column's bind processing: value -> the text an equality lookup binds)
TextCheck = tuple[int, int, int, Callable[[Any], Any]]


def _count_mismatches(
    shards: Sequence[ShardColumn],
    rows: Iterable[Sequence[Any]],
    bar: Any,
    texts: Sequence[TextCheck] = (),
) -> tuple[int, list[int]]:
    """Hash each row (sources of every shard column, then the stored shards) client-side:
    the rows seen and each column's mismatches. A row whose stored text of a source is not
    the text a lookup binds for its value (``texts``) is a mismatch too: no ``==`` finds it."""
    spans = []
    at = 0
    for sc in shards:
        spans.append((sc, at, at + len(sc.sources)))
        at += len(sc.sources)
    bad = [0] * len(shards)
    n = 0
    for row in rows:
        n += 1
        for i, (sc, lo, hi) in enumerate(spans):
            stored = row[at + i]
            try:
                good = stored is not None and stored == sc.compute(row[lo:hi])
            except ShardingError:  # a NULL or unhashable source: the row cannot be right
                good = False
            if good:
                good = all(
                    row[raw] is None or row[raw] == bind(row[value])
                    for j, value, raw, bind in texts
                    if j == i
                )
            if not good:
                bad[i] += 1
        if n % 1000 == 0:
            bar.advance(1000)
    bar.advance(n % 1000)
    return n, bad


def scan_partitions(
    snapshot: Any, sql: str, work: Callable[[Iterable[Any]], tuple[int, list[int]]],
    workers: int, timeout: float,
) -> tuple[int, list[int]]:  # fmt: skip
    """``work`` on each partition of ``sql`` in one batch snapshot, ``workers`` partitions
    at a time (threads: a partition's rows arrive over the network while others are
    hashed; the partitions share the snapshot's read timestamp, as Dataflow's workers do).
    Listing the partitions takes at most ``timeout`` and ``DEFAULTS["partition_query"]``;
    each partition's stream is bounded by ``timeout``; sums of what ``work`` returns."""
    from concurrent.futures import ThreadPoolExecutor

    listing = Deadline.after(min(timeout, DEFAULTS["partition_query"]), "the partitioning")
    batches = snapshots.partitions(snapshot, sql, listing)

    def read_one(batch: Any) -> tuple[int, list[int]]:
        deadline = Deadline.after(timeout, "partition_timeout")  # from its stream's start
        return work(snapshots.partition_rows(snapshot, batch, deadline))

    total, bad = 0, None
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="verify") as pool:
        # each partition's client spans under verify's (carried: the caller's context)
        parts = pool.map(carried(read_one), batches)
        for n, found in parts:
            total += n
            bad = found if bad is None else [x + y for x, y in zip(bad, found, strict=True)]
    return total, bad or []


def _spanner_counts(
    snapshot: Any, bind: Any, table: sa.Table, shards: Sequence[ShardColumn], bar: Any,
    workers: int, timeout: float,
) -> tuple[int, list[int]]:  # fmt: skip
    """Every row's sources and shards through a partitioned read of ``snapshot`` (the
    verify's one batch snapshot), hashed as they come."""
    columns = [c for sc in shards for c in sc.sources] + [sc.column for sc in shards]
    sql = f"SELECT {', '.join(quote(c.name) for c in columns)} FROM {quote(table.name, 'table')}"
    decode = row_decoder(columns, bind.dialect)
    return scan_partitions(
        snapshot, sql, lambda raw: _count_mismatches(shards, map(decode, raw), bar),
        workers, timeout,
    )  # fmt: skip


def _text_checks(dialect: sa.Dialect, shards: Sequence[ShardColumn]) -> list[TextCheck]:
    """On SQLite, where a timestamp is stored as text and compared as text, each timestamp
    source's check that its stored text is the one the column binds: a row another writer
    stored as ``2018-05-01 15:16:03`` (Python's sqlite3 adapter at 0 microseconds) holds
    the right shard, yet ``ts == value`` binds ``...03.000000`` and never finds it."""
    if dialect.name != "sqlite":
        return []
    checks: list[TextCheck] = []
    at = 0
    n = sum(len(sc.sources) for sc in shards) + len(shards)
    for i, sc in enumerate(shards):
        for c in sc.sources:
            if isinstance(base_type(c.type), sa.DateTime):
                process = c.type.dialect_impl(dialect).bind_processor(dialect)
                checks.append((i, at, n + len(checks), process or (lambda v: v)))
            at += 1
    return checks


def _sqlalchemy_scan(
    conn: sa.Connection, shards: Sequence[ShardColumn], texts: Sequence[TextCheck]
) -> Iterable[Any]:
    columns = [c for sc in shards for c in sc.sources] + [sc.column for sc in shards]
    raw = [sa.type_coerce(columns[value], sa.String()) for _, value, _, _ in texts]
    stmt = sa.select(*columns, *raw).execution_options(yield_per=5000)
    yield from conn.execute(stmt)


#: what GoogleSQL counts as a function call in a statement's text, over-counted: every
#: parenthesis opened (calls, CASTs, groupings) and every operator
_CALLS = re.compile(r"\(|!=|<>|<=|>=|[=<>+*/-]|\b(?:IS|OR|AND|NOT)\b")


def function_calls(sql: str) -> int:
    """An upper bound of the function calls Spanner counts in ``sql`` (its limit:
    :data:`sharded_orm.limits.SPANNER_FUNCTIONS`), string literals aside."""
    return len(_CALLS.findall(re.sub(r"'(?:[^'\\]|\\.)*'", "''", sql)))


def _server_counts(
    bind: Any, table: sa.Table, shards: Sequence[ShardColumn], read_timestamp: Any
) -> list[int]:
    """``[COUNT(*), mismatches of each column]``, server-side: one query, or one per group
    of columns when their tests together pass Spanner's function calls a statement; every
    query reads at ``read_timestamp`` (the verify's snapshot), so a write between two of
    them is seen by neither."""
    tests = [f"COUNTIF({mismatch_sql(sc.name, sc.sources, sc.count)})" for sc in shards]
    groups: list[list[str]] = []
    used = 0
    budget = SPANNER_FUNCTIONS - function_calls("COUNT(*)")
    for test in tests:
        cost = function_calls(test)
        if not groups or used + cost > budget:
            groups.append([])
            used = 0
        groups[-1].append(test)
        used += cost
    total: int | None = None
    counts: list[int] = []
    engine = bind.engine if isinstance(bind, sa.Connection) else bind
    # each query a single-use read at the one timestamp: no transaction of ours for another
    # to end (the emulator ends an older transaction when a newer one begins)
    with engine.connect() as fresh:
        conn = fresh.execution_options(
            isolation_level="AUTOCOMMIT", read_only=True,
            staleness={"read_timestamp": read_timestamp},
        )  # fmt: skip
        for group in groups:
            sql = f"SELECT {', '.join(['COUNT(*)', *group])} FROM {quote(table.name, 'table')}"
            row = [int(v or 0) for v in conn.exec_driver_sql(sql).one()]
            total = row[0] if total is None else total
            counts += row[1:]
    return [total or 0, *counts]


@contextlib.contextmanager
def _spanner_snapshot(bind: Any, table: sa.Table, timeout: float) -> Iterator[tuple[Any, int, Any]]:
    """The verify's one moment on Spanner: the table's row count, a strong read whose read
    timestamp the answer gives; then a batch snapshot at that timestamp (the partitioned
    scan) and the server-side counts at it too, so every statement sees the table as it
    was at one moment, and none holds a transaction another could end. The count's read,
    restarts included, ends within ``timeout`` (a partition's most)."""
    from sharded_orm.spanner.mutations import database_of

    database = database_of(bind)
    sql = f"SELECT COUNT(*) FROM {quote(table.name, 'table')}"
    try:
        row, at = snapshots.strong_first_row(
            database, sql, Deadline.after(timeout, "partition_timeout")
        )
    except Exception as exc:  # said as the library says it, with what to do
        failure = snapshots.call_failure(exc)
        if failure is None:
            raise
        if failure.timed_out:
            todo = (
                f"Spanner did not answer within {timeout:g} s (partition_timeout): run "
                "verify again, or give it a larger partition_timeout"
            )
        elif "not found" in failure.message.lower():
            todo = "check that the table exists in this database (and the URL names it)"
        else:
            todo = "run verify again; nothing was changed"
        raise ShardingError(
            f"verify could not count the rows of {table.name!r}: {failure.message}; {todo}."
        ) from exc
    with snapshots.snapshot_at(database, at) as snapshot:
        yield snapshot, int(row[0]), at


def _verify_target(bind: Any, model_or_table: Any, *args: Any, **kw: Any) -> tuple[Any, str]:
    return bind, table_of(model_or_table).name


def _verify_figures(report: VerifyReport) -> dict[str, Any]:
    return {"rows_checked": report.rows_checked, "rows_mismatched": sum(report.mismatched.values())}


@traced("verify", _verify_target, _verify_figures)
def verify(
    bind: Any, model_or_table: Any, *, progress_mode: Any = "auto", workers: int = 4,
    partition_timeout: float = DEFAULTS["partition_read"],
) -> VerifyReport:  # fmt: skip
    """Check every row's shard columns against their sources; see the module docstring.

    ``bind`` is an Engine or Connection; ``model_or_table`` a mapped class or ``Table``.
    ``workers``: partitions of a crc32 scan on Spanner read at a time;
    ``partition_timeout``: the most one partition's stream may take.
    Returns a :class:`VerifyReport` (``.rows_checked``, ``.mismatched`` by column name).
    """
    refuse_async_bind(bind, "verify")
    if not isinstance(bind, (sa.Engine, sa.Connection)):
        hint = " (create_engine(url) first)" if isinstance(bind, str) else ""
        raise ShardTypeError(
            f"verify takes a SQLAlchemy Engine or Connection, got {shown(bind)}{hint}"
        )
    check_positive_int(workers, "workers")
    table = table_of(model_or_table)
    shards = shard_columns(table)
    if not shards:
        raise ShardConfigError(
            f"table {table.name!r} has no shard columns, so there is nothing to verify; "
            "declare them with shard_column(...) (or pass the model that does)"
        )
    report = VerifyReport(table.name, mismatched={sc.name: 0 for sc in shards})
    start = time.monotonic()
    if is_spanner(bind):
        _verify_spanner(bind, table, shards, report, progress_mode, workers, partition_timeout)
    else:
        _verify_client(bind, table, shards, report, progress_mode)
    report.seconds = time.monotonic() - start
    return report


def _verify_spanner(
    bind: Any, table: sa.Table, shards: Sequence[ShardColumn], report: VerifyReport,
    progress_mode: Any, workers: int, partition_timeout: float,
) -> None:  # fmt: skip
    """farm_fingerprint columns counted server-side, the others hashed from a partitioned
    scan: all of it in one snapshot (:func:`_spanner_snapshot`)."""
    server = [sc for sc in shards if sc.algorithm == FARM_FINGERPRINT]
    client = [sc for sc in shards if sc not in server]
    with _spanner_snapshot(bind, table, partition_timeout) as (snapshot, total, at):
        report.rows_checked = total
        if client:
            with progress(total, f"verify {table.name}", mode=progress_mode) as bar:
                n, bad = _spanner_counts(
                    snapshot, bind, table, client, bar, workers, partition_timeout
                )
            report.rows_checked = max(total, n)
            for sc, found in zip(client, bad, strict=True):
                report.mismatched[sc.name] = found
        if server:
            counts = _server_counts(bind, table, server, at)
            for sc, n in zip(server, counts[1:], strict=True):
                report.mismatched[sc.name] = n
    for sc in shards:
        report.methods[sc.name] = "server-side count" if sc in server else "partitioned scan"


def _verify_client(
    bind: Any, table: sa.Table, shards: Sequence[ShardColumn], report: VerifyReport,
    progress_mode: Any,
) -> None:  # fmt: skip
    """Every shard hashed by the client from one streamed SELECT, after the row count (the
    progress bar's total), both in one transaction: on SQLite the ``BEGIN`` pysqlite would
    not emit before a SELECT is emitted (:func:`sharded_orm.write.begin.begin_for_write`),
    so the scan reads what the count read."""
    with connect(bind) as conn:
        begin_for_write(conn)
        count = sa.select(sa.func.count()).select_from(table)
        total = int(conn.execute(count).scalar_one())
        with progress(total, f"verify {table.name}", mode=progress_mode) as bar:
            texts = _text_checks(bind.dialect, shards)
            n, bad = _count_mismatches(shards, _sqlalchemy_scan(conn, shards, texts), bar, texts)
    report.rows_checked = n
    for sc, found in zip(shards, bad, strict=True):
        report.mismatched[sc.name] = found
        report.methods[sc.name] = "client scan"
