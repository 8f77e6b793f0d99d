"""Rows the ORM flush has just filled, so the engine hook does not hash them again.

``before_insert`` runs for every object of a flush before SQLAlchemy sends their INSERT,
on the same ``Connection``. For each object it fills, it records here (per connection and
table, in order) the very source objects it hashed and the shard it stored. The engine
hook accepts an INSERT row without hashing it only when both hold:

* the statement is the ORM flush's own INSERT for that table: SQLAlchemy's persistence
  sends each of its statements with the execution option ``compiled_cache`` set to the
  mapper's own statement cache, which a statement sent by a listener (an audit or outbox
  row written from ``before_insert``) or by the application does not carry;
* the row holds those same objects (``is``) and that shard, record by record, in order.

Any other row, or any row out of step, is checked in full, and the records of that
connection are dropped; they are dropped as well when the connection commits or rolls
back (a failed flush leaves nothing behind for the next statement).
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any

#: a record: (column key, value) pairs of one object, shard and sources, as filled
Record = tuple[tuple[str, Any], ...]

#: connection -> (id of the mapper's statement cache, id of the table) -> records
Queues = dict[tuple[int, int], deque[Record]]
_pending: weakref.WeakKeyDictionary[Any, Queues] = weakref.WeakKeyDictionary()


def pending(connection: Any) -> Queues:
    """The per-table records of rows filled by the ORM on ``connection`` (created on use)."""
    records = _pending.get(connection)
    if records is None:
        records = _pending[connection] = {}
    return records


def _same(got: Any, want: Any) -> bool:
    # identity proves the row sends what was hashed; an int shard may be a new object
    return got is want or (type(got) is int and type(want) is int and got == want)


def take(connection: Any, options: Any, table: Any, rows: list[dict[str, Any]]) -> bool:
    """True when the INSERT into ``table``, run with execution ``options``, is the ORM
    flush's own and every row is the next recorded object, unchanged; the records are
    consumed. False otherwise (the rows are then checked in full, and the connection's
    records dropped)."""
    records = _pending.get(connection)
    if not records:
        return False
    queue = records.get((id(options.get("compiled_cache")), id(table)))
    if not queue or len(queue) < len(rows):
        records.clear()
        return False
    for row, record in zip(rows, queue, strict=False):
        for key, value in record:
            if not _same(row.get(key), value):
                records.clear()
                return False
    for _ in rows:
        queue.popleft()
    return True


def forget(connection: Any, *args: Any) -> None:
    """Drop the records of ``connection`` (commit, rollback, or a flush that failed)."""
    records = _pending.get(connection)
    if records:
        records.clear()


class Tally:
    """Records filled rows for ``before_insert``, which runs once per object: the records
    of the connection last seen are kept at hand (by weak reference), so consecutive
    objects of one flush pay one identity test instead of a weak-dictionary lookup.
    ``on_new_connection`` is called the first time a connection is seen in a row."""

    __slots__ = ("_last", "_on_new")

    def __init__(self, on_new_connection: Any) -> None:
        self._last: tuple[weakref.ref[Any], Queues] | None = None
        self._on_new = on_new_connection

    def add(self, connection: Any, cache: Any, table: int, record: Record) -> None:
        """Record ``record`` for the INSERT into the table of id ``table`` that the flush
        will send with ``cache`` (the mapper's statement cache) as its compiled cache."""
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
        queue.append(record)
