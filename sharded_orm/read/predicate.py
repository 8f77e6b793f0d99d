"""The shard predicate of a ``sharded_select``: ``shard = k``, ``shard BETWEEN 0 AND N-1``
or ``shard = <var>`` (a correlated branch), a SQL construct compiled by ``@compiles``."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Boolean
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal

from sharded_orm.errors import ShardConfigError
from sharded_orm.read.criteria import nulls_excluded
from sharded_orm.spanner.stock import refuse_stock


class ShardPredicate(ColumnElement[bool]):
    """``shard = k`` (``point`` set) or ``shard BETWEEN 0 AND N-1``, compiled by ``@compiles``.

    ``point`` and ``fixed`` are in the cache key: a compiled form is reused only for the
    same shard. ``fixed`` marks a shard chosen by the caller (a merge branch), which a
    later ``where()`` must not recompute.
    """

    __visit_name__ = "sharded_orm_shard_predicate"
    inherit_cache = True
    _is_implicitly_boolean = True  # a comparison: no "= 1" around it where booleans are ints
    _traverse_internals = [
        ("column", InternalTraversal.dp_clauseelement),
        ("count", InternalTraversal.dp_plain_obj),
        ("point", InternalTraversal.dp_plain_obj),
        ("fixed", InternalTraversal.dp_plain_obj),
        ("not_null", InternalTraversal.dp_clauseelement_tuple),
        ("index", InternalTraversal.dp_plain_obj),
        ("var", InternalTraversal.dp_plain_obj),
    ]
    type = Boolean()

    def __init__(
        self,
        column: Any,
        count: int,
        point: int | None,
        fixed: bool = False,
        not_null: tuple[Any, ...] = (),
        index: str | None = None,
        var: str | None = None,
    ) -> None:
        self.column = column
        self.count = count
        self.point = point
        self.fixed = fixed
        self.not_null = not_null  # a NULL_FILTERED index's nullable columns
        self.index = index
        #: ``shard = <var>``: the shard named by an enclosing query (a correlated branch)
        self.var = var


@compiles(ShardPredicate)
def _compile_predicate(element: ShardPredicate, compiler: Any, **kw: Any) -> str:
    refuse_stock(compiler.dialect, "A sharded read (sharded_select, merged(), page())")
    if element.not_null and compiler.stack:
        _check_nulls_excluded(element, compiler.stack[-1].get("selectable"))
    col = element.column
    point = element.point
    if element.var is not None:
        return f"{compiler.process(col, **kw)} = {element.var}"
    expr = col.between(0, element.count - 1) if point is None else col == point
    return str(compiler.process(expr, **kw))


def _check_nulls_excluded(pred: ShardPredicate, select_: Any) -> None:
    where = getattr(select_, "_where_criteria", ())
    excluded: set[Any] = set()
    for c in where:
        if not isinstance(c, ShardPredicate):
            excluded |= nulls_excluded(c)
    missing = [c for c in pred.not_null if c._deannotate() not in excluded]
    if missing:
        names = ", ".join(repr(c.name) for c in missing)
        raise ShardConfigError(
            f"index {pred.index!r} is NULL_FILTERED: it holds no row whose {names} is NULL, "
            "so it cannot answer a statement that does not exclude those rows (the answer "
            "would silently miss them). Exclude NULL in the WHERE clause (e.g. "
            f".where({missing[0].name}.is_not(None)), or any comparison on it), or read "
            "through another index or the primary key."
        )


def split_criteria(criteria: tuple[Any, ...]) -> tuple[list[Any], ShardPredicate | None]:
    rest = [c for c in criteria if not isinstance(c, ShardPredicate)]
    preds = [c for c in criteria if isinstance(c, ShardPredicate)]
    return rest, (preds[0] if preds else None)
