"""sharded-orm: hotspot-free keys and indexes for Cloud Spanner, in SQLAlchemy.

Importing this package is cheap: it never imports google-cloud-spanner; only the
modules under ``sharded_orm.spanner`` and ``sharded_orm.testing`` that talk to
Spanner do, when they are used.
"""

from __future__ import annotations

from sharded_orm.errors import (
    ShardConfigError,
    ShardingError,
    ShardingWarning,
    ShardMismatchError,
    ShardReadError,
    ShardTypeError,
    ShardValueError,
    UnsupportedOnDialectError,
)
from sharded_orm.hashing import canonical_string, canonical_text, compute_shard

# --- key strategies (ids, sequences) ---
from sharded_orm.ids.mixins import (
    BitReversedPrimaryKeyMixin,
    HashedPrimaryKeyMixin,
    UUIDPrimaryKeyMixin,
    bit_reverse,
    get_by_id,
    hashed_id_of,
    hashed_reference,
    id_filter,
)
from sharded_orm.ids.sequences import SequenceExhausted, SpannerSequence, TableSequence

# --- bulk loading ---
from sharded_orm.load.bulk import BulkLoadError, BulkLoadReport, BulkValidationError, bulk_load

# --- at scale: pre-splitting, verifying shards (google is imported inside the calls) ---
from sharded_orm.load.presplit import PresplitReport, presplit
from sharded_orm.load.verify import VerifyReport, verify

# --- sharded queries ---
from sharded_orm.read.merge import FoundBound, MergeStats, merged, order_columns
from sharded_orm.read.pagination import CursorError, Page, page, set_cursor_secret
from sharded_orm.read.plan import expand, sharded_select

# --- foundation (shard hash, shard columns) ---
from sharded_orm.schema.columns import (
    ShardColumn,
    ShardSpec,
    get_shard_column,
    shard_column,
    shard_columns,
)

# --- schema constructs (indexes, descending keys, mixins) ---
from sharded_orm.schema.indexes import ShardedIndex
from sharded_orm.schema.interleave import interleave_in
from sharded_orm.schema.keys import OrderedPrimaryKey, key_column, primary_key
from sharded_orm.schema.mixins import TimestampShardedMixin
from sharded_orm.schema.naive import set_naive_datetimes
from sharded_orm.schema.types import UTCDateTime

# --- linter, simulator, doctor ---
from sharded_orm.tools.doctor import Diagnosis, HotspotFinding, doctor
from sharded_orm.tools.lint import Finding, lint
from sharded_orm.tools.simulate import (
    Comparison,
    Instance,
    SimulationResult,
    Workload,
    sample_rows,
    simulate,
)

__all__ = [
    "Comparison",
    "Diagnosis",
    "HotspotFinding",
    "doctor",
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
    "PresplitReport",
    "VerifyReport",
    "presplit",
    "verify",
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
    "FoundBound",
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
    "ShardReadError",
    "ShardTypeError",
    "ShardValueError",
    "ShardingError",
    "ShardingWarning",
    "UTCDateTime",
    "UnsupportedOnDialectError",
    "canonical_string",
    "canonical_text",
    "compute_shard",
    "get_shard_column",
    "shard_column",
    "shard_columns",
    "set_naive_datetimes",
    "declare_successor",
    "watch",
]

# Registration side effects: the ORM events (installed per sharded mapper when it is
# configured), the server-side shard DDL. The engine hook is attached per engine (watch).
from sharded_orm.spanner import expressions as _expressions  # noqa: E402,F401
from sharded_orm.write import orm_events as _orm_events  # noqa: E402,F401
from sharded_orm.write import session_events as _session_events  # noqa: E402,F401
from sharded_orm.write.engine_hook import watch  # noqa: E402
from sharded_orm.write.successor import declare_successor  # noqa: E402
