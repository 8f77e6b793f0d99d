"""How autogenerate writes Spanner schemas into migration files.

Through Alembic's public hooks only: ``alembic.autogenerate.renderers`` for our plan
ops, and a ``render_item`` function (installed by the Spanner impl, chained before the
user's own) for descending primary-key parts. The output is plain ``op.*`` calls:

* index columns: ``'Kind'`` or ``sa.desc(sa.column('Timestamp'))``, never the
  ``sa.literal_column('"Ts" DESC')`` stock autogenerate writes and Spanner rejects;
* Spanner options as the dialect's keywords: ``spanner_storing=[...]``,
  ``spanner_null_filtered=True``, ``spanner_interleave_in='Parent'``;
* a DESC key part: ``sharded_orm.primary_key('UserId', sa.desc('LastAccessTimestamp'))``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from alembic.autogenerate import render_op_text, renderers
from alembic.autogenerate.api import AutogenContext
from alembic.operations import ops
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import UnaryExpression

from sharded_orm.errors import ShardTypeError
from sharded_orm.schema.keys import is_descending
from sharded_orm.schema.types import UTCDateTime

from . import reflection
from .markers import marker_clause
from .notes import NoteOp
from .ops import (
    AddShardColumnOp,
    AlterIndexStoringOp,
    CompleteShardOp,
    DropShardColumnOp,
    SpannerCreateIndexOp,
    SpannerDropIndexOp,
    UnknownShardSpecOp,
    VerifyShardOp,
)

RenderItem = Callable[[str, Any, AutogenContext], "str | bool"]


def _op_prefix(ctx: AutogenContext) -> str:
    return str(ctx.opts.get("alembic_module_prefix") or "op.")


def _sa_prefix(ctx: AutogenContext) -> str:
    return str(ctx.opts.get("sqlalchemy_module_prefix") or "sa.")


def quote_char(ctx: AutogenContext) -> str:
    """The dialect's identifier quote (``"`` without a dialect), for marker clauses."""
    dialect = ctx.dialect
    return dialect.identifier_preparer.initial_quote if dialect is not None else '"'


# ----------------------------------------------------------------------------- render_item


def render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | bool:
    """Alembic ``render_item`` hook: a primary key with DESC parts as ``primary_key(...)``.

    Returns ``False`` (Alembic's own rendering) for everything else.
    """
    if type_ == "type" and isinstance(obj, UTCDateTime):
        # the type's own repr would be written as sharded_orm.schema.types.UTCDateTime()
        # with no import for it: a NameError at upgrade
        autogen_context.imports.add("import sharded_orm")
        return "sharded_orm.UTCDateTime()"
    if type_ == "primary_key" and not isinstance(obj, sa.PrimaryKeyConstraint):
        raise ShardTypeError(
            f"render_item('primary_key', ...) takes a PrimaryKeyConstraint, got {obj!r}"
        )
    if type_ == "primary_key" and any(is_descending(c) for c in obj.columns):
        sa_ = _sa_prefix(autogen_context)
        autogen_context.imports.add("import sharded_orm")
        parts = [
            f"{sa_}desc({c.name!r})" if is_descending(c) else repr(c.name) for c in obj.columns
        ]
        if obj.name:
            parts.append(f"name={obj.name!r}")
        return f"sharded_orm.primary_key({', '.join(parts)})"
    return False


def chain_render_item(user: RenderItem | None) -> RenderItem:
    """``render_item`` trying ours first, then the user's."""
    if user is None or getattr(user, "_sharded_orm_chained", False):
        return user or render_item

    def chained(type_: str, obj: Any, ctx: AutogenContext) -> str | bool:
        ours = render_item(type_, obj, ctx)
        return ours if ours is not False else user(type_, obj, ctx)

    chained._sharded_orm_chained = True  # type: ignore[attr-defined]
    return chained


# ----------------------------------------------------------------------------- indexes


def index_parts(index: sa.Index, ctx: AutogenContext) -> list[str]:
    """Index columns as plain Python: names, or ``sa.desc(sa.column(name))``."""
    sa_ = _sa_prefix(ctx)
    out = []
    for expr in index.expressions:
        desc = isinstance(expr, UnaryExpression) and expr.modifier is operators.desc_op
        inner = expr.element if isinstance(expr, UnaryExpression) else expr
        name = getattr(inner, "name", None)
        if name is None:
            name = str(getattr(inner, "text", inner))
        out.append(f"{sa_}desc({sa_}column({name!r}))" if desc else repr(name))
    return out


def _spanner_kwargs(index: sa.Index) -> list[str]:
    sig = reflection.index_signature(index)
    out = []
    if sig["storing"]:
        out.append(f"spanner_storing={sig['storing']!r}")
    if sig["null_filtered"]:
        out.append("spanner_null_filtered=True")
    if sig["interleave_in"]:
        out.append(f"spanner_interleave_in={sig['interleave_in']!r}")
    return out


