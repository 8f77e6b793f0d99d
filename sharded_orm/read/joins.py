"""Joins a merge is proven exact for: rows that each hold a row of the sharded table,
told apart by keys (``sharded_orm.read.order`` orders by them; docs/queries.md)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.sql import selectable

from sharded_orm.errors import ShardConfigError


def _holds(frm: Any, table: Any) -> bool:
    if isinstance(frm, selectable.Join):
        return _holds(frm.left, table) or _holds(frm.right, table)
    return frm is table or getattr(frm, "_deannotate", lambda: frm)() is table


def check_joins(frm: Any, table: Any) -> None:
    """Refuse a join that gives rows holding no row of the sharded ``table`` (FULL, or
    outer with ``table`` on the side it does not keep): the merge reads rows of
    ``table``, shard by shard."""
    if not isinstance(frm, selectable.Join):
        return
    if frm.full or (frm.isouter and _holds(frm.right, table)):
        kind = "a FULL OUTER JOIN" if frm.full else f"an outer join to {table.name!r}"
        raise ShardConfigError(
            f"merged()/page() cannot merge {kind}: it gives rows with no row of "
            f"{table.name!r}, which no shard holds. Join with {table.name!r} on the left "
            "of an outer join (or an inner join)."
        )
    check_joins(frm.left, table)
    check_joins(frm.right, table)


def proven_key(frm: Any) -> list[Any] | None:
    """Columns whose values tell every row of the FROM ``frm`` apart, or None where that
    is not proven: a table's (or an alias's) primary key; for a subquery (or a CTE) of
    one SELECT, its GROUP BY columns if it groups by plain columns it selects, otherwise
    the key of its one FROM (no join) if it selects all of it. A join to such FROMs
    repeats a row of the sharded table once for each joined row: the merge tells the
    copies apart by these keys."""
    if isinstance(frm, selectable.TableClause):
        return list(getattr(frm, "primary_key", ())) or None
    if isinstance(frm, (selectable.Lateral, selectable.TableSample)):
        return None
    if isinstance(frm, (selectable.Subquery, selectable.CTE)) and isinstance(
        frm.element, selectable.Select
    ):
        sel: Any = frm.element
        if sel._group_by_clauses:
            inner = list(sel._group_by_clauses)
        elif sel._having_criteria:
            return None
        else:
            froms = sel.get_final_froms()
            key = proven_key(froms[0]) if len(froms) == 1 else None
            if key is None:
                return None
            inner = key
        outer = [frm.corresponding_column(c) for c in inner if hasattr(c, "key")]
        if len(outer) != len(inner):
            return None
        return outer if outer and all(c is not None for c in outer) else None
    if isinstance(frm, selectable.Alias) and isinstance(frm.element, selectable.TableClause):
        return list(frm.primary_key) or None
    return None
