"""Key reshard operations: ``op.copy_table_rows`` (expand) and ``op.retire_table`` (contract).

A shard column in the primary key cannot be backfilled: the reshard is a new table
(docs/migrations.md, 'Resharding a key'). The expand is autogenerate's ``create_table``
of the new model, then::

    op.copy_table_rows("Events", "Events16")

every row of the old table copied into the new one (:func:`sharded_orm.load.copy.copy_table`:
key cursor in stored order, ``insert_or_update`` batches, a timeout on every read and
commit). The cursor is committed with each batch in a small table
(``ShardedOrmCopyCursor``), so a run killed anywhere resumes after its last batch; the
table is dropped when a copy completes. The contract is::

    op.retire_table("Events", successor="Events16")

which closes the window old code could write in: it renames the old table first
(``Events`` -> ``EventsRetired``), so every write of old code fails loudly from then on;
then a final copy of every row (resumable too) that deletes the copied rows old code
deleted, a row-for-row comparison that must find no difference, and the drop of the
retired table and its indexes. Killed or failed anywhere, ``alembic upgrade`` again
picks up where it stopped. Both run online only: ``--sql`` prints the command to run and
a statement that fails while a row is missing (copy), or refuses (retire).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic.operations import MigrateOperation, Operations

from sharded_orm import telemetry
from sharded_orm.checks import check_identifier, shown
from sharded_orm.errors import ShardConfigError
from sharded_orm.retry import DEFAULTS

from .errors import MigrationError
from .impl_guard import require_our_impl
from .steps import own_transactions, reporting

#: ``Config.attributes`` key of a progress callback: the same key as ``op.backfill_shard``'s
#: (``alembic_ext.ops.PROGRESS_ATTRIBUTE``; ops imports this module, so it is not imported)
PROGRESS_ATTRIBUTE = "sharded_orm.backfill_progress"

__all__ = ["COPY_ENGINES", "CURSOR_TABLE", "CopyTableRowsOp", "RetireTableOp", "VerifyTablesOp"]

#: The table holding the cursors of copies under way (dropped when none is left).
CURSOR_TABLE = "ShardedOrmCopyCursor"
#: ``"client"``: this process copies; ``"external"``: copied out of band (Beam on
#: Dataflow), the op only checks that no row is missing.
COPY_ENGINES = ("client", "external")


@Operations.register_operation("copy_table_rows")
class CopyTableRowsOp(MigrateOperation):
    """Copy every row of ``source`` into ``target`` (its new shard computed)."""

    def __init__(
        self,
        source: str,
        target: str,
        *,
        batch_size: int = 500,
        call_timeout: float = DEFAULTS["statement"],
        deadline: float | None = None,
        engine: str = "client",
    ) -> None:
        if engine not in COPY_ENGINES:
            raise ShardConfigError(
                f"copy_table_rows engine must be one of {', '.join(map(repr, COPY_ENGINES))}, "
                f"got {shown(engine)}"
            )
        self.engine = engine
        check_identifier(source, "table name")
        check_identifier(target, "table name")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ShardConfigError(f"batch_size must be a positive int, got {batch_size!r}")
        self.source, self.target = source, target
        self.batch_size, self.call_timeout, self.deadline = batch_size, call_timeout, deadline

    @classmethod
    def copy_table_rows(cls, operations: Operations, source: str, target: str, **kw: Any) -> Any:
        """Copy every row of table ``source`` into ``target``, whose model (in
        ``target_metadata``) declares the new shard; resumable, idempotent. With
        ``engine="external"`` the rows were copied out of band: only checked."""
        return operations.invoke(cls(source, target, **kw))

    def reverse(self) -> MigrateOperation:
        raise NotImplementedError("a copy has no reverse: drop the new table to undo it")


@Operations.register_operation("retire_table")
class RetireTableOp(MigrateOperation):
    """Fence, final copy, verify and drop of a key reshard's old table."""

    def __init__(
        self,
        table: str,
        *,
        successor: str,
        retired_name: str | None = None,
        batch_size: int = 500,
        call_timeout: float = DEFAULTS["statement"],
        deadline: float | None = None,
    ) -> None:
        self.copy = CopyTableRowsOp(
            retired_name or f"{table}Retired", successor, batch_size=batch_size,
            call_timeout=call_timeout, deadline=deadline,
        )  # fmt: skip
        self.table = check_identifier(table, "table name")

    @classmethod
    def retire_table(cls, operations: Operations, table: str, **kw: Any) -> Any:
        """Rename ``table`` (old code now fails loudly), copy its last rows into
        ``successor``, check both hold the same rows, drop it."""
        return operations.invoke(cls(table, **kw))

    def reverse(self) -> MigrateOperation:
        raise NotImplementedError(
            "a retired table is dropped with its rows: its successor holds them. To go "
            "back, reshard again (a new table and a copy)"
        )


