"""The dual write's reads and writes: the old table's rows read by key, and the
successor made to hold them (``sharded_orm.write.successor`` decides when)."""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sharded_orm.errors import UnsupportedOnDialectError
from sharded_orm.spanner import is_spanner
from sharded_orm.write.mirror_rules import MIRROR_OK
from sharded_orm.write.successor_plan import MirrorPlan

__all__ = ["Key", "copy_stmt", "mirror", "normaliser", "old_key", "read_keys", "read_where"]

#: key columns per read-back statement stay under this many bound values (Spanner
#: takes 950 parameters a statement, old SQLite 999)
_MAX_PARAMS = 600
#: values per multi-row INSERT into the successor (Spanner takes 950 parameters)
_MAX_VALUES = 900
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
    """The old table's rows at ``keys``, by normalised key: one statement per chunk, an
    IN list per key column (a key seek on Spanner and SQLite), filtered exactly here."""
    norm = normaliser(mp.old, mp.old_key, conn.dialect)
    wanted = {norm(k): k for k in keys}
    found: dict[Key, dict[str, Any]] = {}
    todo = list(wanted.values())
    size = max(1, min(200, _MAX_PARAMS // len(mp.old_key)))
    for i in range(0, len(todo), size):
        chunk = todo[i : i + size]
        where = [
            c == chunk[0][j] if len(chunk) == 1 else c.in_(list(dict.fromkeys(k[j] for k in chunk)))
            for j, c in enumerate(mp.old_key)
        ]
        for row in read_where(conn, mp, sa.and_(*where), None):
            nk = norm(old_key(mp, row))
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
    params = []
    for row in rows:
        new = mp.new_row(row)
        p = {f"s_{i}": sc.compute([new[k] for k in sc.source_keys]) for i, sc in enumerate(shards)}
        p.update((f"k_{j}", row[c.key]) for j, c in enumerate(mp.old_key))
        params.append(p)
    conn.execute(stmt, params)


def _copy_spanner(conn: Connection, mp: MirrorPlan, rows: list[dict[str, Any]]) -> None:
    """Spanner: the rows read back, written as they were read (Spanner's types come back
    exactly as stored), ``INSERT OR UPDATE`` by the successor's primary key (a unique
    index refuses it loudly), one multi-row statement per 900 values; the engine hook
    computes the new shards."""
    per = max(1, _MAX_VALUES // max(1, len(mp.copied)))
    stmt = sa.insert(mp.new).prefix_with("OR UPDATE")
    for i in range(0, len(rows), per):
        conn.execute(stmt.values([mp.new_row(r) for r in rows[i : i + per]]))


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
