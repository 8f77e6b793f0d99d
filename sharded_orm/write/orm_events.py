"""Unit-of-work events: the shard is computed once per row, at the cheapest correct moment.

* ``before_insert`` computes the shard of a new object (evaluating and storing Python
  defaults of the sources) and counts the row (``sharded_orm.write.trust``), so the engine
  hook accepts it without hashing it again. Building objects hashes nothing.
* A ``set`` listener on each source attribute recomputes the shard where it is needed
  before the flush: on an object with a row (persistent or detached: its loaded shard
  would otherwise be stale, e.g. for ``bulk_save_objects``), and on any object when the
  shard is in the primary key (``session.merge()`` and the identity map key the object by
  it). A shard the caller set by hand is left alone and checked at flush. A source change
  the session discards (``expire``, ``refresh``) takes the derived shard back with it.
* ``before_update`` evaluates a source's Python ``onupdate`` (so the value stored is the
  value hashed) and recomputes the shard when a source changed. It sends only the changed
  columns, as SQLAlchemy does: when some sources are unchanged, the shard is left to the
  engine hook, which computes it from the stored row in the same transaction (the
  object's in-memory copy of the other sources may be stale).

Events are installed on every mapper whose tables include a sharded one, sub-mappers of
joined and single inheritance included, when SQLAlchemy configures it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, event
from sqlalchemy.orm import EXT_CONTINUE, LoaderCallableStatus, Mapper, attributes
from sqlalchemy.orm.attributes import instance_dict, set_committed_value

from sharded_orm.errors import ShardingError
from sharded_orm.schema.columns import ShardColumn, is_shard_column, shard_columns
from sharded_orm.write.engine_hook import watch
from sharded_orm.write.fastpath import IMMUTABLE_SOURCE_TYPES, derived_mark_key, object_filler
from sharded_orm.write.rows import mismatch
from sharded_orm.write.sql import MISSING, evaluate_default, evaluate_onupdate
from sharded_orm.write.trust import Tally, forget

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


def _insert_values(
    sc: ShardColumn, source_attrs: tuple[str, ...], target: Any, d: Any
) -> list[Any]:
    """Source values for an INSERT, evaluating (and storing) Python-side defaults."""
    values = []
    for col, attr in zip(sc.sources, source_attrs, strict=True):
        v = d.get(attr)
        if v is None:
            dv = evaluate_default(col, {a: d[a] for a in source_attrs if a in d})
            if dv is not MISSING:
                setattr(target, attr, dv)  # store exactly what we hash
                v = dv
        values.append(v)
    return values


def _record_keys(mapper: Mapper[Any], plans: list[Plan]) -> list[tuple[int, list[tuple[str, str]]]]:
    """Per sharded table: (attribute, column key) of each shard and source it holds."""
    out: dict[int, list[tuple[str, str]]] = {}
    for sc, shard_attr, source_attrs in plans:
        keys = out.setdefault(id(sc.column.table), [])
        for attr, col in ((shard_attr, sc.column), *zip(source_attrs, sc.sources, strict=True)):
            if col.table is sc.column.table and (attr, col.key) not in keys:
                keys.append((attr, col.key))
    return list(out.items())


def install_mapper_events(mapper: Mapper[Any]) -> None:
    """Attach the flush events to one mapper whose tables have shard columns.

    Reads nothing that configures mappers: it runs when SQLAlchemy configures this one."""
    plans = mapper_plans(mapper)
    pk_cols = {c for t in mapper.tables for c in t.primary_key}
    onupdate = {
        mapper.get_property_by_column(c).key: c
        for sc, _, _ in plans
        for c in sc.sources
        if c.onupdate is not None
    }

    fill = object_filler(plans)
    record_keys = _record_keys(mapper, plans)

    add = Tally(watch).add

    def before_insert(mapper_: Any, connection: Any, state: Any) -> Any:
        d = state.dict
        try:
            if not fill(d):
                _fill_slowly(state, d)
        except BaseException:
            forget(connection)
            raise
        # the flush sends its INSERT with the base mapper's statement cache as its
        # compiled_cache: the mark of the ORM's own statement (sharded_orm.write.trust)
        cache = mapper_.base_mapper._compiled_cache
        for table, keys in record_keys:
            add(connection, cache, table, tuple([(key, d.get(attr)) for attr, key in keys]))
        return EXT_CONTINUE

    def _fill_slowly(state: Any, d: Any) -> None:
        target = state.obj()
        for sc, shard_attr, source_attrs in plans:
            # unset or None: maybe a default applies (evaluated and stored)
            values = _insert_values(sc, source_attrs, target, d)
            send = sc.values_to_send(values)
            for attr, v, stored in zip(source_attrs, values, send, strict=True):
                if stored is not v:
                    d[attr] = stored  # the object holds, and the INSERT sends, what is hashed
            shard = sc.compute(send)
            given = d.get(shard_attr)
            if given is not None and given != shard:
                raise mismatch(sc, given, shard)
            # A pending object's INSERT is built from its dict: no history to keep.
            d[shard_attr] = shard

    def before_update(mapper_: Any, connection: Any, target: Any) -> None:
        watch(connection)
        state = attributes.instance_state(target)
        if onupdate:
            _apply_onupdate(state, target, onupdate, [p.key for p in mapper_.column_attrs])
        for sc, shard_attr, source_attrs in plans:
            changed = [a for a in source_attrs if state.attrs[a].history.has_changes()]
            shard_hist = state.attrs[shard_attr].history
            if not changed and not shard_hist.has_changes():
                continue
            values = [getattr(target, a) for a in source_attrs]
            send = sc.values_to_send(values)
            for attr, v, stored in zip(source_attrs, values, send, strict=True):
                if stored is not v:
                    setattr(target, attr, stored)  # sent and kept in its stored form
            shard = sc.compute(send)
            given = shard_hist.added[0] if shard_hist.added else None
            derived = (
                given is None or given == shard or _was_derived(sc, state, source_attrs, given)
            )
            if not derived:
                raise mismatch(sc, given, shard)
            unsent = [
                a
                for col, a in zip(sc.sources, source_attrs, strict=True)
                if col not in pk_cols and a not in changed
            ]
            if unsent and sc.column not in pk_cols and (given is None or given == shard):
                # Only some sources change: send only them, as SQLAlchemy does. The object
                # may hold stale values of the others, so the execution hook computes the
                # shard it sends from the stored row (read in this transaction); the object
                # keeps the shard of what it holds, with no history to send.
                set_committed_value(target, shard_attr, shard)
            elif getattr(target, shard_attr) != shard or shard_hist.has_changes():
                setattr(target, shard_attr, shard)

    # raw and retval: SQLAlchemy calls it directly, with no wrapper, once per object
    event.listen(mapper, "before_insert", before_insert, raw=True, retval=True)
    event.listen(mapper, "before_update", before_update)


def _was_derived(sc: ShardColumn, state: Any, source_attrs: tuple[str, ...], given: Any) -> bool:
    """True when the shard's new value is what the old sources hash to: it was derived by
    the set listener (or merge copied it), not chosen by the caller."""
    old = []
    for a in source_attrs:
        h = state.attrs[a].history
        old.append(h.deleted[0] if h.deleted else (h.unchanged[0] if h.unchanged else None))
    try:
        return bool(sc.compute(old) == given)
    except ShardingError:
        return False


def _apply_onupdate(
    state: Any, target: Any, onupdate: dict[str, Any], column_attrs: list[str]
) -> None:
    """Evaluate a source's Python onupdate now, when the row will be UPDATEd anyway, so
    the value SQLAlchemy would write behind the hook's back is the one hashed."""
    if not any(state.attrs[a].history.has_changes() for a in column_attrs):
        return  # no net change: the ORM sends no UPDATE, the onupdate must not fire
    d = instance_dict(target)
    for attr, col in onupdate.items():
        if not state.attrs[attr].history.has_changes():
            setattr(target, attr, evaluate_onupdate(col, dict(d)))


