"""Migration operations: one public op, ``op.backfill_shard``, and autogenerate's plans.

Everything autogenerate writes is a plain ``op.*`` call with ``spanner_*`` keywords,
except filling a shard column on a table that has rows, which no stock op can do:

``op.backfill_shard(table, column, sources=[...], count=N, algorithm="crc32", engine=...)``
    online: :func:`alembic_ext.backfill.backfill_shard` once the work before it is
    committed (:mod:`alembic_ext.steps`), batched, resumable, idempotent; ``engine`` picks
    the client, Partitioned DML or an out-of-band fill (Beam) that it only checks. Offline
    (``--sql``): the UPDATE that computes it (``farm_fingerprint``), then a statement that
    fails while any row is unfilled (``crc32``: after the command that fills it, in a
    comment).

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

from sharded_orm.checks import check_identifier, shown
from sharded_orm.errors import ShardConfigError
from sharded_orm.hashing import shard_function

from .backfill import DEADLINE_ATTRIBUTE, ENGINES, check_backfill_args
from .errors import MigrationError
from .impl_guard import require_our_impl
from .markers import Marker
from .notes import NoteOp
from .steps import own_transactions

#: ``alembic.config.Config.attributes`` key: a progress callback for ``op.backfill_shard``
#: (``alembic_ext.BackfillProgress`` after each batch) instead of the stderr bar.
PROGRESS_ATTRIBUTE = "sharded_orm.backfill_progress"


def metadata_list(md: Any) -> list[sa.MetaData]:
    """``target_metadata`` as a list: Alembic takes one MetaData, a sequence of them, or None."""
    if md is None:
        return []
    return list(md) if isinstance(md, (list, tuple)) else [md]


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
        engine: str = "auto",
    ) -> None:
        # checked when the migration runs its upgrade(), before any statement
        self.sources = check_backfill_args(table_name, column_name, sources, batch_size)
        shard_function(count, algorithm)  # count and algorithm
        if engine not in ENGINES:
            raise ShardConfigError(
                f"backfill_shard engine must be one of {', '.join(map(repr, ENGINES))}, "
                f"got {shown(engine)}"
            )
        self.table_name = table_name
        self.column_name = column_name
        self.count = count
        self.algorithm = algorithm
        self.batch_size = batch_size
        self.engine = engine

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
        engine: str = "auto",
    ) -> Any:
        """Fill ``table_name.column_name`` with its shard where NULL or stale.

        ``engine``: ``"auto"`` (Partitioned DML for farm_fingerprint on Spanner, else the
        client), ``"client"``, ``"partitioned_dml"``, or ``"external"`` (filled out of
        band, e.g. by the Beam pipeline: only checked, failing with what to run).

        It writes in its own transactions, so the work before it is committed first: on
        Spanner, as before a schema change, the connection's open transaction commits and
        the SQLAlchemy transaction, Alembic's or the caller's, stays open for what
        follows; elsewhere, Alembic's ``autocommit_block`` (:mod:`alembic_ext.steps`)."""
        op = cls(
            table_name, column_name, sources=sources, count=count,
            algorithm=algorithm, batch_size=batch_size, engine=engine,
        )  # fmt: skip
        return operations.invoke(op)

    def reverse(self) -> MigrateOperation:
        raise NotImplementedError(
            "a backfill has no reverse of its own: drop the column to undo it"
        )

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("backfill_shard", self.table_name, self.column_name)


def _model_check(operations: Operations, op: BackfillShardOp) -> None:
    """Refuse a backfill that disagrees with the models (``target_metadata``)."""
    from sharded_orm.schema.columns import shard_columns

    for m in metadata_list(operations.migration_context.opts.get("target_metadata")):
        table = m.tables.get(op.table_name)
        if table is None or op.column_name not in table.c:
            continue
        spec = {sc.name: sc for sc in shard_columns(table)}.get(op.column_name)
        if spec is None:
            raise _error(
                f"backfill_shard target {op.table_name}.{op.column_name} is a data column in "
                "the models, not a shard column: a backfill would overwrite its NULLs with "
                "shard numbers. Name the shard column to fill."
            )
        want = (spec.count, spec.algorithm, [c.name for c in spec.sources])
        got = (op.count, op.algorithm, list(op.sources))
        if want != got:
            raise _error(
                f"backfill_shard({op.table_name!r}, {op.column_name!r}) asks for count="
                f"{got[0]}, algorithm={got[1]!r}, sources={got[2]}, but the model declares "
                f"count={want[0]}, algorithm={want[1]!r}, sources={want[2]}: rows filled so "
                "would be unfindable. Make the migration and the model agree."
            )


