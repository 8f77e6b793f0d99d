"""Rows to Spanner mutations, the library's way, one row at a time (no Beam import here).

A :class:`RowPlan` is built once per worker from the model; :meth:`RowPlan.prepare` turns
one input (a mapping keyed by attribute or column key, or a model instance) into the
values of one insert mutation: Python-side defaults and library-made ids evaluated
(``write.sql.evaluate_default``, as the engine hook does), every shard column computed by
``ShardColumn.compute`` (and a given one checked against it), each value checked and then
converted by the column type's bind processor for the Spanner dialect (as ``bulk_load``'s
mutations are). A bad row raises :class:`RowRejected` with the reason, which the pipeline
sends to its dead-letter output.
"""

from __future__ import annotations

import datetime as dt
import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import types as sqltypes

from sharded_orm.errors import ShardConfigError, ShardingError
from sharded_orm.schema.columns import ATTR_COLUMNS_KEY, shard_columns, table_of
from sharded_orm.write.sql import MISSING, evaluate_default

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class RowRejected(ShardingError, ValueError):
    """One input row that cannot be written; the message is the dead letter's reason."""


def model_path(model: Any) -> str:
    """``module:QualName`` of a mapped class, checked importable (workers import it)."""
    if not isinstance(model, type):
        raise ShardConfigError(
            f"give the mapped class itself (workers import it by name), got {model!r}"
        )
    table_of(model)  # a mapped class, or a clear error
    path = f"{model.__module__}:{model.__qualname__}"
    if "<locals>" in model.__qualname__ or load_model(path) is not model:
        raise ShardConfigError(
            f"{path} cannot be imported by name, and pipeline workers find the model by "
            "importing it: define it at module level"
        )
    return path


def load_model(path: str) -> Any:
    module_name, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def server_filled_keys(table: sa.Table) -> list[str]:
    """Key columns only the database can fill (IDENTITY, sequences, SQL defaults)."""
    out = []
    for c in table.primary_key.columns:
        if (
            c.identity is not None
            or c.server_default is not None
            or isinstance(c.default, sa.Sequence)
            or (c.default is not None and getattr(c.default, "is_clause_element", False))
        ):
            out.append(c.key)
    return out


class RowPlan:
    """How one table's rows become mutation values (see the module docstring)."""

    def __init__(self, model: Any, dialect: sa.Dialect | None = None) -> None:
        table = table_of(model)
        self.table = table
        self.attr_columns: Mapping[str, Any] = table.info.get(ATTR_COLUMNS_KEY, {})
        server_made = {sc.key for sc in shard_columns(table) if sc.server_side}
        self.columns = [c for c in table.columns if c.key not in server_made and c.computed is None]
        self.column_names = [c.name for c in self.columns]
        self.shards = [sc for sc in shard_columns(table) if sc.key not in server_made]
        bad = server_filled_keys(table)
        if bad:
            raise ShardConfigError(
                f"{table.name}.{', '.join(bad)} is filled by the database (IDENTITY, sequence "
                "or SQL default), and a pipeline writes mutations, which cannot ask it for "
                "values: give every row its key (a client-side id such as "
                "UUIDPrimaryKeyMixin, or ids drawn from a SpannerSequence pool beforehand)"
            )
        if dialect is None:
            from sharded_orm.spanner.mutations import dialect_of

            dialect = dialect_of(None)
        self.processors = [
            c.type.dialect_impl(dialect).bind_processor(dialect) for c in self.columns
        ]

    def _as_row(self, raw: Any) -> dict[str, Any]:
        if isinstance(raw, Mapping):
            items = list(raw.items())
        else:
            state = sa.inspect(raw, raiseerr=False)
            mapper = getattr(state, "mapper", None)
            if mapper is None or mapper.local_table is not self.table:
                raise RowRejected(
                    f"a row is a mapping or a mapped {self.table.name} instance, "
                    f"got {type(raw).__name__}"
                )
            # attributes the instance holds (unset ones are left to defaults)
            items = [(k, v) for k, v in state.dict.items() if k in mapper.column_attrs]
        row: dict[str, Any] = {}
        for k, v in items:
            col = self.attr_columns.get(k)
            key = col.key if col is not None else k
            if key not in self.table.c:
                raise RowRejected(f"{k!r} is not a column of {self.table.name!r}")
            row[key] = v
        return row

    def prepare(self, raw: Any) -> list[Any]:
        """The mutation values of one row, in ``column_names`` order; raises RowRejected."""
        row = self._as_row(raw)
        for c in self.columns:
            if c.key not in row and c.default is not None and "sharded_orm.shard" not in c.info:
                try:
                    v = evaluate_default(c, row)
                except ShardingError as exc:
                    raise RowRejected(str(exc)) from None
                if v is not MISSING:
                    row[c.key] = v
        for sc in self.shards:
            try:
                shard = sc.compute([row.get(k) for k in sc.source_keys])
            except ShardingError as exc:
                raise RowRejected(f"shard column {sc.name!r}: {exc}") from None
            given = row.get(sc.key)
            if given is not None and given != shard:
                raise RowRejected(
                    f"{sc.name}={given!r} disagrees with its sources, which hash to {shard}"
                )
            row[sc.key] = shard
        values = []
        for c, proc in zip(self.columns, self.processors, strict=True):
            v = row.get(c.key)
            if v is None:
                if c.primary_key:
                    raise RowRejected(f"key column {c.key!r} is missing")
                if not c.nullable:
                    raise RowRejected(f"column {c.key!r} is NOT NULL but has no value")
            else:
                problem = check_value(c, v)
                if problem:
                    raise RowRejected(problem)
                try:
                    v = proc(v) if proc is not None else v
                except Exception as exc:
                    raise RowRejected(f"column {c.key!r}: cannot convert {v!r}: {exc}") from None
            values.append(v)
        return values


_PY_TYPES: Sequence[tuple[type[Any], tuple[type, ...]]] = (
    (sqltypes.Boolean, (bool,)),
    (sqltypes.Integer, (int,)),
    (sqltypes.DateTime, (dt.datetime,)),
    (sqltypes.Date, (dt.date,)),
    (sqltypes.String, (str,)),
    (sqltypes.LargeBinary, (bytes,)),
)


def check_value(col: sa.Column[Any], v: Any) -> str | None:
    """Why ``v`` cannot go into ``col`` (wrong type, naive datetime, too long), or None."""
    t = col.type.impl_instance if isinstance(col.type, sqltypes.TypeDecorator) else col.type
    for sa_type, py in _PY_TYPES:
        if isinstance(t, sa_type):
            if not isinstance(v, py) or (bool not in py and isinstance(v, bool)):
                names = "/".join(p.__name__ for p in py)
                return f"column {col.key!r} takes {names}, got {type(v).__name__} {v!r}"
            break
    if isinstance(v, int) and not isinstance(v, bool) and not INT64_MIN <= v <= INT64_MAX:
        return f"column {col.key!r}: {v} does not fit in an INT64"
    if isinstance(v, dt.datetime) and v.tzinfo is None:
        return f"column {col.key!r}: naive datetime {v!r}; give it a timezone (UTC)"
    length = getattr(t, "length", None)
    if isinstance(v, (str, bytes)) and isinstance(length, int) and len(v) > length:
        return f"column {col.key!r} holds at most {length} characters, got {len(v)}"
    return None
