"""Writes to both tables of a key reshard while the models declare both (the dual write).

A shard column in the primary key cannot be recomputed in place: a key reshard copies
the table into a new one whose key holds the new shard (docs/migrations.md, 'Resharding a
key'). Between the expand and the contract, every library write to the old table must
reach the new one too, in the same transaction, or the copy chases writers forever.
``declare_successor(Event, Event16)`` says so (``sharded_orm.write.successor_plan``);
from then on, on every watched engine (``sharded_orm.write.engine_hook``), after each
INSERT, UPDATE or DELETE of the old table, in its transaction:

1. the keys it touched are known: an INSERT's from the rows SQLAlchemy sent (Python
   defaults included) or reported (a key the database made); an UPDATE's or DELETE's
   from a WHERE on the full key, else from the rows its WHERE matched, read just before
   it runs; an UPDATE that sets a key column adds the new keys;
2. the old table's rows at those keys are read back, so what the successor receives is
   what the database holds (SQL defaults and expressions, upserts that kept or changed a
   row, the row at its new key), never the values the statement sent;
3. those rows are upserted into the successor by its primary key (``INSERT OR UPDATE`` on
   Spanner, ``ON CONFLICT (<key>) DO UPDATE`` on SQLite: a unique index of the successor
   fails loudly, no row is replaced), every column copied (no default evaluated there),
   the new shard computed by the new table's spec; a key that holds no row any more (a
   deleted row, a row whose key changed) is deleted from the successor.

Statements that cannot be mirrored so are refused before anything is written
(``sharded_orm.write.mirror_rules``). If a mirror fails after its statement ran (say a
unique index of the successor), the error is raised and the transaction cannot commit
(``SuccessorWriteError`` at COMMIT) until it is rolled back. A table with no successor
pays one dictionary look-up per statement.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.dml import Delete, Insert, Update
from sqlalchemy.sql.elements import TextClause

from sharded_orm.errors import ShardConfigError, SuccessorWriteError
from sharded_orm.spanner import is_spanner
from sharded_orm.write.begin import begin_for_write
from sharded_orm.write.mirror_io import Key, mirror, normaliser, old_key, read_keys, read_where
from sharded_orm.write.mirror_keys import key_of_row
from sharded_orm.write.mirror_rules import MIRROR_OK, Shape, check_statement, refusal
from sharded_orm.write.sql import literal_value, statement_values
from sharded_orm.write.successor_plan import (
    SUCCESSOR_KEY,
    MirrorPlan,
    declare_successor,
    old_tables,
    plan,
    successor_of,
)
from sharded_orm.write.targets import statement_table

__all__ = ["SUCCESSOR_KEY", "MirrorPlan", "declare_successor", "listen", "plan", "successor_of"]

_STATE = "sharded_orm.successor_state"


@dataclass
class _Pending:
    elem: Any
    mp: MirrorPlan
    shape: Shape
    old_keys: list[list[Key]]  # per parameter set: the old keys it touches
    pre: dict[Key, dict[str, Any]]  # rows read before the statement, by normalised key


@dataclass
class _State:
    """Per DB-API connection (``Connection.info``)."""

    pending: list[_Pending] = field(default_factory=list)
    failed: str | None = None  # a mirror that failed: this transaction must roll back
    failed_depth: int = 0
    savepoints: list[str | None] = field(default_factory=list)
    batch_dml: bool = False


def _state(conn: Connection) -> _State:
    st = conn.info.get(_STATE)
    if st is None:
        st = conn.info[_STATE] = _State()
    return st


def _target(elem: Any) -> tuple[sa.Table, sa.Table] | None:
    if not isinstance(elem, (Insert, Update, Delete)):
        return None
    table = statement_table(elem)
    if isinstance(table, sa.Table) and table._annotations:
        table = table._deannotate()
    new = successor_of(table)
    return None if new is None else (table, new)


# ------------------------------------------------------------------ the statement's keys


def _bound_keys(shape: Shape, params: list[Any]) -> list[list[Key]]:
    assert shape.key_binds is not None
    return [[tuple(literal_value(b, p) for b in shape.key_binds)] for p in params]


def _before_execute(
    conn: Connection, elem: Any, multiparams: Any, params: Any, execution_options: Any
) -> None:
    target = _target(elem)
    if target is None:
        return
    mp = plan(*target)
    st = _state(conn)
    rows = list(multiparams) if multiparams else [params or {}]
    _check_transaction(conn, mp.old, st.batch_dml)
    shape = check_statement(conn, elem, mp, rows)
    if st.failed is not None:
        raise SuccessorWriteError(st.failed)
    begin_for_write(conn)  # the reads below run in the statement's transaction (pysqlite)
    norm = normaliser(mp.old, mp.old_key, conn.dialect)
    old_keys: list[list[Key]] = []
    pre: dict[Key, dict[str, Any]] = {}
    if shape.kind == "insert":
        if shape.upsert == "update" and not mp.follows_key:  # the row may move in the successor
            if shape.multi_keys is not None:  # multi-VALUES: the keys are in the statement
                keys = list(shape.multi_keys)
            else:
                values = statement_values(elem)
                keys = [key_of_row(mp, r, values) for r in rows]
            pre = read_keys(conn, mp, [k for k in keys if None not in k])
    elif shape.key_binds is not None:
        old_keys = _bound_keys(shape, rows)
        if not mp.follows_key:
            pre = read_keys(conn, mp, [k for ks in old_keys for k in ks])
    else:  # the rows the WHERE matches now are the rows it writes (mirror_rules)
        for p in rows:
            found = read_where(conn, mp, elem.whereclause, p)
            old_keys.append([old_key(mp, r) for r in found])
            pre.update((norm(old_key(mp, r)), r) for r in found)
    st.pending.append(_Pending(elem, mp, shape, old_keys, pre))


def _inserted_keys(p: _Pending, elem: Insert, result: Any) -> list[Key]:
    if p.shape.multi_keys is not None:
        return list(p.shape.multi_keys)
    context = result.context
    compiled = context.compiled_parameters or []
    values = statement_values(elem)
    keys = [key_of_row(p.mp, row, values) for row in compiled]  # a generated shard hashed
    if p.shape.database_key:
        reported = list(result.inserted_primary_key_rows)
        keys = [tuple(r) for r in reported]
    if any(v is None for k in keys for v in k):
        raise SuccessorWriteError(
            f"an INSERT into {p.mp.old.name} wrote a row whose key the client cannot read "
            f"back, so {p.mp.new.name} did not receive it. Give the key values."
        )
    return keys


def _after_execute(
    conn: Connection, elem: Any, multiparams: Any, params: Any, execution_options: Any, result: Any
) -> None:
    if _target(elem) is None:
        return
    st = _state(conn)
    p = next((x for x in reversed(st.pending) if x.elem is elem), None)
    if p is None:
        return
    st.pending.remove(p)
    try:
        _apply(conn, p, elem, result)
    except BaseException as exc:
        st.failed = (
            f"a write to {p.mp.old.name} ran but its mirror into {p.mp.new.name} failed "
            f"({type(exc).__name__}: {str(exc)[:300]}); this transaction cannot commit: roll "
            "it back"
        )
        st.failed_depth = len(st.savepoints)
        raise


def _apply(conn: Connection, p: _Pending, elem: Any, result: Any) -> None:
    mp, shape = p.mp, p.shape
    if shape.kind == "insert":
        touched = _inserted_keys(p, elem, result)
    else:
        touched = [k for ks in p.old_keys for k in ks]
        if shape.sets_key:
            compiled = result.context.compiled_parameters or []
            values = statement_values(elem)
            at = {c.key: i for i, c in enumerate(mp.old_key)}
            for keys, row in zip(p.old_keys, compiled, strict=False):
                for k in keys:
                    moved = list(k)
                    for name in shape.sets_key:
                        v = values.get(name)
                        moved[at[name]] = literal_value(v, row) if v is not None else row.get(name)
                    touched.append(tuple(moved))
    if shape.kind == "delete" and (shape.key_binds is None or shape.exact):
        after: dict[Key, dict[str, Any]] = {}  # every row it matched is gone
    else:
        after = read_keys(conn, mp, touched)
    mirror(conn, mp, touched, p.pre, after)


# ------------------------------------------------------------------ raw SQL, transactions


def _check_transaction(conn: Any, table: sa.Table, batch_dml: bool) -> None:
    """Refuse a write the mirror could not put in the same transaction."""
    level = conn.get_execution_options().get("isolation_level") or getattr(
        conn.dialect, "isolation_level", None
    )
    dbapi = conn.connection.dbapi_connection if is_spanner(conn.dialect) else None
    mode = getattr(getattr(dbapi, "autocommit_dml_mode", None), "name", "")
    if level == "AUTOCOMMIT" or getattr(dbapi, "autocommit", False) is True:
        what = "Partitioned DML" if mode == "PARTITIONED_NON_ATOMIC" else "AUTOCOMMIT"
        raise refusal(
            table,
            f"this connection writes in {what}, where each statement commits alone",
            "Write it in a transaction (engine.begin(), Session.begin()).",
        )
    if batch_dml:
        raise refusal(
            table,
            "Spanner's batch DML (START BATCH DML) holds its statements "
            "back until RUN BATCH, so they cannot be read back",
            "Run these writes outside the batch.",
        )


_WRITE = re.compile(
    r"\b(?:insert(?:\s+or\s+\w+)?\s+into|replace\s+into|update|delete(?:\s+from)?|"
    r"merge\s+into)\s+(?:[`\"\[]?\w+[`\"\]]?\s*\.\s*)?[`\"\[]?(\w+)",
    re.IGNORECASE,
)


def _raw_writes(sql: str, names: set[str]) -> list[str]:
    """Names among ``names`` (lower case) that raw SQL text inserts into, updates or
    deletes from."""
    return [m for m in _WRITE.findall(sql) if m.lower() in names]


def _before_cursor_execute(
    conn: Connection, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
) -> None:
    compiled = getattr(context, "compiled", None)
    if compiled is not None and not isinstance(compiled.statement, TextClause):
        return  # a Core or ORM statement: _before_execute saw it
    head = statement.lstrip()[:20].upper()
    if head.startswith(("START BATCH DML", "RUN BATCH", "ABORT BATCH")):
        _state(conn).batch_dml = head.startswith("START")
        return
    olds = old_tables()
    if not olds or (context is not None and context.execution_options.get(MIRROR_OK)):
        return
    hit = _raw_writes(statement, {t.name.lower() for t in olds})
    named = [t for t in olds if hit and t.name.lower() == hit[0].lower()]
    if any(_successor_here(conn, successor_of(t)) for t in named):
        raise ShardConfigError(
            f"raw SQL writes {hit[0]}, which has a successor table (a key reshard is under "
            "way): it cannot be mirrored. Write it with insert()/update()/delete() on the "
            "table or model, or, if the same transaction writes the successor itself, run "
            f"it with execution_options({MIRROR_OK}=True). Statement: {statement[:200]!r}"
        )


#: engine -> names of successor tables found in its database
_present: weakref.WeakKeyDictionary[Engine, set[str]] = weakref.WeakKeyDictionary()


def _successor_here(conn: Connection, new: sa.Table | None) -> bool:
    """Whether ``new`` exists in this connection's database: raw SQL names its table by
    name only, and a process may talk to databases where that name is another table."""
    if new is None:
        return False
    seen = _present.setdefault(conn.engine, set())
    if new.name not in seen:
        if is_spanner(conn.dialect):  # INFORMATION_SCHEMA is not read in a transaction
            with conn.engine.connect() as other:
                found = conn.dialect.has_table(other, new.name, schema=new.schema)
        else:
            found = conn.dialect.has_table(conn, new.name, schema=new.schema)
        if not found:
            return False
        seen.add(new.name)
    return True


def _check_commit(conn: Connection) -> None:
    st = conn.info.get(_STATE)
    if st is not None:
        if st.failed is not None:
            raise SuccessorWriteError(st.failed)
        st.pending.clear()
        st.savepoints = []


def _rolled_back(conn: Connection) -> None:
    if conn.invalidated:
        # the DB-API connection is gone and its ``info`` with it (SQLAlchemy refuses to
        # read ``conn.info`` until this rollback ends): nothing pending survives it
        return
    st = conn.info.get(_STATE)
    if st is not None:
        st.pending.clear()
        st.failed, st.savepoints = None, []


def _savepoint(conn: Connection, name: str | None) -> None:
    _state(conn).savepoints.append(name)  # None: SQLAlchemy names it after this event


def _level(st: _State, name: str | None) -> int:
    """The depth of savepoint ``name``; the innermost for one named by SQLAlchemy."""
    return st.savepoints.index(name) if name in st.savepoints else len(st.savepoints) - 1


def _release(conn: Connection, name: str, context: Any) -> None:
    st = _state(conn)
    if st.savepoints:
        del st.savepoints[_level(st, name) :]
        st.failed_depth = min(st.failed_depth, len(st.savepoints))


def _rollback_to(conn: Connection, name: str, context: Any) -> None:
    if conn.invalidated:
        return  # as in _rolled_back
    st = _state(conn)
    if st.savepoints:
        depth = _level(st, name)
        if st.failed is not None and st.failed_depth > depth:
            st.failed = None  # the failed write is undone with its savepoint
        del st.savepoints[depth:]
        st.pending.clear()


def _on_error(ctx: Any) -> None:
    """A statement failed: it wrote nothing, so there is nothing to mirror."""
    conn = ctx.connection
    st = conn.info.get(_STATE) if conn is not None and not conn.invalidated else None
    if st is not None:
        st.pending.clear()


def listen(engine: Engine) -> None:
    """Mirror writes to tables with a successor on ``engine`` (``engine_hook.watch``)."""
    sa.event.listen(engine, "before_execute", _before_execute)
    sa.event.listen(engine, "after_execute", _after_execute)
    sa.event.listen(engine, "before_cursor_execute", _before_cursor_execute)
    sa.event.listen(engine, "handle_error", _on_error)
    sa.event.listen(engine, "commit", _check_commit)
    sa.event.listen(engine, "rollback", _rolled_back)
    sa.event.listen(engine, "savepoint", _savepoint)
    sa.event.listen(engine, "release_savepoint", _release)
    sa.event.listen(engine, "rollback_savepoint", _rollback_to)
    sa.event.listen(engine, "reset", _pool_reset)  # returned to the pool, rolled back there


def _pool_reset(dbapi_connection: Any, record: Any, reset_state: Any) -> None:
    st = record.info.get(_STATE) if record is not None else None
    if st is not None:
        st.pending.clear()
        st.failed, st.savepoints, st.batch_dml = None, [], False
