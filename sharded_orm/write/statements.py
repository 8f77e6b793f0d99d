"""INSERT forms whose rows the client never sees: upserts' DO UPDATE and INSERT ... SELECT.

Their new source values exist only inside the database, so the shard cannot be hashed
from them. What can be proven in SQL is accepted (an upsert whose SET takes every
changed source from ``excluded`` and keys the others by the conflict target: the shard
is then ``excluded.<shard>``; an INSERT ... SELECT that copies the shard together with
its unchanged sources from a table sharded the same way); anything else is refused with
the way out.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.sql.elements import ClauseElement, ColumnClause
from sqlalchemy.sql.expression import TableClause
from sqlalchemy.sql.schema import Table
from sqlalchemy.sql.visitors import replacement_traverse

from sharded_orm.errors import ShardConfigError, ShardingError
from sharded_orm.schema.columns import ShardColumn, shard_columns
from sharded_orm.schema.registry import declared_tables
from sharded_orm.write.sql import column_key, statement_values


def with_upsert_shard(stmt: Insert, shards: Sequence[ShardColumn]) -> Insert:
    """``stmt`` with ``shard = excluded.shard`` added to its DO UPDATE SET where needed."""
    clause = getattr(stmt, "_post_values_clause", None)  # SQLAlchemy's ON CONFLICT clause
    to_set = getattr(clause, "update_values_to_set", None)
    if not to_set:
        return stmt
    items = list(to_set.items() if isinstance(to_set, dict) else to_set)
    keys = {column_key(k): v for k, v in items}
    targets = {getattr(c, "key", c) for c in getattr(clause, "inferred_target_elements", ()) or ()}
    extra: list[tuple[Any, Any]] = []
    for sc in shards:
        setting = [k for k in sc.source_keys if k in keys]
        if not setting and sc.key not in keys:
            continue
        for i, k in enumerate(sc.source_keys):
            if k in keys:
                v = keys[k]
                if getattr(getattr(v, "table", None), "name", None) == "excluded" and v.key == k:
                    continue
                why = f"sets {k!r} to something other than excluded.{k}"
            elif k in targets and not (sc.loose and sc.loose[i]):
                continue
            else:
                why = f"keeps {k!r}, which is not an exact column of the conflict target"
            raise ShardConfigError(
                f"this upsert's DO UPDATE {why}, so the new {sc.name!r} cannot be computed. "
                f"Take every changed source of {sc.name!r} from excluded (set_={{'{k}': "
                f"stmt.excluded.{k}}}) with the others in index_elements, or upsert through "
                "a SELECT and an UPDATE."
            )
        if sc.key in keys:
            continue  # given: the INSERT half's check covers excluded.shard
        extra.append((sc.key, stmt.excluded[sc.key]))  # type: ignore[attr-defined]
    if not extra:
        return stmt
    new_clause = copy.copy(clause)
    if isinstance(to_set, dict):
        new_clause.update_values_to_set = {**to_set, **dict(extra)}  # type: ignore[union-attr]
    else:
        new_clause.update_values_to_set = items + extra  # type: ignore[union-attr]
    new = stmt._generate()
    new._post_values_clause = new_clause
    return new


def _plain(col: Any) -> Any:
    """The column without the ORM's annotations."""
    deannotate = getattr(col, "_deannotate", None)
    return deannotate() if deannotate is not None else col


def check_from_select(stmt: Insert, table: Any, shards: Sequence[ShardColumn]) -> None:
    """Refuse an INSERT ... FROM SELECT whose shard values are not a verified copy."""
    names = [column_key(c) for c in (stmt._select_names or ())]
    selected = list(stmt.select.selected_columns)  # type: ignore[union-attr]
    by_key = dict(zip(names, selected, strict=False))
    for sc in shards:
        if sc.key not in by_key:
            raise ShardConfigError(
                f"INSERT ... FROM SELECT into {table.name!r} must select the shard "
                f"column {sc.name!r} too: the client never sees those rows"
            )
        shard_src = _plain(by_key[sc.key])
        source_table = getattr(shard_src, "table", None)
        origin = _origin_layout(source_table, shard_src)
        ok = origin is not None and (origin.count, origin.algorithm) == (sc.count, sc.algorithm)
        if ok and origin is not None:
            for k, src in zip(sc.source_keys, origin.sources, strict=True):
                if _plain(by_key.get(k)) is not src:
                    ok = False
        if not ok:
            raise ShardConfigError(
                f"INSERT ... FROM SELECT into {table.name!r} selects {sc.name!r} from something "
                "other than a copy of a same-layout shard with its own unchanged sources, so "
                "its value cannot be verified (crc32 cannot be computed in SQL). Select the "
                "rows and insert them through sharded-orm, or use a server_side=True shard "
                "on Spanner."
            )


def _origin_layout(table: Any, column: Any) -> ShardColumn | None:
    if table is None or not hasattr(table, "columns"):
        return None
    try:
        layout = shard_columns(table)
    except ShardingError:
        return None
    for sc in layout:
        if sc.column is column:
            return sc
    return None


def _swap_columns(element: Any, swap: Callable[[Any], Any]) -> Any:
    """``element`` with the columns ``swap`` names replaced (SQLAlchemy's visitor)."""
    traverse: Callable[[Any, Any, Any], Any] = replacement_traverse
    return traverse(element, {}, swap)


def onto_declared(stmt: Any, light: Any) -> tuple[Any, Table] | None:
    """A statement on a lightweight ``sa.table()`` that lacks the shard column, rebuilt on
    the declared table of that name (same SQL name, the declared types), so the shard can
    be set; None when it cannot be rebuilt faithfully (RETURNING, ordered values, column
    keys that differ from names...), and the caller refuses."""
    if isinstance(light, Table) or not isinstance(light, TableClause):
        return None
    if stmt._returning or stmt._hints:
        return None
    if isinstance(stmt, Insert) and (stmt._multi_values or stmt.select is not None):
        return None
    names = {c.name for c in light.c}
    for declared in declared_tables(getattr(light, "schema", None), light.name):
        by_name = {c.name: c for c in declared.columns}
        if names <= by_name.keys() and all(by_name[n].key == n for n in names):
            break
    else:
        return None

    def swap(element: Any) -> Any:
        if isinstance(element, ColumnClause) and getattr(element, "table", None) is light:
            return by_name[element.name]
        return None

    new: Any
    if isinstance(stmt, Update):
        new = declared.update()
        if stmt.whereclause is not None:
            new = new.where(_swap_columns(stmt.whereclause, swap))
    else:
        new = declared.insert()
    values = {
        by_name[k]: _swap_columns(v, swap) if isinstance(v, ClauseElement) else v
        for k, v in statement_values(stmt).items()
    }
    if not values:
        return new, declared
    if getattr(stmt, "_maintain_values_ordering", False) or getattr(stmt, "_ordered_values", None):
        return new.ordered_values(*values.items()), declared
    return new.values(values), declared
