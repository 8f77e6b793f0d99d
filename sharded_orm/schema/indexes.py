"""``ShardedIndex``: a secondary index led by a shard column.

An index on ``(CompanyId, Timestamp)`` is a hotspot of its own: every insert lands at the
end of the company's range. Leading it with the shard column spreads the writes over N
ranges, and the query helpers fan out over ``shard BETWEEN 0 AND N-1``. On Spanner::

    CREATE [UNIQUE] [NULL_FILTERED] INDEX name ON table (shard, ..., ts DESC)
        [STORING (...)] [, INTERLEAVE IN parent]

Elsewhere it is a plain index with the same columns and directions; ``storing``,
``null_filtered`` and ``interleave_in`` have no meaning there and are left out (an index
without them returns the same rows; see docs/schema.md).

The options are kept as the dialect's own keywords (``spanner_storing``,
``spanner_null_filtered``, ``spanner_interleave_in``), so the index can be reproduced by
a plain ``op.create_index(..., spanner_storing=[...])`` in a migration.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Column, Index, Table, event, exc
from sqlalchemy.orm import Mapper
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import ColumnElement, UnaryExpression, _textual_label_reference

from sharded_orm.checks import check_spanner_name
from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.schema.columns import ShardColumn, get_shard_column, is_shard_column
from sharded_orm.schema.interleave import check_before_create


def _name_of(part: Any) -> str | None:
    """The column name behind a name, a column, an ORM attribute or desc("name")'s inside."""
    if isinstance(part, str):
        return part
    if isinstance(part, _textual_label_reference):  # what desc("name") wraps
        return str(part.element)
    key = getattr(part, "key", None)
    if isinstance(part, ColumnElement):
        return key if isinstance(key, str) and hasattr(part, "table") else None
    clause = getattr(part, "__clause_element__", None)
    if clause is not None:
        inner = clause()
        return None if inner is part else _name_of(inner)
    return None


def _split_direction(part: Any) -> tuple[Any, bool]:
    """(column reference, descending) for a name, a column, an attribute or desc(...)."""
    if isinstance(part, UnaryExpression) and part.modifier in (operators.desc_op, operators.asc_op):
        inner: Any = part.element
        if isinstance(inner, _textual_label_reference):
            inner = str(inner.element)
        return inner, part.modifier is operators.desc_op
    clause = getattr(part, "__clause_element__", None)
    if clause is not None and not isinstance(part, str):
        inner = clause()
        if isinstance(inner, UnaryExpression):
            return _split_direction(inner)
        return inner, False
    return part, False