def _error(message: str) -> Exception:
    return MigrationError(message)


class VerifyShardOp(BackfillShardOp):
    """A contract's last step: ``op.backfill_shard`` on the shard column that stays, run
    after the old column is dropped (which fences old code: its writes name that column
    and now fail), so it fills and fixes every row old code wrote since the expand and
    nothing can add one behind it. Its own reverse (verifying again is harmless)."""

    def reverse(self) -> MigrateOperation:
        return self


class CompleteShardOp(VerifyShardOp):
    """Before a shard column becomes NOT NULL (the contract of its first layout): fill the
    rows written since the expand by code that did not fill it; the NOT NULL after it then
    fences such code (its INSERTs fail) and finds no NULL left. Its reverse is a comment:
    the rows keep their shard (a backfill there walked the table for nothing)."""

    def reverse(self) -> MigrateOperation:
        return NoteOp(
            f"nothing to undo for the fill of {self.table_name}.{self.column_name}: its rows "
            "keep their shard, and the column is nullable again above"
        )


@Operations.implementation_for(BackfillShardOp)
def _run_backfill(operations: Operations, op: BackfillShardOp) -> None:
    ctx = operations.migration_context
    require_our_impl(ctx, "op.backfill_shard")
    if ctx.as_sql:
        _offline_backfill(operations, op)
        return
    from .backfill import backfill_shard

    if ctx.connection is None:
        raise ShardConfigError("backfill_shard needs a database connection (online mode)")
    _model_check(operations, op)
    attrs = getattr(ctx.config, "attributes", None) or {}
    progress = attrs.get(PROGRESS_ATTRIBUTE, True)
    # The last step of a contract needs every row filled: the old column is dropped by
    # then, so old code fails loudly instead of adding a row without the new shard.
    contract = _after_old_layout_dropped(operations, op)
    # the column must exist (and the old one be gone), and the work before committed
    with own_transactions(ctx):
        backfill_shard(
            ctx.connection,
            op.table_name,
            op.column_name,
            sources=op.sources,
            count=op.count,
            algorithm=op.algorithm,
            batch_size=op.batch_size,
            progress=progress,
            engine=op.engine,
            require_complete=contract,
            deadline=attrs.get(DEADLINE_ATTRIBUTE),
        )


def _after_old_layout_dropped(operations: Operations, op: BackfillShardOp) -> bool:
    """True for a contract's verify, and for a backfill of a column the models declare NOT
    NULL: either way no row may be left unfilled when the step reports success."""
    if isinstance(op, VerifyShardOp):
        return True
    for m in metadata_list(operations.migration_context.opts.get("target_metadata")):
        table = m.tables.get(op.table_name)
        if table is not None and op.column_name in table.c:
            return not table.c[op.column_name].nullable
    return False


