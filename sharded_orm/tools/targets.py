"""What a ``module:attr`` on the command line names, the same way for every subcommand.

A mapped class or a ``Table`` means that table; a declarative base or a ``MetaData`` all
its tables; a module all the tables of every MetaData it holds (a table whose name two of
them declare is shown as ``Attr.name``; ``verify`` and ``doctor``, which read one
database, ask which one is meant when two declare a table). ``verify`` keeps those with
shard columns. The module is imported from the current directory, as alembic and uvicorn
do; whatever it raises while importing (``SystemExit`` included) becomes a
:class:`ShardingError`, so a model module that exits cannot end a CI gate silently.
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
    "table; a declarative base or a MetaData all its tables; MODULE alone all the tables "
    "of every MetaData it holds"
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


def metadatas_of(obj: Any) -> list[tuple[str, MetaData]]:
    """The MetaData objects ``obj`` means, each with the name messages give it: the one of
    a MetaData or a declarative base; every one a module holds (as a variable, or as the
    ``metadata`` of a class), named ``module:attr`` after a MetaData variable or a
    declarative base rather than a mapped class, in the module's order."""
    if isinstance(obj, MetaData):
        return [("metadata", obj)]
    md = getattr(obj, "metadata", None)
    if isinstance(md, MetaData) and not isinstance(obj, types.ModuleType):
        return [(getattr(obj, "__name__", "metadata"), md)]
    if not isinstance(obj, types.ModuleType):
        return []
    found: dict[int, tuple[int, str, MetaData]] = {}  # id -> (rank, name, metadata)
    for attr, value in vars(obj).items():
        md = value if isinstance(value, MetaData) else getattr(value, "metadata", None)
        if not isinstance(md, MetaData) or not isinstance(value, (MetaData, type)):
            continue
        if isinstance(value, MetaData):
            rank = 0
        else:  # a declarative base before a mapped class
            rank = 1 if sa.inspect(value, raiseerr=False) is None else 2
        if id(md) not in found or rank < found[id(md)][0]:
            found[id(md)] = (rank, f"{obj.__name__}:{attr}", md)
    return [(name, md) for _, name, md in found.values()]


def _labelled(obj: Any) -> list[tuple[str, sa.Table]]:
    """Every table of every MetaData ``obj`` means, each with its name, or ``Attr.name``
    where two of the MetaData objects declare a table of that name."""
    mds = metadatas_of(obj)
    seen: dict[tuple[str | None, str], int] = {}
    for _, md in mds:
        for t in md.tables.values():
            seen[(t.schema, t.name)] = seen.get((t.schema, t.name), 0) + 1
    return [
        (t.name if seen[(t.schema, t.name)] == 1 else f"{name.rpartition(':')[2]}.{t.name}", t)
        for name, md in mds
        for t in md.sorted_tables
    ]


def _one_per_name(obj: Any, what: str) -> None:
    """Refuse a module whose MetaData objects declare one table twice, for a command that
    reads one database: which declaration is meant must be said."""
    mds = metadatas_of(obj)
    names: dict[tuple[str | None, str], list[str]] = {}
    for name, md in mds:
        for t in md.tables.values():
            names.setdefault((t.schema, t.name), []).append(name)
    twice = {k: v for k, v in names.items() if len(v) > 1}
    if twice:
        (_, table), holders = next(iter(twice.items()))
        raise ShardConfigError(
            f"module {obj.__name__} declares table {table!r} in {len(holders)} MetaData "
            f"objects; {what} reads one database: name the one it holds, "
            f"{' or '.join(holders)}"
        )


def metadata_of(obj: Any, what: str = "doctor") -> MetaData:
    """The MetaData of a MetaData, a declarative base, or a module: its one MetaData, or a
    copy of the tables of all of them (a module holding several; refused where two declare
    a table of one name)."""
    mds = metadatas_of(obj)
    if len(mds) == 1:
        return mds[0][1]
    if not mds:
        raise ShardConfigError(
            f"{obj!r:.80} is not a MetaData, a declarative base, or a module holding one"
        )
    _one_per_name(obj, what)
    merged = MetaData()
    for _, md in mds:
        for t in md.sorted_tables:
            t.to_metadata(merged)
    return merged


def table_of_class(obj: Any) -> sa.Table | None:
    """The table of a mapped class or a ``Table``; None for anything else (a Base too)."""
    if isinstance(obj, sa.Table):
        return obj
    if not isinstance(obj, type):
        return None
    mapper: Any = sa.inspect(obj, raiseerr=False)
    table = getattr(mapper, "local_table", None)
    return table if isinstance(table, sa.Table) else None


def labelled_tables(obj: Any, *, sharded_only: bool = False) -> list[tuple[str, sa.Table]]:
    """The tables ``obj`` means, each with the name to show: its own (a class or Table), or
    all those of its MetaData objects (a module may hold several: a table whose name two of
    them declare is shown as ``Attr.name``, e.g. ``Naive.LogEntries``). ``sharded_only``
    (verify, which reads one database): those with shard columns, one declaration a name."""
    one = table_of_class(obj)
    if one is not None:
        return [(one.name, one)]
    if not isinstance(obj, (sa.MetaData, type, types.ModuleType)):
        raise ShardConfigError(
            f"{obj!r:.80} is not a MetaData, a declarative base, a mapped class, a Table "
            "or a module holding one"
        )
    if not metadatas_of(obj):
        raise ShardConfigError(
            f"{obj!r:.80} is not a MetaData, a declarative base, or a module holding one"
        )
    tables = _labelled(obj)
    if sharded_only:
        tables = [(n, t) for n, t in tables if shard_columns(t)]
        if not tables:
            raise ShardConfigError(
                f"none of the tables of {getattr(obj, '__name__', obj)!r} has a shard column: "
                "nothing to verify"
            )
        if isinstance(obj, types.ModuleType):
            _one_per_name(obj, "verify")
    elif not tables:
        raise ShardConfigError("the metadata has no tables: nothing to check")
    return tables


def tables_of(obj: Any, *, sharded_only: bool = False) -> list[sa.Table]:
    """The tables ``obj`` means (:func:`labelled_tables` without the names)."""
    return [t for _, t in labelled_tables(obj, sharded_only=sharded_only)]
