"""One bounded, thread-safe memo with one eviction policy: least recently used.

Every module-level cache in the library is a :class:`Memo`: it holds at most
``maxsize`` entries (and, when ``maxbytes`` is given, at most that many bytes as
measured by ``sizeof``), and when a ``put`` would exceed either bound it evicts
the least recently used entries, one at a time, until both hold again. A
``get`` hit makes its entry the most recently used; a value too large to fit
``maxbytes`` on its own is not stored. One lock guards every operation, so a
memo may be shared by threads. This module imports only the standard library,
so any layer may use it.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar, overload

__all__ = ["Memo", "MemoStats"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
D = TypeVar("D")


@dataclass(frozen=True)
class MemoStats:
    """Counters of one memo since it was made (``clear`` does not reset them)."""

    name: str
    hits: int
    misses: int
    evictions: int
    size: int
    nbytes: int


class Memo(Generic[K, V]):
    """A least-recently-used map bounded by entry count and, optionally, by bytes.

    ``Memo(name, maxsize)`` keeps at most ``maxsize`` entries. With
    ``maxbytes``, the sum of ``sizeof(value)`` over the entries (``sizeof``
    defaults to :func:`sys.getsizeof`) also stays at or under ``maxbytes``.
    Evicting the least recently used entry is the only policy.
    """

    __slots__ = (
        "_data",
        "_evictions",
        "_hits",
        "_lock",
        "_misses",
        "_nbytes",
        "_sizes",
        "_sizeof",
        "maxbytes",
        "maxsize",
        "name",
    )

    def __init__(
        self,
        name: str,
        maxsize: int,
        *,
        maxbytes: int | None = None,
        sizeof: Callable[[V], int] | None = None,
    ) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
            raise ValueError(
                f"Memo {name!r}: maxsize must be a positive int, got {maxsize!r}; "
                "pass the number of entries the memo may hold"
            )
        if maxbytes is not None and (
            isinstance(maxbytes, bool) or not isinstance(maxbytes, int) or maxbytes < 1
        ):
            raise ValueError(
                f"Memo {name!r}: maxbytes must be a positive int or None, got {maxbytes!r}; "
                "pass the byte budget, or None to bound by entry count only"
            )
        self.name = name
        self.maxsize = maxsize
        self.maxbytes = maxbytes
        self._sizeof: Callable[[V], int] | None = (
            None if maxbytes is None else (sizeof if sizeof is not None else sys.getsizeof)
        )
        self._data: OrderedDict[K, V] = OrderedDict()
        self._sizes: dict[K, int] = {}
        self._nbytes = 0
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0
        self._evictions = 0

    @overload
    def get(self, key: K) -> V | None: ...

    @overload
    def get(self, key: K, default: D) -> V | D: ...

    def get(self, key: K, default: object = None) -> object:
        """The value stored for ``key`` (now the most recently used), else ``default``."""
        data = self._data
        with self._lock:
            try:
                value = data[key]
            except KeyError:
                self._misses += 1
                return default
            data.move_to_end(key)
            self._hits += 1
            return value

    def put(self, key: K, value: V) -> None:
        """Store ``value`` for ``key`` as the most recently used entry, evicting as needed.

        A value whose size alone exceeds ``maxbytes`` is not stored (and any
        older value for ``key`` is dropped, so a ``get`` never returns stale data).
        """
        with self._lock:
            data = self._data
            size = 0
            if self._sizeof is not None:
                size = self._sizeof(value)
                old = self._sizes.pop(key, None)
                if old is not None:
                    self._nbytes -= old
                    del data[key]
                if self.maxbytes is not None and size > self.maxbytes:
                    return
            elif key in data:
                data[key] = value
                data.move_to_end(key)
                return
            data[key] = value
            if self._sizeof is not None:
                self._sizes[key] = size
                self._nbytes += size
            self._evict()

    def _evict(self) -> None:
        data = self._data
        maxbytes = self.maxbytes
        while len(data) > self.maxsize or (maxbytes is not None and self._nbytes > maxbytes):
            old_key, _ = data.popitem(last=False)
            self._nbytes -= self._sizes.pop(old_key, 0)
            self._evictions += 1

    def clear(self) -> None:
        """Drop every entry (the counters of :meth:`stats` keep counting)."""
        with self._lock:
            self._data.clear()
            self._sizes.clear()
            self._nbytes = 0

    def stats(self) -> MemoStats:
        """Hits, misses and evictions so far, with the current entry count and bytes."""
        with self._lock:
            return MemoStats(
                name=self.name,
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                size=len(self._data),
                nbytes=self._nbytes,
            )

    def keys(self) -> list[K]:
        """The keys, least recently used first (a snapshot)."""
        with self._lock:
            return list(self._data)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is stored; unlike :meth:`get`, does not touch the LRU order."""
        with self._lock:
            return key in self._data

    def __repr__(self) -> str:
        bound = f"maxsize={self.maxsize}"
        if self.maxbytes is not None:
            bound += f", maxbytes={self.maxbytes}"
        return f"Memo({self.name!r}, {bound}, size={len(self)})"
