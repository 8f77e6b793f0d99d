"""Unit-of-work events: the shard follows the object, computed from what the flush sends.

A shard value an object holds is the caller's only while it is the value the caller set
on the shard attribute (``given_mark_key``: a mark in the instance's ``__dict__``, set by
the shard attribute's ``set`` event, so it travels with the object through rollback,
expunge, ``make_transient`` and re-adding); any other value (one an earlier flush derived
and then rolled back, a loaded row's, one ``merge`` copied from a stale object) is derived
again from the sources. A caller's shard is checked, never replaced.

* ``before_insert`` computes the shards of a new object (evaluating and storing Python
  defaults of the sources) and records the row (``sharded_orm.write.trust``), so the
  engine hook accepts it without hashing it again. When a listener that runs later (an
  application's own ``before_insert`` that normalises a source) changes a source, the hook
  computes the derived shard again from the row it sends and writes it back here.
* ``before_update`` evaluates a source's Python ``onupdate`` (so the value stored is the
  value hashed). A changed source leaves a derived shard to the engine hook, which
  computes it from the UPDATE's row (the other sources read from the stored row, one
  SELECT per batch: ``sharded_orm.write.stored``) and writes it back to the object; so a
  later listener's change is hashed too, and the object holds what the row holds.
* A shard in the primary key is needed before the flush (``session.merge()`` and the
  identity map key the object by it): a ``set`` listener on each of its sources derives it
  as soon as every source is known. Other shards have no source listener: building
  objects costs nothing.

Events are installed on every mapper whose tables include a sharded one, sub-mappers of
joined and single inheritance included, when SQLAlchemy configures it.
"""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy import Table, event
from sqlalchemy.orm import EXT_CONTINUE, LoaderCallableStatus, Mapper, attributes
from sqlalchemy.orm.attributes import instance_dict, set_committed_value

from sharded_orm.errors import ShardingError
from sharded_orm.schema.columns import ShardColumn, is_shard_column, shard_columns
from sharded_orm.write.engine_hook import watch
from sharded_orm.write.fastpath import (
    IMMUTABLE_SOURCE_TYPES,
    derived_mark_key,
    given_mark_key,
    object_filler,
)
from sharded_orm.write.rows import mismatch
from sharded_orm.write.sql import MISSING, evaluate_default, evaluate_onupdate
from sharded_orm.write.trust import Tally, expect_update, forget

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


def _record_keys(
    mapper: Mapper[Any], plans: list[Plan]
) -> list[tuple[int, tuple[tuple[str, str], ...]]]:
    """Per sharded table: (attribute, column key) of each shard and source it holds."""
    out: dict[int, list[tuple[str, str]]] = {}
    for sc, shard_attr, source_attrs in plans:
        keys = out.setdefault(id(sc.column.table), [])
        for attr, col in ((shard_attr, sc.column), *zip(source_attrs, sc.sources, strict=True)):
            if col.table is sc.column.table and (attr, col.key) not in keys:
                keys.append((attr, col.key))
    return [(t, tuple(keys)) for t, keys in out.items()]


_NO: Any = object()


