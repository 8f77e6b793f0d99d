"""The ORM events of sharded mappers: the shard follows the object, computed from what
the flush sends.

Attribute events mark the shard value the caller sets and derive a key shard as soon as
its sources are known; unit-of-work events prepare each object's INSERT or UPDATE so the
engine hook (``sharded_orm.write.engine_hook``) computes each row's shard once, from what
is finally sent, and the object holds what the row holds.

A shard value an object holds is the caller's only while it is the value the caller set
on the shard attribute (``given_mark_key``: a mark in the instance's ``__dict__``, set by
the shard attribute's ``set`` event, so it travels with the object through rollback,
expunge, ``make_transient`` and re-adding); any other value (one an earlier flush derived
and then rolled back, a loaded row's, one ``merge`` copied from a stale object) is derived
again from the sources. A caller's shard is checked, never replaced.

* ``before_insert`` evaluates and stores the Python defaults of the sources of a new
  object and records the object (``sharded_orm.write.trust``); the engine hook computes
  its shards once, from the row the INSERT sends (so a later listener's change, an
  application's own ``before_insert`` that normalises a source, is hashed), and writes
  them back here. A key shard, or one Spanner computes, is computed by ``before_insert``
  itself (the identity map and the INSERT's batching need it first) and recorded with
  the sources hashed: the hook reads it without hashing again unless a later listener
  changed one of them.
* ``before_update`` evaluates a source's Python ``onupdate`` (so the value stored is the
  value hashed). A changed source leaves a derived shard to the engine hook, which
  computes it from the UPDATE's row (the other sources read from the stored row, one
  SELECT per batch: ``sharded_orm.write.stored``) and writes it back to the object; so a
  later listener's change is hashed too, and the object holds what the row holds.
* The defaults and onupdates both evaluate are planned once per flush, table, kind and
  set of keys the object gives (``FlushDefaults``: built when the flush's first object
  needs them, dropped with its connection when the flush's session transaction ends),
  and evaluated for each object, seeing its own row.
* On every client-computed shard attribute, a ``set`` listener marks the value the caller
  sets (``given_mark_key``): that value is the caller's, checked at flush, never replaced.
* A shard in the primary key is needed before the flush (``session.merge()`` and the
  identity map key the object by it): a ``set`` listener on each of its sources derives it
  as soon as every source is known, and remembers which source objects it hashed, so the
  flush takes it without hashing again (``DERIVED_MARK``); a source change the session
  discards (``expire``, ``refresh``) takes the key shard it derived back with it. Other
  shards have no source listener: building objects costs nothing.

Events are installed on every mapper whose tables include a sharded one, sub-mappers of
joined and single inheritance included, when SQLAlchemy configures it.
"""

from __future__ import annotations

import datetime as _dt
import weakref
from typing import Any, cast

from sqlalchemy import Table, event
from sqlalchemy.orm import EXT_CONTINUE, LoaderCallableStatus, Mapper, Session, attributes
from sqlalchemy.orm.attributes import instance_dict, set_committed_value
from sqlalchemy.orm.exc import UnmappedColumnError
from sqlalchemy.sql import sqltypes
from sqlalchemy.sql.schema import Column

from sharded_orm.errors import ShardingError
from sharded_orm.schema.coerce import base_type
from sharded_orm.schema.columns import ShardColumn, is_shard_column, piece_kind, shard_columns
from sharded_orm.schema.pieces import PIECE_INT, PIECE_STR, PIECE_UTC_DATETIME
from sharded_orm.write.engine_hook import watch
from sharded_orm.write.fastpath import (
    IMMUTABLE_SOURCE_TYPES,
    derived_mark_key,
    given_mark_key,
    object_filler,
)
from sharded_orm.write.offsets import offsets_checked
from sharded_orm.write.row_errors import mismatch
from sharded_orm.write.sql import (
    MISSING,
    StatementDefaults,
    evaluate_default,
    evaluate_onupdate,
)
from sharded_orm.write.trust import Shape, Tally, expected, forget, hook_fills, updates_of

