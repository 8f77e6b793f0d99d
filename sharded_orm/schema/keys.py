"""Descending primary-key parts: ``PRIMARY KEY (UserId, LastAccessTimestamp DESC)``.

Newest-first reads of a key that ends in a timestamp want that part descending (the
seeds' best practice #3). SQLAlchemy's ``PrimaryKeyConstraint`` has no per-column order,
so the order is a mark on the column (``Column.info``): it survives mixins, ``to_metadata``
and a subclass's ``__table_args__``, and every dialect reads it from the same place.

Declare it on the column::

    last_access: Mapped[dt.datetime] = key_column(UTCDateTime, descending=True)

or in the key's order, in ``__table_args__``::

    __table_args__ = (primary_key("user_id", desc("last_access")),)

Spanner renders ``DESC`` in the key; SQLite too (``PRIMARY KEY (a, b DESC)``); other
dialects, which have no descending primary keys, render the plain key.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, PrimaryKeyConstraint
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import MappedColumn, mapped_column
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import UnaryExpression, _textual_label_reference

from sharded_orm.errors import ShardConfigError, ShardTypeError

DESC_INFO_KEY = "sharded_orm.descending"


def is_descending(column: Any) -> bool:
    info = getattr(column, "info", None)
    return isinstance(info, dict) and bool(info.get(DESC_INFO_KEY))


def key_column(*args: Any, descending: bool = False, **kwargs: Any) -> MappedColumn[Any]:
    """A primary-key ``mapped_column``; ``descending=True`` makes its key part ``DESC``."""
    if not isinstance(descending, bool):
        raise ShardTypeError(f"descending must be a bool, got {descending!r}")
    if kwargs.get("primary_key") is False:
        raise ShardConfigError("key_column is a primary-key column; drop primary_key=False")
    kwargs["primary_key"] = True
    info = dict(kwargs.pop("info", None) or {})
    info[DESC_INFO_KEY] = descending
    return mapped_column(*args, info=info, **kwargs)


def _part_name(part: Any) -> tuple[str | Column[Any], bool]:
    """(a column or its name, descending) for one part given to ``primary_key``."""
    descending = False
    if isinstance(part, UnaryExpression) and part.modifier in (operators.desc_op, operators.asc_op):
        descending = part.modifier is operators.desc_op
        part = part.element
        if isinstance(part, _textual_label_reference):  # desc("name")
            part = str(part.element)
    if not isinstance(part, (str, Column)):
        # an ORM attribute gives its column; anything else (a function, a literal) has none
        clause = getattr(part, "__clause_element__", None)
        inner = clause() if clause is not None else None
        if not isinstance(inner, Column):
            raise ShardTypeError(
                "primary key parts are column names, columns or desc(...) of them, got "
                f"{part!r}; a key cannot hold an expression"
            )
        part = inner
    return part, descending


class OrderedPrimaryKey(PrimaryKeyConstraint):
    """A ``PrimaryKeyConstraint`` whose parts may be ``desc(...)``; see :func:`primary_key`."""

    def __init__(self, *parts: Any, **kwargs: Any) -> None:
        resolved = [_part_name(p) for p in parts]
        self._descending = {(c if isinstance(c, str) else c.key) for c, desc in resolved if desc}
        super().__init__(*[c for c, _ in resolved], **kwargs)

    def _set_parent(self, parent: Any, **kw: Any) -> None:
        super()._set_parent(parent, **kw)
        for col in self.columns:
            if col.key in self._descending or col.name in self._descending:
                col.info[DESC_INFO_KEY] = True


def primary_key(*parts: Any, **kwargs: Any) -> OrderedPrimaryKey:
    """The table's key in order; ``desc("ts")`` marks a descending part."""
    return OrderedPrimaryKey(*parts, **kwargs)


@compiles(PrimaryKeyConstraint, "sqlite")
def _sqlite_primary_key(constraint: PrimaryKeyConstraint, compiler: Any, **kw: Any) -> str:
    if not any(is_descending(c) for c in constraint.columns):
        return compiler.visit_primary_key_constraint(constraint, **kw)  # type: ignore[no-any-return]
    text = ""
    if constraint.name is not None:
        text += f"CONSTRAINT {compiler.preparer.format_constraint(constraint)} "
    parts = [
        compiler.preparer.quote(c.name) + (" DESC" if is_descending(c) else "")
        for c in constraint.columns
    ]
    return text + f"PRIMARY KEY ({', '.join(parts)})"
