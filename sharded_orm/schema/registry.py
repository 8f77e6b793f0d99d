"""Every sharded table by name, so a statement is recognised however its table is named.

The engine hook sees the ``Table`` a statement was built from. That is the declared
table for the model's own statements, but a reflected ``Table``, a lightweight
``sa.table()`` (Alembic's ``op.execute`` idiom) or a copy made by ``to_metadata`` is a
different object with no shard information. Declared sharded tables register here by
``(schema, name)``; a statement on any other table of that name is checked against them.

Two metadatas may declare a table of one name (test suites, several apps in one
process). If their shard layouts agree (same shard and source column names, count and
algorithm) either will do; if they disagree the name is ambiguous and a write through an
undeclared table of that name is refused rather than guessed.
"""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy import event
from sqlalchemy.sql.schema import MetaData, Table

#: (schema, lower-case name) -> declared sharded tables of that name
_tables: dict[tuple[str | None, str], weakref.WeakSet[Table]] = {}
#: (schema, lower-case name of a referenced table) -> names of its columns that an
#: ``ON UPDATE CASCADE`` foreign key copies into a shard source
_cascades: dict[tuple[str | None, str], dict[str, str]] = {}


def _key(schema: str | None, name: str) -> tuple[str | None, str]:
    return (schema, name.lower())


#: how many times a sharded table was registered: a check made against the registry
#: (``declared_names``) is out of date once this changes
_registered = [0]


def register(table: Table) -> None:
    """Record a declared table that has a shard column."""
    tables = _tables.setdefault(_key(table.schema, table.name), weakref.WeakSet())
    if table not in tables:
        tables.add(table)
        _registered[0] += 1


def registrations() -> int:
    """A number that changes whenever a sharded table is registered."""
    return _registered[0]


def declared_names() -> dict[str | None, set[str]]:
    """Schema -> lower-case names of the live declared sharded tables in it."""
    out: dict[str | None, set[str]] = {}
    for (schema, name), tables in list(_tables.items()):
        if len(tables):
            out.setdefault(schema, set()).add(name)
    return out


def register_cascades(table: Table, layout: tuple[Any, ...]) -> None:
    """Record the foreign keys that let the database rewrite a source (``layout``: its
    resolved ShardColumns)."""
    for sc in layout:
        for src in sc.sources:
            for fk in src.foreign_keys:
                if (fk.onupdate or "").upper() not in ("CASCADE", "SET NULL", "SET DEFAULT"):
                    continue
                parent = fk.column
                what = f"{table.name}.{src.name} (a source of shard {sc.name!r})"
                _cascades.setdefault(_key(parent.table.schema, parent.table.name), {})[
                    parent.name
                ] = what


def declared_tables(schema: str | None, name: str) -> list[Table]:
    """The live declared sharded tables named ``name`` in ``schema``."""
    found = _tables.get(_key(schema, name))
    return list(found) if found else []


def cascade_targets(schema: str | None, name: str) -> dict[str, str]:
    """Columns of table ``name`` whose UPDATE the database cascades into a shard source."""
    return _cascades.get(_key(schema, name)) or {}


def sharded_names() -> frozenset[str]:
    """Lower-case names of every declared sharded table (for the raw-SQL warning)."""
    return frozenset(name for (_, name), tables in _tables.items() if len(tables))


# --------------------------------------------------------------------------- engines

_engine_watcher: list[Any] = []


def set_engine_watcher(fn: Any) -> None:
    """The write layer's ``watch(engine)``, called when a sharded table meets an engine."""
    _engine_watcher[:] = [fn]


def engine_seen(connection: Any) -> None:
    """``connection``'s engine has something to do with a sharded table: watch it."""
    for fn in _engine_watcher:
        fn(connection)


def _on_ddl(target: Any, connection: Any, **kw: Any) -> None:
    engine_seen(connection)


def watch_ddl(table: Table) -> None:
    """Watch every engine that creates, drops or checks ``table`` or its MetaData (per
    object: a table without a shard column, and its engines, are left alone)."""
    targets: list[Any] = [table]
    if isinstance(table.metadata, MetaData):
        targets.append(table.metadata)
    for target in targets:
        for name in ("before_create", "before_drop"):
            if not event.contains(target, name, _on_ddl):
                event.listen(target, name, _on_ddl)
