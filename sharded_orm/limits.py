"""The backends' limits on one statement and one commit, in one place, and the arithmetic
that keeps a statement the library builds under them, counted from the statement as it
is compiled (after every hook has added its columns), not from what the caller gave.

Spanner's limits are those on Google's "Quotas and limits" page,
https://cloud.google.com/spanner/quotas (rechecked against its text for issue 41: query
limits; limits for creating, reading, updating and deleting data; request limits; schema
limits; pre-splitting API limits; notes 3 and 10 on how mutations are counted); each
constant names the page's row it comes from. The emulator enforces some of them (parameters,
functions), with Spanner's own messages. SQLite's are its compile-time defaults; a build may
set others (:func:`sqlite_variables` asks the connection).

Builders size their statements here: the dual write's copy into a successor
(``sharded_orm.write.mirror_io``) and the stored-source read of a partial-source UPDATE
(``sharded_orm.write.stored``) count the parameters of the compiled statement; the key
reads (``stored``, and the dual write's read-back of the old rows) send their keys as
arrays so that a statement's parameters and functions do not grow with its keys. The
commits built of mutations (``bulk_load``, ``copy_table``, the backfill's batches) count
their mutations as Spanner does (:func:`row_mutations`) and their bytes as the commit
carries them, index entries and a successor's row included (:func:`row_bytes`), and are
cut with :func:`commit_chunks`; a schema change's statements with :func:`ddl_batches`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SPANNER_CELL_BYTES",
    "SPANNER_COMMIT_BYTES",
    "SPANNER_DDL_BYTES",
    "SPANNER_FUNCTIONS",
    "SPANNER_IN_VALUES",
    "SPANNER_KEY_BYTES",
    "SPANNER_KEY_COLUMNS",
    "SPANNER_MUTATIONS",
    "SPANNER_NAME_LENGTH",
    "SPANNER_NESTED_FUNCTIONS",
    "SPANNER_PARAMETERS",
    "SPANNER_REQUEST_BYTES",
    "SPANNER_REQUEST_OVERHEAD",
    "SPANNER_SPLIT_POINTS",
    "SPANNER_SPLIT_REQUEST_BYTES",
    "SPANNER_STATEMENT_CHARS",
    "SPANNER_STRUCT_FIELDS",
    "SPANNER_TABLE_COLUMNS",
    "SPANNER_UNIONS",
    "SQLITE_COMPOUND_SELECT",
    "SQLITE_VARIABLES",
    "commit_chunks",
    "compiled_parameters",
    "ddl_batches",
    "index_cells",
    "parameter_limit",
    "param_bytes",
    "request_budget",
    "value_bytes",
    "RowBytes",
    "row_bytes",
    "row_mutations",
    "rows_per_statement",
    "sqlite_variables",
]

# Each value below is a row of https://cloud.google.com/spanner/quotas (the page's words
# in quotes); "MiB" there is 1024 * 1024 bytes.

# ------------------------------------------------------------------ Spanner: one statement

#: query parameters per statement (Query limits: "Parameters | 950"; refused by our
#: dialect before it is sent, ``sharded_orm.spanner.dialect``)
SPANNER_PARAMETERS = 950
#: function calls per statement, operators included (Query limits: "Function calls |
#: 1,000"; the emulator: "Number of functions exceeds the maximum allowed limit of 1000"):
#: an OR of per-key ANDs of equalities spends about ``2 * key columns`` per key
SPANNER_FUNCTIONS = 1000
#: function calls nested in one another (Query limits: "Nested function calls | 75")
SPANNER_NESTED_FUNCTIONS = 75
#: values in one IN list (Query limits: "Values in an IN operator | 10,000")
SPANNER_IN_VALUES = 10_000
#: fields of one STRUCT, e.g. a STRUCT key sent as a parameter (Query limits: "STRUCT
#: fields | 1,000")
SPANNER_STRUCT_FIELDS = 1000
#: branches of one UNION (Query limits: "Unions in a query | 200")
SPANNER_UNIONS = 200
#: characters of one SQL statement's text (Query limits: "Query statement length | 1
#: million characters"; characters, not bytes)
SPANNER_STATEMENT_CHARS = 1_000_000
#: bytes of one request other than a commit: a query with its parameters, a read (Request
#: limits: "Request size other than for commits | 10 MiB", note 6: "reading, streaming
#: reads, executing SQL queries, and executing streaming SQL queries")
SPANNER_REQUEST_BYTES = 10 * 1024 * 1024

# ------------------------------------------------------------------ Spanner: one commit

#: mutations per commit, secondary index entries included (Limits for creating, reading,
#: updating, and deleting data: "Mutations per commit (including indexes) | 80,000"; note 3:
#: an insert or update counts one per column it writes, key columns always, a delete one,
#: each index entry it changes apart; note 10: a table with generated or defaulted columns
#: adds those and its key columns again: :func:`row_mutations`). Google's "Commit
#: statistics" page (https://cloud.google.com/spanner/docs/commit-statistics): for DML the
#: 80,000 apply per statement, and a transaction of several statements is bounded by its
#: size (``SPANNER_COMMIT_BYTES``)
SPANNER_MUTATIONS = 80_000
#: bytes one commit may hold (same section: "Commit size (including indexes and change
#: streams) | 100 MiB"): :func:`row_bytes` counts a row's index entries with it
SPANNER_COMMIT_BYTES = 100 * 1024 * 1024

# ------------------------------------------------------------------ Spanner: schema, keys, values

#: bytes of one schema change request (Schema limits, DDL statements: "DDL statement size
#: for a single schema change | 10 MiB")
SPANNER_DDL_BYTES = 10 * 1024 * 1024
#: columns in a table's key, parents' included (Tables: "Number of columns in a table key |
#: 16"), and in an index's key, the table's key columns included (Indexes: "Number of
#: columns in an index key | 16")
SPANNER_KEY_COLUMNS = 16
#: bytes of a table's or index's key (Tables: "Maximum size of a primary key or index key
#: per row | 8 KiB")
SPANNER_KEY_BYTES = 8 * 1024
#: columns of one table (Tables: "Columns per table | 1,024"): a shard column or a
#: successor adds to them
SPANNER_TABLE_COLUMNS = 1024
#: characters of a table's, column's or index's name (Tables, Indexes: "Table name length |
#: 1 to 128 characters", "Column name length", "Index name length"): names the library
#: makes (successors, cursor tables, shard columns, indexes) stay within it
SPANNER_NAME_LENGTH = 128
#: bytes of one cell (Tables: "Maximum size of data per cell | 10 MiB")
SPANNER_CELL_BYTES = 10 * 1024 * 1024
#: split points per ``AddSplitPoints`` request (Pre-splitting API limits: "Split points
#: added per API request | 100")
SPANNER_SPLIT_POINTS = 100
#: bytes of one ``AddSplitPoints`` request (same section: "Split point API request size |
#: 1 MiB")
SPANNER_SPLIT_REQUEST_BYTES = 1024 * 1024

# ------------------------------------------------------------------ SQLite

#: SQLite's default SQLITE_LIMIT_VARIABLE_NUMBER (999 before 3.32)
SQLITE_VARIABLES = 32766
#: SQLite's default SQLITE_LIMIT_COMPOUND_SELECT
SQLITE_COMPOUND_SELECT = 500


def sqlite_variables(dbapi_connection: Any, dbapi: Any) -> int:
    """The most parameters one statement may carry on this SQLite connection (Python 3.11+
    asks the connection; older: the default)."""
    getlimit = getattr(dbapi_connection, "getlimit", None)
    which = getattr(dbapi, "SQLITE_LIMIT_VARIABLE_NUMBER", None)
    if getlimit is None or which is None:
        return SQLITE_VARIABLES
    return int(getlimit(which))


def parameter_limit(dialect: Any, dbapi_connection: Any = None) -> int | None:
    """The most parameters one statement may carry on ``dialect`` (None: no limit known).
    SQLite's is asked of ``dbapi_connection`` when one is given."""
    name = str(getattr(dialect, "name", ""))
    if name.startswith("spanner"):
        return SPANNER_PARAMETERS
    if name == "sqlite":
        if dbapi_connection is None:
            return 999  # the lowest any SQLite build has had
        return sqlite_variables(dbapi_connection, getattr(dialect, "dbapi", None))
    return None


