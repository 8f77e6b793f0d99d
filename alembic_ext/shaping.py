"""How autogenerate's operations are shaped for Spanner: warnings, order, in-place changes.

Pure functions over Alembic operations, used by :mod:`alembic_ext.compare`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

import sqlalchemy as sa
from alembic.operations import ops
from sqlalchemy.sql.elements import UnaryExpression

from sharded_orm.errors import ShardTypeError
from sharded_orm.hashing import CRC32, FARM_FINGERPRINT

from . import reflection
from .markers import Marker, spec_digest
from .ops import (
    AddShardColumnOp,
    AlterIndexStoringOp,
    CompleteShardOp,
    DropShardColumnOp,
    VerifyShardOp,
)

MONOTONIC_TYPES = (sa.DateTime, sa.Date, sa.Time)


def index_warnings(index: sa.Index) -> list[str]:
    """Warnings written above ``op.create_index`` in the generated file.

    The linter's findings (``sharded_orm.tools.lint.index_warnings``) about this index; for
    an index not attached to a model table, a minimal check: an index whose first column
    has a date/time type puts every new row at the end of the index (a write hotspot).
    """
    from sharded_orm.tools import lint

    if not isinstance(index, sa.Index):
        raise ShardTypeError(f"index_warnings takes a sqlalchemy Index, got {index!r}")
    if isinstance(index.table, sa.Table) and index in index.table.indexes:
        return [f"{f.rule} {f.message}" for f in lint.index_warnings(index)]
    exprs = list(index.expressions)
    if not exprs:
        return []
    first = exprs[0]
    col = first.element if isinstance(first, UnaryExpression) else first
    if isinstance(getattr(col, "type", None), MONOTONIC_TYPES):
        return [
            f"index {index.name!r} starts with {getattr(col, 'name', col)!r}, a monotonically "
            "increasing column: every insert writes the same split (a hotspot). Lead it with a "
            "shard column (sharded_orm.ShardedIndex)."
        ]
    return []


def recover_spec(
    marker: Marker, column: str, candidates: Iterable[str]
) -> tuple[str, tuple[str, ...]] | None:
    """(algorithm, sources) whose digest matches a marker: up to three source columns."""
    names = [c for c in candidates if c != column]
    for n in (1, 2, 3):
        for sources in itertools.permutations(names, n):
            for algorithm in (CRC32, FARM_FINGERPRINT):
                if spec_digest(algorithm, marker.count, sources) == marker.digest:
                    return algorithm, sources
    return None


def stub_index(info: reflection.IndexInfo) -> sa.Index:
    """An ``sa.Index`` carrying everything Spanner stores about a reflected index."""
    table = sa.Table(info.table, sa.MetaData())
    exprs: list[Any] = []
    for name, desc in info.columns:
        c = sa.Column(name, sa.types.NULLTYPE)
        table.append_column(c)
        exprs.append(c.desc() if desc else c)
    kw: dict[str, Any] = {}
    if info.storing:
        kw["spanner_storing"] = sorted(info.storing)
    if info.null_filtered:
        kw["spanner_null_filtered"] = True
    if info.interleave_in:
        kw["spanner_interleave_in"] = info.interleave_in
    return sa.Index(info.name, *exprs, unique=info.unique, _table=table, **kw)


def _order_key(op: ops.MigrateOperation) -> int:
    if isinstance(op, CompleteShardOp):
        return 1  # with the NOT NULL it comes right before
    if isinstance(op, VerifyShardOp):
        return 7  # after the old layout is dropped: that drop fences old writers
    if isinstance(op, DropShardColumnOp):
        return 6
    if isinstance(op, (AddShardColumnOp, ops.AddColumnOp)):
        return 0
    if isinstance(op, ops.AlterColumnOp):
        return 1
    if isinstance(op, (ops.CreateIndexOp, AlterIndexStoringOp)):
        return 2
    if isinstance(op, ops.AddConstraintOp):
        return 3
    if isinstance(op, ops.DropIndexOp):
        return 4
    if isinstance(op, ops.DropConstraintOp):
        return 5
    if isinstance(op, ops.DropColumnOp):
        return 6
    return 1


def order_in_table(found: list[ops.MigrateOperation]) -> list[ops.MigrateOperation]:
    """Ops on one table in the order Spanner accepts: add columns, create indexes and
    markers, then drop indexes, constraints, columns (Spanner refuses to drop a column an
    index or CHECK still uses). A changed index or constraint goes before it comes back
    under the same name (Spanner compares names case-insensitively: ``fk_a`` and
    ``FK_A`` collide, "Duplicate name in schema"); a replaced one (new name) stays until
    its successor exists."""

    def folded(name: Any) -> str | None:
        return name.lower() if isinstance(name, str) else None

    recreated = {folded(o.index_name) for o in found if isinstance(o, ops.CreateIndexOp)}
    readded = {
        folded(getattr(o, "constraint_name", None))
        for o in found
        if isinstance(o, ops.AddConstraintOp)
    }
    recreated.discard(None)
    readded.discard(None)

    def key(o: ops.MigrateOperation) -> int:
        if isinstance(o, ops.DropIndexOp) and folded(o.index_name) in recreated:
            return -1
        if isinstance(o, ops.DropConstraintOp) and folded(o.constraint_name) in readded:
            return -1
        return _order_key(o)

    return sorted(found, key=key)  # stable: keeps Alembic's order within a kind


def storing_in_place(found: list[ops.MigrateOperation]) -> list[ops.MigrateOperation]:
    """An index whose only change is its STORING list: ``ALTER INDEX``, not drop + create
    (the index would be gone, then rebuilt in full)."""
    drops = {o.index_name: o for o in found if isinstance(o, ops.DropIndexOp)}
    out: list[ops.MigrateOperation] = []
    replaced = set()
    for o in found:
        if isinstance(o, ops.CreateIndexOp) and o.index_name in drops:
            old = reflection.index_signature(drops[o.index_name].to_index())
            new = reflection.index_signature(o.to_index())
            if {k: v for k, v in old.items() if k != "storing"} == {
                k: v for k, v in new.items() if k != "storing"
            }:
                add = sorted(set(new["storing"]) - set(old["storing"]))
                drop = sorted(set(old["storing"]) - set(new["storing"]))
                out.append(AlterIndexStoringOp(o.index_name, o.table_name, add=add, drop=drop))
                replaced.add(o.index_name)
                continue
        out.append(o)
    return [o for o in out if not (isinstance(o, ops.DropIndexOp) and o.index_name in replaced)]


def order_tables(
    found: list[ops.MigrateOperation], parent_of: Callable[[str], str | None]
) -> list[ops.MigrateOperation]:
    """Creates parents before children, drops children (and their indexes) before
    parents: Spanner refuses both the other way round. Deterministic (no set order)."""

    def depth(name: str) -> int:
        d, seen = 0, {name}
        while (p := parent_of(name)) and p not in seen:
            d, name = d + 1, p
            seen.add(p)
        return d

    def key(item: tuple[int, ops.MigrateOperation]) -> tuple[int, int, int]:
        i, o = item
        if isinstance(o, ops.CreateTableOp):
            return (0, depth(o.table_name), i)
        if isinstance(o, (ops.DropIndexOp, ops.DropTableOp)):
            rank = 0 if isinstance(o, ops.DropIndexOp) else 1
            return (2, -depth(o.table_name or "") * 2 + rank, i)
        return (1, 0, i)

    return [o for _, o in sorted(enumerate(found), key=key)]
