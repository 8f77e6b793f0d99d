"""The stored rows an UPDATE by primary key changes, read in one statement per batch.

An UPDATE that sets some sources of a shard but not the others (the ORM flush sends only
the changed columns; ``bulk_update_mappings`` and the ORM bulk UPDATE by primary key send
what they are given) needs the stored values of the others to compute the new shard. They
are read from the database, in the same transaction, before the UPDATE runs: for every row
of the statement at once, ``SELECT <key>, <columns> ... WHERE <key> IN (...)`` in batches
of at most :data:`BATCH` rows (and under Spanner's limit of parameters per statement; of
:data:`JSON_BATCH` rows where the keys go as one JSON array), so an UPDATE of 2,000 rows
costs one or two statements more, not 2,000.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import and_, bindparam, func, or_, select, tuple_
from sqlalchemy.engine import Connection
from sqlalchemy.sql import sqltypes
from sqlalchemy.sql.elements import BindParameter

from sharded_orm.spanner import is_spanner
from sharded_orm.write.sql import MISSING, literal_value

#: rows read per SELECT
BATCH = 1000
#: rows read per SELECT whose keys go as one JSON array (SQLite): one parameter, whatever
#: the number of keys
JSON_BATCH = 10_000
#: parameters per statement kept under Spanner's limit of 950
SPANNER_PARAMETERS = 900


class StoredRows:
    """``fetch(row, keys)``: the stored values of ``keys`` for the row an UPDATE's WHERE
    names by its full primary key (``pinned``: column key -> bound value), or None when
    there is no such row. The first call for a set of keys reads them for every row of
    the statement.

    A row's key (:meth:`key_of`) is its primary key's value for a one-column key (the
    common case: no tuple built per row), else the tuple of its values; :meth:`batch` maps
    each key read to the tuple of the stored values asked for, in their order, or to the
    value itself when one column is asked for (no tuple per row)."""

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
        self.read: list[tuple[tuple[str, ...], dict[Any, Any]]] = []
        binds = [pinned[c.key] for c in self.pk]
        #: the row's keys of the primary key's values, when every one is a parameter of the
        #: row (the ORM's statements): read straight from the row
        self.row_keys = (
            [b.key for b in binds]
            if all(isinstance(b, BindParameter) and not b.unique for b in binds)
            else None
        )
        self._keys: list[Any] | None = None

    def key_of(self, row: Mapping[str, Any]) -> Any:
        """The primary key the row's WHERE names (see the class), None when it names none."""
        values: tuple[Any, ...]
        if self.row_keys is not None:
            try:
                values = tuple([row[k] for k in self.row_keys])
            except KeyError:
                values = tuple([literal_value(self.pinned[c.key], row) for c in self.pk])
        else:
            values = tuple([literal_value(self.pinned[c.key], row) for c in self.pk])
        if any(v is MISSING or v is None for v in values):
            return None
        return values[0] if len(values) == 1 else values

    def keys(self) -> list[Any]:
        """:meth:`key_of` of each row of the statement, in order (computed once)."""
        if self._keys is None:
            rk = self.row_keys
            if rk is not None and len(rk) == 1:
                (k,) = rk
                try:  # the ORM's rows: the key read straight from each
                    self._keys = [row[k] for row in self.rows]
                except KeyError:
                    self._keys = None
            if self._keys is None:
                self._keys = [self.key_of(r) for r in self.rows]
        return self._keys

    def batch(self, keys: Sequence[str]) -> dict[Any, Any]:
        """The stored values of ``keys`` (a tuple, in that order; the value alone for one
        key) of every row of the statement, by primary key (:meth:`key_of`), read on the
        first call for them."""
        keys = tuple(keys)
        for have, rows in self.read:
            if have == keys:
                return rows
        found = self._read(list(keys))
        self.read.append((keys, found))
        return found

    def __call__(self, row: Mapping[str, Any], keys: list[str]) -> dict[str, Any] | None:
        found = self.batch(keys)
        key = self.key_of(row)
        hit = None if key is None else found.get(key)
        if hit is None:
            # not read back under the value bound (or no such row, or a lone NULL): ask the
            # database's own "=", as the UPDATE's WHERE will
            return self._one(row, keys)
        if len(keys) == 1:
            return {keys[0]: hit}
        return dict(zip(keys, hit, strict=True))

    def _one(self, row: Mapping[str, Any], keys: list[str]) -> dict[str, Any] | None:
        where = [c == literal_value(self.pinned[c.key], row) for c in self.pk]
        got = self.conn.execute(select(*[self.table.c[k] for k in keys]).where(*where))
        first = got.first()
        return None if first is None else dict(zip(keys, first, strict=True))

    def _read(self, keys: list[str]) -> dict[Any, Any]:
        distinct = dict.fromkeys(self.keys())
        distinct.pop(None, None)
        wanted = list(distinct)
        size = BATCH
        spanner = is_spanner(self.conn.dialect)
        if spanner:
            size = min(size, max(1, SPANNER_PARAMETERS // len(self.pk)))
        found: dict[Any, Any] = {}
        n = len(self.pk)
        as_json = _json_keys(self.conn.dialect, self.pk, wanted)
        if as_json:
            size = JSON_BATCH
        stmt = None if spanner and n > 1 else _select_by_keys(self.table, self.pk, keys, as_json)
        for at in range(0, len(wanted), size):
            chunk = wanted[at : at + size]
            if stmt is not None:
                got = self.conn.execute(
                    stmt, {_KEYS: json.dumps(chunk) if as_json else chunk}
                ).all()
            else:  # Spanner has no row-value IN: one AND per row
                cols = [self.table.c[k] for k in keys]
                match = or_(
                    *[and_(*[c == v for c, v in zip(self.pk, k, strict=True)]) for k in chunk]
                )
                got = self.conn.execute(select(*self.pk, *cols).where(match)).all()
            if n == 1:
                found.update(got if len(keys) == 1 else [(r[0], r[1:]) for r in got])
            elif len(keys) == 1:
                found.update([(r[:n], r[n]) for r in got])
            else:
                found.update([(r[:n], r[n:]) for r in got])
        return found


_KEYS = "sharded_orm_keys"
_statements: dict[tuple[int, tuple[str, ...], bool], tuple[Any, Any]] = {}
_INT64 = (-(2**63), 2**63 - 1)


def _json_keys(dialect: Any, pk: list[Any], keys: list[Any]) -> bool:
    """Whether the keys go as one JSON array parameter (``FROM json_each(?) JOIN table``)
    instead of one parameter each: on SQLite 3.38+ (JSON built in), for a
    one-column key of a plain Integer or String type (no Python conversion on bind) and
    keys that JSON carries exactly (int64 ints, strings). SQLAlchemy's expanding IN costs
    more per key than the row it reads."""
    if dialect.name != "sqlite" or len(pk) != 1:
        return False
    if getattr(dialect.dbapi, "sqlite_version_info", (0,)) < (3, 38):
        return False
    type_ = pk[0].type
    if type(type_) not in _JSON_TYPES or type_.bind_processor(dialect) is not None:
        return False
    kinds = set(map(type, keys))  # exact types: a bool or an IntEnum is not carried as is
    if not kinds <= _JSON_KINDS:
        return False
    if int not in kinds:
        return True
    ints = keys if len(kinds) == 1 else [k for k in keys if k.__class__ is int]
    lo, hi = _INT64
    return lo <= min(ints) and max(ints) <= hi


_JSON_KINDS = frozenset({int, str})
_JSON_TYPES = frozenset(
    {sqltypes.Integer, sqltypes.BigInteger, sqltypes.SmallInteger, sqltypes.String}
)


def _select_by_keys(table: Any, pk: list[Any], keys: list[str], as_json: bool) -> Any:
    """``SELECT <key>, <keys> FROM table WHERE <key> IN (<the keys>)``, built once per
    table and columns: a statement made with ``in_(values)`` checks every value as it is
    built, which cost more than the rows it reads. The keys are one expanding parameter,
    or one JSON array (:func:`_json_keys`) joined to the table: half the time of
    ``IN (SELECT value FROM json_each(?))``, for which SQLite first copies the array
    into a temporary b-tree."""
    at = (id(table), tuple(keys), as_json)
    hit = _statements.get(at)
    if hit is not None and hit[0] is table:
        return hit[1]
    columns = [*pk, *[table.c[k] for k in keys]]
    if as_json:  # each of the array's values looked up by the key's index
        values = func.json_each(bindparam(_KEYS, type_=sqltypes.String())).table_valued("value")
        stmt = select(*columns).select_from(values.join(table, pk[0] == values.c.value))
    else:
        where = pk[0] if len(pk) == 1 else tuple_(*pk)
        stmt = select(*columns).where(where.in_(bindparam(_KEYS, expanding=True)))
    if len(_statements) > 1024:
        _statements.clear()
    _statements[at] = (table, stmt)
    return stmt
