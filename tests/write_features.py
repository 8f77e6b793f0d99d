"""The library's own write features, and SQLAlchemy's settings that reach a write: the
input space of the write-pair oracle (``test_write_pairs.py``).

Each dimension is a list; the oracle draws one entry of each, so every pair of entries
is drawn. Adding a feature (or a SQLAlchemy setting) is one more entry here. The
"Supported combinations" section of ``docs/shard_columns.md`` lists these entries
(``test_write_pairs_docs.py`` keeps the two in step).
"""

from __future__ import annotations

from typing import Any

#: where the writes run: SQLite in memory, or the Spanner emulator (one database a
#: module, a table set of its own for each example) through the sync engine or through
#: the async one (``spanner+spanner_async``: the same writes, run in SQLAlchemy's greenlet)
BACKENDS = ["sqlite", "spanner", "spanner_async"]

#: the database a backend writes to, where it is another backend's (what it has is that
#: database's: the async engine writes to Spanner)
DATABASE_OF = {"spanner_async": "spanner"}

#: a successor declared (a key reshard between its expand and its contract), or not
SUCCESSOR = [False, True]

#: where the shard is computed: by the client (crc32), or by the database
#: (farm_fingerprint, a generated column on Spanner; on SQLite the client fills it)
SHARD_SIDE = ["client", "server"]

#: the shard column beside the primary key, or its first part
SHARD_POSITION = ["column", "key"]

#: how many columns the primary key has (the shard column apart)
KEY_COLUMNS = [1, 2, 3]

#: the type of the first shard source (the second is a String): each type a Spanner
#: column holds (FLOAT64, JSON and ARRAY are refused as sources, with the reason), aware and
#: naive datetimes, Enums (a SQLAlchemy Enum, a str Enum in a String) and a TypeDecorator
SOURCE_TYPES = [
    "String",
    "BigInteger",
    "UTCDateTime",
    "AwareDateTime",
    "NaiveDateTime",
    "Date",
    "Numeric",
    "Boolean",
    "Enum",
    "StrEnum",
    "Uuid",
    "LargeBinary",
    "TypeDecorator",
    "Float",
    "JSON",
    "Array",
]

#: the ``onupdate=`` of the second source ``b``: every kind SQLAlchemy evaluates
ONUPDATE = ["none", "scalar", "callable", "context", "sql"]

#: the ``default=`` of the second source ``b`` (an insert without ``b``)
DEFAULT = ["scalar", "callable", "context", "sql"]

#: a child table keyed by the parent's key (shard included where it is in the key):
#: none, an ORM ``cascade="all, delete-orphan"``, or ``ON DELETE CASCADE`` in the
#: database with ``passive_deletes=True``
CHILD = ["none", "orm_cascade", "on_delete_cascade"]

#: what writes (after a first load of rows through Core executemany)
WRITE_PATHS = [
    "orm_add",
    "orm_change_b",
    "orm_change_body",
    "orm_delete",
    "bulk_insert_mappings",
    "bulk_update_mappings",
    "orm_insert_many",
    "core_insert_many",
    "core_insert_values",
    "core_insert_without_b",
    "core_update_where_body",
    "core_update_where_b",
    "orm_update_where_auto",
    "orm_update_where_evaluate",
    "orm_update_where_fetch",
    "orm_update_where_none",
    "core_delete_where",
    "orm_delete_where_auto",
    "orm_delete_where_evaluate",
    "orm_delete_where_fetch",
    "orm_delete_where_none",
    "insert_or_ignore_many",
    "sqlite_upsert",
    "sqlite_upsert_sources",
    "sqlite_upsert_many",
    "spanner_insert_or_update_many",
]

#: write paths only one backend has (SQLite's ON CONFLICT; Spanner's INSERT OR UPDATE)
ONLY_ON = {
    "sqlite_upsert": "sqlite",
    "sqlite_upsert_sources": "sqlite",
    "sqlite_upsert_many": "sqlite",
    "spanner_insert_or_update_many": "spanner",
}

#: rows in the statement, per backend, around the limits the library's builders keep:
#: on SQLite around its own chunking; on Spanner around the 950 parameters of one
#: statement (a row of 5 to 9 parameters: 120 and 140 rows are either side of it)
BATCH = [1, 3, 40, 260]
SPANNER_BATCH = [1, 3, 40, 120, 140]


#: source types only one backend has (none now: an aware ``DateTime(timezone=True)`` runs
#: on SQLite too, where it stores the UTC wall time and reads back naive, so a write that
#: reads a stored value back is refused with the reason, naming UTCDateTime)
TYPE_ONLY_ON: dict[str, str] = {}


def database(backend: str) -> str:
    """The database ``backend`` writes to (``spanner_async``: ``spanner``)."""
    return DATABASE_OF.get(backend, backend)


def source_types(backend: str) -> list[str]:
    """The source types ``backend`` has."""
    db = database(backend)
    return [t for t in SOURCE_TYPES if TYPE_ONLY_ON.get(t, db) == db]


def write_paths(backend: str) -> list[str]:
    """The write paths ``backend`` has."""
    db = database(backend)
    return [p for p in WRITE_PATHS if ONLY_ON.get(p, db) == db]


def batches(backend: str) -> list[int]:
    return SPANNER_BATCH if database(backend) == "spanner" else BATCH


def dimensions() -> dict[str, list[Any]]:
    return {
        "backend": BACKENDS,
        "successor": SUCCESSOR,
        "shard_side": SHARD_SIDE,
        "shard_position": SHARD_POSITION,
        "key_columns": KEY_COLUMNS,
        "source_type": SOURCE_TYPES,
        "onupdate": ONUPDATE,
        "default": DEFAULT,
        "child": CHILD,
        "write_path": WRITE_PATHS,
        "batch": sorted(set(BATCH) | set(SPANNER_BATCH)),
    }
