"""The revisions ``sharded-orm doctor --fix`` writes, rendered by Alembic with our renderers.

A :class:`sharded_orm.tools.doctor.changes.ModelChange` (the models before and after a fix)
becomes the library's plan ops (``AddShardColumnOp``, ``SpannerCreateIndexOp``, ...), and
Alembic's ``render_python_code`` writes them with the renderers autogenerate uses, so the
revision says exactly what ``alembic revision --autogenerate`` would for that model change
(markers, ``sa.desc`` parts, the backfill), plus the steps autogenerate leaves to people:
``op.copy_table_rows`` / ``op.retire_table`` for a key reshard, the bit-reversed sequence.
Files are written by Alembic's ``ScriptDirectory`` with the project's own template, after
its current head; nothing is applied. Revisions a previous run wrote for the same finding
(:func:`written_before`) are found in the versions folder, and said, not written again.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic.autogenerate import render_python_code
from alembic.operations import ops
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import rev_id

from sharded_orm.checks import check_identifier
from sharded_orm.errors import ShardConfigError
from sharded_orm.schema.columns import shard_columns

from .markers import marker_clause, marker_for
from .ops import (
    AddShardColumnOp,
    DropShardColumnOp,
    SpannerCreateIndexOp,
    SpannerDropIndexOp,
    VerifyShardOp,
)
from .render import render_item

__all__ = ["PREFIX", "Prior", "Revision", "render_change", "write_revisions", "written_before"]

#: how every revision doctor --fix writes starts its message: then "<pattern> on <name>: "
PREFIX = "doctor fix: "


@dataclass
class Revision:
    """One revision's text: message, upgrade and downgrade bodies (indented), imports."""

    message: str
    upgrade: str
    downgrade: str
    imports: str = ""
    path: Path | None = None
    revision: str | None = None


@dataclass
class Prior:
    """A revision an earlier ``doctor --fix`` wrote: its id, file, message and whether the
    database has it (``applied``: True, False, or None when the database was not read)."""

    revision: str
    path: Path
    message: str
    applied: bool | None

    @property
    def state(self) -> str:
        return {True: "applied", False: "pending"}.get(self.applied, "pending or applied")  # type: ignore[arg-type]


def _what(change: Any) -> str:
    return f"{change.finding.pattern} on {change.finding.table}"


def written_before(config: Any, change: Any) -> list[Prior]:
    """The revisions in the project's versions folder that an earlier ``doctor --fix`` wrote
    for ``change``'s finding (the same pattern on the same table or index), oldest first,
    each said applied or pending where the database (``sqlalchemy.url``) answers."""
    script = ScriptDirectory.from_config(config)
    start = f"{PREFIX}{_what(change)}: "
    found = [
        sc
        for sc in script.walk_revisions()
        if " ".join(str(sc.doc or "").split()).startswith(start)  # Alembic may wrap it
    ]
    if not found:
        return []
    applied = _applied(config, script)
    return [
        Prior(
            str(sc.revision),
            Path(sc.path),
            " ".join(str(sc.doc).split()),
            None if applied is None else sc.revision in applied,
        )
        for sc in reversed(found)
    ]


def _applied(config: Any, script: ScriptDirectory) -> set[str] | None:
    """Every revision the database is at or past, or None where it cannot be read."""
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        return None
    try:
        engine = sa.create_engine(url)
        try:
            with engine.connect() as conn:
                heads = MigrationContext.configure(conn).get_current_heads()
        finally:
            engine.dispose()
    except Exception:  # noqa: BLE001 - any failure to read it: the state is "not known"
        return None
    return {sc.revision for sc in script.iterate_revisions(heads, "base")} if heads else set()


def _context(dialect: Any) -> MigrationContext:
    return MigrationContext.configure(dialect=dialect, opts={})


def _render(ctx: MigrationContext, items: list[Any], extra: tuple[str, ...] = ()) -> str:
    text = render_python_code(
        ops.UpgradeOps(ops=items),
        migration_context=ctx,
        render_item=render_item,  # type: ignore[arg-type]
    )
    lines = [ln for ln in text.splitlines() if "### " not in ln]
    lines += [f"    {ln}" for ln in extra]
    return "\n".join(lines) or "    pass"


def _shard_op(cls: Any, table: sa.Table, name: str) -> Any:
    sc = next(s for s in shard_columns(table) if s.name == name)
    col = sa.Column(sc.name, sc.column.type, nullable=sc.column.nullable)
    return cls(
        table.name, col, sources=[c.name for c in sc.sources], count=sc.count,
        algorithm=sc.algorithm, marker=marker_for(sc),
    )  # fmt: skip


def _create_index(ix: sa.Index) -> SpannerCreateIndexOp:
    return SpannerCreateIndexOp.wrap(ops.CreateIndexOp.from_index(ix))


def _create_table(table: sa.Table, quote: str) -> ops.CreateTableOp:
    op = ops.CreateTableOp.from_table(table)
    op.info = {}
    for sc in shard_columns(table):
        m = marker_for(sc)
        op.columns = [
            *op.columns,
            sa.CheckConstraint(marker_clause(sc.name, sc.count, quote), name=m.name),
        ]
    return op


