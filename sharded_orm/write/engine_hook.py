"""The one place every INSERT and UPDATE of a sharded table passes through.

A ``before_execute`` hook looks at each INSERT/UPDATE whose table is sharded, however the
statement names it (``sharded_orm.write.targets``), and fills or checks every row
(``sharded_orm.write.rows``). It is attached to one engine at a time (``watch``), only to
engines that have something to do with a sharded table: every Spanner engine (our
dialect's ``engine_created``), any other engine the moment it creates (or checks) a
sharded table or runs an ORM flush or statement on a sharded model, and any engine given
to ``sharded_orm.watch``. No class-level ``Engine`` listener exists, so an engine that
never meets a sharded table stays on SQLAlchemy's no-events fast path. It also:

* adds the shard to a SQLite/PostgreSQL upsert's ``ON CONFLICT DO UPDATE SET`` when the
  SET changes a source (as ``excluded.<shard>``), or refuses one it cannot prove;
* accepts ``INSERT ... FROM SELECT`` only when it copies shard and sources together from
  a table sharded the same way (nothing else can be computed in SQL for crc32);
* refuses an UPDATE that the database would cascade (``ON UPDATE CASCADE``) into a source;
* warns (``ShardingWarning``) once per statement when raw SQL (``text()``,
  ``exec_driver_sql``) writes a sharded table: it cannot be checked.

The ORM flush's own INSERT rows get each shard here, once, from what is finally sent,
filled in place and written back to their objects (``sharded_orm.write.trust``); a key
shard ``before_insert`` computed is read with one comparison, not hashed again.
"""

from __future__ import annotations

import hashlib
import re
import warnings
import weakref
from operator import methodcaller
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.sql.elements import TextClause

from sharded_orm.checks import shown
from sharded_orm.errors import ShardConfigError, ShardingWarning, ShardTypeError
from sharded_orm.memo import Memo
from sharded_orm.schema.registry import cascade_targets, set_engine_watcher, sharded_names
from sharded_orm.schema.timestamps import OFFSETS_DROPPED, drops_offsets
from sharded_orm.spanner import is_spanner
from sharded_orm.spanner.stock import refuse_stock
from sharded_orm.telemetry import skew
from sharded_orm.write import stock_writes as _stock_writes  # noqa: F401  (compile hooks)
from sharded_orm.write import successor
from sharded_orm.write.begin import begin_for_write
from sharded_orm.write.rows import Fetch, RowShards, fast_insert_rows, resendable
from sharded_orm.write.sql import (
    MISSING,
    column_key,
    literal_value,
    statement_values,
    where_equalities,
)
from sharded_orm.write.statements import check_from_select, onto_declared, with_upsert_shard
from sharded_orm.write.stored import StoredRows
from sharded_orm.write.targets import statement_table, write_shards
from sharded_orm.write.trust import (
    Expected,
    Taken,
    forget,
    hook_fills,
    take,
    targets_of,
    updated_objects,
)


def _rewrite_multi_values(stmt: Insert, table: Any, shards: RowShards) -> Insert:
    """``insert().values([{...}, {...}])``: fill each VALUES row in the statement itself.

    SQLAlchemy keeps these rows in ``Insert._multi_values`` (no public accessor), and a
    context-sensitive column default cannot see them; so we rebuild the rows with the shard.
    """
    new_rows: list[dict[str, Any]] = []
    first_keys: tuple[str, ...] | None = None
    for group in stmt._multi_values:
        for raw in group:
            items = raw.items() if isinstance(raw, dict) else zip(table.c, raw, strict=False)
            row: dict[str, Any] = {}
            for k, v in items:
                key = column_key(k)
                if key is None:
                    raise ShardConfigError(f"cannot read multi-VALUES key {k!r}")
                lit = literal_value(v)
                row[key] = v if lit is MISSING else lit
            if first_keys is None:  # what SQLAlchemy's context shows each row's defaults
                shards.defaults.use_multi_values(first_keys := tuple(row))
            new_rows.append(shards.insert_row(row, {}))
    new = stmt._generate()
    # plain values, as the caller gave them: SQLAlchemy binds each under its per-row name
    # (``id_m1``), which its context shows a context-sensitive default of a later row
    # (an anonymous literal() left that default a KeyError)
    new._multi_values = (new_rows,)  # type: ignore[assignment]
    return new