_NO: Any = object()

# ------------------------------------------------------------------ attribute events

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
        if is_given(d, shard_attr, mark):
            return  # the caller's: the flush checks it (hashing the sources once, then)
        values = [value if a == me else d[a] for a in source_attrs]
        try:
            new = sc.compute(values)
        except (ShardingError, TypeError, ValueError):
            return  # not hashable: the flush refuses it with the precise error
        if d.get(shard_attr) != new:
            d[shard_attr] = new  # a new object's INSERT is built from its dict
        _mark_derived(d, sc, shard_attr, values, new)

    return on_set


def _derived_from(mark: Any, values: list[Any]) -> int | None:
    """The shard ``mark`` (a ``derived_mark_key`` entry: ``(shard, *source values)``) holds
    when it was derived from these very ``values`` (``is``: immutable, so unchanged); None
    when there is no mark or it is of other values (then the caller hashes them)."""
    if mark is None or len(mark) != len(values) + 1:
        return None
    for held, v in zip(mark[1:], values, strict=True):
        if held is not v:
            return None
    shard: int = mark[0]
    return shard


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


# --------------------------------------------------------------------- flush events


class FlushDefaults:
    """The :class:`StatementDefaults` of one flush on one connection, one per table and
    kind of write (INSERT or UPDATE), built when its first object needs it: what a flush
    evaluates for an object depends on those and on the keys it gives (each
    ``StatementDefaults`` plans once per set of keys), not on the object, so a flush of
    many objects plans once per shape while each object's defaults are still evaluated
    for it, seeing its own row. :meth:`close`, when the flush's session transaction
    ends, lets go of the connection and of everything built (one still asked, by a
    flush a listener ended early, builds for that call alone: nothing is evaluated
    with another connection than the caller's)."""

    __slots__ = ("_made", "connection")

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self._made: dict[tuple[Any, bool], StatementDefaults] = {}

    def of(self, table: Any, *, isinsert: bool, connection: Any) -> StatementDefaults:
        """The ``StatementDefaults`` of ``table``'s INSERTs or UPDATEs on ``connection``
        (the flush's: built once)."""
        if connection is not self.connection:  # closed: build for this call alone
            return StatementDefaults(table, None, {}, isinsert=isinsert, connection=connection)
        key = (table, isinsert)
        found = self._made.get(key)
        if found is None:
            found = self._made[key] = StatementDefaults(
                table, None, {}, isinsert=isinsert, connection=connection
            )
        return found

    def close(self) -> None:
        self.connection = None
        self._made.clear()


#: session -> the :class:`FlushDefaults` of its flush under way (one per connection);
#: closed and dropped when the flush's session transaction ends (committed or rolled back)
_flushing: weakref.WeakKeyDictionary[Session, list[FlushDefaults]] = weakref.WeakKeyDictionary()


def _flush_defaults(session: Session, connection: Any) -> FlushDefaults:
    """The :class:`FlushDefaults` of the flush of ``session`` on ``connection``."""
    scopes = _flushing.get(session)
    if scopes is None:
        scopes = _flushing[session] = []
    for found in scopes:
        if found.connection is connection:
            return found
    found = FlushDefaults(connection)
    scopes.append(found)
    return found


def _end_flush(session: Any, transaction: Any) -> None:
    """A session transaction ended (the flush's own, committed or rolled back, ends
    with every flush): its flush keeps nothing."""
    scopes = _flushing.pop(session, None)
    if scopes:
        for found in scopes:
            found.close()


def _end_flushes_with_transactions() -> None:
    """The one Session listener flushes that evaluate defaults need (installed once, by
    the first mapper whose shard sources have a Python default or onupdate; once per
    session transaction, never per statement or object)."""
    if not event.contains(Session, "after_transaction_end", _end_flush):
        event.listen(Session, "after_transaction_end", _end_flush)


