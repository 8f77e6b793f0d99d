"""The stored rows an UPDATE by primary key changes, read in one statement per batch.

An UPDATE that sets some sources of a shard but not the others (the ORM flush sends only
the changed columns; ``bulk_update_mappings`` and the ORM bulk UPDATE by primary key send
what they are given) needs the stored values of the others to compute the new shard. They
are read from the database, in the same transaction, before the UPDATE runs: for every row
of the statement at once, ``SELECT <key>, <columns> ... WHERE <key> IN (...)`` in batches
of at most :data:`BATCH` rows (of :data:`JSON_BATCH` rows where the keys go as one JSON
array), so an UPDATE of 2,000 rows costs one or two statements more, not 2,000.

On Spanner the keys go as one array per key column, joined to the table on equality of
every key column (:func:`_spanner_by_arrays`): a statement's parameters (one per key
column) and functions (a few) do not grow with its keys, so no batch meets Spanner's
limits on parameters or functions per statement (``sharded_orm.limits``). A key column
with no array type falls back to one OR of ANDs, sized under both limits. Every read on
Spanner is also cut under its request size (``SPANNER_REQUEST_BYTES``, 10 MiB), its keys'
values counted as sent (:func:`~sharded_orm.limits.param_bytes`; BYTES go as base64): a
thousand keys of 8 KiB would pass it. Keys whose column types bound them well under it
(integers, short strings) are not measured.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import and_, bindparam, column, func, or_, select, text, tuple_
from sqlalchemy.engine import Connection
from sqlalchemy.sql import sqltypes
from sqlalchemy.sql.elements import BindParameter

from sharded_orm.errors import ShardValueError
from sharded_orm.limits import (
    SPANNER_FUNCTIONS,
    SPANNER_PARAMETERS,
    commit_chunks,
    param_bytes,
    parameter_limit,
    request_budget,
)
from sharded_orm.memo import Memo
from sharded_orm.schema.coerce import base_type
from sharded_orm.schema.timestamps import read_back_error
from sharded_orm.spanner import is_spanner
from sharded_orm.write.sql import MISSING, literal_value

#: per column key, the coercer that hashes the stored value (``read_back_checks``)
Checks = Mapping[str, tuple[Any, Callable[[Any], Any]]]


def read_back_checks(shards: Sequence[Any]) -> dict[str, tuple[Any, Callable[[Any], Any]]]:
    """The timestamp sources of ``shards`` (ShardColumns the client computes), by column
    key: (column, coercer). A naive datetime read back for one (SQLite keeps no offset)
    that its coercer refuses is refused as a stored value (:func:`check_read`)."""
    out: dict[str, tuple[Any, Callable[[Any], Any]]] = {}
    for sc in shards:
        for i, col in enumerate(sc.sources):
            if sc.coercers and isinstance(base_type(col.type), sqltypes.DateTime):
                out.setdefault(col.key, (col, sc.coercers[i]))
    return out


def check_read(checks: Checks, keys: Sequence[str], values: Any) -> None:
    """Refuse, as a stored value with its cause, a naive datetime read back for a timestamp
    source that cannot hash it (``values``: a tuple in ``keys``' order, or the value itself
    for one key)."""
    for i, k in enumerate(keys):
        hit = checks.get(k)
        if hit is None:
            continue
        v = values if len(keys) == 1 else values[i]
        if v.__class__ is _dt.datetime and v.tzinfo is None:
            col, coerce = hit
            try:
                coerce(v)
            except ShardValueError:
                raise read_back_error(col, v) from None


#: rows read per SELECT
BATCH = 1000
#: rows read per SELECT whose keys go as one JSON array (SQLite): one parameter, whatever
#: the number of keys
JSON_BATCH = 10_000


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
        checks: Checks | None = None,
    ) -> None:
        self.conn = conn
        #: timestamp sources whose naive stored values are refused as such (check_read)
        self.checks = checks or {}
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
        if self.checks and any(k in self.checks for k in keys):
            for values in found.values():
                check_read(self.checks, keys, values)
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
        if first is None:
            return None
        if self.checks:
            check_read(self.checks, keys, first[0] if len(keys) == 1 else tuple(first))
        return dict(zip(keys, first, strict=True))

    def _read(self, keys: list[str]) -> dict[Any, Any]:
        distinct = dict.fromkeys(self.keys())
        distinct.pop(None, None)
        wanted = list(distinct)
        dialect = self.conn.dialect
        n = len(self.pk)
        found: dict[Any, Any] = {}
        arrays = (
            _spanner_by_arrays(self.table, self.pk, keys, dialect) if is_spanner(dialect) else None
        )
        if arrays is not None:
            stmt, procs = arrays
            # the arrays as sent (each key column's values through its bind processor)
            parts = [wanted] if n == 1 else [[k[j] for k in wanted] for j in range(n)]
            sent = [
                part if p is None else [p(v) for v in part]
                for p, part in zip(procs, parts, strict=True)
            ]
            budget = request_budget(str(stmt))
            encoded = [p is not None for p in procs]
            for at, end in _key_chunks(sent, self.pk, BATCH, budget, 0, encoded):
                params = {f"{_KEYS}_{j}": part[at:end] for j, part in enumerate(sent)}
                _collect(found, self.conn.execute(stmt, params).all(), n, len(keys))
            return found
        as_json = _json_keys(dialect, self.pk, wanted)
        if as_json:
            size = JSON_BATCH
        else:
            limit = parameter_limit(dialect, _dbapi_connection(self.conn))
            size = BATCH if limit is None else max(1, min(BATCH, limit // n))
        or_of_ands = is_spanner(dialect) and n > 1
        if or_of_ands:  # Spanner has no row-value IN: an equality per key part, an AND per key
            size = max(1, min(SPANNER_PARAMETERS // n, _SPANNER_FUNCTIONS_FREE // (2 * n)))
        stmt = None if or_of_ands else _select_by_keys(self.table, self.pk, keys, as_json)
        if is_spanner(dialect):  # under the request's bytes too, each key's SQL text counted
            parts = [wanted] if n == 1 else [[k[j] for k in wanted] for j in range(n)]
            budget = request_budget(str(select(*self.pk, *[self.table.c[k] for k in keys])))
            chunks = _key_chunks(parts, self.pk, size, budget, _KEY_TEXT * n)
        else:
            chunks = [(at, min(at + size, len(wanted))) for at in range(0, len(wanted), size)]
        for at, end in chunks:
            chunk = wanted[at:end]
            if stmt is not None:
                got = self.conn.execute(
                    stmt, {_KEYS: json.dumps(chunk) if as_json else chunk}
                ).all()
            else:
                cols = [self.table.c[k] for k in keys]
                match = or_(
                    *[and_(*[c == v for c, v in zip(self.pk, k, strict=True)]) for k in chunk]
                )
                got = self.conn.execute(select(*self.pk, *cols).where(match)).all()
            _collect(found, got, n, len(keys))
        return found


#: functions an OR of ANDs may spend (Spanner's limit, less the statement's own few)
_SPANNER_FUNCTIONS_FREE = SPANNER_FUNCTIONS - 10
#: SQL text a key adds to a statement that names each key part (an OR of ANDs, an IN
#: list): ``table.column = @pN AND``, about, a key part
_KEY_TEXT = 160


_BINARY = (sqltypes.LargeBinary, sqltypes.BINARY, sqltypes.VARBINARY)


def _most_bytes(column: Any) -> int | None:
    """The most bytes a value of key ``column`` takes as a parameter (:func:`param_bytes`),
    from its type; None when its type does not bound it (STRING(MAX), BYTES(MAX))."""
    type_ = base_type(column.type)
    if isinstance(type_, (sqltypes.String, *_BINARY)):
        length = getattr(type_, "length", None)
        if not isinstance(length, int):
            return None
        if isinstance(type_, _BINARY):
            return 4 * -(-length // 3) + 8
        return 4 * length + 8
    return 32


def _sent_bytes(value: Any) -> int:
    """A BYTES value a bind processor made: already the text the client sends (the
    Spanner client sends valid base64 as it is), so its own length."""
    if isinstance(value, (bytes, bytearray)):
        return len(value) + 8
    return param_bytes(value)


def _key_chunks(
    parts: Sequence[Sequence[Any]],
    pk: Sequence[Any],
    count: int,
    budget: int,
    extra: int,
    encoded: Sequence[bool] = (),
) -> list[tuple[int, int]]:
    """The keys (``parts``: one list of values per key column, as sent) cut into reads of
    at most ``count`` keys and ``budget`` bytes of values (:func:`param_bytes`, with
    ``extra`` a key for its SQL text; ``encoded``: which key columns' values went through
    a bind processor, :func:`_sent_bytes`), as ``[start, end)`` ranges in order. The keys are
    measured only when their columns' types do not already bound a read under
    ``budget``: keys of integers or short strings cost nothing here."""
    total = len(parts[0]) if parts else 0
    most = [_most_bytes(c) for c in pk]
    if all(m is not None for m in most):
        bound = sum(m for m in most if m is not None) + 8 + extra
        if bound * min(total, count) <= budget:
            return [(at, min(at + count, total)) for at in range(0, total, count)]
    sizes = [8 + extra] * total
    for j, part in enumerate(parts):
        measure = _sent_bytes if j < len(encoded) and encoded[j] else param_bytes
        sizes = [s + measure(v) for s, v in zip(sizes, part, strict=True)]
    return commit_chunks(sizes, 1, mutations=count, byte_limit=budget)


def _collect(found: dict[Any, Any], got: Sequence[Any], n: int, asked: int) -> None:
    """Rows read (``n`` key values, then the ``asked`` values) into ``found`` by key."""
    if n == 1:
        found.update(got if asked == 1 else [(r[0], r[1:]) for r in got])
    elif asked == 1:
        found.update([(r[:n], r[n]) for r in got])
    else:
        found.update([(r[:n], r[n:]) for r in got])


def _dbapi_connection(conn: Connection) -> Any:
    try:
        return conn.connection.driver_connection
    except Exception:  # noqa: BLE001  (a closed or detached connection: the default limit)
        return None


#: Spanner's scalar types a key column may have, as an array parameter is cast to them
_ARRAY_TYPES = frozenset(
    {"INT64", "STRING", "BYTES", "DATE", "TIMESTAMP", "NUMERIC", "FLOAT64", "FLOAT32", "BOOL"}
)
#: (id(table), columns read, dialect) -> (the table, the statement, the key binds' processors)
_arrays: Memo[tuple[int, tuple[str, ...], str], tuple[Any, Any, list[Any]]] = Memo(
    "write.stored_arrays", 1024
)


def _spanner_by_arrays(
    table: Any, pk: list[Any], keys: list[str], dialect: Any
) -> tuple[Any, list[Any]] | None:
    """Spanner: ``SELECT <key>, <keys> FROM UNNEST(@k0) AS k0 WITH OFFSET AS i JOIN table
    ON key0 = k0 AND key1 = @k1[OFFSET(i)] ...``, each ``@kj`` the array of the keys'
    j-th values (cast to its column's type), and the bind processor of each key column,
    applied to each value. None when a key column's type has no Spanner array type."""
    at = (id(table), tuple(keys), dialect.name)
    hit = _arrays.get(at)
    if hit is not None and hit[0] is table:
        return hit[1], hit[2]
    types = []
    for c in pk:
        name = str(dialect.type_compiler_instance.process(c.type)).split("(")[0].strip().upper()
        if name not in _ARRAY_TYPES:
            return None
        types.append(name)
    prep = dialect.identifier_preparer

    def quoted(name: str) -> str:  # a ":" in a quoted name is no parameter of text()
        return str(prep.quote(name)).replace(":", "\\:")

    columns = [*pk, *[table.c[k] for k in keys]]
    picked = ", ".join(f"so_t.{quoted(c.name)}" for c in columns)
    on = [f"so_t.{quoted(pk[0].name)} = so_k0"]
    on += [
        f"so_t.{quoted(c.name)} = CAST(:{_KEYS}_{j} AS ARRAY<{types[j]}>)[OFFSET(so_i)]"
        for j, c in enumerate(pk)
        if j
    ]
    table_name = str(prep.format_table(table)).replace(":", "\\:")
    sql = (
        f"SELECT {picked} FROM UNNEST(CAST(:{_KEYS}_0 AS ARRAY<{types[0]}>)) AS so_k0 "
        f"WITH OFFSET AS so_i JOIN {table_name} AS so_t ON {' AND '.join(on)}"
    )
    stmt = text(sql).columns(*[column(c.name, c.type) for c in columns])
    procs = [c.type.dialect_impl(dialect).bind_processor(dialect) for c in pk]
    _arrays.put(at, (table, stmt, procs))
    return stmt, procs


_KEYS = "sharded_orm_keys"
#: (id(table), columns read, keys as JSON) -> (the table, the statement)
_statements: Memo[tuple[int, tuple[str, ...], bool], tuple[Any, Any]] = Memo(
    "write.stored_statements", 1024
)
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
    _statements.put(at, (table, stmt))
    return stmt