def render_change(change: Any, dialect: Any) -> list[Revision]:
    """The revision(s) of one model change (two for a reshard: expand, then contract)."""
    ctx = _context(dialect)
    quote = dialect.identifier_preparer.initial_quote
    kind, table, after = change.kind, change.table, change.after
    what = _what(change)
    if kind in ("shard_index", "reshard_index"):
        # expand: the new column (backfilled; NOT NULL for a new shard column, which fences
        # old code; nullable for a reshard, whose contract fences by dropping the old one)
        # and the new index; contract: the old layout dropped, then (reshard) every row
        # filled and checked
        new_sc = _shard_op(AddShardColumnOp, after, change.new_shard)
        contract_ops: list[Any] = [SpannerDropIndexOp.from_index(change.old_index)]
        if kind == "reshard_index":
            contract_ops.append(_shard_op(DropShardColumnOp, table, change.old_shard))
            contract_ops.append(
                VerifyShardOp(
                    table.name,
                    change.new_shard,
                    sources=new_sc.sources,
                    count=new_sc.count,
                    algorithm=new_sc.algorithm,
                )  # fmt: skip
            )
        index = change.new_index.name
        expand = _pair(ctx, f"{PREFIX}{what}: expand", [new_sc, _create_index(change.new_index)])
        contract = _pair(
            ctx,
            f"{PREFIX}{what}: CONTRACT (apply once every reader uses {index})",
            contract_ops,
        )
        return [expand, contract]
    if kind == "key_reshard":
        old, new = (
            check_identifier(table.name, "table name"),
            check_identifier(after.name, "table name"),
        )
        create = [_create_table(after, quote), *(_create_index(ix) for ix in after.indexes)]
        upgrade = _render(ctx, create, (f"op.copy_table_rows({old!r}, {new!r})",))
        downgrade = _render(ctx, list(reversed([o.reverse() for o in create])))
        expand = Revision(f"{PREFIX}{what}: key reshard to {new}, expand", upgrade, downgrade)
        message = (
            f"{old} is retired into {new}: its rows are gone from {old}; to go back, reshard again"
        )
        contract = Revision(
            f"{PREFIX}{what}: key reshard to {new}, CONTRACT (apply once every writer uses {new})",
            f"    op.retire_table({old!r}, successor={new!r})",
            f"    raise NotImplementedError({message!r})",
        )
        return [expand, contract]
    if kind == "bit_reversed":
        prep = dialect.identifier_preparer
        seq = check_identifier(change.sequence, "sequence name")
        top = f"SELECT MAX({prep.quote(change.column)}) FROM {prep.quote(table.name)}"
        upgrade = "\n".join(
            [
                "    # new ids from a bit-reversed sequence that skips every id already used",
                f"    top = op.get_bind().execute(sa.text({top!r})).scalar() or 0",
                f"    ddl = SpannerSequence.create_ddl({seq!r}, skip_range=(1, max(int(top), 1)))",
                "    op.execute(ddl)",
            ]
        )
        downgrade = f"    op.execute({f'DROP SEQUENCE {prep.quote(seq)}'!r})"
        imports = "from sharded_orm.ids.sequences import SpannerSequence"
        return [Revision(f"{PREFIX}{what}: bit-reversed ids", upgrade, downgrade, imports)]
    raise ShardConfigError(f"no revision for a change of kind {kind!r}")


def _pair(ctx: MigrationContext, message: str, up: list[Any]) -> Revision:
    down = [o.reverse() for o in reversed(up)]
    return Revision(message, _render(ctx, up), _render(ctx, down))


def _imports(rev: Revision) -> str:
    lines = [rev.imports] if rev.imports else []
    if "sharded_orm." in rev.upgrade + rev.downgrade:
        lines.append("import sharded_orm")
    return "\n".join(lines)


def write_revisions(config: Any, revisions: list[Revision]) -> list[Revision]:
    """Write ``revisions`` in order after the project's single head (Alembic's template and
    versions folder); refuses a project with several heads."""
    script = ScriptDirectory.from_config(config)
    heads = script.get_heads()
    if len(heads) > 1:
        raise ShardConfigError(
            f"the Alembic project has {len(heads)} heads ({', '.join(heads)}): merge them "
            "(alembic merge heads) before doctor --fix writes after them"
        )
    head = heads[0] if heads else None
    with contextlib.redirect_stdout(sys.stderr):  # Alembic's "Generating ...": not the result
        _generate(script, head, revisions)
    return revisions


def _generate(script: ScriptDirectory, head: str | None, revisions: list[Revision]) -> None:
    for rev in revisions:
        rid = rev_id()
        made = script.generate_revision(
            rid, rev.message, head=head or "base", imports=_imports(rev),
            upgrades=rev.upgrade.strip("\n").removeprefix("    "),
            downgrades=rev.downgrade.strip("\n").removeprefix("    "),
        )  # fmt: skip
        if made is None:  # pragma: no cover - Alembic returns None only for a refused splice
            raise ShardConfigError(f"Alembic wrote no revision for {rev.message!r}")
        rev.path, rev.revision, head = Path(made.path), made.revision, made.revision