class _FlushScope:
    """One mapper's way to its flush's :class:`FlushDefaults`: the one last used is kept
    at hand, so consecutive objects of one flush pay one identity test; it lets go of its
    connection when the flush ends, and is then never matched again."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: FlushDefaults | None = None

    def __call__(self, state: Any, connection: Any) -> FlushDefaults:
        last = self._last  # one load: another thread may replace it, never half of it
        if last is not None and last.connection is connection:
            return last
        session = state.session
        if session is None:  # not a Session's flush: nothing would end it, keep nothing
            return FlushDefaults(connection)
        found = self._last = _flush_defaults(session, connection)
        return found


#: the mapped columns of one table, as :func:`_insert_values` reads them (planned once per
#: mapper): (attribute, column key, whether the column has a default) of each, and
#: column key -> attribute
InsertTable = tuple[tuple[tuple[str, str, bool], ...], dict[str, str]]


def _insert_table(columns: list[tuple[str, str]], table: Any) -> InsertTable:
    """The :data:`InsertTable` of ``table``'s mapped ``columns`` ((attribute, column key))."""
    return (
        tuple((a, k, table.c[k].default is not None) for a, k in columns),
        {k: a for a, k in columns},
    )


def _insert_values(
    sc: ShardColumn,
    source_attrs: tuple[str, ...],
    target: Any,
    d: Any,
    columns: InsertTable,
    connection: Any,
    defaults: FlushDefaults,
) -> list[Any]:
    """Source values for an INSERT, evaluating (and storing) Python-side defaults; a
    context-sensitive one sees, as in SQLAlchemy, the object's column values by column
    key (``columns``: the table's mapped columns; ``defaults``: the flush's, on
    ``connection``)."""
    table = sc.column.table
    mapped, attr_of = columns
    if any(
        d.get(a) is None and c.default is not None
        for c, a in zip(sc.sources, source_attrs, strict=True)
    ):
        # as the flush's INSERT would: every Python default of a column the object leaves
        # None, in table order, each seeing the ones before it; all set on the object, so
        # the INSERT sends (and SQLAlchemy does not evaluate again) what the source saw
        params = {
            k: d[a] for a, k, defaulted in mapped if a in d and not (defaulted and d[a] is None)
        }
        for k, v in (
            defaults.of(table, isinsert=True, connection=connection).evaluate(params).items()
        ):
            if k in attr_of:
                setattr(target, attr_of[k], v)
    values = []
    for col, attr in zip(sc.sources, source_attrs, strict=True):
        v = d.get(attr)
        if v is None:
            params = {k: d[a] for a, k, _ in mapped if a in d}
            dv = evaluate_default(col, params, connection)
            if dv is not MISSING:
                setattr(target, attr, dv)  # store exactly what we hash
                v = dv
        values.append(v)
    return values


def _record_keys(
    mapper: Mapper[Any], plans: list[Plan]
) -> list[tuple[int, Shape, tuple[str, ...]]]:
    """Per sharded table: its records' shape (``trust.Shape``: the shards computed before
    the statement and their sources, recorded as filled; the key and the sources of the
    shards the hook fills, which the row must hold as the object does; and what the hook
    writes back), and the attributes of the recorded values alone."""
    recorded: dict[Any, list[tuple[str, str]]] = {}
    backs: dict[Any, list[tuple[str, str]]] = {}
    for sc, shard_attr, source_attrs in plans:
        table = sc.column.table
        recorded.setdefault(table, [])
        keys = (backs if _hook_fills(sc, plans) else recorded).setdefault(table, [])
        for attr, col in ((shard_attr, sc.column), *zip(source_attrs, sc.sources, strict=True)):
            if col.table is table and (attr, col.key) not in keys:
                keys.append((attr, col.key))
    out = []
    for table, keys in recorded.items():
        back = backs.get(table, [])
        check: list[tuple[str, str]] = []
        if back:  # the key, then the sources of the shards the hook fills
            shard_keys = {sc.key for sc, _, _ in plans if _hook_fills(sc, plans)}
            for c in table.primary_key:
                try:
                    check.append((mapper.get_property_by_column(c).key, c.key))
                except UnmappedColumnError:
                    continue  # not mapped: the sources alone keep the rows in step
            check += [p for p in back if p[1] not in shard_keys and p not in check]
        shape: Shape = (
            tuple(keys),
            tuple(k for _, k in keys),
            tuple(a for a, _ in check),
            tuple(k for _, k in check),
            tuple(back),
        )
        out.append((id(table), shape, tuple(a for a, _ in keys)))
    return out