def _offline_backfill(operations: Operations, op: BackfillShardOp) -> None:
    """``--sql``: the statements a DBA applies in order. farm_fingerprint: the UPDATE that
    computes the shard (Partitioned-DML-able). Always: an UPDATE that raises while any
    row is unfilled, so a script applied without the fill stops there."""
    from sharded_orm.hashing import FARM_FINGERPRINT
    from sharded_orm.load.verify import quote

    ctx = operations.migration_context
    t, c = op.table_name, op.column_name
    srcs = " ".join(op.sources)
    out = ctx.impl.static_output
    sources = _model_sources(operations, op)
    if op.algorithm == FARM_FINGERPRINT and sources is not None and op.engine != "external":
        from sharded_orm.load.backfill_server import backfill_sql

        out(
            f"-- sharded_orm: fill {t}.{c} (shard of {', '.join(op.sources)} mod {op.count}). "
            "On a large table run it as Partitioned DML: gcloud spanner databases "
            "execute-sql DATABASE --instance=INSTANCE --enable-partitioned-dml --sql='...'"
        )
        out(backfill_sql(t, c, sources, op.count, fix_stale=True) + ctx.impl.command_terminator)
    else:
        out(
            f"-- sharded_orm: NEEDS A FILL BEFORE THE NEXT STATEMENT: {t}.{c} = shard("
            f"{', '.join(op.sources)}) mod {op.count} ({op.algorithm}), which Spanner cannot "
            f"compute in SQL. Run: sharded-orm backfill <url> {t} {c} --sources {srcs} "
            f"--count {op.count} --algorithm {op.algorithm} (or the Beam pipeline, "
            "docs/migrations.md). The next statement fails while a row is unfilled."
        )
    message = (
        f"sharded_orm: {t}.{c} has unfilled rows; run: sharded-orm backfill <url> {t} {c} "
        f"--sources {srcs} --count {op.count} --algorithm {op.algorithm}, then this "
        "script again from here"
    )
    out(
        f"UPDATE {quote(t, 'table name')} SET {quote(c)} = ERROR({_sql_string(message)}) "
        f"WHERE {quote(c)} IS NULL" + ctx.impl.command_terminator
    )


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _model_sources(operations: Operations, op: BackfillShardOp) -> list[sa.Column[Any]] | None:
    """The source columns (with their types, which the SQL expression needs) from the
    models, or None when ``target_metadata`` does not declare the table."""
    for m in metadata_list(operations.migration_context.opts.get("target_metadata")):
        table = m.tables.get(op.table_name)
        if table is not None and all(s in table.c for s in op.sources):
            return [table.c[s] for s in op.sources]
    return None


@Operations.register_operation("alter_index_storing")
class AlterIndexStoringOp(MigrateOperation):
    """Add or drop STORING columns of an index in place (``ALTER INDEX``): the index stays
    usable throughout, where a DROP + CREATE would leave readers without it."""

    def __init__(
        self,
        index_name: str,
        table_name: str,
        *,
        add: Sequence[str] = (),
        drop: Sequence[str] = (),
    ) -> None:
        self.index_name = index_name
        self.table_name = table_name
        self.add = list(add)
        self.drop = list(drop)

    @classmethod
    def alter_index_storing(
        cls,
        operations: Operations,
        index_name: str,
        table_name: str,
        *,
        add: Sequence[str] = (),
        drop: Sequence[str] = (),
    ) -> Any:
        """``ALTER INDEX index_name ADD|DROP STORED COLUMN ...`` (Spanner only)."""
        return operations.invoke(cls(index_name, table_name, add=add, drop=drop))

    def reverse(self) -> AlterIndexStoringOp:
        return AlterIndexStoringOp(self.index_name, self.table_name, add=self.drop, drop=self.add)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("alter_index_storing", self.index_name, tuple(self.add), tuple(self.drop))


@Operations.implementation_for(AlterIndexStoringOp)
def _run_alter_index_storing(operations: Operations, op: AlterIndexStoringOp) -> None:
    require_our_impl(operations.migration_context, "op.alter_index_storing")
    impl: Any = operations.migration_context.impl
    if not hasattr(impl, "alter_index_storing"):
        raise _error(
            f"op.alter_index_storing({op.index_name!r}) is Spanner-only (ALTER INDEX ... "
            f"STORED COLUMN); this migration runs on {impl.dialect.name!r}. Use "
            "op.drop_index + op.create_index there."
        )
    for name in (op.index_name, *op.add, *op.drop):
        check_identifier(name, "alter_index_storing name")
    impl.alter_index_storing(op.index_name, op.add, op.drop)


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


# the key reshard's ops (op.copy_table_rows, op.retire_table) register with these
from . import key_reshard as _key_reshard  # noqa: E402,F401
