"""The Session side of the write path: identity-map resync, and the engines to watch.

``session.execute(update(Model).where(...).values(ts=...))`` with ``synchronize_session``
'auto', 'evaluate' or 'fetch', and the ORM bulk UPDATE by primary key, write the new
source into the objects already loaded that the statement matched, but not the shard the
engine hook added to the statement. SQLAlchemy tells each of those objects, and only
those, with the instance ``refresh`` event (the attributes it set): a listener on each
sharded mapper recomputes, from its committed sources, the shard of such an object whose
sources and shard are loaded and not pending a change. No other object is looked at, and
no statement pays anything per object the session holds.

An ORM bulk INSERT or UPDATE of a sharded model runs no mapper event, so its engine must
already be watched for the engine hook to see it. An engine is watched when it creates a
sharded table, flushes a sharded object, is a Spanner engine, or is given to ``watch``;
the one case left is a process whose engine meets tables that already exist (created by
a migration, or another process). So once a sharded mapper is configured, a Session
``after_begin`` listener (once per transaction and connection, never per statement)
looks, the first time an unwatched engine begins a Session transaction, for a sharded
table in its database (one ``get_table_names`` per schema, on the dialects that answer
it without side effects; any other dialect's engine is watched), and watches the engine
if it holds one. An engine that holds none is not asked again until another sharded table
is declared, and pays nothing per statement. An app with no sharded model installs no
Session listener at all.
"""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Mapper, Session
from sqlalchemy.orm.attributes import instance_state, set_committed_value

from sharded_orm.errors import ShardingError
from sharded_orm.schema.registry import declared_names, registrations
from sharded_orm.write.engine_hook import is_watched, root_engine, watch
from sharded_orm.write.orm_events import Plan, mapper_plans, sharded_tables

_plans: weakref.WeakKeyDictionary[Any, list[Plan]] = weakref.WeakKeyDictionary()


def _plans_of(mapper: Any) -> list[Plan]:
    hit = _plans.get(mapper)
    if hit is None:
        hit = _plans[mapper] = mapper_plans(mapper)
    return hit


def _refresher(plans: list[Plan]) -> Any:
    sources = frozenset(a for _, _, source_attrs in plans for a in source_attrs)
    # per shard: its sources an UPDATE rewrites (onupdate=), by attribute
    rewritten = [
        (
            shard_attr,
            [a for a, c in zip(source_attrs, sc.sources, strict=True) if c.onupdate is not None],
        )
        for sc, shard_attr, source_attrs in plans
    ]
    rewritten = [(shard_attr, attrs) for shard_attr, attrs in rewritten if attrs]

    def on_refresh(target: Any, context: Any, attrs: Any) -> None:
        if context is None and rewritten:  # an ORM UPDATE statement matched the object
            _expire_rewritten(target, attrs or (), rewritten)
        if not attrs or sources.isdisjoint(attrs):
            return  # a full load (attrs None: shard and sources read together) or no source
        state = instance_state(target)
        d = state.dict
        for sc, shard_attr, source_attrs in plans:
            if shard_attr in attrs or shard_attr not in d:
                continue  # the shard was read with them, or is not loaded
            if any(a not in d for a in source_attrs) or not any(a in attrs for a in source_attrs):
                continue
            if any(a in state.committed_state for a in (*source_attrs, shard_attr)):
                continue  # a pending change: the flush will compute it
            values = [d[a] for a in source_attrs]
            try:
                send = sc.values_to_send(values)
                shard = sc.compute(send)
            except ShardingError:
                continue
            for attr, v, stored in zip(source_attrs, values, send, strict=True):
                if stored is not v:  # 'evaluate' copied the given value: keep what is stored
                    set_committed_value(target, attr, stored)
            if d[shard_attr] != shard:
                set_committed_value(target, shard_attr, shard)

    return on_refresh


def _expire_rewritten(target: Any, attrs: Any, rewritten: list[tuple[str, list[str]]]) -> None:
    """An ORM UPDATE statement (``synchronize_session``) matched the object: the sources
    it rewrote by their ``onupdate`` (which the engine hook evaluated and sent, so
    SQLAlchemy does not copy them to the object as it copies its own) and their shard are
    expired, loaded from the row when next read, as SQLAlchemy expires what the database
    computed."""
    state = instance_state(target)
    stale: set[str] = set()
    for shard_attr, onupdate_attrs in rewritten:
        missed = [a for a in onupdate_attrs if a not in attrs]
        if missed:
            stale.update(missed)
            stale.add(shard_attr)
    stale.difference_update(state.committed_state)  # a pending change: the flush's
    loaded = [a for a in stale if a in state.dict]
    session = state.session
    if loaded and session is not None:  # (an empty list would expire every attribute)
        session.expire(target, loaded)


def _install_refresher(mapper: Mapper[Any], class_: Any) -> None:
    """On each mapper with a sharded table (a subclass's plans include its parents');
    the first one installs the Session listener."""
    if sharded_tables(mapper):
        event.listen(mapper, "refresh", _refresher(_plans_of(mapper)))
        if not event.contains(Session, "after_begin", _after_begin):
            event.listen(Session, "after_begin", _after_begin)


#: The dialects whose ``get_table_names`` is a plain catalog read (no side effect, no
#: error in a healthy transaction); an engine of any other dialect is watched.
ASKED_DIALECTS = frozenset({"sqlite", "postgresql", "mysql", "mariadb", "mssql", "oracle"})

#: engine -> the registrations() its database was last found to hold no sharded table at
_clean: weakref.WeakKeyDictionary[Engine, int] = weakref.WeakKeyDictionary()


def _after_begin(session: Any, transaction: Any, connection: Any) -> None:
    engine = root_engine(connection)
    seen = _clean.get(engine)
    if seen is not None and seen == registrations():
        return  # asked already: its database holds no sharded table
    if is_watched(engine):
        return
    if holds_sharded_table(connection):
        watch(connection)
    else:
        _clean[engine] = registrations()


def holds_sharded_table(connection: Any) -> bool:
    """Whether the database of ``connection`` holds a table named as a declared sharded
    table (case-insensitively: a near miss errs on the side of watching); True for a
    dialect not in :data:`ASKED_DIALECTS`. A table declared in a schema the database does
    not have is looked for in its default schema (where a ``schema_translate_map`` puts
    it), not taken as a sign that every engine may write it."""
    dialect = connection.dialect
    if dialect.name not in ASKED_DIALECTS:
        return True
    declared = declared_names()
    named = {s for s in declared if s is not None}
    if named:
        try:
            present = set(dialect.get_schema_names(connection))
        except Exception:  # noqa: BLE001 -- unknown to the catalog: watch rather than guess
            return True
    # a schema this database does not have holds nothing here by that name; a
    # schema_translate_map may put its tables in the default schema, so look there
    wanted: dict[str | None, set[str]] = {}
    for schema, names in declared.items():
        where = schema if schema is None or schema in present else None
        wanted.setdefault(where, set()).update(names)
    for schema, names in wanted.items():
        try:
            held = dialect.get_table_names(connection, schema=schema)
        except Exception:  # noqa: BLE001 -- unknown to the catalog: watch rather than guess
            return True
        if any(h.lower() in names for h in held):
            return True
    return False


event.listen(Mapper, "mapper_configured", _install_refresher)
