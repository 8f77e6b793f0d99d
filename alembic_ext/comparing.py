"""How the Spanner impl compares a model with the database in autogenerate.

A mixin of :class:`alembic_ext.impl.SpannerImpl`, Alembic's public hooks
(``compare_indexes``, ``compare_server_default``, ``compare_type``): indexes on
everything Spanner stores, defaults as Spanner stores them (:mod:`.defaults`), types with
Spanner's MAX lengths and the stored type under a ``TypeDecorator``.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic.ddl._autogen import ComparisonResult
from alembic.ddl.impl import DefaultImpl
from sqlalchemy.engine import Dialect

from . import defaults, reflection


def _stored_type(type_: Any, dialect: Dialect) -> Any:
    """The type a column of ``type_`` is stored as on ``dialect``: a TypeDecorator's
    dialect impl, through decorators of decorators."""
    for _ in range(8):
        if not isinstance(type_, sa.types.TypeDecorator):
            break
        type_ = type_.load_dialect_impl(dialect)
    return type_


class SpannerComparisons(DefaultImpl):
    """Autogenerate's comparisons for Spanner (see the module docstring)."""

    def compare_indexes(self, metadata_index: sa.Index, reflected_index: sa.Index) -> Any:
        meta = reflection.index_signature(metadata_index)
        real = reflection.index_signature(reflected_index)
        diffs = [f"{key} {real[key]!r} to {meta[key]!r}" for key in meta if meta[key] != real[key]]
        return ComparisonResult.Different(diffs) if diffs else ComparisonResult.Equal()

    def compare_server_default(
        self,
        inspector_column: sa.Column[Any],
        metadata_column: sa.Column[Any],
        rendered_metadata_default: str | None,
        rendered_inspector_default: str | None,
    ) -> bool:
        """Spanner reflects a default as the SQL it stores (see :mod:`.defaults`)."""
        return defaults.differs(
            metadata_column.server_default, rendered_metadata_default, rendered_inspector_default
        )

    def compare_type(
        self, inspector_column: sa.Column[Any], metadata_column: sa.Column[Any]
    ) -> bool:
        """STRING(MAX) / BYTES(MAX) reflect with their byte limit as length: the same type
        as an unsized ``String()``, ``Text()`` or ``LargeBinary()``, also under a
        ``TypeDecorator`` (``PickleType``, sqlalchemy-spanner's ``SpannerPickleType``: a
        BYTES(MAX) column; each was a type change on every autogenerate)."""
        real, meta = inspector_column.type, _stored_type(metadata_column.type, self.dialect)
        unsized = getattr(meta, "length", None) is None
        if unsized and isinstance(real, sa.String) and isinstance(meta, sa.String):
            return False
        if unsized and isinstance(real, sa.LargeBinary) and isinstance(meta, sa.LargeBinary):
            return False
        return bool(super().compare_type(inspector_column, metadata_column))