def install_source_listeners(mapper: Mapper[Any]) -> None:
    """Recompute the shard on the object when one of its sources is set, where it is
    needed before the flush: on an object that has a row (persistent or detached, whose
    loaded shard would otherwise be stale, e.g. for ``bulk_save_objects``), and on any
    object when the shard is in the primary key (``session.merge()`` and the identity map
    key the object by it). A new object's other shards are computed once, at flush, so
    building objects costs one early return per source set. A source change the session
    discards (``expire``, ``refresh``) takes the shard it derived back with it."""
    pk_cols = {c for t in mapper.tables for c in t.primary_key}
    restore: list[tuple[str, tuple[str, ...]]] = []
    for sc, shard_attr, source_attrs in mapper_plans(mapper):
        if sc.server_side:
            continue
        restore.append((shard_attr, source_attrs))
        eager = sc.column in pk_cols
        for attr in source_attrs:
            event.listen(
                mapper.class_manager[attr],
                "set",
                _source_setter(sc, shard_attr, source_attrs, attr, eager),
                propagate=True,
                raw=True,
            )
    if restore:
        event.listen(mapper, "expire", _shard_restorer(restore), propagate=True)


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


def _source_setter(
    sc: ShardColumn, shard_attr: str, source_attrs: tuple[str, ...], me: str, eager: bool
) -> Any:
    others = [a for a in source_attrs if a != me]

    def on_set(state: Any, value: Any, oldvalue: Any, initiator: Any) -> None:
        if state.key is None and not eager:
            return  # a new object: before_insert computes the shard once, at flush
        target = state.obj()
        d = state.dict
        for a in others:
            if a not in d:
                return  # not all known yet: the flush computes it
        values = [value if a == me else d[a] for a in source_attrs]
        try:
            new = sc.compute(values)
        except (ShardingError, TypeError, ValueError):
            return  # not hashable: the flush refuses it with the precise error
        current = d.get(shard_attr)
        if current is not None and current != new:
            try:
                old = sc.compute([oldvalue if a == me else d[a] for a in source_attrs])
            except (ShardingError, TypeError, ValueError):
                old = None
            if old == current:
                setattr(target, shard_attr, new)  # it was derived from the old sources
            # else it was set by hand, and the flush checks it
        elif current is None:
            setattr(target, shard_attr, new)
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


def _install_for_sharded_tables(mapper: Mapper[Any], class_: Any) -> None:
    """Every mapper with a sharded table fills its shards at flush."""
    tables = sharded_tables(mapper)
    if not tables:
        return
    install_mapper_events(mapper)
    parent = mapper.inherits
    if parent is None or not sharded_tables(parent):
        install_source_listeners(mapper)  # propagate=True covers the subclasses


# When SQLAlchemy configures the mapper (before its first object is made, queried or
# flushed), not when it is constructed: reading attributes then would configure every
# mapper of the registry early, before the classes a string relationship() names exist.
event.listen(Mapper, "mapper_configured", _install_for_sharded_tables)
