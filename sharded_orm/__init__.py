"""sharded-orm: hotspot-free keys and indexes for Cloud Spanner, in SQLAlchemy.

Importing this package is cheap: it never imports google-cloud-spanner; only the
modules under ``sharded_orm.spanner`` and ``sharded_orm.testing`` that talk to
Spanner do, when they are used.
"""

from __future__ import annotations

# --- bulk loading ---
from .bulk import BulkLoadError, BulkLoadReport, BulkValidationError, bulk_load

# --- foundation (shard hash, shard columns) ---
from .columns import ShardColumn, ShardSpec, get_shard_column, shard_column, shard_columns
from .errors import (
    ShardConfigError,
    ShardingError,
    ShardMismatchError,
    ShardTypeError,
    ShardValueError,
    UnsupportedOnDialectError,
)
from .hashing import canonical_string, canonical_text, compute_shard

# --- key strategies (ids, sequences) ---
from .ids import (
    BitReversedPrimaryKeyMixin,
    HashedPrimaryKeyMixin,
    UUIDPrimaryKeyMixin,
    bit_reverse,
    get_by_id,
    hashed_id_of,
    hashed_reference,
    id_filter,
)

# --- schema constructs (indexes, descending keys, mixins) ---
from .indexes import ShardedIndex
from .interleave import interleave_in
from .keys import OrderedPrimaryKey, key_column, primary_key

# --- linter and simulator ---
from .lint import Finding, lint

# --- sharded queries ---
from .merge import MergeStats, merged, order_columns
from .mixins import TimestampShardedMixin
from .pagination import CursorError, Page, page, set_cursor_secret
from .query import expand, sharded_select
from .sequences import SequenceExhausted, SpannerSequence, TableSequence
from .simulate import Comparison, Instance, SimulationResult, Workload, sample_rows, simulate
from .types import UTCDateTime

__all__ = [
    "Comparison",
    "Finding",
    "Instance",
    "SimulationResult",
    "Workload",
    "lint",
    "sample_rows",
    "simulate",
    "BulkLoadError",
    "BulkLoadReport",
    "BulkValidationError",
    "bulk_load",
    "BitReversedPrimaryKeyMixin",
    "HashedPrimaryKeyMixin",
    "SequenceExhausted",
    "SpannerSequence",
    "TableSequence",
    "UUIDPrimaryKeyMixin",
    "bit_reverse",
    "get_by_id",
    "hashed_id_of",
    "hashed_reference",
    "id_filter",
    "CursorError",
    "MergeStats",
    "Page",
    "expand",
    "merged",
    "order_columns",
    "page",
    "set_cursor_secret",
    "sharded_select",
    "OrderedPrimaryKey",
    "ShardedIndex",
    "TimestampShardedMixin",
    "interleave_in",
    "key_column",
    "primary_key",
    "ShardColumn",
    "ShardConfigError",
    "ShardMismatchError",
    "ShardSpec",
    "ShardTypeError",
    "ShardValueError",
    "ShardingError",
    "UTCDateTime",
    "UnsupportedOnDialectError",
    "canonical_string",
    "canonical_text",
    "compute_shard",
    "get_shard_column",
    "shard_column",
    "shard_columns",
]

# Registration side effects: the write-path hook and the server-side shard DDL.
from . import execution as _execution  # noqa: E402,F401
from .spanner import expressions as _expressions  # noqa: E402,F401
