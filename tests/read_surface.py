"""SQLAlchemy's public settings that reach a sharded read, each with the values SQLAlchemy
documents: the input space of the read-surface oracle (``test_read_surface.py``).

Every dimension is a list of ``(name, value)``; the oracle draws one entry of each and
asserts that ``merged()`` and every ``page()`` give the unsharded statement's rows (and,
for eager loads, the same loaded attributes), or refuse with a ``ShardingError`` that says
what to do. Adding a SQLAlchemy setting is one more entry here.

A value is data, not a callable, where it can be: the oracle turns names into options
against the model it builds for the example (``make_option`` and friends below).
"""

from __future__ import annotations

from typing import Any

#: ``relationship(lazy=...)`` for the many-to-one ``Ev.owner``: every strategy SQLAlchemy
#: documents for a scalar relationship ("dynamic" and "write_only" are collection-only).
MANY_TO_ONE_LAZY = ["select", "joined", "subquery", "selectin", "immediate", "raise", "noload"]

#: ``relationship(lazy=...)`` for the one-to-many ``Ev.tags`` (a collection)
COLLECTION_LAZY = [
    "select",
    "joined",
    "subquery",
    "selectin",
    "immediate",
    "raise",
    "noload",
    "write_only",
    "dynamic",
]

#: ``relationship(innerjoin=...)`` on the many-to-one (acts with lazy="joined" only)
MAPPER_INNERJOIN = [False, True, "unnested"]

#: loader options on the statement, by name (built by ``make_option``)
LOADER_OPTIONS = [
    "none",
    "joinedload(owner)",
    "joinedload(owner, innerjoin=True)",
    "joinedload(tags)",
    "joinedload(tags, innerjoin=True)",
    "selectinload(owner)",
    "selectinload(tags)",
    "subqueryload(tags)",
    "immediateload(owner)",
    "lazyload(owner)",
    "noload(tags)",
    "raiseload(*)",
    "lazyload(*)",
    "defer(score)",
    "undefer(score)",
    "load_only(ts, tenant)",
    "with_loader_criteria(Ev, tenant != 99)",
    "with_loader_criteria(Ev, tenant in 400 values)",
    "with_loader_criteria(Owner, include_aliases)",
    "with_loader_criteria(Ev, propagate_to_loaders=False)",
]

#: the statement's execution options, by name (built by ``make_execution_options``);
#: "tenant" is an application key that a ``do_orm_execute`` listener reads to add a
#: tenant filter, as multi-tenant apps do
EXECUTION_OPTIONS = [
    "none",
    "populate_existing",
    "yield_per",
    "stream_results",
    "schema_translate_map",
    "tenant",
    "autoflush=False",
    "max_row_buffer",
]

#: how the Session finds its bind
SESSION_BINDS = ["bind", "binds per mapper", "binds per base", "binds per table"]

#: how the WHERE clause pins the boolean ``active`` of the index (active, ts DESC)
BOOLEAN_PINS = [
    "none",
    "== True",
    ".is_(True)",
    "== true()",
    "bare",
    "== False",
    "~",
    ".is_(False)",
]

#: what is called
CALLS = ["merged", "page"]


def dimensions() -> dict[str, list[Any]]:
    """Each dimension by name, for the closing figures and the test ids."""
    return {
        "many_to_one_lazy": MANY_TO_ONE_LAZY,
        "collection_lazy": COLLECTION_LAZY,
        "mapper_innerjoin": MAPPER_INNERJOIN,
        "loader_option": LOADER_OPTIONS,
        "execution_option": EXECUTION_OPTIONS,
        "session_binds": SESSION_BINDS,
        "boolean_pin": BOOLEAN_PINS,
        "call": CALLS,
    }
