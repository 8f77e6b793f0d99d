"""The keys of a key reshard's old table that the dual write knows before and after a
statement (``sharded_orm.write.mirror_rules``, ``sharded_orm.write.successor``): a key
shard Spanner generates (``server_side=True``) is no parameter of any row, but it is its
sources hashed, as Spanner hashes them, wherever the sources are known."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from sharded_orm.schema.columns import ShardColumn
from sharded_orm.write.sql import MISSING, literal_value
from sharded_orm.write.successor_plan import MirrorPlan
from sharded_orm.write.targets import write_shards

__all__ = ["generated_known", "generated_shard", "key_of_row", "python_default"]


def generated_shard(mp: MirrorPlan, c: sa.Column[Any]) -> ShardColumn | None:
    """The shard column ``c`` of the old table is, where it is one Spanner generates
    (``server_side=True``): its value is its sources hashed, known wherever they are."""
    for sc in write_shards(mp.old):
        if sc.key == c.key and sc.server_side:
            return sc
    return None


def generated_known(mp: MirrorPlan, c: sa.Column[Any], values: Any, rows: list[Any]) -> bool:
    """Whether ``c`` is a generated shard whose every source each row gives (a value, a
    parameter of every row, or a Python default SQLAlchemy evaluates)."""
    sc = generated_shard(mp, c)
    if sc is None:
        return False
    for src in sc.sources:
        if src.key in values:
            if literal_value(values[src.key]) is MISSING:
                return False
        elif not ((rows and all(src.key in r for r in rows)) or python_default(src)):
            return False
    return True


def key_of_row(
    mp: MirrorPlan, row: Mapping[str, Any], values: Mapping[str, Any], absent: Any = None
) -> tuple[Any, ...]:
    """The old table's key of an INSERT row, from its parameters (``row``: a row
    SQLAlchemy sent, Python defaults included) and the statement's ``.values()``; a key
    shard Spanner generates, which no row carries, is its sources hashed (as Spanner
    hashes them). ``absent`` where a key value is unknown."""
    out = []
    for c in mp.old_key:
        v = literal_value(values[c.key], row) if c.key in values else row.get(c.key, absent)
        if v is absent or v is None or v is MISSING:
            sc = generated_shard(mp, c)
            if sc is not None:
                got = [
                    literal_value(values[k], row) if k in values else row.get(k, MISSING)
                    for k in sc.source_keys
                ]
                if not any(g is MISSING for g in got):
                    v = sc.compute(sc.values_to_send(got))
        out.append(absent if v is MISSING else v)
    return tuple(out)


def python_default(c: sa.Column[Any]) -> bool:
    return c.default is not None and bool(c.default.is_scalar or c.default.is_callable)
