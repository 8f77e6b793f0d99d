"""The errors of filling one row's shards (``sharded_orm.write.rows``), each saying what is
wrong and what to do."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sharded_orm.errors import ShardConfigError, ShardMismatchError, ShardValueError
from sharded_orm.schema.columns import ShardColumn


def unhashable_source(sc: ShardColumn, key: str) -> ShardConfigError:
    return ShardConfigError(
        f"the value for shard source {key!r} of {sc.name!r} is a SQL expression; the shard "
        "can only be computed from plain values. Compute the value in Python first."
    )


def no_value(sc: ShardColumn, key: str, row: Mapping[str, Any]) -> ShardValueError:
    table = getattr(sc.column, "table", None)
    known = set(getattr(table, "c", {}).keys()) if table is not None else set()
    unknown = [k for k in row if known and k not in known]
    hint = (
        f" The row has keys that are not column keys of {getattr(table, 'name', '?')!r}: "
        f"{', '.join(unknown)} "
        "(Core takes column keys, not ORM attribute names)."
        if unknown
        else ""
    )
    return ShardValueError(
        f"this INSERT gives no value for shard source {key!r} of {sc.name!r} and the column "
        f"has no Python default, so the shard cannot be computed.{hint}"
    )


def mismatch(sc: ShardColumn, given: Any, shard: int) -> ShardMismatchError:
    return ShardMismatchError(
        f"{sc.name}={given!r} disagrees with its sources "
        f"({', '.join(sc.source_keys)}), which hash to {shard}; such a row would be "
        f"invisible to sharded queries. Leave {sc.name!r} out and sharded-orm fills it."
    )


def server_rewritten(sc: ShardColumn, col: Any) -> ShardConfigError:
    return ShardConfigError(
        f"shard source {col.name!r} of {sc.name!r} has server_onupdate: the database changes "
        "it during this UPDATE where the client cannot see the new value, and on this "
        "database sharded-orm computes the shard in the client (server_side=True shards are "
        f"computed by Spanner alone), so it would go stale. Set {col.key!r} in the UPDATE."
    )
