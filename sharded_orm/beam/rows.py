"""Rows to Spanner mutations, the library's way, one row at a time (no Beam import here).

A :class:`RowPlan` is built once per worker from the model; :meth:`RowPlan.prepare` turns
one input (a mapping keyed by attribute or column key, or a model instance) into the
values of one insert mutation through ``bulk_load``'s own ``RowChecker``: Python-side
defaults and library-made ids evaluated, every shard column computed (and a given one
checked against it), each value checked and then converted by the column type's bind
processor for the Spanner dialect. A bad row raises :class:`RowRejected` with the reason,
which the pipeline sends to its dead-letter output.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from sharded_orm.errors import ShardConfigError, ShardingError
from sharded_orm.load.prepare import RowChecker, RowProblem, server_filled_keys, written_columns
from sharded_orm.schema.columns import table_of


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


def refuse_server_filled_keys(table: sa.Table) -> None:
    """A pipeline writes mutations, which cannot ask the database for key values."""
    bad = server_filled_keys(table)
    if bad:
        raise ShardConfigError(
            f"{table.name}.{', '.join(bad)} is filled by the database (IDENTITY, sequence "
            "or SQL default), and a pipeline writes mutations, which cannot ask it for "
            "values: give every row its key (a client-side id such as "
            "UUIDPrimaryKeyMixin, or ids drawn from a SpannerSequence pool beforehand)"
        )


class RowPlan:
    """How one table's rows become mutation values (see the module docstring)."""

    def __init__(self, model: Any) -> None:
        from sharded_orm.spanner.mutations import bind_processors, dialect_of

        table = table_of(model)
        self.table = table
        self.columns = written_columns(table, on_spanner=True)
        self.column_names = [c.name for c in self.columns]
        refuse_server_filled_keys(table)
        processors = bind_processors(self.columns, dialect_of(None))
        self.checker = RowChecker(table, self.columns, processors)

    def _items(self, raw: Any) -> list[tuple[str, Any]]:
        if isinstance(raw, Mapping):
            return list(raw.items())
        state = sa.inspect(raw, raiseerr=False)
        mapper = getattr(state, "mapper", None)
        if mapper is None or mapper.local_table is not self.table:
            raise RowRejected(
                f"a row is a mapping or a mapped {self.table.name} instance, "
                f"got {type(raw).__name__}"
            )
        # attributes the instance holds (unset ones are left to defaults)
        return [(k, v) for k, v in state.dict.items() if k in mapper.column_attrs]

    def prepare(self, raw: Any) -> list[Any]:
        """The mutation values of one row, in ``column_names`` order; raises RowRejected."""
        try:
            return self.checker.values(self.checker.keyed(self._items(raw)))
        except RowProblem as exc:
            raise RowRejected(str(exc)) from None
