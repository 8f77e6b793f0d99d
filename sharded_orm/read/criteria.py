"""What a WHERE clause says about its columns, read from its SQL constructs.

The sharded planner needs two facts the database would otherwise decide: which columns a
statement excludes NULL on (a NULL_FILTERED index can answer only then), and which
Boolean columns it pins with SQL's own constants (``flag == True`` is ``flag = true``,
with no bound value: still a point lookup).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import Boolean
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import (
    AsBoolean,
    BinaryExpression,
    BooleanClauseList,
    ColumnClause,
    False_,
    Grouping,
    Null,
    True_,
)

#: comparisons that are never true when the column is NULL (so a row with NULL there
#: is excluded, as a NULL_FILTERED index excludes it). Not NOT IN: SQLAlchemy renders an
#: empty NOT IN list (known only at execution) as true for every row, NULL included.
_NULL_REJECTING = frozenset(
    {
        operators.eq, operators.ne, operators.lt, operators.le, operators.gt, operators.ge,
        operators.in_op, operators.between_op, operators.not_between_op,
        operators.like_op, operators.not_like_op, operators.ilike_op, operators.not_ilike_op,
        operators.startswith_op, operators.endswith_op, operators.contains_op,
    }
)  # fmt: skip


def nulls_excluded(clause: Any) -> set[Any]:
    """Table columns on which ``clause`` (a WHERE criterion) is never true for NULL.

    ANDed criteria add up, ORed ones count where every branch excludes it; a comparison
    (``=``, ``<``, ``IN``, ``BETWEEN``, ``LIKE``...), ``IS NOT NULL``, ``IS TRUE`` and a
    bare Boolean column exclude NULL; anything else is not counted (a conservative
    answer: a NULL-filtered index is then refused, never used wrongly).
    """
    while isinstance(clause, Grouping):
        clause = clause.element
    if isinstance(clause, BooleanClauseList):
        parts = [nulls_excluded(c) for c in clause.clauses]
        if clause.operator is operators.and_:
            return set().union(*parts)
        if clause.operator is operators.or_ and parts:
            return set.intersection(*parts)
        return set()
    if isinstance(clause, ColumnClause) and isinstance(clause.type, Boolean):
        return {clause._deannotate()}  # WHERE flag: true only for TRUE
    if isinstance(clause, AsBoolean) and isinstance(clause.element, ColumnClause):
        return {clause.element._deannotate()}  # NOT flag
    if not isinstance(clause, BinaryExpression):
        return set()
    op = clause.operator
    sides = [clause.left, clause.right]
    if op in (operators.is_not, operators.is_):
        # IS NOT NULL, IS TRUE, IS FALSE (not IS NULL, not IS NOT TRUE)
        other = [s for s in sides if isinstance(s, (Null, True_, False_))]
        if not other or (op is operators.is_) == isinstance(other[0], Null):
            return set()
    elif op not in _NULL_REJECTING:
        return set()
    return {s._deannotate() for s in sides if isinstance(s, ColumnClause)}


def anded(where: Any) -> Iterator[Any]:
    """Each criterion ``where`` ANDs together (nested ANDs and parentheses opened)."""
    stack = [where] if where is not None else []
    while stack:
        clause = stack.pop()
        while isinstance(clause, Grouping):
            clause = clause.element
        if isinstance(clause, BooleanClauseList) and clause.operator is operators.and_:
            stack.extend(clause.clauses)
        else:
            yield clause


def boolean_equalities(where: Any) -> dict[Any, bool]:
    """``{column: True/False}`` for each Boolean column the ANDed criteria pin with SQL's
    own constants: ``flag == True`` (SQLAlchemy makes it ``flag = true``, no bound value),
    ``flag == true()``, ``flag.is_(True)``, a bare ``flag``, ``~flag`` and the False forms:
    the same point lookup as ``flag == literal(True)``."""
    found: dict[Any, bool] = {}
    for clause in anded(where):
        if isinstance(clause, ColumnClause) and isinstance(clause.type, Boolean):
            found[clause._deannotate()] = True
        elif isinstance(clause, AsBoolean) and isinstance(clause.element, ColumnClause):
            found[clause.element._deannotate()] = clause.operator is operators.is_true
        elif isinstance(clause, BinaryExpression) and clause.operator in (
            operators.eq,
            operators.is_,
        ):
            left, right = clause.left, clause.right
            if isinstance(left, (True_, False_)):
                left, right = right, left
            if isinstance(left, ColumnClause) and isinstance(right, (True_, False_)):
                found[left._deannotate()] = isinstance(right, True_)
    return found


def null_pins(where: Any) -> set[Any]:
    """Table columns the ANDed criteria pin to NULL (``col.is_(None)``, ``col == None``):
    one value in every row the statement gives, like ``col == value``."""
    found: set[Any] = set()
    for clause in anded(where):
        if isinstance(clause, BinaryExpression) and clause.operator is operators.is_:
            sides = [clause.left, clause.right]
            if any(isinstance(s, Null) for s in sides):
                found |= {s._deannotate() for s in sides if isinstance(s, ColumnClause)}
    return found