def _refuse_missing_columns(table: Any, shards: RowShards, is_insert: bool, keys: Any) -> None:
    """A lightweight ``sa.table()`` that could not be rebuilt on the declared table must
    name the shard column for us to set it."""
    for sc in shards.client_made:
        if getattr(sc.column, "table", None) is not None:
            continue
        if is_insert or any(k in keys for k in sc.source_keys):
            raise ShardConfigError(
                f"this statement writes shard sources of {table.name!r} through a table() "
                f"that has no column {sc.name!r}, so sharded-orm cannot set the shard. Add "
                f"sa.column({sc.name!r}) to the table() (or write through the model)."
            )


def _refuse_cascade(elem: Update, table: Any, targets: Any, keys: Any) -> None:
    values = statement_values(elem)
    changed = [c for c in targets if c in keys or c in values]
    if changed:
        raise ShardConfigError(
            f"this UPDATE changes {table.name}.{changed[0]}, which the database copies by "
            f"ON UPDATE CASCADE into {targets[changed[0]]}; the shard would not follow. Drop "
            "onupdate='CASCADE' from that foreign key and update the rows through sharded-orm."
        )


def _row_fetcher(
    conn: Connection, table: Any, pinned: dict[str, Any], rows: list[Any], shards: RowShards
) -> Fetch | None:
    """Reads the sources an UPDATE by full primary key does not set (the ORM flush,
    ORM bulk UPDATE by primary key, ``bulk_update_mappings``) from the rows themselves, in
    the same transaction: every row of the statement in one SELECT per batch
    (``sharded_orm.write.stored``)."""
    pk = list(getattr(table, "primary_key", None) or ())
    if not pk or any(c.key not in pinned for c in pk):
        return None
    begin_for_write(conn)  # its reads run in the UPDATE's transaction (pysqlite)
    return StoredRows(conn, table, pk, pinned, rows, shards.read_back)


def _flush_rows(
    rows: list[dict[str, Any]], taken: Taken, shards: RowShards
) -> list[dict[str, Any]]:
    """The ORM flush's INSERT rows, each shard computed once: those ``before_insert``
    computed (a key shard, ``trust.hook_fills``) read from its record, computed again only
    for a row whose sources a later listener changed; every other computed here, from the
    row sent (the ORM's own, made for this statement: filled in place), and written back
    to the object with its sources in their stored form."""
    objects, shapes, changed = taken
    every = (*shards.client_made, *shards.server_made)
    plan = tuple(sc for sc in shards.client_made if hook_fills(sc, every))
    if plan:
        rows = fast_insert_rows(shards, rows, plan, in_place=True)
    if changed:
        rows = _derive_again(rows, changed, shards)
    if not _all_filled(rows, shards):  # a shard before_insert left unset: the rows' own
        rows = fast_insert_rows(shards, rows)
    for row, d, shape in zip(rows, objects, shapes, strict=True):
        for attr, key in shape[4]:
            v = row[key]
            if d.get(attr) is not v:
                d[attr] = v
    return rows


def _derive_again(
    rows: list[dict[str, Any]], changed: list[tuple[int, Any]], shards: RowShards
) -> list[dict[str, Any]]:
    """The flush's INSERT rows, where a listener that ran after ``before_insert`` changed
    some sources: each derived shard of those rows computed again from the row (what the
    database gets) and written back to its object; a caller's shard is checked."""
    out = list(rows)
    for i, (_, d, _, derived, _) in changed:
        row = dict(out[i])
        for key, _ in derived:
            row[key] = None
        row = shards.insert_row(row, {})
        for key, attr in derived:
            d[attr] = row[key]
        out[i] = row
    return out


def _write_back(rows: list[dict[str, Any]], keys: list[Any], backs: Expected) -> None:
    """Give the objects of the flush's UPDATE the shard the hook computed for their row
    (``keys``: the primary key each row's WHERE names, as ``StoredRows.keys`` gives it)."""
    pop = backs.pop
    usual = backs.usual
    if usual is None:
        return  # nothing recorded
    attr, k = usual
    for row, key in zip(rows, keys, strict=True):
        got = pop(key, None)
        if got is None:
            continue
        if got.__class__ is dict:  # the usual: the object's __dict__ alone
            if k in row:
                got[attr] = row[k]
            continue
        for d, a, c in targets_of(got, usual):
            if c in row:
                d[a] = row[c]


def _all_filled(rows: list[dict[str, Any]], shards: RowShards) -> bool:
    return not any(None in map(methodcaller("get", sc.key), rows) for sc in shards.client_made)


