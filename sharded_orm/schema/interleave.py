"""Interleaved tables: a child's rows stored inside its parent's key range.

``__table_args__ = {**interleave_in("Users", on_delete_cascade=True)}`` gives the dialect's
own keywords (``spanner_interleave_in``, ``spanner_interleave_on_delete_cascade``). On top,
sharded-orm makes ``metadata.create_all`` create the parent first (Spanner refuses a child
whose parent does not exist yet) and checks, before any DDL is sent, that the parent's
key is a prefix of the child's, which Spanner requires. Other dialects have no
interleaving: the tables are created as plain tables.

Both are per-table listeners that ``interleave_in`` hands to the ``Table`` (its
``listeners`` keyword): a table that is not interleaved is never looked at, and nothing
is written into any ``info`` dict.
"""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy import Index, MetaData, Table, event

from sharded_orm.checks import check_spanner_name
from sharded_orm.errors import ShardConfigError, ShardTypeError

#: metadata -> parent name -> children attached before their parent (weakly held)
_pending: weakref.WeakKeyDictionary[MetaData, dict[str, list[Table]]] = weakref.WeakKeyDictionary()


def interleave_in(parent: str | Table | Any, *, on_delete_cascade: bool = False) -> dict[str, Any]:
    """Table keywords interleaving a table in ``parent`` (a name, Table or mapped class)."""
    if not isinstance(on_delete_cascade, bool):
        raise ShardTypeError(f"on_delete_cascade must be a bool, got {on_delete_cascade!r}")
    name = parent if isinstance(parent, str) else getattr(parent, "__tablename__", None)
    if name is None:
        name = getattr(parent, "name", None)
    if not isinstance(name, str) or not name:
        raise ShardTypeError(
            f"interleave parent must be a table name, Table or model, got {parent!r}"
        )
    check_spanner_name(name, "interleave parent")
    kw: dict[str, Any] = {
        "spanner_interleave_in": name,
        "listeners": [
            ("after_parent_attach", _order_interleaved),
            ("before_create", _check_interleaved),
        ],
    }
    if on_delete_cascade:
        kw["spanner_interleave_on_delete_cascade"] = True
    return kw


def parent_of(table: Table | Index) -> str | None:
    """The name a table (or index) is interleaved in, from its spanner options."""
    # Membership first: looking up a dialect's options loads the dialect, and this runs
    # for every Table anyone defines (some while a dialect module is being imported).
    if "spanner" not in table.dialect_options:
        return None
    parent = table.dialect_options["spanner"].get("interleave_in")
    return parent if isinstance(parent, str) else None


def check_key_prefix(child: Table, parent: Table) -> None:
    """Spanner's rule: the parent's primary key is a prefix of the child's."""
    pk = [(c.name, c.type.compile() if c.type else None) for c in parent.primary_key.columns]
    child_pk = [(c.name, c.type.compile() if c.type else None) for c in child.primary_key.columns]
    if child_pk[: len(pk)] != pk:
        raise ShardConfigError(
            f"table {child.name!r} is interleaved in {parent.name!r}, but the parent's key "
            f"({', '.join(n for n, _ in pk)}) is not a prefix of the child's key "
            f"({', '.join(n for n, _ in child_pk)}). Start the child's key with the parent's "
            "key columns, same names and types, in the same order."
        )


def _order_interleaved(table: Table, parent: Any) -> None:
    """The child is created after its parent: a dependency for ``create_all`` and
    ``sorted_tables`` (Spanner refuses a child whose parent does not exist yet)."""
    if not isinstance(parent, MetaData):
        return
    parent_name = parent_of(table)
    if parent_name is None:
        return
    parent_table = parent.tables.get(parent_name)
    if parent_table is not None:
        table.add_is_dependent_on(parent_table)
        return
    # the parent is declared further down: wait for it, listening only while a child waits
    waiting = _pending.setdefault(parent, {})
    waiting.setdefault(parent_name, []).append(table)
    if not event.contains(Table, "after_parent_attach", _parent_arrived):
        event.listen(Table, "after_parent_attach", _parent_arrived)


def _parent_arrived(table: Table, parent: Any) -> None:
    waiting = _pending.get(parent) if isinstance(parent, MetaData) else None
    if waiting:
        for child in waiting.pop(table.name, []):
            child.add_is_dependent_on(table)
        if not waiting:
            del _pending[parent]


def check_index_prefix(index: Any, parent: Table) -> None:
    """Spanner's rule for an interleaved index: it starts with the parent's key."""
    pk = [c.name for c in parent.primary_key.columns]
    lead = [c.name for c in list(index.columns)[: len(pk)]]
    if lead != pk:
        raise ShardConfigError(
            f"index {index.name!r} is interleaved in {parent.name!r}, so Spanner requires it to "
            f"start with the parent's key ({', '.join(pk)}), but it starts with "
            f"({', '.join(lead)}). Interleave it only in a parent keyed by its leading "
            "columns (for a ShardedIndex: the shard column first), or drop interleave_in."
        )


def check_before_create(table: Table) -> None:
    """Check ``table``'s interleaved indexes before it is created (``ShardedIndex``)."""
    if not event.contains(table, "before_create", _check_interleaved):
        event.listen(table, "before_create", _check_interleaved)


def _check_interleaved(table: Table, connection: Any, **kw: Any) -> None:
    tables = table.metadata.tables
    parent_name = parent_of(table)
    if parent_name is not None and parent_name in tables:
        check_key_prefix(table, tables[parent_name])
    for index in table.indexes:
        index_parent = parent_of(index)
        if index_parent is not None and index_parent in tables:
            check_index_prefix(index, tables[index_parent])
