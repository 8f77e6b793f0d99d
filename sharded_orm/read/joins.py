"""Joins a merge is proven exact for: rows that each hold a row of the sharded table,
told apart by keys (``sharded_orm.read.order`` orders by them; docs/queries.md). And the
joins of eager loads, which the branches of a merge do not make: eager loading (of an
option or of the mapper) happens in the rows statement alone, and what an eager inner
join filters, the branches filter by ``EXISTS`` (``without_options``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, exists, inspect, select, true
from sqlalchemy.orm import lazyload
from sqlalchemy.sql import selectable

from sharded_orm.errors import ShardConfigError
from sharded_orm.memo import Memo


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


# ----------------------------------------------------------------------------- eager loads


def leaves(frm: Any) -> list[Any]:
    """The tables, aliases and subqueries a FROM joins (groupings seen through), plain."""
    while isinstance(frm, selectable.FromGrouping):
        frm = frm.element
    if isinstance(frm, selectable.Join):
        return leaves(frm.left) + leaves(frm.right)
    return [frm._deannotate() if hasattr(frm, "_deannotate") else frm]


def inner_eager_joins(final: Any, ours: set[int]) -> tuple[list[Any], list[Any], bool]:
    """(the right sides, the ON clauses) of the eager loads' inner joins that filter the
    rows of the FROM ``final`` (one of a statement's final FROMs, the ORM's eager joins
    in it), and whether the statement's own rows are nested in a subquery there (the ORM
    does so under LIMIT with a joined collection: its joins then come after the LIMIT).

    ``ours``: the ``id`` of each FROM the statement has with eager loading off. A join
    whose right side holds none of them is an eager load's; an inner one on the chain of
    left sides filters the rows (SQLAlchemy nests an inner join below an outer one in
    the outer one's right side, where it filters nothing of ours).
    """
    rights: list[Any] = []
    ons: list[Any] = []
    frm = final
    while isinstance(frm, (selectable.Join, selectable.FromGrouping)):
        if isinstance(frm, selectable.FromGrouping):
            frm = frm.element
            continue
        if not frm.isouter and not any(id(t) in ours for t in leaves(frm.right)):
            rights.append(frm.right)
            ons.append(frm.onclause)
        frm = frm.left
    root = leaves(frm)[0]
    return rights, ons, id(root) not in ours


#: whether a mapper (or a subclass of it) has a relationship the mapper loads joined
_JOINS_EAGERLY: dict[Any, bool] = {}


def _mapper_joins(stmt: Any) -> bool:
    """Whether an entity ``stmt`` selects has ``relationship(lazy="joined")`` (its own or
    a subclass's): only then does SQLAlchemy add eager joins no option asked for."""
    for d in stmt.column_descriptions:
        entity = d.get("entity")
        if entity is None or d.get("expr") is not entity:
            continue
        mapper = inspect(entity).mapper
        hit = _JOINS_EAGERLY.get(mapper)
        if hit is None:
            hit = any(
                r.lazy in ("joined", False)
                for m in mapper.self_and_descendants
                for r in m.relationships
            )
            _JOINS_EAGERLY[mapper] = hit
        if hit:
            return True
    return False


def without_eager(stmt: Any) -> Any:
    """``stmt`` without its loader options and with every relationship of its entities
    lazy, the mapper's own eager loads (``relationship(lazy="joined")``...) included:
    the user's own FROMs and WHERE, no eager-load joins."""
    bare = stmt.options()
    bare._with_options = ()
    # a wildcard strategy applies to every relationship no option names: after the
    # options are gone, to all of them (the mapper's lazy= is a default it overrides)
    return bare.options(lazyload("*")) if _mapper_joins(stmt) else bare


def without_options(stmt: Any) -> Any:
    """``stmt`` as the branches of a merge read it: no loader options, no eager loading
    (of an option or of the mapper), and what its eager loads' inner joins filter as a
    condition (``eager_filter``): the rows the statement gives, only their keys."""
    bare = without_eager(stmt)
    cond = eager_filter(stmt)
    return bare if cond is None else bare.where(cond)


#: eager_filter by statement (SQLAlchemy's cache key): (the condition,) where it holds
#: no bound value
_EAGER: Memo[Any, tuple[Any]] = Memo("read.eager_joins", 512)


def eager_filter(stmt: Any) -> Any:
    """A condition true of the rows ``stmt``'s eager loads keep, or None where they keep
    every row.

    ``joinedload(rel, innerjoin=True)`` (or ``relationship(lazy="joined",
    innerjoin=True)``, or ``lazy="joined"`` on a relationship SQLAlchemy chains inner
    joins from) loads with an inner join, which drops the rows with no related row: the
    branches, which load nothing, drop them by ``EXISTS`` over the same joins, found as
    SQLAlchemy renders the statement (so each option and mapper setting counts as it
    does there). Refused where SQLAlchemy nests the statement's rows in a subquery (a
    joined eager collection beside the inner join): there the join filters after the
    LIMIT, so which rows it drops depends on the LIMIT.
    """
    options = any(getattr(o, "_is_strategy_option", False) for o in stmt._with_options)
    if not options and not _mapper_joins(stmt):
        return None  # no eager join: nothing to compile
    key = stmt._generate_cache_key()
    if key is not None and (kept := _EAGER.get(key.key)) is not None:
        return kept[0]
    ours = {id(t) for f in without_eager(stmt).get_final_froms() for t in leaves(f)}
    full = stmt.limit(None).offset(None).order_by(None)
    rights: list[Any] = []
    ons: list[Any] = []
    nested = False
    for final in full.get_final_froms():
        r, o, n = inner_eager_joins(final, ours)
        rights += r
        ons += o
        nested = nested or n
    cond = None
    if ons:
        if not nested:  # under a LIMIT (every rows statement of a merge has one)
            nested = any(inner_eager_joins(f, ours)[2] for f in full.limit(1).get_final_froms())
        if nested:
            raise _nested_inner_join(stmt, rights[0])
        cond = exists(select(true()).select_from(*rights).where(*ons))
    # kept unless it holds a bound value (an ``.and_()`` criterion, loader criteria in
    # the ON clause): the statement's key is the same for other values
    held = None if cond is None else cond._generate_cache_key()
    if key is not None and (cond is None or (held is not None and not held.bindparams)):
        _EAGER.put(key.key, (cond,))
    return cond


def _nested_inner_join(stmt: Any, right: Any) -> ShardConfigError:
    target = leaves(right)[0]
    table = getattr(target, "element", target)
    name = str(getattr(table, "name", table))
    rel: Any = None
    entity = stmt.column_descriptions[0].get("entity")
    if entity is not None:
        for r in inspect(entity).mapper.relationships:
            if name in {t.name for t in r.mapper.tables if isinstance(t, Table)}:
                rel = r
                break
    attr = "the relationship" if rel is None else f"{rel.parent.class_.__name__}.{rel.key}"
    other = "drop DISTINCT" if stmt._distinct else "load the collection with selectinload()"
    if rel is not None and rel.uselist:  # a join would repeat the row for each item
        fix = (
            f"Write the filter: .where({attr}.any()), and load {attr} with "
            f"selectinload({attr}) (or without innerjoin=True)"
        )
    else:
        fix = (
            f"Write the join: .join({attr}) (with contains_eager({attr}) to load it from "
            f"there), or {other}"
        )
    where = "in a DISTINCT statement" if stmt._distinct else "beside a joined eager collection"
    return ShardConfigError(
        f"merged()/page() cannot merge an eager load with innerjoin=True (to {name!r}) {where}: "
        "SQLAlchemy then nests the statement's rows (DISTINCT, LIMIT) in a subquery and joins "
        f"after it, so which rows the inner join drops depends on the LIMIT. {fix}."
    )