_UTC = _dt.timezone.utc


def install_mapper_events(mapper: Mapper[Any]) -> None:
    """Attach the flush events to one mapper whose tables have shard columns.

    Reads nothing that configures mappers: it runs when SQLAlchemy configures this one."""
    plans = mapper_plans(mapper)
    onupdate = {
        mapper.get_property_by_column(c).key: c
        for sc, _, _ in plans
        for c in sc.sources
        if c.onupdate is not None
    }

    # (attribute, column key, table) of every mapped column: what SQLAlchemy's context
    # shows a context-sensitive default or onupdate of a source, by column key
    all_columns = [
        (p.key, c.key, c.table)
        for p in mapper.column_attrs
        for c in p.columns
        if isinstance(c, Column) and c.table in mapper.tables
    ]
    onupdate_plan = _onupdate_plan(onupdate, all_columns)
    by_table: dict[int, list[tuple[str, str]]] = {}
    for a, k, t in all_columns:
        by_table.setdefault(id(t), []).append((a, k))
    table_columns = {
        id(t): _insert_table(by_table[id(t)], t) for t in mapper.tables if id(t) in by_table
    }
    # the shards computed here, before the statement (a key shard, a Spanner-computed one:
    # ``trust.hook_fills``); the engine hook computes every other from the row it sends
    early = [p for p in plans if not _hook_fills(p[0], plans)]
    fill = object_filler(early) if early else None
    # per shard the hook fills, whose sources have Python defaults: its plan and those
    # sources' attributes (evaluated and stored here when the object leaves them None)
    defaulted = [
        (p, tuple(a for a, c in zip(p[2], p[0].sources, strict=True) if c.default is not None))
        for p in plans
        if _hook_fills(p[0], plans) and any(c.default is not None for c in p[0].sources)
    ]
    record_keys = _record_keys(mapper, plans)
    # per shard: (attribute, given mark, (column key, attribute)) and all of them derived
    marks = [(attr, given_mark_key(attr), (sc.key, attr)) for sc, attr, _ in plans]
    all_derived = tuple(m[2] for m in marks)
    # per shard: its plan, its sources as a set, given mark, where its table's primary key
    # is in the identity key (in the table's order: what the UPDATE's WHERE names; one int
    # for a one-column key, None for none), its table, its write-back's (attribute, column
    # key) (trust.Expected), and the sources to keep in their stored form
    update_plans = [
        (
            sc,
            attr,
            source_attrs,
            frozenset(source_attrs),
            given_mark_key(attr),
            _one_or_all(_key_positions(mapper, sc.column.table)),
            sc.column.table,
            (attr, sc.key),
            _stored_form_keepers(sc, source_attrs),
        )
        for sc, attr, source_attrs in plans
    ]

    add = Tally(watch).add
    # the flush's StatementDefaults, per table and kind, built once per flush (not per object)
    flush_defaults = _FlushScope()
    if any(c.default is not None or c.onupdate is not None for p in plans for c in p[0].sources):
        _end_flushes_with_transactions()
    # a timestamp source: on SQLite, which drops offsets, one with an offset other than UTC
    # is refused while the object's shards are computed (``coerce.OFFSETS_DROPPED``)
    dated = any(
        isinstance(base_type(c.type), sqltypes.DateTime) for sc, _, _ in plans for c in sc.sources
    )
    # the same, for the shards ``before_insert`` computes (the hook checks the others once
    # per statement)
    dated_early = any(
        isinstance(base_type(c.type), sqltypes.DateTime) for sc, _, _ in early for c in sc.sources
    )

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
            if fill is not None and not fill(d):
                _fill_slowly(state, d, connection)
            for plan, attrs in defaulted:
                for a in attrs:
                    if d.get(a) is None:  # a default applies: evaluated and stored
                        sc, _, source_attrs = plan
                        columns = table_columns[id(sc.column.table)]
                        _insert_values(
                            sc,
                            source_attrs,
                            state.obj(),
                            d,
                            columns,
                            connection,
                            flush_defaults(state, connection),
                        )
                        break
        except BaseException:
            forget(connection)
            raise
        # the flush sends its INSERT with the base mapper's statement cache as its
        # compiled_cache: the mark of the ORM's own statement (sharded_orm.write.trust)
        cache = mapper_.base_mapper._compiled_cache
        get = d.get
        for table, shape, attrs in record_keys:
            add(connection, cache, table, shape, d, derived, map(get, attrs))
        return EXT_CONTINUE

    def _fill_slowly(state: Any, d: Any, connection: Any) -> None:
        target = state.obj()
        defaults = flush_defaults(state, connection)
        for sc, shard_attr, source_attrs in early:
            # unset or None: maybe a default applies (evaluated and stored)
            values = _insert_values(
                sc,
                source_attrs,
                target,
                d,
                table_columns[id(sc.column.table)],
                connection,
                defaults,
            )
            send = sc.values_to_send(values)
            for attr, v, stored in zip(source_attrs, values, send, strict=True):
                if stored is not v:
                    d[attr] = stored  # the object holds, and the INSERT sends, what is hashed
            # a default just stored (setattr) completed the sources: the source listener
            # hashed them then (``DERIVED_MARK``), and that shard is taken, not hashed again
            shard = _derived_from(d.get(derived_mark_key(shard_attr)), send)
            if shard is None:
                shard = sc.compute(send)
            given = d.get(shard_attr)
            if given is not None and given != shard:
                raise mismatch(sc, given, shard)
            # A pending object's INSERT is built from its dict: no history to keep.
            d[shard_attr] = shard

    # the connection last watched (a weak reference), its write-backs (trust.updates_of),
    # and per table the statement cache and write-back table last used (trust.expected)
    seen: list[Any] = [None]

    def before_update(mapper_: Any, connection: Any, state: Any) -> Any:
        last = seen[0]
        if last is None or last[0]() is not connection:
            watch(connection)
            last = seen[0] = (weakref.ref(connection), updates_of(connection), {})
        if onupdate:
            target = state.obj()
            _apply_onupdate(
                state, target, onupdate_plan, connection, flush_defaults(state, connection)
            )
        committed = state.committed_state
        for plan in update_plans:
            sc, shard_attr, source_attrs, sources, mark, pk_at, table, tail, keep = plan
            # sources set since loaded (perhaps to an equal value: then the row does not
            # send it, and the hook has nothing to compute)
            changed = not sources.isdisjoint(committed)
            shard_set = shard_attr in committed and state.attrs[shard_attr].history.has_changes()
            if not changed and not shard_set:
                continue
            d = state.dict
            if shard_set and is_given(d, shard_attr, mark):
                given = d[shard_attr]
                if not (changed and _was_derived(sc, state, source_attrs, given)):
                    continue  # the caller's: the engine hook checks it with the sources sent
            # derived: by the engine hook, once, from the row the UPDATE sends (after every
            # listener), and written back to the object; a key shard too (the identity
            # map is keyed again from the object when the flush ends)
            if shard_set:  # copied (merge) or left by a key listener: not sent as given
                old = committed.get(shard_attr, _NO)
                set_committed_value(state.obj(), shard_attr, None if old is _NO else old)
            if not changed:
                continue
            for attr, coerce, exact, utc in keep:
                if attr not in committed or attr not in d:
                    continue
                v = d[attr]
                if v.__class__ is exact and (not utc or v.tzinfo is _UTC):
                    continue  # already its stored form (the coercer's own first test)
                _keep_stored_form(state, attr, v, coerce)
            if pk_at is None:
                continue
            # the hook computes the shard from the row and writes it back to ``d``
            cache = mapper_.base_mapper._compiled_cache
            held = last[2].get(table)
            if held is None or held[0] is not cache:
                held = last[2][table] = (cache, expected(last[1], cache, table))
            by_key = held[1]
            ident = state.key[1]
            if pk_at.__class__ is int:
                pk = ident[pk_at]
            else:
                pk = tuple([ident[i] for i in cast("tuple[int, ...]", pk_at)])
            # the usual write-back is the object's __dict__ alone (trust.Expected)
            if tail is not by_key.usual or by_key.setdefault(pk, d) is not d:
                by_key.expect(pk, d, tail)
        return EXT_CONTINUE

    # one set of flush events per mapper: a second install (``hashed_reference`` adds a
    # shard to a mapped class) replaces the first, so each object is recorded once and
    # the hook writes each row back to its own object
    for name, fn in _installed.pop(mapper, ()):
        event.remove(mapper, name, fn)
    # raw and retval: SQLAlchemy calls it directly, with no wrapper, once per object
    if dated_early:
        before_insert = offsets_checked(before_insert, _dialect)
    if dated:
        before_update = offsets_checked(before_update, _dialect)
    event.listen(mapper, "before_insert", before_insert, raw=True, retval=True)
    event.listen(mapper, "before_update", before_update, raw=True, retval=True)
    _installed[mapper] = (("before_insert", before_insert), ("before_update", before_update))


