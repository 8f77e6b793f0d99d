"""Attribute events of sharded mappers, and the plans the unit-of-work events follow.

* On every client-computed shard attribute, a ``set`` listener marks the value the caller
  sets (``given_mark_key``): that value is the caller's, checked at flush, never replaced.
* On each source of a shard in the primary key, a ``set`` listener derives the shard of a
  new object as soon as every source is known (``session.merge()`` and the identity map
  key the object by it); a source change the session discards (``expire``, ``refresh``)
  takes the key shard it derived back with it. Other shards have no source listener:
  building objects costs nothing.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, event
from sqlalchemy.orm import LoaderCallableStatus, Mapper, attributes
from sqlalchemy.orm.attributes import set_committed_value

from sharded_orm.errors import ShardingError
from sharded_orm.schema.columns import ShardColumn, is_shard_column, shard_columns
from sharded_orm.write.fastpath import IMMUTABLE_SOURCE_TYPES, derived_mark_key, given_mark_key

Plan = tuple[ShardColumn, str, tuple[str, ...]]


def sharded_tables(mapper: Mapper[Any]) -> list[Table]:
    return [
        t
        for t in mapper.tables
        if isinstance(t, Table) and any(is_shard_column(c) for c in t.columns)
    ]


def mapper_plans(mapper: Mapper[Any]) -> list[Plan]:
    """``(shard column, shard attribute, source attributes)`` for each shard of the mapper."""
    plans = []
    for table in sharded_tables(mapper):
        for sc in shard_columns(table):
            shard_attr = mapper.get_property_by_column(sc.column).key
            source_attrs = tuple(mapper.get_property_by_column(c).key for c in sc.sources)
            plans.append((sc, shard_attr, source_attrs))
    return plans


_NO: Any = object()


def is_given(d: dict[str, Any], shard_attr: str, mark: str) -> bool:
    """Whether the shard value ``d`` holds is the one the caller set (``given_mark_key``)."""
    value = d.get(shard_attr)
    return value is not None and d.get(mark, _NO) == value


def install_source_listeners(mapper: Mapper[Any]) -> None:
    """The ``set`` listeners of a mapper's shards: on every client-computed shard
    attribute, one that marks the value the caller sets (``given_mark_key``); on each
    source of a shard in the primary key, one that derives the shard of a new object as soon
    as every source is known (``session.merge()`` keys it by its attributes). A
    source change the session discards (``expire``, ``refresh``) takes the key shard it
    derived back with it. Other shards are derived at flush, from what it sends."""
    pk_cols = {c for t in mapper.tables for c in t.primary_key}
    restore: list[tuple[str, tuple[str, ...]]] = []
    for sc, shard_attr, source_attrs in mapper_plans(mapper):
        if sc.server_side:
            continue
        event.listen(
            mapper.class_manager[shard_attr],
            "set",
            _given_marker(given_mark_key(shard_attr)),
            propagate=True,
            raw=True,
        )
        if sc.column not in pk_cols:
            continue
        restore.append((shard_attr, source_attrs))
        for attr in source_attrs:
            event.listen(
                mapper.class_manager[attr],
                "set",
                _source_setter(sc, shard_attr, source_attrs, attr),
                propagate=True,
                raw=True,
            )
    if restore:
        event.listen(mapper, "expire", _shard_restorer(restore), propagate=True)


def _given_marker(mark: str) -> Any:
    def on_set(state: Any, value: Any, oldvalue: Any, initiator: Any) -> None:
        if value is None:
            state.dict.pop(mark, None)
        else:
            state.dict[mark] = value

    return on_set


def _shard_restorer(plans: list[tuple[str, tuple[str, ...]]]) -> Any:
    def on_expire(target: Any, attrs: Any) -> None:
        if attrs is None:
            return  # everything expired, the shard too
        state = attributes.instance_state(target)
        for shard_attr, source_attrs in plans:
            if shard_attr in attrs or not any(a in attrs for a in source_attrs):
                continue
            committed = state.committed_state.get(shard_attr, LoaderCallableStatus.NO_VALUE)
            state.dict.pop(derived_mark_key(shard_attr), None)
            if committed is LoaderCallableStatus.NO_VALUE:
                continue  # the shard has no pending change
            set_committed_value(target, shard_attr, committed)

    return on_expire


def _source_setter(sc: ShardColumn, shard_attr: str, source_attrs: tuple[str, ...], me: str) -> Any:
    others = [a for a in source_attrs if a != me]
    mark = given_mark_key(shard_attr)

    def on_set(state: Any, value: Any, oldvalue: Any, initiator: Any) -> None:
        if state.key is not None:
            # a row's object: merge() and the identity map know it by its stored key, and
            # the flush moves the key (before_update); setting the shard here could load
            # expired attributes, and that autoflush
            return
        d = state.dict
        for a in others:
            if a not in d:
                return  # not all known yet: the flush computes it
        values = [value if a == me else d[a] for a in source_attrs]
        try:
            new = sc.compute(values)
        except (ShardingError, TypeError, ValueError):
            return  # not hashable: the flush refuses it with the precise error
        if is_given(d, shard_attr, mark):
            return  # the caller's: the flush checks it
        if d.get(shard_attr) != new:
            d[shard_attr] = new  # a new object's INSERT is built from its dict
        _mark_derived(d, sc, shard_attr, values, new)

    return on_set


def _mark_derived(
    d: dict[str, Any], sc: ShardColumn, shard_attr: str, values: list[Any], shard: int
) -> None:
    """Remember that these very source objects hash to ``shard`` (``derived_mark_key``), so
    the flush need not hash them again. A fact about the values, not about the shard
    attribute (the flush still compares that); kept only for immutable values already in
    their stored form, where ``is`` at flush proves nothing changed."""
    key = derived_mark_key(shard_attr)
    if all(type(v) in IMMUTABLE_SOURCE_TYPES for v in values) and all(
        s is v for s, v in zip(sc.values_to_send(values), values, strict=True)
    ):
        d[key] = (shard, *values)
    else:
        d.pop(key, None)
