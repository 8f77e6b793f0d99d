"""The dual write's reads and writes: the old table's rows read by key, and the
successor made to hold them (``sharded_orm.write.successor`` decides when)."""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sharded_orm.errors import UnsupportedOnDialectError
from sharded_orm.limits import SPANNER_PARAMETERS, compiled_parameters, rows_per_statement
from sharded_orm.memo import Memo
from sharded_orm.spanner import is_spanner
from sharded_orm.write.mirror_rules import MIRROR_OK
from sharded_orm.write.rows import RowShards
from sharded_orm.write.stored import StoredRows, check_read, read_back_checks
from sharded_orm.write.successor_plan import MirrorPlan
from sharded_orm.write.targets import write_shards

__all__ = [
    "Key",
    "copy_rows_per_statement",
    "copy_stmt",
    "mirror",
    "normaliser",
    "old_key",
    "read_keys",
    "read_where",
]

Key = tuple[Any, ...]


# ------------------------------------------------------------------ keys and reads

_procs: weakref.WeakKeyDictionary[sa.Table, dict[str, list[Any]]] = weakref.WeakKeyDictionary()


def normaliser(table: sa.Table, cols: Iterable[sa.Column[Any]], dialect: Any) -> Any:
    """Key values as the database compares them (a value sent and the same value read
    back may differ in Python: naive and aware datetimes, subclasses)."""
    cols = list(cols)
    by_dialect = _procs.setdefault(table, {})
    tag = f"{dialect.name}:{','.join(c.key for c in cols)}"
    procs = by_dialect.get(tag)
    if procs is None:
        procs = by_dialect[tag] = [
            c.type.dialect_impl(dialect).bind_processor(dialect) for c in cols
        ]

    def norm(key: Key) -> Key:
        return tuple(
            p(v) if p is not None and v is not None else v for p, v in zip(procs, key, strict=True)
        )

    return norm


def old_key(mp: MirrorPlan, row: dict[str, Any]) -> Key:
    return tuple(row[c.key] for c in mp.old_key)


def read_where(conn: Connection, mp: MirrorPlan, where: Any, params: Any) -> list[dict[str, Any]]:
    stmt = sa.select(*mp.old.c)
    if where is not None:
        stmt = stmt.where(where)
    return [dict(r) for r in conn.execute(stmt, params or {}).mappings()]


def read_keys(conn: Connection, mp: MirrorPlan, keys: Iterable[Key]) -> dict[Key, dict[str, Any]]:
    """The old table's rows at ``keys`` (its primary key), by normalised key, read as the
    stored-source read reads (:class:`sharded_orm.write.stored.StoredRows`): on Spanner
    one array per key column joined to the table, so a statement's parameters and
    functions do not grow with its keys; elsewhere batches sized under the connection's
    parameter limit. Exact: a row whose key is not one asked for is dropped."""
    norm = normaliser(mp.old, mp.old_key, conn.dialect)
    wanted = {norm(k): k for k in keys if None not in k}
    if not wanted:
        return {}
    names = [c.key for c in mp.old_key]
    columns = [c.key for c in mp.old.c]
    pinned: dict[str, Any] = {c.key: sa.bindparam(f"so_key_{j}") for j, c in enumerate(mp.old_key)}
    rows = [{f"so_key_{j}": v for j, v in enumerate(k)} for k in wanted.values()]
    got = StoredRows(conn, mp.old, list(mp.old_key), pinned, rows).batch(columns)
    found: dict[Key, dict[str, Any]] = {}
    for values in got.values():
        row = dict(zip(columns, values if len(columns) > 1 else (values,), strict=True))
        nk = norm(tuple(row[n] for n in names))
        if nk in wanted:
            found[nk] = row
    return found


# ------------------------------------------------------------------ writes to the successor

_copies: weakref.WeakKeyDictionary[sa.Table, dict[str, Any]] = weakref.WeakKeyDictionary()
#: the engine hook's option for raw SQL that keeps its shards right itself
_RAW_SQL_OK = "sharded_orm_raw_sql_ok"


def copy_stmt(dialect: Any, mp: MirrorPlan) -> tuple[Any, list[Any]]:
    """SQLite: the upsert of one old row into the successor, by the successor's primary
    key alone (no other row is ever replaced; a unique index refuses it loudly), its
    values copied by the database from the old row (``INSERT ... SELECT``): SQLite keeps a
    value a SQL default made in its own text form, which a value read into Python and
    written back would not keep. The new shards are parameters (``:s_i``), the old key
    too (``:k_j``). Returns the statement and the shards it sends."""
    cached = _copies.setdefault(mp.new, {})
    hit = cached.get(dialect.name)
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    prep = dialect.identifier_preparer
    shards = list(mp.shards)
    names = [sc.name for sc in shards] + [mp.new.c[n].name for _, n in mp.copied]
    picked = [f":s_{i}" for i in range(len(shards))] + [
        prep.quote(mp.old.c[o].name) for o, _ in mp.copied
    ]
    where = " AND ".join(f"{prep.quote(c.name)} = :k_{j}" for j, c in enumerate(mp.old_key))
    key = [c.name for c in mp.new.primary_key.columns]
    rest = [prep.quote(n) for n in names if n not in key]
    action = (
        ("DO UPDATE SET " + ", ".join(f"{n} = excluded.{n}" for n in rest))
        if rest
        else ("DO NOTHING")
    )
    sql = (
        f"INSERT INTO {prep.format_table(mp.new)} ({', '.join(prep.quote(n) for n in names)}) "
        f"SELECT {', '.join(picked)} FROM {prep.format_table(mp.old)} WHERE {where} "
        f"ON CONFLICT ({', '.join(prep.quote(n) for n in key)}) {action}"
    )
    binds = [sa.bindparam(f"s_{i}", type_=sc.column.type) for i, sc in enumerate(shards)]
    binds += [sa.bindparam(f"k_{j}", type_=c.type) for j, c in enumerate(mp.old_key)]
    stmt = sa.text(sql).bindparams(*binds).execution_options(**{_RAW_SQL_OK: True, MIRROR_OK: True})
    cached[dialect.name] = (stmt, shards)
    return stmt, shards


