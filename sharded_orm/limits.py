"""The backends' limits on one statement and one commit, in one place, and the arithmetic
that keeps a statement the library builds under them, counted from the statement as it
is compiled (after every hook has added its columns), not from what the caller gave.

Spanner's limits are those on Google's "Quotas and limits" page
(https://cloud.google.com/spanner/quotas: query limits; limits for creating, reading,
updating and deleting data; schema limits). The emulator enforces the ones marked so, with
Spanner's own messages. SQLite's are its compile-time defaults; a build may set others
(:func:`sqlite_variables` asks the connection).

Builders size their statements here: the dual write's copy into a successor
(``sharded_orm.write.mirror_io``) and the stored-source read of a partial-source UPDATE
(``sharded_orm.write.stored``) count the parameters of the compiled statement; the key
reads (``stored``, and the dual write's read-back of the old rows) send their keys as
arrays so that a statement's parameters and functions do not grow with its keys. The
commits built of mutations (``bulk_load``, ``copy_table``, the backfill's batches) count
their mutations as Spanner does (:func:`row_mutations`) and are cut with
:func:`commit_chunks`; a schema change's statements with :func:`ddl_batches`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "SPANNER_COMMIT_BYTES",
    "SPANNER_DDL_BYTES",
    "SPANNER_FUNCTIONS",
    "SPANNER_IN_VALUES",
    "SPANNER_KEY_BYTES",
    "SPANNER_KEY_COLUMNS",
    "SPANNER_MUTATIONS",
    "SPANNER_PARAMETERS",
    "SPANNER_SPLIT_POINTS",
    "SPANNER_STATEMENT_BYTES",
    "SQLITE_COMPOUND_SELECT",
    "SQLITE_VARIABLES",
    "commit_chunks",
    "compiled_parameters",
    "ddl_batches",
    "index_cells",
    "parameter_limit",
    "row_mutations",
    "rows_per_statement",
    "sqlite_variables",
]

# ------------------------------------------------------------------ Spanner: one statement

#: query parameters per statement ("Query parameters"; refused by our dialect before it is
#: sent, ``sharded_orm.spanner.dialect``)
SPANNER_PARAMETERS = 950
#: function calls per statement, operators included ("Functions"; the emulator: "Number of
#: functions exceeds the maximum allowed limit of 1000"): an OR of per-key ANDs of
#: equalities spends about ``2 * key columns`` per key
SPANNER_FUNCTIONS = 1000
#: values in one IN list ("Values in an IN operator")
SPANNER_IN_VALUES = 10_000
#: length of one SQL statement's text ("SQL statement length": 1 MB)
SPANNER_STATEMENT_BYTES = 1024 * 1024

# ------------------------------------------------------------------ Spanner: one commit

#: mutations per commit, secondary index entries included ("Mutations per commit
#: (including indexes)"; an insert or update counts one per column it writes, key columns
#: always; a delete one; each index entry it changes counts apart: :func:`row_mutations`).
#: Google's "Commit statistics" page: for DML the 80,000 apply per statement, and a
#: transaction of several statements is bounded by its size (``SPANNER_COMMIT_BYTES``)
SPANNER_MUTATIONS = 80_000
#: bytes one commit may hold ("Commit size", indexes and change streams included: 100 MB)
SPANNER_COMMIT_BYTES = 100 * 1024 * 1024

# ------------------------------------------------------------------ Spanner: schema, keys

#: bytes of one schema change request ("Schema change size": 10 MB)
SPANNER_DDL_BYTES = 10 * 1024 * 1024
#: columns in a table's or index's key, parents' included
SPANNER_KEY_COLUMNS = 16
#: bytes of a table's or index's key ("Size of a table or index key": 8 KB)
SPANNER_KEY_BYTES = 8 * 1024
#: split points per ``AddSplitPoints`` request
SPANNER_SPLIT_POINTS = 100

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
    names = {c.name for c in index.columns}
    key = [c.name for c in table.primary_key.columns if c.name not in names]
    storing = index.dialect_kwargs.get("spanner_storing") or ()
    return len(names) + len(key) + len(storing)


def _indexed(index: Any, columns: set[str] | None) -> bool:
    if columns is None:
        return True
    storing = set(index.dialect_kwargs.get("spanner_storing") or ())
    return bool(columns & ({c.name for c in index.columns} | storing))


def row_mutations(
    table: Any,
    written: int,
    *,
    indexes: bool = True,
    replaces: bool = False,
    changed: Iterable[str] | None = None,
) -> int:
    """The mutations one row's write costs a commit, as Spanner counts them ("Mutations per
    commit"): ``written`` (its columns, key included) and, for each secondary index
    (``indexes``) whose key or STORING holds a column the write changes (``changed``
    names them; None: every index), the entry's cells (:func:`index_cells`), plus one
    for the old entry's delete when the write may replace a stored row (``replaces``:
    ``insert_or_update``, ``update``). An upper bound: an unchanged entry costs nothing."""
    per_row = written
    if indexes:
        names = None if changed is None else set(changed)
        for ix in table.indexes:
            if _indexed(ix, names):
                per_row += index_cells(table, ix) + (1 if replaces else 0)
    return per_row


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
