"""What a ``module:attr`` on the command line names, the same way for every subcommand.

A mapped class or a ``Table`` means that table; a declarative base, a ``MetaData`` or a
module means all its tables (``verify`` keeps those with shard columns). The module is
imported from the current directory, as alembic and uvicorn do; whatever it raises while
importing (``SystemExit`` included) becomes a :class:`ShardingError`, so a model module that
exits cannot end a CI gate silently.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from typing import Any

import sqlalchemy as sa
from sqlalchemy import MetaData

from sharded_orm.errors import ShardConfigError, ShardingError
from sharded_orm.schema.columns import shard_columns

TARGET_HELP = (
    "MODULE:ATTR, imported from the current directory: a mapped class or Table means that "
    "table; a declarative base, a MetaData or a module means all its tables"
)


def load_target(spec: str) -> Any:
    """The object ``module:attr`` names (``module`` alone: the module)."""
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise ShardingError(f"give a module path, like models:Base (got {spec!r})")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except SystemExit as exc:
        raise ShardingError(
            f"importing {module_name!r} called sys.exit({exc.code!r}): nothing was checked; "
            "guard the module's script code with `if __name__ == '__main__':`"
        ) from None
    except BaseException as exc:
        raise ShardingError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None
    if not attr:
        return module
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ShardingError(f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def metadata_of(obj: Any) -> MetaData:
    """The MetaData of a MetaData, a declarative base, or a module (its one MetaData)."""
    if isinstance(obj, MetaData):
        return obj
    md = getattr(obj, "metadata", None)
    if isinstance(md, MetaData):
        return md
    if isinstance(obj, types.ModuleType):
        found = {id(v): v for v in vars(obj).values() if isinstance(v, MetaData)}
        for v in vars(obj).values():
            m = getattr(v, "metadata", None)
            if isinstance(v, type) and isinstance(m, MetaData):
                found[id(m)] = m
        if len(found) == 1:
            return next(iter(found.values()))
        if found:
            raise ShardConfigError(
                f"module {obj.__name__} has {len(found)} MetaData objects: name one (module:attr)"
            )
    raise ShardConfigError(f"{obj!r} is not a MetaData, a declarative base, or a module with one")


def table_of_class(obj: Any) -> sa.Table | None:
    """The table of a mapped class or a ``Table``; None for anything else (a Base too)."""
    if isinstance(obj, sa.Table):
        return obj
    if not isinstance(obj, type):
        return None
    mapper: Any = sa.inspect(obj, raiseerr=False)
    table = getattr(mapper, "local_table", None)
    return table if isinstance(table, sa.Table) else None


def tables_of(obj: Any, *, sharded_only: bool = False) -> list[sa.Table]:
    """The tables ``obj`` means: its own (a class or Table), or all of its MetaData's."""
    one = table_of_class(obj)
    if one is not None:
        return [one]
    if not isinstance(obj, (sa.MetaData, type, types.ModuleType)):
        raise ShardConfigError(
            f"{obj!r:.80} is not a MetaData, a declarative base, a mapped class, a Table "
            "or a module holding one"
        )
    tables = list(metadata_of(obj).sorted_tables)
    if sharded_only:
        tables = [t for t in tables if shard_columns(t)]
        if not tables:
            raise ShardConfigError(
                f"none of the tables of {getattr(obj, '__name__', obj)!r} has a shard column: "
                "nothing to verify"
            )
    elif not tables:
        raise ShardConfigError("the metadata has no tables: nothing to check")
    return tables
