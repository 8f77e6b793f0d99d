"""What a key reshard's dual write accepts: the statement shapes it mirrors exactly.

The mirror (``sharded_orm.write.successor``) copies what the old table holds after a
statement at the keys the statement touched. So a statement is accepted only when those
keys are known and the rows found are the rows it wrote, in one transaction:

* INSERT: rows as parameters (single, executemany) or ``.values()`` (one row, or a
  multi-row list giving every key column in every row); any value but the key may be a
  SQL expression or a SQL default (it is read back). Upserts whose conflict is the primary
  key: ``OR IGNORE`` (SQLite, Spanner), ``OR UPDATE`` (Spanner), ``ON CONFLICT DO NOTHING``
  and ``ON CONFLICT (<primary key>) DO UPDATE`` not setting a key column (SQLite). A key
  the database makes (no value, no Python default) only in a single-row INSERT without
  ``returning()``, where SQLAlchemy reports it.
* UPDATE and DELETE: a WHERE over the statement's own table built from columns, bound
  values, comparisons, AND/OR/NOT, IN lists, CASE, CAST and deterministic functions, so
  that the rows read before it runs are the rows it writes; an UPDATE sets a key column
  only to a value (or a Python ``onupdate``). Other values may be any SQL.
* inside a transaction: not AUTOCOMMIT, not Spanner's Partitioned DML or batch DML.

Everything else is refused before anything is written, with the way out: INSERT ...
FROM SELECT, ``OR REPLACE`` (it deletes the rows a unique index conflicts with), a DO
UPDATE on another conflict target, UPDATE ... FROM and DELETE with a join or a subquery,
a WHERE with a function that may answer twice differently (``random()``, ``now()``), a
key set to SQL, raw SQL (``text()``, ``exec_driver_sql``) writing the table, a
``PENDING_COMMIT_TIMESTAMP()`` (Spanner cannot read it back in the transaction).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import elements as el
from sqlalchemy.sql import operators
from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.sql.selectable import Exists, ScalarSelect, SelectBase

from sharded_orm.errors import ShardConfigError
from sharded_orm.spanner import is_spanner
from sharded_orm.write.mirror_keys import (
    generated_known,
    generated_shard,
    key_of_row,
    python_default,
)
from sharded_orm.write.sql import MISSING, column_key, literal_value, statement_values
from sharded_orm.write.successor_plan import MirrorPlan

__all__ = ["MIRROR_OK", "Shape", "check_statement", "refusal"]

#: Execution option for raw SQL that writes a table with a successor and writes the
#: successor itself in the same transaction: ``text(...).execution_options(
#: sharded_orm_mirror_ok=True)``.
MIRROR_OK = "sharded_orm_mirror_ok"

#: functions whose answer depends only on their arguments (a WHERE runs twice: once to
#: find the rows, once in the statement)
_SAME_TWICE = frozenset(
    {
        "lower",
        "upper",
        "length",
        "char_length",
        "character_length",
        "coalesce",
        "ifnull",
        "nullif",
        "abs",
        "substr",
        "substring",
        "trim",
        "ltrim",
        "rtrim",
        "concat",
        "mod",
        "starts_with",
        "ends_with",
        "strpos",
        "instr",
        "greatest",
        "least",
    }
)
_PLAIN = tuple(
    getattr(el, n)
    for n in (
        "BinaryExpression",
        "BooleanClauseList",
        "ClauseList",
        "ExpressionClauseList",
        "Grouping",
        "UnaryExpression",
        "BindParameter",
        "Null",
        "True_",
        "False_",
        "Tuple",
        "Cast",
        "TypeCoerce",
        "TypeClause",
        "Case",
        "Label",
        "AsBoolean",
        "CollationClause",
        "Extract",
    )
    if hasattr(el, n)
)


@dataclass(frozen=True)
class Shape:
    """What the mirror needs to know of an accepted statement."""

    kind: str  # "insert", "update", "delete"
    #: INSERT: None, "ignore" (a row at the key stays as it is) or "update" (it changes)
    upsert: str | None = None
    #: UPDATE/DELETE: the WHERE's ``key column = bound value`` for every old key column
    key_binds: tuple[Any, ...] | None = None
    #: ... and nothing else in the WHERE
    exact: bool = False
    #: UPDATE: old key columns (by key) it may set; INSERT: key values of a VALUES list
    sets_key: tuple[str, ...] = ()
    multi_keys: tuple[tuple[Any, ...], ...] | None = None
    #: INSERT: a key column only the database fills (single row: reported by SQLAlchemy)
    database_key: bool = False


def refusal(table: sa.Table, what: str, fix: str) -> ShardConfigError:
    return ShardConfigError(
        f"{table.name} has a successor table (a key reshard is under way) and {what}, so "
        f"the successor cannot be given what {table.name} holds afterwards. {fix}"
    )


def _own_column(col: Any, table: sa.Table) -> bool:
    owner = getattr(col, "table", None)
    if owner is None:
        return not getattr(col, "is_literal", False) and col.name in table.c
    return getattr(owner, "name", None) == table.name and getattr(owner, "schema", None) == getattr(
        table, "schema", None
    )


def _check_where(where: Any, table: sa.Table, verb: str) -> None:
    fix = (
        f"Read the keys first (select(...).where(...)), then {verb} by key "
        f"({verb}(t).where(t.c.<key>.in_(keys))) in the same transaction."
    )
    stack = [where]
    while stack:
        e = stack.pop()
        if isinstance(e, el.ColumnClause):
            if not _own_column(e, table):
                other = getattr(getattr(e, "table", None), "name", None) or str(e)
                raise refusal(
                    table,
                    f"this {verb.upper()}'s WHERE names {other!r} (a join, "
                    "UPDATE ... FROM or SQL text)",
                    fix,
                )
            continue
        if isinstance(e, (SelectBase, ScalarSelect, Exists)):
            raise refusal(
                table,
                f"this {verb.upper()}'s WHERE holds a subquery, whose rows "
                "may differ between the read that finds the rows and the statement",
                fix,
            )
        if isinstance(e, FunctionElement):
            name = str(getattr(e, "name", "")).lower()
            if name not in _SAME_TWICE:
                raise refusal(
                    table,
                    f"this {verb.upper()}'s WHERE calls {name or e}(), "
                    "which may answer differently when run twice (the read that "
                    "finds the rows, then the statement)",
                    fix,
                )
        elif not isinstance(e, _PLAIN):
            raise refusal(
                table,
                f"this {verb.upper()}'s WHERE holds {type(e).__name__}, "
                "not a shape the mirror proves",
                fix,
            )
        stack.extend(e.get_children())


def _names_outside_subqueries(expr: Any, table: sa.Table) -> list[str]:
    """Other tables a SET value names at its top level (SQLAlchemy then adds them to the
    UPDATE's FROM)."""
    out, stack = [], [expr]
    while stack:
        e = stack.pop()
        if not isinstance(e, el.ClauseElement) or isinstance(e, (SelectBase, ScalarSelect)):
            continue
        if isinstance(e, el.ColumnClause):
            owner = getattr(e, "table", None)
            if owner is not None and not _own_column(e, table):
                out.append(str(getattr(owner, "name", owner)))
            continue
        stack.extend(e.get_children())
    return out


def _pending_commit_ts(values: dict[str, Any]) -> str | None:
    for k, v in values.items():
        for e in [v, *sa.sql.visitors.iterate(v)] if isinstance(v, el.ClauseElement) else []:
            if str(getattr(e, "name", "")).lower() == "pending_commit_timestamp":
                return k
    return None


def _key_binds(where: Any, table: sa.Table, mp: MirrorPlan) -> tuple[tuple[Any, ...] | None, bool]:
    terms, found, other = [where], {}, 0
    while terms:
        t = terms.pop()
        if isinstance(t, el.BooleanClauseList) and t.operator is operators.and_:
            terms.extend(t.clauses)
            continue
        if isinstance(t, el.BinaryExpression) and t.operator is operators.eq:
            left, right = t.left, t.right
            if isinstance(left, el.BindParameter):
                left, right = right, left
            if (
                isinstance(left, el.ColumnClause)
                and isinstance(right, el.BindParameter)
                and _own_column(left, table)
                and left.name not in found
                and any(c.name == left.name for c in mp.old_key)
            ):
                found[left.name] = right
                continue
        other += 1
    if len(found) < len(mp.old_key):
        return None, False
    return tuple(found[c.name] for c in mp.old_key), other == 0


def _prefixes(elem: Any, dialect: Any) -> list[str]:
    # SQLAlchemy keeps prefix_with() here, with the dialect each is for
    return [
        str(clause).strip().upper()
        for clause, only in getattr(elem, "_prefixes", ())
        if only in (None, "*", dialect.name)
    ]


def _insert_shape(conn: Any, elem: Insert, mp: MirrorPlan, rows: list[Any]) -> Shape:
    table, spanner = mp.old, is_spanner(conn.dialect)
    if elem.select is not None:
        raise refusal(
            table,
            "an INSERT ... FROM SELECT writes rows whose keys the client never sees",
            "Insert the rows as parameters (conn.execute(insert(t), rows)) until the contract.",
        )
    upsert = None
    for p in _prefixes(elem, conn.dialect):
        if p == "OR IGNORE" or (p == "OR UPDATE" and spanner):
            upsert = "ignore" if p == "OR IGNORE" else "update"
        else:
            raise refusal(
                table,
                f"INSERT {p} may change rows at other keys than its own "
                "(OR REPLACE deletes every row a unique index conflicts with)",
                "Use an upsert on the primary key: on_conflict_do_update("
                "index_elements=<the key>) on SQLite, insert_or_update on Spanner.",
            )
    clause = getattr(elem, "_post_values_clause", None)  # SQLAlchemy's ON CONFLICT clause
    if clause is not None:
        upsert = _on_conflict(clause, mp)
    values = statement_values(elem)
    if _pending_commit_ts(values) and spanner:
        raise _commit_ts(table, _pending_commit_ts(values))
    if elem._multi_values:
        return Shape("insert", upsert, multi_keys=_multi_keys(elem, mp))
    database_key = False
    for c in mp.old_key:
        if c.key in values:
            if literal_value(values[c.key]) is MISSING:
                raise refusal(
                    table,
                    f"the INSERT sets the key column {c.key!r} to SQL, "
                    "which the client cannot read back by",
                    "Give the key as a value until the contract.",
                )
        elif (rows and all(c.key in r for r in rows)) or python_default(c):
            continue
        elif generated_known(mp, c, values, rows):
            continue  # Spanner computes it from sources the client knows: so does the mirror
        elif _reported(conn, elem, rows):
            database_key = True
        else:
            raise refusal(
                table,
                f"the database fills the key column {c.key!r} of these rows "
                "and SQLAlchemy does not report it (executemany without return_defaults(), "
                "or returning())",
                "Insert one row at a time, add .return_defaults(), or give the keys.",
            )
    if upsert == "update" and not mp.follows_key and database_key:
        raise refusal(table, "an upsert without its key cannot be followed", "Give the key.")
    return Shape("insert", upsert, database_key=database_key)


def _reported(conn: Any, elem: Insert, rows: list[Any]) -> bool:
    """SQLAlchemy reports the keys the database made (``inserted_primary_key_rows``): a
    single row, or ``return_defaults()`` (the ORM's) where the dialect returns them for
    executemany; never with the application's own ``returning()``."""
    if getattr(elem, "_returning", None):  # SQLAlchemy keeps returning() here
        return False
    if len(rows) <= 1:
        return True
    return bool(getattr(elem, "_return_defaults", False)) and bool(
        getattr(conn.dialect, "insert_executemany_returning", False)
    )


def _on_conflict(clause: Any, mp: MirrorPlan) -> str:
    kind, table = type(clause).__name__, mp.old
    if kind == "OnConflictDoNothing":
        return "ignore"
    fix = (
        "Upsert on the primary key: on_conflict_do_update(index_elements=["
        + ", ".join(repr(c.name) for c in mp.old_key)
        + "], set_={...}) without key columns in set_."
    )
    if kind != "OnConflictDoUpdate":
        raise refusal(table, f"its {kind} clause is not one the mirror knows", fix)
    target = {getattr(c, "name", c) for c in getattr(clause, "inferred_target_elements", ()) or ()}
    pk_name = mp.old.primary_key.name
    on_key = target == {c.name for c in mp.old_key} or (
        pk_name is not None and getattr(clause, "constraint_target", None) == pk_name
    )
    if not on_key or getattr(clause, "inferred_target_whereclause", None) is not None:
        raise refusal(
            table,
            "this upsert's conflict target is not the primary key (it "
            "updates a row at another key than the one it sends)",
            fix,
        )
    sets = getattr(clause, "update_values_to_set", None) or ()
    items = sets.items() if isinstance(sets, dict) else sets
    keys = {getattr(k, "key", k) for k, _ in items}
    if keys & {c.key for c in mp.old_key}:
        raise refusal(table, "this upsert's DO UPDATE sets a key column", fix)
    return "update"


def _multi_keys(elem: Insert, mp: MirrorPlan) -> tuple[tuple[Any, ...], ...]:
    out = []
    for group in elem._multi_values:
        for raw in group:
            row = raw if isinstance(raw, dict) else dict(zip(mp.old.c, raw, strict=False))
            by_key: dict[str, Any] = {column_key(k): literal_value(v) for k, v in row.items()}
            key = key_of_row(mp, by_key, {}, MISSING)
            if any(v is MISSING for v in key):
                raise refusal(
                    mp.old,
                    "a row of this multi-row VALUES list has no key value "
                    "(or a SQL one) to read it back by",
                    "Give every key column in "
                    "every row, or pass the rows as parameters (conn.execute("
                    "insert(t), rows)).",
                )
            out.append(key)
    return tuple(out)


def _commit_ts(table: sa.Table, key: Any) -> ShardConfigError:
    return refusal(
        table,
        f"it sets {key!r} to PENDING_COMMIT_TIMESTAMP(), which Spanner "
        "cannot read back in the same transaction",
        "Write that column in a "
        "transaction of its own after the contract, or give a timestamp value.",
    )


def check_statement(conn: Any, elem: Any, mp: MirrorPlan, rows: list[Any]) -> Shape:
    """The statement's :class:`Shape`, or ShardConfigError naming what to do instead."""
    if isinstance(elem, Insert):
        return _insert_shape(conn, elem, mp, rows)
    table, verb = mp.old, "update" if isinstance(elem, Update) else "delete"
    where = elem.whereclause
    if where is not None:
        _check_where(where, table, verb)
    sets: list[str] = []
    if isinstance(elem, Update):
        values = statement_values(elem)
        if _pending_commit_ts(values) and is_spanner(conn.dialect):
            raise _commit_ts(table, _pending_commit_ts(values))
        for k, v in values.items():
            others = _names_outside_subqueries(v, table)
            if others:
                raise refusal(
                    table,
                    f"this UPDATE sets {k!r} from {others[0]} (UPDATE ... FROM)",
                    "Read the values first, then update by key.",
                )
        first = rows[0] if rows else {}
        for c in mp.old_key:
            if c.key in values and literal_value(values[c.key]) is MISSING:
                raise refusal(
                    table,
                    f"this UPDATE sets the key column {c.key!r} to SQL, so its new key is unknown",
                    "Set the key to a value.",
                )
            if c.onupdate is not None and not (c.onupdate.is_scalar or c.onupdate.is_callable):
                raise refusal(
                    table,
                    f"the key column {c.key!r} has a SQL onupdate",
                    "Give the key column a Python onupdate, or none.",
                )
            generated = generated_shard(mp, c)
            if generated is not None:
                # Spanner's generated shard: it changes with its sources alone, and its
                # new value is theirs hashed (SQLite: the client fills it in the row)
                if any(k in values or k in first for k in generated.source_keys) or any(
                    src.onupdate is not None for src in generated.sources
                ):
                    sets.append(c.key)
                continue
            if c.server_onupdate is not None:
                raise refusal(
                    table,
                    f"the key column {c.key!r} has a server onupdate (the database may change "
                    "it on any UPDATE)",
                    "Drop the server onupdate until the contract, or give the key column a "
                    "Python onupdate.",
                )
            if c.key in values or c.key in first or c.onupdate is not None:
                sets.append(c.key)
    binds, exact = _key_binds(where, table, mp) if where is not None else (None, False)
    return Shape(verb, key_binds=binds, exact=exact, sets_key=tuple(sets))