def _before_execute(
    conn: Connection,
    elem: Any,
    multiparams: list[dict[str, Any]],
    params: dict[str, Any],
    execution_options: Any,
) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    # on SQLite a timestamp source's offset would be dropped: refused while its rows fill
    token = OFFSETS_DROPPED.set(True) if drops_offsets(conn.dialect) else None
    try:
        sent = _shard_rows(conn, elem, multiparams, params, execution_options)
    finally:
        if token is not None:
            OFFSETS_DROPPED.reset(token)
    if isinstance(sent[0], (Insert, Update)) and skew.counting():
        _count_shards(*sent, skew.database_of(conn))
    return sent


def _count_shards(
    elem: Any, multiparams: list[dict[str, Any]], params: dict[str, Any], database: str | None
) -> None:
    """Rows sent to each shard of the statement's table, for the write-skew gauge."""
    table = statement_table(elem)
    shards = write_shards(table)
    if not shards:
        return
    rows = multiparams or ([params] if params else [])
    if not rows:
        rows = [statement_values(elem)]
    for sc in shards:
        key = sc.key
        found = [row[key] for row in rows if isinstance(row.get(key), int)]
        if found:
            skew.count(table.name, sc.name, sc.count, found, database)


def _shard_rows(
    conn: Connection,
    elem: Any,
    multiparams: list[dict[str, Any]],
    params: dict[str, Any],
    execution_options: Any,
) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    is_insert = isinstance(elem, Insert)
    if not (is_insert or isinstance(elem, Update)):
        return elem, multiparams, params
    table = statement_table(elem)
    shards = write_shards(table)
    if not shards:
        targets = None if is_insert else cascade_targets(getattr(table, "schema", None), table.name)
        if targets:
            _refuse_cascade(elem, table, targets, (multiparams[0] if multiparams else params) or {})
        return elem, multiparams, params
    on_spanner = is_spanner(conn.dialect)
    row_shards = RowShards(shards, on_spanner, conn)
    if any(getattr(sc.column, "table", None) is None for sc in row_shards.client_made):
        rebuilt = onto_declared(elem, table)  # a table() without the shard column
        if rebuilt is not None:
            elem, table = rebuilt
            shards = write_shards(table)
            row_shards = RowShards(shards, on_spanner, conn)
        else:
            first = (multiparams[0] if multiparams else params) or {}
            keys = {**statement_values(elem), **first}
            _refuse_missing_columns(table, row_shards, is_insert, keys)
    stmt_values = statement_values(elem)
    if is_insert:
        # an upsert's DO UPDATE is checked whatever form its INSERT half takes
        elem = with_upsert_shard(elem, shards)
        if elem._multi_values:
            return _rewrite_multi_values(elem, table, row_shards), multiparams, params
        if elem.select is not None:
            check_from_select(elem, table, row_shards.client_made)
            return elem, multiparams, params
        if not stmt_values and not row_shards.server_made and (multiparams or params):
            rows = multiparams if multiparams else [params]
            taken = take(conn, execution_options, table, rows)
            if taken is not None:  # the ORM flush's own rows
                try:
                    rows = _flush_rows(rows, taken, row_shards)
                except BaseException:
                    forget(conn)
                    raise
                if multiparams:
                    return elem, rows, params
                return elem, multiparams, rows[0]
            if multiparams:
                return elem, fast_insert_rows(row_shards, multiparams), params
            return elem, multiparams, fast_insert_rows(row_shards, [params])[0]
        rows = multiparams if multiparams else [params]
        row_shards.defaults.use_statement(elem, table)  # what a default's context shows
        new_rows = [row_shards.insert_row(r, stmt_values) for r in rows]
    else:
        pinned = {
            c.key: v
            for c, v in where_equalities(elem.whereclause).items()
            if getattr(c.table, "name", None) == table.name
        }
        rows = multiparams if multiparams else [params]
        backs = updated_objects(conn, execution_options, table)
        fetch = _row_fetcher(conn, table, pinned, rows, row_shards)
        row_shards.defaults.use_statement(elem, table)  # what an onupdate's context shows
        # the flush's own rows (backs: its UPDATE) are the ORM's, made for this statement
        new_rows = row_shards.update_rows(
            rows, stmt_values, pinned, fetch, in_place=backs is not None
        )
        if backs and fetch is not None:  # (no fetch: the WHERE names no whole key)
            _write_back(new_rows, fetch.keys(), backs)
    if not multiparams and not params:
        # Values came only from .values(...): send the shard as a parameter, which Core
        # turns into a SET/VALUES entry (works with ordered_values() too).
        # A source in .values() whose stored form differs is re-sent the same way.
        first_row = new_rows[0]
        return (
            elem,
            multiparams,
            {
                k: v
                for k, v in first_row.items()
                if k not in stmt_values or resendable(k, stmt_values)
            },
        )
    if multiparams:
        return elem, new_rows, params
    return elem, multiparams, new_rows[0]


