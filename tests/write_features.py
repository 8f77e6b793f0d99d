"""The library's own write features, and SQLAlchemy's settings that reach a write: the
input space of the write-pair oracle (``test_write_pairs.py``).

Each dimension is a list; the oracle draws one entry of each, so every pair of entries
is drawn. Adding a feature (or a SQLAlchemy setting) is one more entry here.
"""

from __future__ import annotations

from typing import Any

#: a successor declared (a key reshard between its expand and its contract), or not
SUCCESSOR = [False, True]

#: where the shard is computed (on SQLite the client fills a server-side column)
SHARD_SIDE = ["client", "server"]

#: how many columns the primary key has (the shard column apart)
KEY_COLUMNS = [1, 2, 3]

#: the type of the first shard source (the second is a String): each type a Spanner
#: column holds, both datetimes, an Enum and a TypeDecorator
SOURCE_TYPES = [
    "String",
    "BigInteger",
    "UTCDateTime",
    "Date",
    "Numeric",
    "Boolean",
    "Enum",
    "Uuid",
    "LargeBinary",
    "TypeDecorator",
]

#: the ``onupdate=`` of the second source ``b``: every kind SQLAlchemy evaluates
ONUPDATE = ["none", "scalar", "callable", "context", "sql"]

#: the ``default=`` of the second source ``b`` (an insert without ``b``)
DEFAULT = ["scalar", "callable", "context", "sql"]

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
    "orm_delete_where",
    "sqlite_upsert",
    "sqlite_upsert_sources",
    "sqlite_upsert_many",
]

#: rows in the statement (around SQLite's own limits the library's chunking decides)
BATCH = [1, 3, 40, 260]


def dimensions() -> dict[str, list[Any]]:
    return {
        "successor": SUCCESSOR,
        "shard_side": SHARD_SIDE,
        "key_columns": KEY_COLUMNS,
        "source_type": SOURCE_TYPES,
        "onupdate": ONUPDATE,
        "default": DEFAULT,
        "write_path": WRITE_PATHS,
        "batch": BATCH,
    }