def _copy_sqlite(conn: Connection, mp: MirrorPlan, rows: list[dict[str, Any]]) -> None:
    stmt, shards = copy_stmt(conn.dialect, mp)
    # a timestamp read back naive (SQLite keeps no offset) is refused as a stored value
    checks = read_back_checks(shards)
    params = []
    for row in rows:
        new = mp.new_row(row)
        if checks:
            for sc in shards:
                got = [new[k] for k in sc.source_keys]
                check_read(checks, sc.source_keys, got[0] if len(got) == 1 else got)
        p = {f"s_{i}": sc.compute([new[k] for k in sc.source_keys]) for i, sc in enumerate(shards)}
        p.update((f"k_{j}", row[c.key]) for j, c in enumerate(mp.old_key))
        params.append(p)
    conn.execute(stmt, params)


def _copy_spanner(conn: Connection, mp: MirrorPlan, rows: list[dict[str, Any]]) -> None:
    """Spanner: the rows read back, written as they were read (Spanner's types come back
    exactly as stored), ``INSERT OR UPDATE`` by the successor's primary key (a unique
    index refuses it loudly); the engine hook computes the new shards. One multi-row
    statement per :func:`copy_rows_per_statement` rows: sized from the statement as sent,
    with every column the hook adds to each row."""
    stmt = sa.insert(mp.new).prefix_with("OR UPDATE")
    new_rows = [mp.new_row(r) for r in rows]
    per = copy_rows_per_statement(conn, mp, new_rows)
    for i in range(0, len(new_rows), per):
        conn.execute(stmt.values(new_rows[i : i + per]))


_per_copy: weakref.WeakKeyDictionary[sa.Table, Memo[tuple[Any, ...], int]] = (
    weakref.WeakKeyDictionary()
)


def copy_rows_per_statement(
    conn: Connection, mp: MirrorPlan, rows: list[dict[str, Any]], limit: int = SPANNER_PARAMETERS
) -> int:
    """How many successor rows one multi-row ``INSERT OR UPDATE`` may carry under ``limit``
    parameters: its widest row is filled as the engine hook fills every row (each new
    shard column the client computes; a server-side one is left out), and the statement
    compiled with one such row and with two, so what a row costs is counted from the
    statement as it is finally sent (:func:`sharded_orm.limits.rows_per_statement`). Two
    compiles per table and row shape, remembered."""
    if not rows:
        return 1
    widest = max(rows, key=len)
    shape = (conn.dialect.name, len(mp.new.c), limit, tuple(widest))
    known = _per_copy.get(mp.new)
    if known is None:
        known = _per_copy[mp.new] = Memo("write.copy_rows_per_statement", 64)
    hit = known.get(shape)
    if hit is not None:
        return hit
    filled = RowShards(write_shards(mp.new), is_spanner(conn.dialect), conn).insert_row(
        dict(widest), {}
    )

    def sent() -> dict[str, Any]:  # the row as the hook sends it: each value a literal
        return {
            k: v if isinstance(v, sa.ClauseElement) else sa.literal(v, mp.new.c[k].type)
            for k, v in filled.items()
        }

    stmt = sa.insert(mp.new).prefix_with("OR UPDATE")
    one, two = (
        compiled_parameters(stmt.values([sent() for _ in range(n)]).compile(dialect=conn.dialect))
        for n in (1, 2)
    )
    per = rows_per_statement(one, two, limit)
    known.put(shape, per)
    return per


def mirror(
    conn: Connection,
    mp: MirrorPlan,
    touched: Iterable[Key],
    pre: dict[Key, Any],
    after: dict[Key, dict[str, Any]],
) -> None:
    """Make the successor hold, for every touched old key, what the old table holds."""
    norm_old = normaliser(mp.old, mp.old_key, conn.dialect)
    norm_new = normaliser(mp.new, mp.new_key, conn.dialect)
    names = [c.key for c in mp.old_key]

    def new_key(row: dict[str, Any]) -> Key:
        return tuple(mp.new_key_of(row).values())

    gone: dict[Key, Key] = {}
    for k in touched:
        nk = norm_old(k)
        was = pre.get(nk)
        if was is not None:
            key = new_key(was)
        elif nk not in after and mp.follows_key:
            key = new_key(dict(zip(names, k, strict=True)))
        else:
            continue
        gone[norm_new(key)] = key
    for row in after.values():
        gone.pop(norm_new(new_key(row)), None)
    if gone:
        stmt = sa.delete(mp.new).where(*[c == sa.bindparam(f"k_{c.key}") for c in mp.new_key])
        conn.execute(
            stmt,
            [
                {f"k_{c.key}": v for c, v in zip(mp.new_key, key, strict=True)}
                for key in gone.values()
            ],
        )
    if after:
        if is_spanner(conn.dialect):
            _copy_spanner(conn, mp, list(after.values()))
        elif conn.dialect.name == "sqlite":
            _copy_sqlite(conn, mp, list(after.values()))
        else:
            raise UnsupportedOnDialectError(
                f"{mp.old.name} has a successor ({mp.new.name}): its writes are mirrored by "
                "an upsert on the primary key, which sharded-orm does on Spanner and SQLite "
                f"only, not {conn.dialect.name}. Copy with copy_table after the writes instead."
            )