# --------------------------------------------------------------------------- raw SQL

_WRITE = re.compile(
    r"\b(?:insert(?:\s+or\s+\w+)?\s+into|replace\s+into|update|merge\s+into)\s+"
    r"(?:[`\"\[]?\w+[`\"\]]?\s*\.\s*)?[`\"\[]?(\w+)",
    re.IGNORECASE,
)
#: Digests of the raw SQL texts already checked (a text is checked once): at most
#: ``_WARNED_MAX`` digests of ``_DIGEST_BYTES`` bytes, whatever the texts' size (it held the
#: texts themselves: 300 of 200 KB kept 57 MiB), the least recently seen evicted first.
_WARNED_MAX = 10_000
_warned: Memo[bytes, bool] = Memo("write.raw_sql_checked", _WARNED_MAX)
_DIGEST_BYTES = 16
#: Execution option for raw SQL that keeps the shard right itself (e.g. a backfill that
#: writes computed shards): ``text(...).execution_options(sharded_orm_raw_sql_ok=True)``.
RAW_SQL_OK = "sharded_orm_raw_sql_ok"


def raw_sql_writes(sql: str) -> list[str]:
    """Names of sharded tables that raw SQL text inserts into or updates."""
    names = sharded_names()
    return [m for m in _WRITE.findall(sql) if m.lower() in names]


def _warn_raw(sql: str) -> None:
    digest = hashlib.blake2b(
        sql.encode("utf-8", "surrogatepass"), digest_size=_DIGEST_BYTES
    ).digest()
    if _warned.get(digest) is not None:
        return
    hit = raw_sql_writes(sql)
    _warned.put(digest, True)
    if hit:
        warnings.warn(
            f"raw SQL writes sharded table {hit[0]!r}; sharded-orm cannot check it, so a "
            "changed source leaves the shard stale. Write through the model or a Core "
            "insert()/update() on the table, or set the shard column yourself. "
            f"Statement: {sql[:200]!r}",
            ShardingWarning,
            stacklevel=6,
        )


def _before_cursor_execute(
    conn: Connection, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
) -> None:
    compiled = getattr(context, "compiled", None)
    raw = compiled is None or isinstance(compiled.statement, TextClause)
    if raw and not context.execution_options.get(RAW_SQL_OK):
        _warn_raw(statement)


_watched: weakref.WeakSet[Engine] = weakref.WeakSet()


def _root(engine: Any) -> Engine:
    engine = getattr(engine, "engine", engine)  # a Connection's engine
    while isinstance(getattr(engine, "_proxied", None), Engine):  # execution_options()
        engine = engine._proxied
    return engine  # type: ignore[no-any-return]


def watch(engine: Engine | Connection) -> Engine:
    """Check every write of ``engine`` to a sharded table from now on (idempotent).

    Spanner engines, and engines that create a sharded table (``create_all``) or run the
    ORM on a sharded model, are watched by themselves. Call this for an engine of another
    database whose first contact with a sharded table is a Core ``insert()``/``update()``
    (e.g. tables made by a migration elsewhere, then written by Core only).
    """
    root = _root(engine)
    if not isinstance(root, Engine):
        raise ShardTypeError(
            f"watch() takes a SQLAlchemy Engine or Connection, got {shown(engine)}; "
            "pass the engine sa.create_engine(...) returned"
        )
    if root in _watched:
        return root
    # the first contact of a stock Spanner engine with a sharded table (DDL, ORM, watch())
    refuse_stock(root.dialect, "A sharded table (created, dropped or written by the ORM)")
    _watched.add(root)
    event.listen(root, "before_execute", _before_execute, retval=True)
    event.listen(root, "before_cursor_execute", _before_cursor_execute)
    for name in ("commit", "rollback", "rollback_savepoint"):
        event.listen(root, name, forget)  # no filled rows outlive their transaction
    successor.listen(root)  # key reshards: writes reach a declared successor table too
    return root


def is_watched(engine: Any) -> bool:
    """True when ``engine`` (or a Connection's) checks writes to sharded tables."""
    return _root(engine) in _watched


def root_engine(engine: Any) -> Any:
    """The Engine itself behind a Connection or an ``execution_options()`` copy."""
    return _root(engine)


set_engine_watcher(watch)
