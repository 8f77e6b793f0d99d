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
reads send their keys as arrays so that a statement's parameters and functions do not
grow with its keys.
"""

from __future__ import annotations

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
    "compiled_parameters",
    "parameter_limit",
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

#: mutations per commit, secondary index entries included ("Mutations per commit";
#: an insert counts one per column written)
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
