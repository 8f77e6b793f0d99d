"""Autogenerate on Spanner: what differs between a model and the database, and the ops for it.

Alembic's per-element hooks, implemented by :class:`SpannerComparisons` (a mixin of
:class:`alembic_ext.impl.SpannerImpl`), say whether an index, a server default or a type
differs as Spanner stores it; the plugin's comparator, :func:`rewrite_for_spanner`, then
rewrites the operations Alembic produced into the ones Spanner needs.

**Element comparisons** (``compare_indexes``, ``compare_server_default``,
``compare_type``): indexes on everything Spanner stores (DESC parts, STORING,
``spanner_*`` keywords), defaults as Spanner stores them (:mod:`.defaults`), types with
Spanner's MAX lengths and the stored type under a ``TypeDecorator``.

**The rewrite**, registered by the ``sharded_orm.autogenerate`` plugin
(``alembic_ext.plugin``) as one comparator that runs *after* Alembic's
(``"autogenerate"`` target, priority LAST), so it sees the finished operations and
rewrites them in place:

* index ops become :class:`~alembic_ext.ops.SpannerCreateIndexOp` /
  :class:`~alembic_ext.ops.SpannerDropIndexOp` (rendered with DESC parts and spanner_*
  keywords, plus the linter's warning); a change of the STORING list only becomes
  ``op.alter_index_storing`` (:mod:`alembic_ext.shaping`);
* a dropped table drops its indexes first (once: Alembic's own drops are kept), and its
  downgrade gets back the DESC key parts, interleave and markers Alembic does not reflect;
* adding a shard column becomes expand / backfill / NOT NULL / marker; dropping one drops
  its marker first and is preceded by a verify backfill of the shard columns that stay
  (the contract); a revision doing both, or reusing the old index's name for the new
  layout, is refused (:mod:`alembic_ext.guards`);
* a shard column whose spec changed in place, or a table whose key or interleave parent
  differs from the model, stops autogenerate (and ``alembic check``) with what to do;
  a user's own generated column is Alembic's (its warning, nothing written);
* a server-side shard column is written as ``sa.Computed('<GoogleSQL>')``.

Ops are ordered for Spanner: parents created before children and dropped after them;
within a table, adds and creates, then drops of indexes, constraints, columns.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from alembic.autogenerate.api import AutogenContext
from alembic.ddl._autogen import ComparisonResult
from alembic.ddl.impl import DefaultImpl
from alembic.operations import ops
from sqlalchemy.engine import Dialect

from sharded_orm.schema.columns import ShardColumn, ShardComputed, shard_columns
from sharded_orm.spanner import is_spanner

from . import defaults, reflection
from .guards import (
    check_key_and_parent,
    check_not_null_unindexed,
    check_reshard,
    in_place_error,
)
from .markers import find_marker, marker_clause, marker_for
from .ops import (
    AddShardColumnOp,
    CompleteShardOp,
    DropShardColumnOp,
    SpannerCreateIndexOp,
    SpannerDropIndexOp,
    VerifyShardOp,
    metadata_list,
)
from .render import chain_render_item, quote_char
from .shaping import (
    index_warnings,
    order_in_table,
    order_tables,
    recover_spec,
    storing_in_place,
    stub_index,
)

# ------------------------------------------------------------ Alembic's per-element hooks


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


# ------------------------------------------------------------------ the rewrite: helpers


def _metadata_tables(ctx: AutogenContext) -> dict[str, sa.Table]:
    return {t.name: t for m in metadata_list(ctx.metadata) for t in m.tables.values()}


def _shard_sql(sc: ShardColumn, ctx: AutogenContext) -> str:
    from sharded_orm.spanner.expressions import shard_sql

    assert ctx.dialect is not None
    return shard_sql(sc.sources, sc.count, ctx.dialect.identifier_preparer.quote)


def _plain_column(sc: ShardColumn, ctx: AutogenContext) -> sa.Column[Any]:
    """A copy of a shard column that Alembic renders as it must be created."""
    col = sc.column
    args: list[Any] = [col.name, col.type]
    computed = isinstance(col.computed, ShardComputed)
    if computed and ctx.dialect is not None and is_spanner(ctx.dialect):
        args.append(sa.Computed(sa.text(_shard_sql(sc, ctx)), persisted=True))
    return sa.Column(*args, nullable=col.nullable, primary_key=col.primary_key)


def _made_not_null(op: ops.MigrateOperation, shards: dict[str, ShardColumn]) -> bool:
    """A client-side shard column (not a key column) that this revision makes NOT NULL."""
    if not isinstance(op, ops.AlterColumnOp) or op.modify_nullable is not False:
        return False
    sc = shards.get(op.column_name)
    return sc is not None and not sc.server_side and not sc.column.primary_key


class _Rewriter:
    def __init__(self, ctx: AutogenContext) -> None:
        self.ctx = ctx
        self.meta = _metadata_tables(ctx)
        self.spanner = ctx.dialect is not None and is_spanner(ctx.dialect)
        self.quote = quote_char(ctx)
        from .split import split_reshard

        hook = ctx.opts.get("process_revision_directives")
        #: env.py passes split_reshard: a one-step reshard becomes expand + contract
        self.splits = hook is split_reshard
        self._checks: dict[str, list[str]] = {}

    def check_names(self, table: str) -> list[str]:
        """``table``'s CHECK constraint names, read once per run (no DDL runs meanwhile)."""
        conn = self.ctx.connection
        if conn is None:
            return []
        if table not in self._checks:
            self._checks[table] = reflection.check_names(conn, table, self.ctx.inspector)
        return self._checks[table]

    # -- top level

    def run(self, upgrade_ops: ops.UpgradeOps) -> None:
        new_ops: list[ops.MigrateOperation] = []
        touched: dict[str, ops.ModifyTableOps] = {}
        created = set()
        # Alembic's own drops of a dropped table's indexes (top level or per table)
        nested = [o.ops for o in upgrade_ops.ops if isinstance(o, ops.ModifyTableOps)]
        dropped_ix = {
            o.index_name
            for o in itertools.chain(upgrade_ops.ops, *nested)
            if isinstance(o, ops.DropIndexOp)
        }
        for op in upgrade_ops.ops:
            if isinstance(op, ops.CreateTableOp):
                created.add(op.table_name)
                self.create_table(op)
                new_ops.append(op)
            elif isinstance(op, ops.DropTableOp):
                self.drop_table(op)
                extra = self.drop_table_indexes(op.table_name)
                new_ops.extend(o for o in extra if getattr(o, "index_name", None) not in dropped_ix)
                new_ops.append(op)
            elif isinstance(op, ops.ModifyTableOps):
                touched[op.table_name] = op
                new_ops.append(op)
            elif isinstance(op, ops.CreateIndexOp):
                new_ops.append(self.create_index(op))
            elif isinstance(op, ops.DropIndexOp):
                new_ops.append(SpannerDropIndexOp.from_index(op.to_index()))
            else:
                new_ops.append(op)
        if self.ctx.connection is not None:
            existing = set(self.ctx.inspector.get_table_names())
            for name, table in self.meta.items():
                if name in created or name not in existing:
                    continue
                extra = self.compare_existing(table)
                if not extra:
                    continue
                mod = touched.get(name)
                if mod is None:
                    mod = ops.ModifyTableOps(name, [])
                    touched[name] = mod
                    new_ops.append(mod)
                mod.ops.extend(extra)
        for mod in touched.values():
            self.modify_table(mod)
        new_ops = [o for o in new_ops if not (isinstance(o, ops.ModifyTableOps) and not o.ops)]
        upgrade_ops.ops[:] = order_tables(new_ops, self.parent_of(new_ops))

    def parent_of(self, found: list[ops.MigrateOperation]) -> Callable[[str], str | None]:
        """The interleave parent of each table, from the models or (dropped) the database."""
        parents: dict[str, str | None] = {
            name: table.kwargs.get("spanner_interleave_in") for name, table in self.meta.items()
        }
        conn = self.ctx.connection
        for o in found:
            if isinstance(o, ops.DropTableOp) and conn is not None and self.spanner:
                parents[o.table_name] = reflection.read_table_parent(conn, o.table_name)[0]
        return parents.get

    def drop_table(self, op: ops.DropTableOp) -> None:
        """Give a dropped table's reverse (the downgrade) what Spanner stores and Alembic's
        reflection leaves out: DESC key parts, INTERLEAVE IN PARENT, shard markers."""
        conn = self.ctx.connection
        if conn is None or not self.spanner or op._reverse is None:
            return
        from sharded_orm.schema.keys import DESC_INFO_KEY

        items: Any = op._reverse.columns
        by_name = {c.name: c for c in items if isinstance(c, sa.Column)}
        for name, desc in reflection.read_primary_key(conn, op.table_name):
            if desc and name in by_name:
                by_name[name].info[DESC_INFO_KEY] = True
        parent, cascade = reflection.read_table_parent(conn, op.table_name)
        if parent:
            op.table_kw["spanner_interleave_in"] = parent
            if cascade:
                op.table_kw["spanner_interleave_on_delete_cascade"] = True
        have = {c.name for c in items if isinstance(c, sa.CheckConstraint)}
        for name, clause in reflection.read_check_constraints(conn, op.table_name).items():
            if name not in have:
                items.append(sa.CheckConstraint(sa.text(clause), name=name))

    # -- new tables

    def create_table(self, op: ops.CreateTableOp) -> None:
        # sharded-orm's bookkeeping in Table.info (ORM attribute maps) is not schema
        if op.info:
            op.info = {k: v for k, v in op.info.items() if not str(k).startswith("sharded_orm.")}
        table = self.meta.get(op.table_name)
        if table is None:
            return
        by_name = {sc.name: sc for sc in shard_columns(table)}
        cols: list[Any] = []
        for item in op.columns:
            sc = (
                by_name.get(getattr(item, "name", None) or "")
                if isinstance(item, sa.Column)
                else None
            )
            cols.append(_plain_column(sc, self.ctx) if sc is not None and sc.server_side else item)
        for sc in by_name.values():
            if not sc.server_side:
                m = marker_for(sc)
                cols.append(
                    sa.CheckConstraint(marker_clause(sc.name, sc.count, self.quote), name=m.name)
                )
        op.columns = cols

    def drop_table_indexes(self, table: str) -> list[ops.MigrateOperation]:
        conn = self.ctx.connection
        if conn is None or not self.spanner:
            return []
        found = reflection.read_indexes(conn, table)
        return [SpannerDropIndexOp.from_index(stub_index(i)) for i in found.values()]

    # -- indexes

    def create_index(self, op: ops.CreateIndexOp) -> SpannerCreateIndexOp:
        if isinstance(op, SpannerCreateIndexOp):
            return op
        index = op.to_index()
        table = self.meta.get(op.table_name)
        real = table is not None and next(
            (i for i in table.indexes if i.name == op.index_name), None
        )
        return SpannerCreateIndexOp.wrap(op, index_warnings(real or index))

    # -- changed tables

    def modify_table(self, mod: ops.ModifyTableOps) -> None:
        table = self.meta.get(mod.table_name)
        shards = {sc.name: sc for sc in shard_columns(table)} if table is not None else {}
        out: list[ops.MigrateOperation] = []
        for op in mod.ops:
            if isinstance(op, ops.CreateIndexOp):
                out.append(self.create_index(op))
            elif isinstance(op, ops.DropIndexOp) and not isinstance(op, SpannerDropIndexOp):
                new = SpannerDropIndexOp(
                    op.index_name, table_name=op.table_name, _reverse=op._reverse, **op.kw
                )
                out.append(new)
            elif isinstance(op, ops.AddColumnOp) and op.column.name in shards:
                sc = shards[op.column.name]
                out.append(
                    AddShardColumnOp(
                        mod.table_name, _plain_column(sc, self.ctx),
                        sources=[c.name for c in sc.sources], count=sc.count,
                        algorithm=sc.algorithm,
                        marker=None if sc.server_side else marker_for(sc),
                        server_side=sc.server_side,
                    )
                )  # fmt: skip
            elif isinstance(op, ops.DropColumnOp):
                out.append(self.drop_column(mod.table_name, op, self.check_names(mod.table_name)))
            elif _made_not_null(op, shards):
                sc = shards[op.column_name]  # type: ignore[attr-defined]
                out.append(
                    CompleteShardOp(
                        mod.table_name, sc.name, sources=[c.name for c in sc.sources],
                        count=sc.count, algorithm=sc.algorithm,
                    )
                )  # fmt: skip
                out.append(op)
            else:
                out.append(op)
        out = storing_in_place(out)
        check_reshard(table, mod.table_name, out, split=self.splits)
        if self.spanner and self.ctx.connection is not None:
            check_not_null_unindexed(self.ctx.connection, mod.table_name, out)
        if any(isinstance(o, DropShardColumnOp) for o in out):
            # A contract: the layout that stays is verified (rows that code unaware of it
            # wrote since the expand are fixed) before the old one goes. A one-step
            # reshard's contract (split off by split_reshard) verifies the new column too.
            added = (
                set()
                if self.splits
                else {o.column.name for o in out if type(o) is AddShardColumnOp}
            )
            out.extend(
                VerifyShardOp(
                    mod.table_name, sc.name, sources=[c.name for c in sc.sources],
                    count=sc.count, algorithm=sc.algorithm,
                )
                for sc in shards.values()
                if not sc.server_side and sc.name not in added and not sc.column.primary_key
            )  # fmt: skip
        mod.ops = order_in_table(out)

    def drop_column(
        self, table: str, op: ops.DropColumnOp, checks: list[str]
    ) -> ops.MigrateOperation:
        marker = find_marker(table, op.column_name, checks)
        if marker is None:
            return op
        column = op.to_column()
        candidates = [c["name"] for c in self.ctx.inspector.get_columns(table)]
        spec = recover_spec(marker, op.column_name, candidates)
        algorithm, sources = spec if spec is not None else ("", ())
        return DropShardColumnOp(
            table, column, sources=sources, count=marker.count, algorithm=algorithm, marker=marker
        )

    def compare_existing(self, table: sa.Table) -> list[ops.MigrateOperation]:
        """Shard specs (markers, generated expressions) of a table on both sides."""
        conn = self.ctx.connection
        assert conn is not None
        db_cols = {c["name"] for c in self.ctx.inspector.get_columns(table.name)}
        out: list[ops.MigrateOperation] = []
        checks = self.check_names(table.name)
        if self.spanner:
            check_key_and_parent(conn, table)
        shards = shard_columns(table)
        generated = (
            reflection.read_generated_columns(conn, table.name)
            if self.spanner and any(sc.server_side for sc in shards)
            else {}
        )
        for sc in shards:
            if sc.name not in db_cols:
                continue  # a new column: Alembic adds it, modify_table makes it a shard add
            if sc.server_side and self.spanner:
                expected = _shard_sql(sc, self.ctx)
                actual = generated.get(sc.name)
                if actual is None or reflection.normalize_sql(actual) != reflection.normalize_sql(
                    expected
                ):
                    raise in_place_error(table.name, sc, f"its generated expression is {actual!r}")
                continue
            want = marker_for(sc)
            have = find_marker(table.name, sc.name, checks)
            if have is None:
                out.append(
                    ops.CreateCheckConstraintOp(
                        want.name, table.name, marker_clause(sc.name, sc.count, self.quote)
                    )
                )
            elif have.digest != want.digest:
                raise in_place_error(
                    table.name, sc, f"the database records count={have.count} (marker {have.name})"
                )
        return out


def rewrite_for_spanner(autogen_context: AutogenContext, upgrade_ops: ops.UpgradeOps) -> None:
    """The plugin's comparator: rewrite Alembic's finished ops (see the module docstring)."""
    # our render_item (UTCDateTime with its import, DESC key parts) on every dialect,
    # before the user's own; Alembic reads it when it renders, after the comparators
    opts = autogen_context.opts
    opts["render_item"] = chain_render_item(opts.get("render_item"))
    _Rewriter(autogen_context).run(upgrade_ops)