@renderers.dispatch_for(SpannerCreateIndexOp)
def _render_create_index(ctx: AutogenContext, op: SpannerCreateIndexOp) -> list[str]:
    index = op.to_index()
    assert index.table is not None
    args = [repr(index.name), repr(index.table.name), f"[{', '.join(index_parts(index, ctx))}]"]
    args.append(f"unique={bool(index.unique)!r}")
    args.extend(_spanner_kwargs(index))
    lines = [f"# WARNING (sharded_orm): {w}" for w in getattr(op, "warnings", [])]
    lines.append(f"{_op_prefix(ctx)}create_index({', '.join(args)})")
    return lines


@renderers.dispatch_for(SpannerDropIndexOp)
def _render_drop_index(ctx: AutogenContext, op: SpannerDropIndexOp) -> str:
    return f"{_op_prefix(ctx)}drop_index({op.index_name!r}, table_name={op.table_name!r})"


@renderers.dispatch_for(AlterIndexStoringOp)
def _render_alter_storing(ctx: AutogenContext, op: AlterIndexStoringOp) -> str:
    args = [repr(op.index_name), repr(op.table_name)]
    if op.add:
        args.append(f"add={op.add!r}")
    if op.drop:
        args.append(f"drop={op.drop!r}")
    return f"{_op_prefix(ctx)}alter_index_storing({', '.join(args)})"


# ----------------------------------------------------------------------------- shard columns


def _nullable_copy(column: sa.Column[Any]) -> sa.Column[Any]:
    return sa.Column(column.name, column.type, nullable=True)


def _expand_steps(nullable: bool, marker: bool) -> list[str]:
    """The comment naming exactly the steps rendered after it."""
    steps = ["expand (nullable)", "backfill existing rows (online, batched, resumable)"]
    if not nullable:
        steps.append("NOT NULL")
    if marker:
        steps.append("the marker recording its spec")
    text = ", ".join(steps[:-1]) + ", then " + steps[-1] + "."
    if len(text) <= 90:
        return [f"# {text}"]
    cut = text.rindex(", ", 0, 90) + 1
    return [f"# {text[:cut]}", f"# {text[cut + 1 :]}"]


@renderers.dispatch_for(NoteOp)
def _render_note(ctx: AutogenContext, op: NoteOp) -> list[str]:
    return [f"# sharded_orm: {op.text}"]


@renderers.dispatch_for(AddShardColumnOp)
def _render_add_shard_column(ctx: AutogenContext, op: AddShardColumnOp) -> list[str]:
    p = _op_prefix(ctx)
    col = op.column
    if op.server_side:
        # Spanner computes a generated column for existing rows itself.
        return [render_op_text(ctx, ops.AddColumnOp(op.table_name, col))]
    srcs = ", ".join(repr(s) for s in op.sources)
    lines = [
        f"# sharded_orm: add shard column {op.table_name}.{col.name} "
        f"(shard of {', '.join(op.sources)} mod {op.count}, {op.algorithm}):",
        *_expand_steps(bool(col.nullable), op.marker is not None),
        render_op_text(ctx, ops.AddColumnOp(op.table_name, _nullable_copy(col))),
        f"{p}backfill_shard({op.table_name!r}, {col.name!r}, sources=[{srcs}], "
        f"count={op.count}, algorithm={op.algorithm!r})",
    ]
    if not col.nullable:
        lines.append(
            f"{p}alter_column({op.table_name!r}, {col.name!r}, nullable=False, "
            f"existing_type={_sa_prefix(ctx)}{col.type!r})"
        )
    if op.marker is not None:
        clause = marker_clause(col.name, op.count, quote_char(ctx))
        lines.append(
            f"{p}create_check_constraint({op.marker.name!r}, {op.table_name!r}, {clause!r})"
        )
    return lines


@renderers.dispatch_for(VerifyShardOp)
def _render_verify(ctx: AutogenContext, op: VerifyShardOp) -> list[str]:
    srcs = ", ".join(repr(s) for s in op.sources)
    why = (
        f"# sharded_orm: fill {op.table_name}.{op.column_name} where code that does not "
        "compute it wrote rows since the expand, before NOT NULL makes such code fail; "
        "fails if one is left."
        if isinstance(op, CompleteShardOp)
        else f"# sharded_orm: verify {op.table_name}.{op.column_name} now that the old layout "
        "is gone (old code writing it fails from here): fill and fix every row written since "
        "the expand by code that did not compute it; fails if one is left."
    )
    return [
        why,
        f"{_op_prefix(ctx)}backfill_shard({op.table_name!r}, {op.column_name!r}, "
        f"sources=[{srcs}], count={op.count}, algorithm={op.algorithm!r})",
    ]


@renderers.dispatch_for(DropShardColumnOp)
def _render_drop_shard_column(ctx: AutogenContext, op: DropShardColumnOp) -> list[str]:
    p = _op_prefix(ctx)
    lines = []
    if op.marker is not None and not op.server_side:
        lines.append(f"{p}drop_constraint({op.marker.name!r}, {op.table_name!r}, type_='check')")
    lines.append(f"{p}drop_column({op.table_name!r}, {op.column.name!r})")
    return lines


@renderers.dispatch_for(UnknownShardSpecOp)
def _render_unknown(ctx: AutogenContext, op: UnknownShardSpecOp) -> list[str]:
    message = f"cannot re-create shard column {op.table_name}.{op.column.name}: {op.reason}"
    return [f"# sharded_orm: {op.reason}", f"raise NotImplementedError({message!r})"]