def _hook_fills(sc: ShardColumn, plans: list[Plan]) -> bool:
    """``trust.hook_fills`` for a shard of the mapper (``plans``: all of its shards)."""
    return hook_fills(sc, [p[0] for p in plans if p[0].column.table is sc.column.table])


#: mapper -> its flush events, as installed (event name, function)
_installed: weakref.WeakKeyDictionary[Mapper[Any], tuple[tuple[str, Any], ...]] = (
    weakref.WeakKeyDictionary()
)


def _dialect(mapper: Any, connection: Any, state: Any) -> Any:
    return connection.dialect


def _stored_form_keepers(
    sc: ShardColumn, source_attrs: tuple[str, ...]
) -> tuple[tuple[str, Any, Any, bool], ...]:
    """Per source sent in its stored form: (attribute, coercer, the exact class the coercer
    returns as it is, whether that needs a UTC tzinfo too) -- a plain ``str`` for a String,
    an ``int`` for an Integer, a UTC ``datetime`` for a DateTime (no TypeDecorator
    conversion): a value of that class needs no coercer call."""
    out = []
    for i, (attr, col) in enumerate(zip(source_attrs, sc.sources, strict=True)):
        if not (sc.sends and sc.sends[i]):
            continue
        kind = piece_kind(col)
        exact = {PIECE_STR: str, PIECE_INT: int, PIECE_UTC_DATETIME: _dt.datetime}.get(
            kind or "", _NO
        )
        out.append((attr, sc.coercers[i], exact, kind == PIECE_UTC_DATETIME))
    return tuple(out)


