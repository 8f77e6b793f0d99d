"""Migration operations: one public op, ``op.backfill_shard``, and autogenerate's plans.

Everything autogenerate writes is a plain ``op.*`` call with ``spanner_*`` keywords,
except filling a shard column on a table that has rows, which no stock op can do:

``op.backfill_shard(table, column, sources=[...], count=N, algorithm="crc32")``
    online: :func:`alembic_ext.backfill.backfill_shard` between two commits (Alembic's
    ``autocommit_block``), batched, resumable, idempotent. Offline (``--sql``): a comment
    saying that this step needs online mode and the exact command to run it.

The other classes here are autogenerate's internal plans (never in a migration file):
they render as several plain ops and reverse into each other, so downgrades come out
right (adding a shard column reverses into dropping it, and dropping one reverses into
adding it back *with* its backfill).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic.operations import MigrateOperation, Operations, ops

from sharded_orm.errors import ShardConfigError

from .markers import Marker

#: ``alembic.config.Config.attributes`` key: a progress callback for ``op.backfill_shard``
#: (``alembic_ext.BackfillProgress`` after each batch) instead of the stderr bar.
PROGRESS_ATTRIBUTE = "sharded_orm.backfill_progress"


@Operations.register_operation("backfill_shard")
class BackfillShardOp(MigrateOperation):
    """Fill a shard column where it is NULL (see :func:`alembic_ext.backfill.backfill_shard`)."""

    def __init__(
        self,
        table_name: str,
        column_name: str,
        *,
        sources: Sequence[str],
        count: int,
        algorithm: str = "crc32",
        batch_size: int = 500,
    ) -> None:
        self.table_name = table_name
        self.column_name = column_name
        self.sources = list(sources)
        self.count = count
        self.algorithm = algorithm
        self.batch_size = batch_size

    @classmethod
    def backfill_shard(
        cls,
        operations: Operations,
        table_name: str,
        column_name: str,
        *,
        sources: Sequence[str],
        count: int,
        algorithm: str = "crc32",
        batch_size: int = 500,
    ) -> Any:
        """Fill ``table_name.column_name`` with its shard where NULL (online only)."""
        op = cls(
            table_name, column_name, sources=sources, count=count,
            algorithm=algorithm, batch_size=batch_size,
        )  # fmt: skip
        return operations.invoke(op)

    def reverse(self) -> MigrateOperation:
        raise NotImplementedError(
            "a backfill has no reverse of its own: drop the column to undo it"
        )

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("backfill_shard", self.table_name, self.column_name)


@Operations.implementation_for(BackfillShardOp)
def _run_backfill(operations: Operations, op: BackfillShardOp) -> None:
    ctx = operations.migration_context
    if ctx.as_sql:
        srcs = ", ".join(op.sources)
        ctx.impl.static_output(
            f"-- sharded_orm: NEEDS ONLINE MODE: fill {op.table_name}.{op.column_name} with "
            f"shard({srcs}) mod {op.count} ({op.algorithm}) for existing rows, before the "
            f"next statement. Run it with: python -m alembic_ext.backfill <url> "
            f"{op.table_name} {op.column_name} --sources {' '.join(op.sources)} "
            f"--count {op.count} --algorithm {op.algorithm}"
        )
        return
    from .backfill import backfill_shard

    if ctx.connection is None:
        raise ShardConfigError("backfill_shard needs a database connection (online mode)")
    attrs = getattr(ctx.config, "attributes", None) or {}
    progress = attrs.get(PROGRESS_ATTRIBUTE, True)
    with ctx.autocommit_block():
        backfill_shard(
            ctx.connection,
            op.table_name,
            op.column_name,
            sources=op.sources,
            count=op.count,
            algorithm=op.algorithm,
            batch_size=op.batch_size,
            progress=progress,
        )


# ----------------------------------------------------------------------------- plans


class SpannerCreateIndexOp(ops.CreateIndexOp):
    """``op.create_index`` rendered with ``sa.desc(...)`` parts, spanner_* keywords, warnings."""

    warnings: list[str]

    @classmethod
    def wrap(cls, op: ops.CreateIndexOp, warnings: Sequence[str] = ()) -> SpannerCreateIndexOp:
        new = cls.from_index(op.to_index())
        assert isinstance(new, SpannerCreateIndexOp)
        new.warnings = list(warnings)
        return new

    def reverse(self) -> ops.DropIndexOp:
        return SpannerDropIndexOp.from_index(self.to_index())


class SpannerDropIndexOp(ops.DropIndexOp):
    """``op.drop_index`` whose reverse renders as :class:`SpannerCreateIndexOp`."""

    def reverse(self) -> ops.CreateIndexOp:
        new = SpannerCreateIndexOp.from_index(self.to_index())
        assert isinstance(new, SpannerCreateIndexOp)
        new.warnings = []
        return new


class AddShardColumnOp(ops.AlterTableOp):
    """Add a shard column; on a table with rows: nullable, backfill, NOT NULL, marker."""

    def __init__(
        self,
        table_name: str,
        column: sa.Column[Any],
        *,
        sources: Sequence[str],
        count: int,
        algorithm: str,
        marker: Marker | None,
        server_side: bool = False,
        schema: str | None = None,
    ) -> None:
        super().__init__(table_name, schema=schema)
        self.column = column
        self.sources = list(sources)
        self.count = count
        self.algorithm = algorithm
        self.marker = marker
        self.server_side = server_side

    def reverse(self) -> DropShardColumnOp:
        return DropShardColumnOp(
            self.table_name, self.column, sources=self.sources, count=self.count,
            algorithm=self.algorithm, marker=self.marker, server_side=self.server_side,
            schema=self.schema,
        )  # fmt: skip

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("add_shard_column", self.table_name, self.column.name)


class DropShardColumnOp(AddShardColumnOp):
    """Drop a shard column (its marker first); reverses into adding it back, backfilled."""

    def reverse(self) -> MigrateOperation:  # type: ignore[override]
        if not self.sources:
            return UnknownShardSpecOp(
                self.table_name, self.column,
                "its spec (sources, algorithm) is not recorded in the database, so its values "
                "cannot be recomputed; write this step by hand",
            )  # fmt: skip
        return AddShardColumnOp(
            self.table_name, self.column, sources=self.sources, count=self.count,
            algorithm=self.algorithm, marker=self.marker, server_side=self.server_side,
            schema=self.schema,
        )  # fmt: skip

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("drop_shard_column", self.table_name, self.column.name)


class UnknownShardSpecOp(ops.AlterTableOp):
    """Dropping a shard column whose spec cannot be recovered: downgrade must fail loudly."""

    def __init__(self, table_name: str, column: sa.Column[Any], reason: str) -> None:
        super().__init__(table_name)
        self.column = column
        self.reason = reason

    def reverse(self) -> MigrateOperation:
        return DropShardColumnOp(
            self.table_name, self.column, sources=(), count=0, algorithm="", marker=None
        )

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("unknown_shard_spec", self.table_name, self.column.name)


class ReplaceGeneratedColumnOp(ops.AlterTableOp):
    """A generated column whose expression changed: Spanner can only drop and re-add it."""

    def __init__(self, table_name: str, old: sa.Column[Any], new: sa.Column[Any]) -> None:
        super().__init__(table_name)
        self.old = old
        self.new = new

    def reverse(self) -> ReplaceGeneratedColumnOp:
        return ReplaceGeneratedColumnOp(self.table_name, self.new, self.old)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("replace_generated_column", self.table_name, self.new.name)
