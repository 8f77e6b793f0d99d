"""The identity map stays truthful after an ORM-enabled UPDATE that changes a source.

``session.execute(update(Model).where(...).values(ts=...))`` with ``synchronize_session``
'auto', 'evaluate' or 'fetch', and the ORM bulk UPDATE by primary key, write the new
source into the objects already loaded that the statement matched, but not the shard the
engine hook added to the statement. SQLAlchemy tells each of those objects, and only
those, with the instance ``refresh`` event (the attributes it set): a listener on each
sharded mapper recomputes, from its committed sources, the shard of such an object whose
sources and shard are loaded and not pending a change. No other object is looked at, and
no statement pays anything per object the session holds.

A ``do_orm_execute`` listener watches the engine of an ORM bulk INSERT or UPDATE of a
sharded model (those run no mapper event).
"""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Mapper, Session
from sqlalchemy.orm.attributes import instance_state, set_committed_value

from sharded_orm.errors import ShardingError
from sharded_orm.write.attr_events import Plan, mapper_plans, sharded_tables
from sharded_orm.write.engine_hook import watch

_plans: weakref.WeakKeyDictionary[Any, list[Plan]] = weakref.WeakKeyDictionary()


def _plans_of(mapper: Any) -> list[Plan]:
    hit = _plans.get(mapper)
    if hit is None:
        hit = _plans[mapper] = mapper_plans(mapper)
    return hit


def _refresher(plans: list[Plan]) -> Any:
    sources = frozenset(a for _, _, source_attrs in plans for a in source_attrs)

    def on_refresh(target: Any, context: Any, attrs: Any) -> None:
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


def _install_refresher(mapper: Mapper[Any], class_: Any) -> None:
    """On each mapper with a sharded table (a subclass's plans include its parents')."""
    if sharded_tables(mapper):
        event.listen(mapper, "refresh", _refresher(_plans_of(mapper)))


def _do_orm_execute(orm_execute_state: Any) -> None:
    if not (orm_execute_state.is_update or orm_execute_state.is_insert):
        return
    mapper = orm_execute_state.bind_mapper
    if mapper is None or not _plans_of(mapper):
        return
    # an ORM bulk INSERT/UPDATE runs no mapper event: its engine must be watched now
    watch(orm_execute_state.session.get_bind(mapper=mapper))


event.listen(Mapper, "mapper_configured", _install_refresher)
event.listen(Session, "do_orm_execute", _do_orm_execute)
