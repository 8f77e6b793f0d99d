"""What the ORM flush tells the engine hook about the rows it is about to send.

Each row's shard is computed once, by the engine hook, from the row the flush finally
sends (after every default and listener), and written back to its object
(:func:`hook_fills`). ``before_insert`` runs for every object of a flush before
SQLAlchemy sends their INSERT, on the same ``Connection``, and records here (per
connection and table, in order) the object's ``__dict__``, so the hook can write the
shards of its row back to it. Two kinds of shard cannot wait for the statement, and are
computed by ``before_insert`` (or by the attribute listener that derived a key shard as its
sources were set): a shard in the primary key (``session.merge()``, the identity map and
SQLAlchemy's batching of the INSERT need it first) and a shard Spanner computes
(``server_side=True``, which the object holds all the same). For those, the record holds
the very source objects hashed and the shard stored, and which of its shards the library
derived (not the caller's). The hook reads them without hashing them again only when both
hold:

* the statement is the ORM flush's own INSERT for that table: SQLAlchemy's persistence
  sends each of its statements with the execution option ``compiled_cache`` set to the
  mapper's own statement cache, which a statement sent by a listener (an audit or outbox
  row written from ``before_insert``) or by the application does not carry;
* the row holds those same objects (``is``) and that shard, record by record, in order.

A row that holds what its object holds *now* but not what was hashed was changed after
``before_insert`` by a listener that ran later (an application's ``before_insert`` that
normalises a source): its derived shards are computed again from the row, the value the
database gets, and written back to the object (:func:`take` returns those records).
Any other row, or any row out of step, is checked in full, and the records of that
connection are dropped; they are dropped as well when the connection commits or rolls
back (a failed flush leaves nothing behind for the next statement).

``before_update`` records, by primary key, the objects whose derived shard the engine hook
computes from the UPDATE it sends (:meth:`Expected.expect`), so the hook can write that
shard back to the object (:func:`updated_objects`): the shard of an updated row, in the
primary key or not, is computed there alone, from what the UPDATE sends.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Iterable
from operator import is_
from typing import Any

#: what the rows of one table's records hold, shared by every record of a mapper:
#: (attribute, column key) of each value recorded (the shards computed before the
#: statement, and their sources), the column keys alone (the row's names for them); the
#: attributes and column keys of the values a row must hold as its object does (the key,
#: and the sources of the shards the hook fills: a row out of step with the records is
#: no object's); and (attribute, column key) of each value the hook writes back to the
#: object (the shards it fills, and their sources in the form stored)
Shape = tuple[
    tuple[tuple[str, str], ...],
    tuple[str, ...],
    tuple[str, ...],
    tuple[str, ...],
    tuple[tuple[str, str], ...],
]
#: a record, as :func:`take` gives one back: the values of one object's shards and sources
#: as filled, the object's __dict__, (attribute, column key) of each value, (column key,
#: attribute) of each shard the library derived, and the column key of each value
Record = tuple[
    tuple[Any, ...],
    dict[str, Any],
    tuple[tuple[str, str], ...],
    tuple[tuple[str, str], ...],
    tuple[str, ...],
]

#: connection -> (id of the mapper's statement cache, id of the table) -> records, laid
#: flat (shape, __dict__, derived, then each value): a flush of many objects keeps no
#: container per object alive, which the garbage collector would walk again and again
Queues = dict[tuple[int, int], deque[Any]]
_pending: weakref.WeakKeyDictionary[Any, Queues] = weakref.WeakKeyDictionary()
#: connection -> (id of the statement cache, id of the table) -> primary key -> write-backs
Target = tuple[dict[str, Any], str, str]


class Expected(dict[Any, Any]):
    """Primary key (its value for a one-column key, else the tuple) -> the write-back of
    one table's flush UPDATEs: the object's ``__dict__`` alone when the write-back is
    :attr:`usual` (the first one recorded: a model's one shard), else one :data:`Target`,
    or a list of them when the row has several (two shards, or several UPDATEs of one
    row). :func:`targets_of` reads any of the three. The flush keeps no container alive per
    object for the usual case."""

    #: (shard attribute, column key) of the write-back stored as a bare dict
    usual: tuple[str, str] | None = None

    def expect(self, pk: Any, d: dict[str, Any], tail: tuple[str, str]) -> None:
        """Record the write-back ``(d, *tail)`` for the row of ``pk`` (``before_update``
        stores the usual one itself, and calls this for anything else)."""
        if self.usual is None:
            self.usual = tail
        value = d if tail is self.usual else (d, *tail)
        got = self.setdefault(pk, value)
        if got is value:
            return  # the row's first
        targets = list(targets_of(got, self.usual))
        target = (d, *tail)
        if target not in targets:
            self[pk] = [*targets, target]


def targets_of(got: Any, usual: tuple[str, str] | None) -> Iterable[Target]:
    """The write-backs an :class:`Expected` entry holds (``usual``: its ``usual``)."""
    cls = got.__class__
    if cls is tuple:
        return (got,)
    if cls is list:
        return got  # type: ignore[no-any-return]
    assert usual is not None
    return ((got, *usual),)


Updates = dict[tuple[int, int], Expected]
_updates: weakref.WeakKeyDictionary[Any, Updates] = weakref.WeakKeyDictionary()


def pending(connection: Any) -> Queues:
    """The per-table records of rows filled by the ORM on ``connection`` (created on use)."""
    records = _pending.get(connection)
    if records is None:
        records = _pending[connection] = {}
    return records


def _same(got: Any, want: Any) -> bool:
    # identity proves the row sends what was hashed; an int shard may be a new object
    return got is want or (type(got) is int and type(want) is int and got == want)


def hook_fills(sc: Any, table_shards: Iterable[Any]) -> bool:
    """Whether the engine hook computes ``sc`` for the flush's INSERT rows, from the row
    sent, and writes it back to the object (``table_shards``: every shard of its table):
    every shard but one in the primary key, and but those of a table with a shard Spanner
    computes (``before_insert`` computes those: the hook leaves such a table's rows as
    the flush sends them)."""
    return not sc.column.primary_key and not any(s.server_side for s in table_shards)


#: what :func:`take` gives back: per row its object's __dict__ and its record's shape, and
#: ``(row index, record)`` of the rows whose shards computed before the statement a later
#: listener changed the sources of (each row still what its object holds now)
Taken = tuple[list[dict[str, Any]], list[Shape], list[tuple[int, Record]]]


def take(connection: Any, options: Any, table: Any, rows: list[dict[str, Any]]) -> Taken | None:
    """For the INSERT into ``table`` run with execution ``options``: when it is the ORM
    flush's own and every row is the next recorded object's, what :data:`Taken` says;
    None otherwise (the rows are then checked in full, and the connection's records
    dropped). The records are consumed."""
    records = _pending.get(connection)
    if not records:
        return None
    queue = records.get((id(options.get("compiled_cache")), id(table)))
    if not queue:
        records.clear()
        return None
    objects: list[dict[str, Any]] = []
    shapes: list[Shape] = []
    changed: list[tuple[int, Record]] = []
    pop = queue.popleft
    try:
        for i, row in enumerate(rows):
            shape, d, derived = pop(), pop(), pop()
            columns = shape[1]
            objects.append(d)
            shapes.append(shape)
            at, keys = shape[2], shape[3]
            if (
                keys
                and not all(map(is_, map(row.get, keys), map(d.get, at)))
                and not all(map(_same, map(row.get, keys), map(d.get, at)))
            ):
                records.clear()  # out of step: not this object's row
                return None
            if not columns:
                continue
            values = [pop() for _ in columns]
            if all(map(is_, map(row.get, columns), values)):
                continue  # the row sends the very objects that were hashed
            if all(map(_same, map(row.get, columns), values)):
                continue
            if any(not _same(row.get(key), d.get(attr)) for attr, key in shape[0]):
                records.clear()  # out of step: not this object's row
                return None
            changed.append((i, (tuple(values), d, shape[0], derived, columns)))
    except IndexError:  # fewer records than rows
        records.clear()
        return None
    return objects, shapes, changed


def updates_of(connection: Any) -> Updates:
    """The write-backs recorded for ``connection`` (created on use; cleared, not replaced,
    by :func:`forget`: a caller may keep it while it holds the connection)."""
    updates = _updates.get(connection)
    if updates is None:
        updates = _updates[connection] = {}
    return updates


def expected(updates: Updates, cache: Any, table: Any) -> Expected:
    """The write-backs of the flush's UPDATEs of ``table`` sent with ``cache`` (the
    mapper's statement cache) as their compiled cache, by primary key (created on use, then
    kept: :func:`forget` empties it in place); ``updates``: :func:`updates_of` the flush's
    connection. ``before_update`` adds to it:
    the object's __dict__, its shard attribute and the shard's column key."""
    at = (id(cache), id(table))
    by_key = updates.get(at)
    if by_key is None:
        by_key = updates[at] = Expected()
    return by_key


def updated_objects(connection: Any, options: Any, table: Any) -> Expected | None:
    """The write-backs :meth:`Expected.expect` recorded for the flush's UPDATEs of ``table``
    run with ``options`` (the flush may send several: one per set of changed columns), by
    primary key (see :class:`Expected`); the caller pops those it uses. None for any
    other statement."""
    updates = _updates.get(connection)
    if not updates:
        return None
    return updates.get((id(options.get("compiled_cache")), id(table)))


def forget(connection: Any, *args: Any) -> None:
    """Drop the records of ``connection`` (commit, rollback, or a flush that failed). The
    write-back tables are emptied in place: ``before_update`` keeps each at hand."""
    records = _pending.get(connection)
    if records:
        records.clear()
    updates = _updates.get(connection)
    if updates:
        for by_key in updates.values():
            by_key.clear()
            by_key.usual = None


class Tally:
    """Records filled rows for ``before_insert``, which runs once per object: the records
    of the connection last seen are kept at hand (by weak reference), so consecutive
    objects of one flush pay one identity test instead of a weak-dictionary lookup.
    ``on_new_connection`` is called the first time a connection is seen in a row."""

    __slots__ = ("_last", "_on_new")

    def __init__(self, on_new_connection: Any) -> None:
        self._last: tuple[weakref.ref[Any], Queues] | None = None
        self._on_new = on_new_connection

    def add(
        self,
        connection: Any,
        cache: Any,
        table: int,
        shape: Shape,
        d: dict[str, Any],
        derived: tuple[tuple[str, str], ...],
        values: Iterable[Any],
    ) -> None:
        """Record one object for the INSERT into the table of id ``table`` that the flush
        will send with ``cache`` (the mapper's statement cache) as its compiled cache: its
        ``__dict__`` ``d``, the shards the library ``derived``, and the ``values`` of its
        shards and sources as filled (one for each of ``shape``'s columns)."""
        last = self._last  # one load: another thread may replace it, never half of it
        if last is not None and last[0]() is connection:
            records = last[1]
        else:
            self._on_new(connection)
            records = pending(connection)
            self._last = (weakref.ref(connection), records)
        key = (id(cache), table)
        queue = records.get(key)
        if queue is None:
            queue = records[key] = deque()
        queue.append(shape)
        queue.append(d)
        queue.append(derived)
        queue.extend(values)