class ShardedIndex(Index):
    """A secondary index whose first column is a shard column of its table."""

    def __init__(
        self,
        name: str,
        *columns: Any,
        shard: Any,
        storing: Sequence[Any] = (),
        null_filtered: bool = False,
        unique: bool = False,
        interleave_in: str | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(name, str):
            raise ShardTypeError(f"ShardedIndex needs a name (str), got {name!r}")
        # The index exists for Spanner: a name Spanner refuses is refused here, at import
        check_spanner_name(name, "ShardedIndex name")
        if not columns:
            raise ShardConfigError(
                f"ShardedIndex {name!r} needs at least one column after the shard"
            )
        for flag, value in (("null_filtered", null_filtered), ("unique", unique)):
            if not isinstance(value, bool):
                raise ShardTypeError(f"{flag} must be a bool, got {value!r}")
        if interleave_in is not None and not isinstance(interleave_in, str):
            raise ShardTypeError(
                f"interleave_in names the parent table (str), got {interleave_in!r}"
            )
        if interleave_in is not None:
            check_spanner_name(interleave_in, f"ShardedIndex {name!r}: interleave_in")
        if isinstance(storing, (str, bytes)) or not isinstance(storing, Iterable):
            raise ShardTypeError(f"storing is a sequence of column names, got {storing!r}")
        shard_name = _name_of(shard)
        if shard_name is None:
            raise ShardTypeError(f"shard names a shard column (name or attribute), got {shard!r}")
        self.shard_name = shard_name
        self._parts = [_split_direction(c) for c in columns]
        for ref, _ in self._parts:
            if _name_of(ref) is None:
                raise ShardConfigError(
                    f"ShardedIndex {name!r}: {ref!r} is an expression; Spanner has no expression "
                    "indexes. Store the value in a (generated) column and index that."
                )
            if _name_of(ref) == shard_name:
                raise ShardConfigError(
                    f"ShardedIndex {name!r}: the shard column {shard_name!r} is listed among the "
                    "columns too; it always leads the index, give it only as shard="
                )
        self.storing_names = tuple(_name_of(s) or s for s in storing)
        self.null_filtered = null_filtered
        self.interleave_in = interleave_in
        spanner_kw: dict[str, Any] = {}
        if self.storing_names:
            spanner_kw["spanner_storing"] = list(self.storing_names)
        if null_filtered:
            spanner_kw["spanner_null_filtered"] = True
        if interleave_in:
            spanner_kw["spanner_interleave_in"] = interleave_in
        # Names are passed as names so SQLAlchemy resolves them to columns on attach;
        # _set_parent then restores the direction of desc("name") parts.
        parts = [
            ref if isinstance(ref, str) else (ref.desc() if desc else ref)
            for ref, desc in self._parts
        ]
        super().__init__(name, shard, *parts, unique=unique, **spanner_kw, **kwargs)

    def _set_parent(self, parent: Any, **kw: Any) -> None:
        try:
            super()._set_parent(parent, **kw)
        except exc.ConstraintColumnNotFoundError as e:
            # SQLAlchemy resolves names by column key, which declarative sets to the SQL name
            missing = e.__cause__.args[0] if isinstance(e.__cause__, KeyError) else None
            raise ShardConfigError(self._missing_message(parent, missing)) from e
        if not isinstance(parent, Table):
            return
        table = parent
        if self.interleave_in:
            check_before_create(table)
        # names given with desc("ts"): SQLAlchemy resolved the name; restore the direction
        self._validate(table)
        self._check_unique(table, deferrable=True)
        exprs: list[Any] = list(self.expressions)
        for i, (ref, desc) in enumerate(self._parts, start=1):
            if desc and isinstance(ref, str):
                exprs[i] = self._column(table, ref).desc()
        self.expressions = self._table_bound_expressions = exprs

    def _missing_message(self, table: Any, missing: Any) -> str:
        columns = ", ".join(c.name for c in getattr(table, "columns", ()))
        what = f"shard={missing!r}" if missing == self.shard_name else repr(missing)
        return (
            f"ShardedIndex {self.name!r}: {what} is not a column of table "
            f"{getattr(table, 'name', table)!r} (columns: {columns}). Name columns by their "
            "SQL name (not the ORM attribute name), or pass the column itself."
        )

    @staticmethod
    def _lookup(table: Table, name: str) -> Column[Any] | None:
        """A column by key, else by SQL name."""
        col = table.c.get(name)
        if col is None:
            col = next((c for c in table.columns if c.name == name), None)
        return col

    @staticmethod
    def _column(table: Table, name: str) -> Column[Any]:
        col = ShardedIndex._lookup(table, name)
        if col is None:
            raise ShardConfigError(f"{name!r} is not a column of table {table.name!r}")
        return col

    # ------------------------------------------------------------------ introspection

    @property
    def shard_column(self) -> ShardColumn:
        """The shard column leading this index."""
        table = self.table
        if table is None:
            raise ShardConfigError(f"ShardedIndex {self.name!r} is not attached to a table")
        return get_shard_column(table, self.shard_name)

    @property
    def ordering(self) -> list[tuple[Any, bool]]:
        """(column, descending) for each column after the shard, in index order."""
        out = []
        for expr in list(self.expressions)[1:]:
            desc = isinstance(expr, UnaryExpression) and expr.modifier is operators.desc_op
            col = expr.element if isinstance(expr, UnaryExpression) else expr
            out.append((col, desc))
        return out

    @property
    def storing(self) -> list[Column[Any]]:
        assert self.table is not None
        return [self.table.c[n] for n in self.storing_names]

    # ------------------------------------------------------------------ validation

    def _validate(self, table: Table) -> None:
        shard_col = self._lookup(table, self.shard_name)
        if shard_col is not None and shard_col is not list(self.columns)[0]:
            raise ShardConfigError(f"ShardedIndex {self.name!r}: the shard column must lead")
        if shard_col is None or not is_shard_column(shard_col):
            raise ShardConfigError(
                f"ShardedIndex {self.name!r}: shard={self.shard_name!r} is not a shard column of "
                f"table {table.name!r}; declare it with shard_column(...)"
            )
        indexed = {c.key for c in self.columns}
        for n in self.storing_names:
            col = table.c.get(n) if isinstance(n, str) else None
            if col is None:
                raise ShardConfigError(
                    f"ShardedIndex {self.name!r}: storing {n!r} is not a column of {table.name!r}"
                )
            if col.primary_key:
                raise ShardConfigError(
                    f"ShardedIndex {self.name!r}: {n!r} is a key column; every index already "
                    "holds the key, so Spanner refuses to STORE it. Remove it from storing."
                )
            if col.key in indexed:
                raise ShardConfigError(
                    f"ShardedIndex {self.name!r}: {n!r} is an indexed column; "
                    "remove it from storing"
                )

    def _check_unique(self, table: Table, *, deferrable: bool = False) -> None:
        """UNIQUE on (shard, cols) means UNIQUE on cols only if the shard follows from them.

        It does when the shard's sources are all indexed, or when the indexed columns hold
        the whole primary key (already unique). Otherwise two rows with equal ``cols`` but
        different shards would both be accepted: uniqueness per shard only.
        """
        if not self.unique:
            return
        try:
            sources = get_shard_column(table, self.shard_name).sources
        except ShardConfigError:
            if deferrable:  # sources named by ORM attribute: checked once the class is mapped
                return
            raise
        indexed = set(self.columns)
        if set(sources) <= indexed or set(table.primary_key.columns) <= indexed:
            return
        missing = ", ".join(c.name for c in sources if c not in indexed)
        raise ShardConfigError(
            f"ShardedIndex {self.name!r}: unique=True would enforce uniqueness only within each "
            f"shard, because shard column {self.shard_name!r} is computed from columns the index "
            f"does not hold ({missing}). Lead it with a shard column computed from indexed "
            "columns only, e.g. shard_column(<the unique columns>, count=N), or drop unique."
        )


def _check_mapped_indexes(mapper: Any, class_: Any) -> None:
    table = mapper.local_table
    if isinstance(table, Table):
        for index in table.indexes:
            if isinstance(index, ShardedIndex):
                index._check_unique(table)


event.listen(Mapper, "after_mapper_constructed", _check_mapped_indexes)
