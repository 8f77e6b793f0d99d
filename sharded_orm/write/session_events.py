"""The identity map stays truthful after an ORM-enabled UPDATE that changes a source.

``session.execute(update(Model).where(...).values(ts=...))`` with ``synchronize_session``
'auto', 'evaluate' or 'fetch' writes the new source into the objects already loaded, but
not the shard the engine hook added to the statement. A ``do_orm_execute`` listener runs
the statement and then recomputes, from their committed sources, the shard of every
loaded object of that mapper whose sources and shard are loaded and not pending a change.
"""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import instance_dict, instance_state, set_committed_value

from sharded_orm.errors import ShardingError
from sharded_orm.write.engine_hook import watch
from sharded_orm.write.orm_events import Plan, mapper_plans

_plans: weakref.WeakKeyDictionary[Any, list[Plan]] = weakref.WeakKeyDictionary()


def _plans_of(mapper: Any) -> list[Plan]:
    hit = _plans.get(mapper)
    if hit is None:
        hit = _plans[mapper] = mapper_plans(mapper)
    return hit


def _resync(session: Session, mapper: Any, plans: list[Plan]) -> None:
    cls = mapper.class_
    for obj in list(session.identity_map.values()):
        if not isinstance(obj, cls):
            continue
        d = instance_dict(obj)
        state = instance_state(obj)
        for sc, shard_attr, source_attrs in plans:
            if shard_attr not in d or any(a not in d for a in source_attrs):
                continue
            if any(state.attrs[a].history.has_changes() for a in (*source_attrs, shard_attr)):
                continue  # a pending change: the flush will compute it
            values = [d[a] for a in source_attrs]
            try:
                send = sc.values_to_send(values)
                shard = sc.compute(send)
            except ShardingError:
                continue
            for attr, v, stored in zip(source_attrs, values, send, strict=True):
                if stored is not v:  # 'evaluate' copied the given value: keep what is stored
                    set_committed_value(obj, attr, stored)
            if d[shard_attr] != shard:
                set_committed_value(obj, shard_attr, shard)


def _do_orm_execute(orm_execute_state: Any) -> Any:
    if not (orm_execute_state.is_update or orm_execute_state.is_insert):
        return None
    mapper = orm_execute_state.bind_mapper
    if mapper is None:
        return None
    plans = _plans_of(mapper)
    if not plans:
        return None
    # an ORM bulk INSERT/UPDATE runs no mapper event: its engine must be watched now
    watch(orm_execute_state.session.get_bind(mapper=mapper))
    if not orm_execute_state.is_update:
        return None
    result = orm_execute_state.invoke_statement()
    _resync(orm_execute_state.session, mapper, plans)
    return result


event.listen(Session, "do_orm_execute", _do_orm_execute)