def is_given(d: dict[str, Any], shard_attr: str, mark: str) -> bool:
    """Whether the shard value ``d`` holds is the one the caller set (``given_mark_key``)."""
    value = d.get(shard_attr)
    return value is not None and d.get(mark, _NO) == value


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
    # per shard: (attribute, given mark, (column key, attribute)) and all of them derived
    marks = [(attr, given_mark_key(attr), (sc.key, attr)) for sc, attr, _ in plans]
    all_derived = tuple(m[2] for m in marks)
    # per shard: its plan, given mark, whether it is a key column, and the attributes of
    # its table's primary key (in the table's order: what the UPDATE's WHERE names)
    update_plans = [
        (
            sc,
            attr,
            source_attrs,
            given_mark_key(attr),
            sc.column in pk_cols,
            _key_positions(mapper, sc.column.table),
        )
        for sc, attr, source_attrs in plans
    ]

    add = Tally(watch).add

    def before_insert(mapper_: Any, connection: Any, state: Any) -> Any:
        d = state.dict
        derived = all_derived
        for attr, mark, entry in marks:
            value = d.get(attr)
            if value is not None:
                if d.get(mark, _NO) == value:  # the caller's: checked, never replaced
                    derived = tuple(e for e in derived if e is not entry)
                else:  # an earlier derivation (rolled back, loaded, copied): again
                    d[attr] = None
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
            add(
                connection,
                cache,
                table,
                (tuple([(key, d.get(attr)) for attr, key in keys]), d, keys, derived),
            )
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

    seen: list[Any] = [None]  # a weak reference to the connection last watched

    def before_update(mapper_: Any, connection: Any, state: Any) -> None:
        last = seen[0]
        if last is None or last() is not connection:
            watch(connection)
            seen[0] = weakref.ref(connection)
        if onupdate:
            target = state.obj()
            _apply_onupdate(state, target, onupdate, [p.key for p in mapper_.column_attrs])
        d = state.dict
        committed = state.committed_state
        for sc, shard_attr, source_attrs, mark, in_pk, pk_attrs in update_plans:
            # set since loaded (perhaps to an equal value: then the row does not send it,
            # and the hook has nothing to compute)
            changed = [a for a in source_attrs if a in committed]
            shard_set = shard_attr in committed and state.attrs[shard_attr].history.has_changes()
            if not changed and not shard_set:
                continue
            if shard_set and is_given(d, shard_attr, mark):
                given = d[shard_attr]
                if not (changed and _was_derived(sc, state, source_attrs, given)):
                    continue  # the caller's: the engine hook checks it with the sources sent
            # derived: from the object's sources (a key shard, which the identity map needs
            # now), or by the engine hook from the row the UPDATE sends
            target = state.obj()
            if in_pk:
                _derive_key_shard(sc, state, target, shard_attr, source_attrs)
                if pk_attrs:  # computed again by the hook if a later listener changes a source
                    expect_update(
                        connection,
                        mapper_.base_mapper._compiled_cache,
                        sc.column.table,
                        tuple([state.key[1][i] for i in pk_attrs]),
                        (d, shard_attr, sc.key, True),
                    )
                continue
            if shard_set:  # copied (merge) or left by a key listener: not sent as given
                old = committed.get(shard_attr, _NO)
                set_committed_value(target, shard_attr, None if old is _NO else old)
            if changed:
                _keep_stored_form(sc, d, target, source_attrs)
            if changed and pk_attrs:
                expect_update(
                    connection,
                    mapper_.base_mapper._compiled_cache,
                    sc.column.table,
                    tuple([state.key[1][i] for i in pk_attrs]),
                    (d, shard_attr, sc.key, False),
                )

    # raw and retval: SQLAlchemy calls it directly, with no wrapper, once per object
    event.listen(mapper, "before_insert", before_insert, raw=True, retval=True)
    event.listen(mapper, "before_update", before_update, raw=True)


def _keep_stored_form(
    sc: ShardColumn,
    d: dict[str, Any],
    target: Any,
    source_attrs: tuple[str, ...],
) -> None:
    """The sources are sent, and kept on the object, in the form their column stores (an
    IntEnum member as its int), as a reload would give them; one set to a value equal to
    the stored one (2 -> Level.HIGH) is no change the UPDATE sends, and is kept as 2."""
    for i, attr in enumerate(source_attrs):
        if attr in d and sc.sends and sc.sends[i]:
            value = d.get(attr)
            try:
                stored = sc.coercers[i](value)
            except (ShardingError, TypeError, ValueError):
                continue  # the engine hook refuses it with the precise error
            if stored is not value:
                setattr(target, attr, stored)


def _key_positions(mapper: Mapper[Any], table: Any) -> tuple[int, ...]:
    """Where each column of ``table``'s primary key (in the table's order: what the
    UPDATE's WHERE names) is in the object's identity key, which holds the stored key
    whether loaded or expired: the column itself, or under joined inheritance the parent's
    key column it refers to."""
    mapper_pk = list(mapper.primary_key)
    out = []
    for c in table.primary_key:
        targets = [c, *(fk.column for fk in c.foreign_keys)]
        found = [i for i, m in enumerate(mapper_pk) if any(m is t for t in targets)]
        if not found:  # not mapped as SQLAlchemy maps keys: no write-back by key
            return ()
        out.append(found[0])
    return tuple(out)


def _derive_key_shard(
    sc: ShardColumn, state: Any, target: Any, shard_attr: str, source_attrs: tuple[str, ...]
) -> None:
    """A shard in the primary key, from the object's sources, set with its history (the
    UPDATE moves the row's key: SQLite and others; Spanner refuses it in the hook)."""
    values = [getattr(target, a) for a in source_attrs]
    send = sc.values_to_send(values)
    for attr, v, stored in zip(source_attrs, values, send, strict=True):
        if stored is not v:
            setattr(target, attr, stored)  # sent and kept in its stored form
    shard = sc.compute(send)
    if getattr(target, shard_attr) != shard:
        setattr(target, shard_attr, shard)
        state.dict.pop(given_mark_key(shard_attr), None)  # the library's, not the caller's


def _was_derived(sc: ShardColumn, state: Any, source_attrs: tuple[str, ...], given: Any) -> bool:
    """True when the shard's new value is what the old sources hash to: ``merge`` copied it
    from an object whose sources changed after it was derived, not chosen by the caller."""
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
