"""The errors of a shard source value that cannot be hashed, naming the column and why
(shared by the stored-value rules, ``sharded_orm.schema.coerce`` and ``timestamps``)."""

from __future__ import annotations

from typing import Any

from sharded_orm.errors import ShardTypeError, ShardValueError
from sharded_orm.hashing import show


def describe(column: Any) -> str:
    table = getattr(column, "table", None)
    tname = getattr(table, "name", None)
    name = getattr(column, "name", None) or getattr(column, "key", "?")
    return f"{tname}.{name}" if tname else str(name)


def type_error(column: Any, value: Any, why: str) -> ShardTypeError:
    return ShardTypeError(
        f"cannot hash {show(value)} ({type(value).__name__}) for shard source {describe(column)} "
        f"({column.type!r}): {why}"
    )


def value_error(column: Any, value: Any, why: str) -> ShardValueError:
    return ShardValueError(
        f"cannot hash {show(value)} for shard source {describe(column)} ({column.type!r}): {why}"
    )


def none_error(column: Any) -> ShardValueError:
    return ShardValueError(
        f"cannot hash None for shard source {describe(column)}: every shard source must "
        "have a value (make the column NOT NULL)"
    )