@Operations.register_operation("verify_tables")
class VerifyTablesOp(MigrateOperation):
    """Fail unless ``target`` holds every row of ``source`` with the same values."""

    def __init__(self, source: str, target: str, *, allow_extra: bool = False) -> None:
        self.copy = CopyTableRowsOp(source, target)
        self.allow_extra = allow_extra

    @classmethod
    def verify_tables(
        cls, operations: Operations, source: str, target: str, *, allow_extra: bool = False
    ) -> Any:
        """Compare ``source`` and ``target`` row for row (``compare_tables``) and fail on
        any difference; ``allow_extra=True`` accepts rows only ``target`` has."""
        return operations.invoke(cls(source, target, allow_extra=allow_extra))

    def reverse(self) -> MigrateOperation:
        return self


def _model_table(operations: Operations, name: str) -> sa.Table | None:
    md = operations.migration_context.opts.get("target_metadata")
    for m in [] if md is None else list(md) if isinstance(md, (list, tuple)) else [md]:
        table: sa.Table | None = m.tables.get(name)
        if table is not None:
            return table
    return None


def _tables(operations: Operations, op: CopyTableRowsOp, bind: Any) -> tuple[sa.Table, sa.Table]:
    target = _model_table(operations, op.target)
    if target is None:
        raise MigrationError(
            f"copy_table_rows: {op.target!r} is not in target_metadata: the copy computes its "
            "shard columns from the model. Give env.py the models (target_metadata)."
        )
    source = _model_table(operations, op.source)
    if source is None:  # the contract's retired table: no model declares it any more
        source = sa.Table(op.source, sa.MetaData(), autoload_with=bind)
    return source, target


def _progress(operations: Operations) -> tuple[Any, Any]:
    """(on_batch, progress mode) from ``Config.attributes[PROGRESS_ATTRIBUTE]``."""
    attrs = getattr(operations.migration_context.config, "attributes", None) or {}
    hook = attrs.get(PROGRESS_ATTRIBUTE, True)
    if callable(hook):
        return hook, "off"
    return None, ("auto" if hook else "off")


def _copy(operations: Operations, op: CopyTableRowsOp, *, prune: bool) -> None:
    from sharded_orm.load.copy import cursor_table_ddl

    ctx = operations.migration_context
    assert ctx.connection is not None
    flush = getattr(ctx.impl, "flush_ddl", None)
    if flush is not None:
        flush()  # the new table must exist before rows go in
    operations.execute(cursor_table_ddl(CURSOR_TABLE))
    if flush is not None:
        flush()
    engine = ctx.connection.engine
    source, target = _tables(operations, op, ctx.connection)
    on_batch, mode = _progress(operations)
    from sharded_orm.load.copy import copy_table

    with own_transactions(ctx):
        copy_table(
            engine, source, target, batch_size=op.batch_size, deadline=op.deadline,
            call_timeout=op.call_timeout, progress_mode=mode, on_batch=on_batch,
            cursor_table=CURSOR_TABLE, prune=prune,
        )  # fmt: skip
        with engine.connect() as conn:
            count = sa.text(f"SELECT COUNT(*) FROM `{CURSOR_TABLE}`")
            left = conn.execution_options(timeout=op.call_timeout).execute(count).scalar_one()
    if not left:
        operations.drop_table(CURSOR_TABLE)
        if flush is not None:
            flush()


def _offline_copy(operations: Operations, op: CopyTableRowsOp) -> None:
    from sharded_orm.load.copy import missing_rows_check_sql

    ctx = operations.migration_context
    out = ctx.impl.static_output
    src, target = _model_table(operations, op.source), _model_table(operations, op.target)
    if src is None or target is None:
        raise MigrationError(
            f"copy_table_rows --sql needs both {op.source!r} and {op.target!r} in "
            "target_metadata (their keys make the check statement)"
        )
    message = (
        f"sharded_orm: rows of {op.source} are missing from {op.target}; run the copy "
        f"(sharded_orm.load.copy.copy_table(engine, {op.source!r} table, {op.target} model)), "
        "then this script again from here"
    )
    out(
        f"-- sharded_orm: COPY NEEDED BEFORE THE NEXT STATEMENT: every row of {op.source} "
        f"into {op.target}, its shard computed by the model (crc32 has no SQL twin). Run "
        "`alembic upgrade` online, or copy_table() from Python (docs/migrations.md, "
        "'Resharding a key'). The next statement fails while a row is missing."
    )
    out(missing_rows_check_sql(src, target, message) + ctx.impl.command_terminator)