def _keep_stored_form(state: Any, attr: str, value: Any, coerce: Any) -> None:
    """A source set since the object was loaded is sent, and kept on the object, in the
    form its column stores (an IntEnum member as its int), as a reload would give it; one
    set to a value equal to the stored one (2 -> Level.HIGH) is no change the UPDATE
    sends, and is kept as 2."""
    try:
        stored = coerce(value)
    except (ShardingError, TypeError, ValueError):
        return  # the engine hook refuses it with the precise error
    if stored is not value:
        setattr(state.obj(), attr, stored)


def _one_or_all(positions: tuple[int, ...]) -> int | tuple[int, ...] | None:
    """A one-column key's position alone (read with one subscript per object); None for
    no key to write back by."""
    if not positions:
        return None
    return positions[0] if len(positions) == 1 else positions


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


#: what :func:`_apply_onupdate` shows the onupdates of one table, planned once per mapper:
#: the table; (attribute, column key) of its mapped columns; (attribute, the ORM's WHERE
#: parameter name) of its primary key columns; and column key -> attribute
OnupdateTable = tuple[Any, tuple[tuple[str, str], ...], tuple[tuple[str, str], ...], dict[str, str]]
#: (every mapped attribute, once; per source with an onupdate: (attribute, its table's
#: :data:`OnupdateTable`); per source with a SQL onupdate: (attribute, column))
OnupdatePlan = tuple[
    tuple[str, ...],
    tuple[tuple[str, OnupdateTable], ...],
    tuple[tuple[str, Any], ...],
]