def compiled_parameters(compiled: Any) -> int:
    """The parameters a compiled statement sends (an expanding IN list counts as the values
    it was given: compile it with them rendered, or count them apart)."""
    positions = getattr(compiled, "positiontup", None)
    if positions is not None:
        return len(positions)
    return len(compiled.params)


def rows_per_statement(one: int, two: int, limit: int) -> int:
    """How many rows fit in one multi-row statement under ``limit`` parameters, from the
    parameters the compiled statement sends with one row and with two (what a row costs,
    and what the statement costs whatever its rows). At least one: a single row over the
    limit is left for the driver's own refusal, which says so."""
    per_row = max(two - one, 1)
    fixed = max(one - per_row, 0)
    return max(1, (limit - fixed) // per_row)


# ------------------------------------------------------------------ Spanner: counting commits


def index_cells(table: Any, index: Any) -> int:
    """The cells one entry of a secondary ``index`` of ``table`` writes: its key parts, the
    table's key columns it does not name (every entry carries the row's key) and its
    STORING columns."""
    return len(_entry_columns(table, index))


def _entry_columns(table: Any, index: Any) -> list[str]:
    """The keys of the columns one entry of ``index`` holds (see :func:`index_cells`); a
    STORING name that is no column of ``table`` stays as given."""
    keys = [c.key for c in index.columns]
    key = [c.key for c in table.primary_key.columns if c.key not in keys]
    by_name = {c.name: c.key for c in table.columns}
    # dialect_options.get: an index declared with no spanner_* option loads no Spanner client
    spanner = index.dialect_options.get("spanner", {})
    storing = [by_name.get(str(n), str(n)) for n in spanner.get("storing") or ()]
    return keys + key + storing


def _indexed(index: Any, columns: set[str] | None) -> bool:
    if columns is None:
        return True
    storing = set(index.dialect_options.get("spanner", {}).get("storing") or ())
    return bool(columns & ({c.name for c in index.columns} | storing))


def _fills(column: Any) -> bool:
    """The server fills ``column`` on a write (generated, DEFAULT, IDENTITY)."""
    return (
        column.computed is not None
        or column.server_default is not None
        or column.identity is not None
    )


def _server_filled(table: Any) -> int:
    """Columns the server fills on a write: the quotas page's note 10 counts each, and the
    key columns again, on every row written to such a table."""
    return sum(1 for c in table.columns if _fills(c))


def row_mutations(
    table: Any,
    written: int,
    *,
    indexes: bool = True,
    replaces: bool = False,
    changed: Iterable[str] | None = None,
) -> int:
    """The mutations one row's write costs a commit, as Spanner counts them ("Mutations per
    commit", notes 3 and 10 of https://cloud.google.com/spanner/quotas): ``written`` (its
    columns, key included); on a table with generated, DEFAULT or IDENTITY columns, those
    and the key columns once more (note 10: "(Number of columns explicitly written) +
    (Number of generated columns or columns with default values) + (Number of primary key
    columns)"); and, for each secondary index (``indexes``) whose key or STORING holds a
    column the write changes (``changed`` names them; None: every index), the entry's
    cells (:func:`index_cells`), plus one for the old entry's delete when the write may
    replace a stored row (``replaces``: ``insert_or_update``, ``update``). An upper bound:
    an unchanged entry costs nothing."""
    per_row = written
    filled = _server_filled(table)
    if filled:
        per_row += filled + len(table.primary_key.columns)
    if indexes:
        names = None if changed is None else set(changed)
        for ix in table.indexes:
            if _indexed(ix, names):
                per_row += index_cells(table, ix) + (1 if replaces else 0)
    return per_row


# ------------------------------------------------------------------ Spanner: a commit's bytes


def value_bytes(value: Any) -> int:
    """Bytes one value takes in a commit, about: strings by their UTF-8 length, bytes by
    theirs, each with 8 for its framing; arrays by their items; anything else 16."""
    if value is None:
        return 1
    if isinstance(value, str):
        return len(value.encode()) + 8
    if isinstance(value, (bytes, bytearray)):
        return len(value) + 8
    if isinstance(value, (list, tuple)):
        return 8 + sum(value_bytes(v) for v in value)
    if isinstance(value, dict):
        return len(json.dumps(value, default=str)) + 8
    return 16


#: bytes a query request carries besides its SQL text and its parameters' values: the
#: session's name, the transaction selector, the parameters' names and types, request
#: options and tags (an upper bound; the budget :func:`request_budget` leaves them)
SPANNER_REQUEST_OVERHEAD = 64 * 1024


def param_bytes(value: Any) -> int:
    """Bytes one query parameter's value takes in a request (``ExecuteSql``), about: a
    string by its UTF-8 length, BYTES as the base64 text the wire carries them as (4 for
    every 3), an array by its items, each with 8 for its framing; anything else (numbers,
    dates, timestamps, sent as their text) 32."""
    if value is None:
        return 2
    if isinstance(value, str):
        return len(value.encode()) + 8
    if isinstance(value, (bytes, bytearray)):
        return 4 * -(-len(value) // 3) + 8
    if isinstance(value, (list, tuple)):
        return 8 + sum(param_bytes(v) for v in value)
    return 32


def request_budget(sql: str, limit: int = SPANNER_REQUEST_BYTES) -> int:
    """The bytes a query's parameter values may take under ``limit`` ("Request size other
    than for commits | 10 MiB"), its SQL text (UTF-8) and :data:`SPANNER_REQUEST_OVERHEAD`
    left out. At least 1."""
    return max(1, limit - len(sql.encode()) - SPANNER_REQUEST_OVERHEAD)


def column_bytes(column: Any) -> int:
    """The most bytes a value of ``column`` takes, for a cell the client does not send (a
    generated column the server fills): a bounded STRING or BYTES by its length (4 bytes
    a character, UTF-8's most), anything else as :func:`value_bytes` counts a scalar."""
    length = getattr(column.type, "length", None)
    if isinstance(length, int):
        return 4 * length + 8
    return 16


@dataclass(frozen=True)
class RowBytes:
    """What one row's write carries in a commit, in bytes: each value it sends once for the
    row and once for every secondary index entry holding it (as a key part, as the table's
    key every entry carries, or STORING), and ``fixed`` for the cells the server fills
    (generated columns, and their copies in index entries). Made once per table and
    columns (:func:`row_bytes`); called once per row."""

    weights: tuple[int, ...]  # per value sent, in the order sent
    fixed: int = 0

    def __call__(self, values: Sequence[Any]) -> int:
        return self.fixed + sum(
            w * value_bytes(v) for w, v in zip(self.weights, values, strict=True)
        )


def row_bytes(table: Any, columns: Sequence[str], *, indexes: bool = True) -> RowBytes:
    """The sizer of a row of ``table`` sent as values of ``columns`` (column keys, in the
    order sent) as a commit counts it ("Commit size (including indexes and change
    streams) | 100 MiB", https://cloud.google.com/spanner/quotas): the row's values, and
    with ``indexes`` each secondary index's entry (its columns, the table's key and its
    STORING columns, :func:`index_cells`). Several tables written in one commit (a key
    reshard's successor) are each sized with their own and summed."""
    at = {name: i for i, name in enumerate(columns)}
    weights = [1] * len(columns)
    fixed = 0
    # a column not sent is NULL in the row (1 byte), or filled by the server (its most)
    filled = [c for c in table.columns if c.key not in at and _fills(c)]
    unsent = {c.key: column_bytes(c) for c in filled}
    fixed += sum(unsent.values())
    if indexes:
        for ix in table.indexes:
            for key in _entry_columns(table, ix):
                if key in at:
                    weights[at[key]] += 1
                else:
                    fixed += unsent.get(key, value_bytes(None))
    return RowBytes(tuple(weights), fixed)


def commit_chunks(
    sizes: Sequence[int],
    per_row: int,
    *,
    fixed: int = 0,
    fixed_bytes: int = 0,
    mutations: int = SPANNER_MUTATIONS,
    byte_limit: int = SPANNER_COMMIT_BYTES,
) -> list[tuple[int, int]]:
    """Rows cut into commits, as ``[start, end)`` ranges in order: each under ``mutations``
    (``per_row`` a row, :func:`row_mutations`, and ``fixed`` for what every commit adds,
    e.g. a cursor row) and under ``byte_limit`` (``sizes``: each row's bytes;
    ``fixed_bytes`` every commit's own). A row alone over a limit is a commit of its own,
    for Spanner to refuse with its own message."""
    out: list[tuple[int, int]] = []
    start = 0
    count = used = 0
    for i, size in enumerate(sizes):
        if count and (
            fixed + (count + 1) * per_row > mutations or fixed_bytes + used + size > byte_limit
        ):
            out.append((start, i))
            start, count, used = i, 0, 0
        count += 1
        used += size
    if count:
        out.append((start, len(sizes)))
    return out


def ddl_batches(statements: Sequence[str], byte_limit: int = SPANNER_DDL_BYTES) -> list[list[str]]:
    """Schema statements cut into requests (``UpdateDatabaseDdl``), in order, each under
    ``byte_limit`` bytes of statement text (UTF-8). A statement alone over it is a request
    of its own, for Spanner to refuse with its own message."""
    out: list[list[str]] = []
    batch: list[str] = []
    used = 0
    for stmt in statements:
        size = len(stmt.encode())
        if batch and used + size > byte_limit:
            out.append(batch)
            batch, used = [], 0
        batch.append(stmt)
        used += size
    if batch:
        out.append(batch)
    return out