def _step(operations: Operations, op: Any) -> tuple[Any, str]:
    """A reshard step's database and the table it writes (for its span)."""
    copy = getattr(op, "copy", op)
    return operations.migration_context.connection, copy.target


@Operations.implementation_for(CopyTableRowsOp)
@telemetry.traced("reshard.copy", _step)
def _run_copy(operations: Operations, op: CopyTableRowsOp) -> None:
    require_our_impl(operations.migration_context, "op.copy_table_rows")
    if operations.migration_context.as_sql:
        _offline_copy(operations, op)
        return
    if op.engine == "external":
        _check_external(operations, op)
        return
    _copy(operations, op, prune=False)


def _check_external(operations: Operations, op: CopyTableRowsOp) -> None:
    from sharded_orm.load.copy import compare_tables

    ctx = operations.migration_context
    assert ctx.connection is not None
    flush = getattr(ctx.impl, "flush_ddl", None)
    if flush is not None:
        flush()
    source, target = _tables(operations, op, ctx.connection)
    with own_transactions(ctx):
        missing = compare_tables(ctx.connection.engine, source, target)["missing_in_target"]
    if missing:
        raise MigrationError(
            f"{missing} rows of {op.source} are not in {op.target} yet (engine='external': "
            "this step only checks). Run the copy (the Beam pipeline "
            f"sharded_orm.beam.copy.CopyTable(old model, {op.target} model, ...), or "
            "sharded_orm.load.copy.copy_table), then "
            "`alembic upgrade` again."
        )


@Operations.implementation_for(RetireTableOp)
@telemetry.traced("reshard.retire", _step)
def _run_retire(operations: Operations, op: RetireTableOp) -> None:
    from sharded_orm.load.copy import compare_tables
    from sharded_orm.load.verify import verify

    ctx = operations.migration_context
    require_our_impl(ctx, "op.retire_table")
    if ctx.as_sql:
        raise MigrationError(
            f"retire_table({op.table!r}) runs online only: its final copy and comparison "
            "need the database. Run this revision with `alembic upgrade` (not --sql)."
        )
    assert ctx.connection is not None
    retired = op.copy.source
    names = set(sa.inspect(ctx.connection).get_table_names())
    if op.table in names and retired in names:
        raise MigrationError(
            f"both {op.table} and {retired} exist: a retire left half done by hand? Drop or "
            "rename one of them, then run the upgrade again"
        )
    if op.copy.target not in names:
        raise MigrationError(f"retire_table: the successor {op.copy.target} does not exist")
    if op.table in names:  # the fence: from here, every write of old code fails loudly
        operations.rename_table(op.table, retired)
        flush = getattr(ctx.impl, "flush_ddl", None)
        if flush is not None:
            flush()
    elif retired not in names:
        return  # retired and dropped by an earlier run
    _copy(operations, op.copy, prune=True)
    engine = ctx.connection.engine
    source, target = _tables(operations, op.copy, ctx.connection)
    diff = compare_tables(engine, source, target)
    if any(diff.values()):
        raise MigrationError(
            f"{op.table} (now {retired}) and {op.copy.target} still differ after the final "
            f"copy: {diff}. Something writes {op.copy.target} or {retired} outside the "
            "library; stop it and run the upgrade again (nothing is dropped yet)."
        )
    with reporting():
        report = verify(engine, target, progress_mode=_progress(operations)[1])
    if not report.ok:
        raise MigrationError(
            f"{op.copy.target} has rows whose shard disagrees with their sources: "
            f"{report.as_dict()}. Nothing is dropped yet; fix them and run the upgrade again."
        )
    for ix in sa.inspect(ctx.connection).get_indexes(retired):
        if ix["name"]:
            operations.drop_index(ix["name"], table_name=retired)
    operations.drop_table(retired)


@Operations.implementation_for(VerifyTablesOp)
@telemetry.traced("reshard.verify", _step)
def _run_verify(operations: Operations, op: VerifyTablesOp) -> None:
    from sharded_orm.load.copy import compare_tables

    ctx = operations.migration_context
    require_our_impl(ctx, "op.verify_tables")
    if ctx.as_sql:
        raise MigrationError("verify_tables runs online only: it reads both tables")
    assert ctx.connection is not None
    flush = getattr(ctx.impl, "flush_ddl", None)
    if flush is not None:
        flush()
    source, target = _tables(operations, op.copy, ctx.connection)
    with own_transactions(ctx):
        diff = compare_tables(ctx.connection.engine, source, target)
    if op.allow_extra:
        diff.pop("missing_in_source")
    if any(diff.values()):
        raise MigrationError(
            f"{op.copy.source} and {op.copy.target} differ: {diff}. Copy again "
            f"(op.copy_table_rows) and run the upgrade again."
        )
