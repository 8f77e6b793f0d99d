"""The stored rows an UPDATE by primary key changes, read in one statement per batch.

An UPDATE that sets some sources of a shard but not the others (the ORM flush sends only
the changed columns; ``bulk_update_mappings`` and the ORM bulk UPDATE by primary key send
what they are given) needs the stored values of the others to compute the new shard. They
are read from the database, in the same transaction, before the UPDATE runs: for every row
of the statement at once, ``SELECT <key>, <columns> ... WHERE <key> IN (...)`` in batches
of at most :data:`BATCH` rows (and under Spanner's limit of parameters per statement), so
an UPDATE of 2,000 rows costs one or two statements more, not 2,000.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import and_, or_, select, tuple_
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import BindParameter

from sharded_orm.spanner import is_spanner
from sharded_orm.write.sql import MISSING, literal_value

#: rows read per SELECT
BATCH = 1000
#: parameters per statement kept under Spanner's limit of 950
SPANNER_PARAMETERS = 900


class StoredRows:
    """``fetch(row, keys)``: the stored values of ``keys`` for the row an UPDATE's WHERE
    names by its full primary key (``pinned``: column key -> bound value), or None when
    there is no such row. The first call for a set of keys reads them for every row of
    the statement."""

    def __init__(
        self,
        conn: Connection,
        table: Any,
        pk: Sequence[Any],
        pinned: Mapping[str, Any],
        rows: Sequence[Mapping[str, Any]],
    ) -> None:
        self.conn = conn
        self.table = table
        self.pk = list(pk)
        self.pinned = pinned
        self.rows = rows
        self.read: list[tuple[frozenset[str], dict[tuple[Any, ...], dict[str, Any]]]] = []
        binds = [pinned[c.key] for c in self.pk]
        #: the row's keys of the primary key's values, when every one is a parameter of the
        #: row (the ORM's statements): read straight from the row
        self.row_keys = (
            [b.key for b in binds]
            if all(isinstance(b, BindParameter) and not b.unique for b in binds)
            else None
        )
        self._keys: list[tuple[Any, ...] | None] | None = None

    def key_of(self, row: Mapping[str, Any]) -> tuple[Any, ...] | None:
        if self.row_keys is not None:
            try:
                values = tuple([row[k] for k in self.row_keys])
            except KeyError:
                values = tuple([literal_value(self.pinned[c.key], row) for c in self.pk])
        else:
            values = tuple([literal_value(self.pinned[c.key], row) for c in self.pk])
        return None if any(v is MISSING or v is None for v in values) else values

    def keys(self) -> list[tuple[Any, ...] | None]:
        """:meth:`key_of` of each row of the statement, in order (computed once)."""
        if self._keys is None:
            self._keys = [self.key_of(r) for r in self.rows]
        return self._keys

    def batch(self, keys: Sequence[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
        """The stored values of ``keys`` of every row of the statement, by primary key
        (:meth:`key_of`), read on the first call for them."""
        for have, rows in self.read:
            if have.issuperset(keys):
                return rows
        found = self._read(list(keys))
        self.read.append((frozenset(keys), found))
        return found

    def __call__(self, row: Mapping[str, Any], keys: list[str]) -> dict[str, Any] | None:
        found = self.batch(keys)
        key = self.key_of(row)
        hit = None if key is None else found.get(key)
        if hit is None:
            # not read back under the value bound (or no such row): ask the database's
            # own "=", as the UPDATE's WHERE will
            hit = self._one(row, keys)
        return hit

    def _one(self, row: Mapping[str, Any], keys: list[str]) -> dict[str, Any] | None:
        where = [c == literal_value(self.pinned[c.key], row) for c in self.pk]
        got = self.conn.execute(select(*[self.table.c[k] for k in keys]).where(*where))
        first = got.first()
        return None if first is None else dict(zip(keys, first, strict=True))

    def _read(self, keys: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
        wanted = list(dict.fromkeys(k for k in self.keys() if k is not None))
        size = BATCH
        if is_spanner(self.conn.dialect):
            size = min(size, max(1, SPANNER_PARAMETERS // len(self.pk)))
        cols = [self.table.c[k] for k in keys]
        found: dict[tuple[Any, ...], dict[str, Any]] = {}
        n = len(self.pk)
        for at in range(0, len(wanted), size):
            chunk = wanted[at : at + size]
            stmt = select(*self.pk, *cols).where(self._matching(chunk))
            for got in self.conn.execute(stmt):
                found[tuple(got[:n])] = dict(zip(keys, got[n:], strict=True))
        return found

    def _matching(self, keys: list[tuple[Any, ...]]) -> Any:
        if len(self.pk) == 1:
            return self.pk[0].in_([k[0] for k in keys])
        if is_spanner(self.conn.dialect):  # no row-value IN there: one AND per row
            return or_(*[and_(*[c == v for c, v in zip(self.pk, k, strict=True)]) for k in keys])
        return tuple_(*self.pk).in_(keys)
