"""Rows the ORM flush has just filled, so the engine hook does not hash them again.

``before_insert`` runs for every object of a flush before SQLAlchemy sends their INSERT,
on the same ``Connection``. Each object it fills is counted here, per table and per
connection; the hook then accepts that many INSERT rows of that table, from a statement
of the ORM's own persistence, with one ``is None`` test per shard instead of a hash. The
count is consumed as it is used and dropped with the connection, and a flush that fails
before its INSERT leaves its session unusable until rollback, which ends the connection's
use; an INSERT that does not match the count exactly is checked in full.
"""

from __future__ import annotations

import weakref
from typing import Any

_counts: weakref.WeakKeyDictionary[Any, dict[int, int]] = weakref.WeakKeyDictionary()


def counter(connection: Any) -> dict[int, int]:
    """The per-table count of rows filled by the ORM on ``connection`` (created on use)."""
    counts = _counts.get(connection)
    if counts is None:
        counts = _counts[connection] = {}
    return counts


def take(connection: Any, table: Any, n: int) -> bool:
    """Consume ``n`` filled rows of ``table`` if exactly that many or more are pending."""
    counts = _counts.get(connection)
    if not counts:
        return False
    have = counts.get(id(table), 0)
    if have < n:
        counts.pop(id(table), None)  # out of step: check everything from here
        return False
    if have == n:
        del counts[id(table)]
    else:
        counts[id(table)] = have - n
    return True


def forget(connection: Any) -> None:
    """Drop the counts of ``connection`` (a flush failed while filling). The dict is
    emptied in place, so a caller holding it (``Tally``) counts into the live one."""
    counts = _counts.get(connection)
    if counts:
        counts.clear()


class Tally:
    """Counts filled rows for ``before_insert``, which runs once per object: the counts of
    the connection last seen are kept at hand (by weak reference), so consecutive objects
    of one flush pay one identity test instead of a weak-dictionary lookup."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[weakref.ref[Any], dict[int, int]] | None = None

    def add(self, connection: Any, tables: list[int]) -> None:
        last = self._last  # one load: another thread may replace it, never half of it
        if last is not None and last[0]() is connection:
            counts = last[1]
        else:
            counts = counter(connection)
            self._last = (weakref.ref(connection), counts)
        for t in tables:
            counts[t] = counts.get(t, 0) + 1
