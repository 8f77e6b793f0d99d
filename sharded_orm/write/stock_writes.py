"""INSERT and UPDATE of a sharded table on an engine of the stock Spanner dialect: refused.

An engine made before ``import sharded_orm`` (or on a stock dialect the app registered
itself) is never watched by our dialect, so a Core write of a sharded table on it would go
out unchecked (a wrong or stale shard), without our deadlines and error mapping. These
hooks, keyed by the dialect's name, see every such statement when it compiles (whatever
the engine, before anything is sent) and refuse it (``sharded_orm.spanner.stock``); on
our dialect, and for a table that is not sharded, they only hand over to the compiler.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.dml import Insert, Update

from sharded_orm.spanner import SPANNER_DIALECT_NAMES
from sharded_orm.spanner.stock import is_stock_spanner, refuse_stock
from sharded_orm.write.targets import statement_table, write_shards


def _check(stmt: Any, compiler: Any, verb: str) -> None:
    if is_stock_spanner(compiler.dialect):
        table = statement_table(stmt)
        if write_shards(table):
            refuse_stock(compiler.dialect, f"{verb} of sharded table {table.name}")


def _insert(stmt: Insert, compiler: Any, **kw: Any) -> str:
    _check(stmt, compiler, "an INSERT")
    return str(compiler.visit_insert(stmt, **kw))


def _update(stmt: Update, compiler: Any, **kw: Any) -> str:
    _check(stmt, compiler, "an UPDATE")
    return str(compiler.visit_update(stmt, **kw))


for _name in SPANNER_DIALECT_NAMES:
    compiles(Insert, _name)(_insert)
    compiles(Update, _name)(_update)