def _onupdate_plan(onupdate: dict[str, Any], columns: list[tuple[str, str, Any]]) -> OnupdatePlan:
    """The :data:`OnupdatePlan` of a mapper's sources with an onupdate (``columns``:
    (attribute, column key, table) of the mapper's columns): what does not depend on the
    object, worked out once rather than for every object a flush updates."""
    tables: dict[int, OnupdateTable] = {}
    for col in onupdate.values():
        table = col.table
        if id(table) in tables:
            continue
        own = tuple((a, k) for a, k, t in columns if t is table)
        key = tuple(
            (a, getattr(table.c[k], "_label", None) or f"{table.name}_{k}")
            for a, k in own
            if table.c[k].primary_key
        )
        tables[id(table)] = (table, own, key, {k: a for a, k in own})
    sql_made = tuple(
        (attr, col)
        for attr, col in onupdate.items()
        if not (
            getattr(col.onupdate, "is_scalar", False) or getattr(col.onupdate, "is_callable", False)
        )
    )
    return (
        tuple(dict.fromkeys(a for a, _, _ in columns)),
        tuple((attr, tables[id(col.table)]) for attr, col in onupdate.items()),
        sql_made,
    )


def _apply_onupdate(
    state: Any,
    target: Any,
    plan: OnupdatePlan,
    connection: Any,
    defaults: FlushDefaults,
) -> None:
    """Evaluate a source's Python onupdate now, when the row will be UPDATEd anyway, so
    the value SQLAlchemy would write behind the hook's back is the one hashed. A
    context-sensitive one sees what SQLAlchemy's context would: the values the UPDATE of
    its table sets, by column key (``plan``: :func:`_onupdate_plan`), each onupdate
    evaluated before it included; ``defaults``: the flush's, on ``connection``."""
    all_attrs, per_source, sql_made = plan
    attrs = state.attrs
    changed = {a for a in all_attrs if attrs[a].history.has_changes()}
    if not changed:
        return  # no net change: the ORM sends no UPDATE, the onupdate must not fire
    d = instance_dict(target)
    done: set[Any] = set()
    for attr, (table, own, key, attr_of) in per_source:
        if attr in changed or table in done:
            continue
        done.add(table)
        # what the flush's UPDATE of this table shows its onupdates: the changed columns,
        # the primary key under the ORM's parameter names, every column still to be
        # evaluated as None; each evaluated in table order, seeing the ones before it,
        # and set on the object (sent, not evaluated again by SQLAlchemy)
        params = {k: d.get(a) for a, k in own if a in changed}
        for a, name in key:
            old = attrs[a].history.deleted
            params[name] = old[0] if old else d.get(a)
        for k, value in (
            defaults.of(table, isinsert=False, connection=connection).evaluate(params).items()
        ):
            if k in attr_of:
                setattr(target, attr_of[k], value)
    for attr, col in sql_made:
        if attr not in changed:
            evaluate_onupdate(col, {}, connection)  # a SQL onupdate: refused, with the way out


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
