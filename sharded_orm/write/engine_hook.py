"""The one place every INSERT and UPDATE of a sharded table passes through.

An ``Engine`` ``before_execute`` hook (registered for all engines when
``sharded_orm`` is imported) looks at each INSERT/UPDATE whose table has shard
columns, and for every row:

* fills a missing shard value from its sources (evaluating a source's Python-side
  default first, and writing that value too, so the stored source and the hash agree);
* refuses a given shard value that disagrees with its sources (``ShardMismatchError``);
* refuses an UPDATE that sets some sources but not the others, unless the others are
  pinned by ``column == value`` in the WHERE clause (the ORM flush pins the primary key
  that way), because the new shard could not be computed;
* on Spanner, leaves ``server_side=True`` shard columns to the server (after checking
  a value the caller gave).

Statements of other tables cost one dictionary lookup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import event, literal
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.sql.elements import (
    ClauseElement,
)
from sqlalchemy.sql.schema import Table

from sharded_orm.errors import ShardConfigError, ShardMismatchError, ShardValueError
from sharded_orm.schema.columns import ShardColumn, shard_columns
from sharded_orm.spanner import is_spanner
from sharded_orm.write.sql import (
    MISSING,
    evaluate_default,
    literal_value,
    statement_values,
    where_equalities,
)

_PARAM_PREFIX = "sharded_orm_"


def _table_shards(table: Any) -> tuple[ShardColumn, ...]:
    if not isinstance(table, Table):
        return ()
    info = table.info  # annotated ORM copies share the original's info dict
    cached = info.get("sharded_orm.shards")
    if cached is not None and cached[0] == len(table.columns):
        return cached[1]  # type: ignore[no-any-return]
    shards = shard_columns(table) if _has_shard_info(table) else ()
    info["sharded_orm.shards"] = (len(table.columns), shards)
    return shards


def _has_shard_info(table: Table) -> bool:
    return any(c.info and "sharded_orm.shard" in c.info for c in table.columns)


def _unhashable_source(sc: ShardColumn, key: str) -> ShardConfigError:
    return ShardConfigError(
        f"the value for shard source {key!r} of {sc.name!r} is a SQL expression; the shard "
        "can only be computed from plain values. Compute the value in Python first."
    )


class _RowShards:
    """Fills or checks the shard columns of one table, row by row."""

    def __init__(self, shards: Sequence[ShardColumn], on_spanner: bool) -> None:
        self.server_made = [sc for sc in shards if sc.server_side and on_spanner]
        self.client_made = [sc for sc in shards if sc not in self.server_made]

    def insert_row(self, row: dict[str, Any], stmt_values: Mapping[str, Any]) -> dict[str, Any]:
        """The row to send, with shard values filled in; raises on a disagreeing one."""
        out = row
        for sc in self.client_made:
            values = _source_values(sc, out, stmt_values, insert=True)
            if values is None:
                raise ShardConfigError(
                    f"cannot compute shard column {sc.name!r}: no value for its sources "
                    f"{', '.join(sc.source_keys)}"
                )
            if out is row:
                out = dict(row)
            for k, v in values.items():
                out.setdefault(k, v)  # defaults we evaluated are written too
            shard = sc.compute([values[k] for k in sc.source_keys])
            _check_given(sc, out, stmt_values, shard)
            out[sc.key] = shard
        for sc in self.server_made:
            out = self._drop_server_made(sc, out, stmt_values, insert=True)
        return out

    def update_row(
        self,
        row: dict[str, Any],
        stmt_values: Mapping[str, Any],
        pinned: Mapping[str, Any],
    ) -> dict[str, Any]:
        out = row
        for sc in self.client_made:
            setting = [k for k in sc.source_keys if k in out or k in stmt_values]
            shard_given = sc.key in out or sc.key in stmt_values
            if not setting and not shard_given:
                continue
            values: dict[str, Any] = {}
            for k in sc.source_keys:
                if k in out:
                    values[k] = out[k]
                elif k in stmt_values:
                    values[k] = literal_value(stmt_values[k], out)
                    if values[k] is MISSING:
                        raise _unhashable_source(sc, k)
                elif k in pinned:
                    values[k] = literal_value(pinned[k], out)
                    if values[k] is MISSING:
                        raise _unhashable_source(sc, k)
                else:
                    what = f"sets {', '.join(setting)}" if setting else f"sets {sc.name!r}"
                    raise ShardConfigError(
                        f"this UPDATE {what} but not shard source {k!r}, so shard column "
                        f"{sc.name!r} cannot be recomputed and the row would be lost to "
                        f"sharded queries. Set all of {', '.join(sc.source_keys)} in the same "
                        f"UPDATE, pin {k!r} with {k} == value in the WHERE clause, or change "
                        "the row through the ORM (which knows the whole row)."
                    )
            shard = sc.compute([values[k] for k in sc.source_keys])
            _check_given(sc, out, stmt_values, shard)
            if out is row:
                out = dict(row)
            out[sc.key] = shard
        for sc in self.server_made:
            out = self._drop_server_made(sc, out, stmt_values, insert=False)
        return out

    @staticmethod
    def _drop_server_made(
        sc: ShardColumn, row: dict[str, Any], stmt_values: Mapping[str, Any], *, insert: bool
    ) -> dict[str, Any]:
        if sc.key in stmt_values:
            raise ShardConfigError(
                f"{sc.name!r} is generated by Spanner (server_side=True); leave it out of .values()"
            )
        if sc.key not in row:
            return row
        values = _source_values(sc, row, stmt_values, insert=insert)
        if values is not None:
            _check_given(sc, row, stmt_values, sc.compute([values[k] for k in sc.source_keys]))
        out = dict(row)
        del out[sc.key]
        return out


def _source_values(
    sc: ShardColumn, row: Mapping[str, Any], stmt_values: Mapping[str, Any], *, insert: bool
) -> dict[str, Any] | None:
    values: dict[str, Any] = {}
    for col in sc.sources:
        k = col.key
        if k in row:
            v = row[k]
        elif k in stmt_values:
            v = literal_value(stmt_values[k], row)
            if v is MISSING:
                raise _unhashable_source(sc, k)
        elif insert:
            v = evaluate_default(col, {**stmt_values, **row, **values})
            if v is MISSING:
                v = None  # the column will be NULL: compute() names the problem
        else:
            return None
        values[k] = v
    return values


def _check_given(
    sc: ShardColumn, row: Mapping[str, Any], stmt_values: Mapping[str, Any], shard: int
) -> None:
    if sc.key in row:
        given = row[sc.key]
    elif sc.key in stmt_values:
        given = literal_value(stmt_values[sc.key], row)
    else:
        return
    if given is None or given is MISSING:
        return  # the ORM sends None for an attribute it was never given
    if given != shard or isinstance(given, bool):
        raise ShardMismatchError(
            f"{sc.name}={given!r} disagrees with its sources "
            f"({', '.join(sc.source_keys)}), which hash to {shard}; such a row would be "
            f"invisible to sharded queries. Leave {sc.name!r} out and sharded-orm fills it."
        )


def _fast_insert_rows(shards: _RowShards, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """INSERT rows carrying every source: fill a missing shard (in a copy), accept a given
    one that agrees. Anything else (a source to default, a disagreeing shard) takes the
    full path, which evaluates defaults and raises the precise error."""
    plan = [(sc.key, sc.source_keys, sc._fn) for sc in shards.client_made]
    out = []
    for row in rows:
        new: dict[str, Any] | None = None
        try:
            for key, source_keys, fn in plan:
                shard = fn([row[k] for k in source_keys])
                given = row.get(key)
                if given is None:
                    if new is None:
                        new = row.copy()
                    new[key] = shard
                elif given != shard or given.__class__ is bool:
                    raise KeyError(key)
        except (KeyError, ShardValueError):
            new = shards.insert_row(row, {})
        out.append(row if new is None else new)
    return out


def _rewrite_multi_values(stmt: Insert, shards: _RowShards) -> Insert:
    """``insert().values([{...}, {...}])``: fill each VALUES row in the statement itself.

    SQLAlchemy keeps these rows in ``Insert._multi_values`` (no public accessor), and a
    context-sensitive column default cannot see them; so we rebuild the rows with the shard.
    """
    table = stmt.table
    new_rows: list[dict[str, Any]] = []
    for group in stmt._multi_values:
        for raw in group:
            items = raw.items() if isinstance(raw, dict) else zip(table.c, raw, strict=False)
            row: dict[str, Any] = {}
            for k, v in items:
                key = k if isinstance(k, str) else getattr(k, "key", None)
                if key is None:
                    raise ShardConfigError(f"cannot read multi-VALUES key {k!r}")
                lit = literal_value(v)
                row[key] = v if lit is MISSING else lit
            new_rows.append(shards.insert_row(row, {}))
    new = stmt._generate()
    new._multi_values = (  # type: ignore[assignment]
        [
            {
                k: (v if isinstance(v, ClauseElement) else literal(v, table.c[k].type))
                for k, v in r.items()
            }
            for r in new_rows
        ],
    )
    return new


def _before_execute(
    conn: Connection,
    elem: Any,
    multiparams: list[dict[str, Any]],
    params: dict[str, Any],
    execution_options: Any,
) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    is_insert = isinstance(elem, Insert)
    if not (is_insert or isinstance(elem, Update)):
        return elem, multiparams, params
    shards = _table_shards(elem.table)
    if not shards:
        return elem, multiparams, params
    row_shards = _RowShards(shards, is_spanner(conn.dialect))
    if is_insert:
        if elem._multi_values:
            return _rewrite_multi_values(elem, row_shards), multiparams, params
        if elem.select is not None:
            names = {getattr(c, "key", c) for c in (elem._select_names or ())}
            missing = [sc.name for sc in row_shards.client_made if sc.key not in names]
            if missing:
                raise ShardConfigError(
                    f"INSERT ... FROM SELECT into {elem.table.name!r} must select the shard "
                    f"column(s) {', '.join(missing)} too: the client never sees those rows"
                )
            return elem, multiparams, params
    stmt_values = statement_values(elem)
    if is_insert and not stmt_values and not row_shards.server_made and (multiparams or params):
        if multiparams:
            return elem, _fast_insert_rows(row_shards, multiparams), params
        return elem, multiparams, _fast_insert_rows(row_shards, [params])[0]
    pinned: dict[str, Any] = {}
    if not is_insert:
        sources = {c for sc in shards for c in sc.sources}
        pinned = {
            c.key: v
            for c, v in where_equalities(elem.whereclause).items()
            if c._deannotate() in sources
        }
    rows = multiparams if multiparams else [params]
    if is_insert:
        new_rows = [row_shards.insert_row(r, stmt_values) for r in rows]
    else:
        new_rows = [row_shards.update_row(r, stmt_values, pinned) for r in rows]
    if not multiparams and not params:
        # Values came only from .values(...): put the shard into the statement itself.
        extra = {k: v for k, v in new_rows[0].items() if k not in stmt_values}
        return (elem.values(**extra) if extra else elem), multiparams, params
    if multiparams:
        return elem, new_rows, params
    return elem, multiparams, new_rows[0]


event.listen(Engine, "before_execute", _before_execute, retval=True)
