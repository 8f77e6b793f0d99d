"""sharded-orm: hotspot-free keys and indexes for Cloud Spanner, in SQLAlchemy.

Importing this package is cheap: it loads what must be in place before a model or an
engine meets the library (the Spanner dialect's registration, the DDL compilers, the ORM
and Session hooks) and nothing else. Every public name is loaded from its module on first
use (a module ``__getattr__``, as ``alembic_ext`` does): ``from sharded_orm import lint``
imports the linter then, never at ``import sharded_orm``. Nothing here imports
google-cloud-spanner, Alembic, rich or matplotlib.

To add a public name: one line in ``_LAZY`` (name -> module), the same import under
``TYPE_CHECKING`` (for mypy and IDEs), and the name in ``__all__``
(tests/test_package.py checks the three agree).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Registration side effects, needed before a model or an engine meets the library: the
# Spanner dialect under both names (sharded_orm.spanner), the server-side shard DDL
# (expressions), the ORM events (installed per sharded mapper when it is configured), the
# Session's do_orm_execute hook; the engine hook is attached per engine (watch).
from sharded_orm.spanner import expressions as _expressions  # noqa: F401
from sharded_orm.write import orm_events as _orm_events  # noqa: F401
from sharded_orm.write import session_events as _session_events  # noqa: F401

#: the installed distribution's version (``importlib.metadata``), read on first use
__version__: str

if TYPE_CHECKING:
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
    from sharded_orm.load.bulk import BulkLoadError, BulkLoadReport, BulkValidationError, bulk_load
    from sharded_orm.load.presplit import PresplitReport, presplit
    from sharded_orm.load.verify import VerifyReport, verify
    from sharded_orm.read.merge import FoundBound, MergeStats, merged, order_columns
    from sharded_orm.read.pagination import CursorError, Page, page, set_cursor_secret
    from sharded_orm.read.plan import expand, sharded_select
    from sharded_orm.schema.columns import (
        ShardColumn,
        ShardSpec,
        get_shard_column,
        shard_column,
        shard_columns,
    )
    from sharded_orm.schema.indexes import ShardedIndex
    from sharded_orm.schema.interleave import interleave_in
    from sharded_orm.schema.keys import OrderedPrimaryKey, key_column, primary_key
    from sharded_orm.schema.mixins import TimestampShardedMixin
    from sharded_orm.schema.naive import set_naive_datetimes
    from sharded_orm.schema.types import UTCDateTime
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
    from sharded_orm.write.engine_hook import watch
    from sharded_orm.write.successor import declare_successor

#: public name -> the module that defines it, imported on first use
_LAZY: dict[str, str] = {
    "ShardConfigError": "sharded_orm.errors",
    "ShardingError": "sharded_orm.errors",
    "ShardingWarning": "sharded_orm.errors",
    "ShardMismatchError": "sharded_orm.errors",
    "ShardReadError": "sharded_orm.errors",
    "ShardTypeError": "sharded_orm.errors",
    "ShardValueError": "sharded_orm.errors",
    "UnsupportedOnDialectError": "sharded_orm.errors",
    "canonical_string": "sharded_orm.hashing",
    "canonical_text": "sharded_orm.hashing",
    "compute_shard": "sharded_orm.hashing",
    "BitReversedPrimaryKeyMixin": "sharded_orm.ids.mixins",
    "HashedPrimaryKeyMixin": "sharded_orm.ids.mixins",
    "UUIDPrimaryKeyMixin": "sharded_orm.ids.mixins",
    "bit_reverse": "sharded_orm.ids.mixins",
    "get_by_id": "sharded_orm.ids.mixins",
    "hashed_id_of": "sharded_orm.ids.mixins",
    "hashed_reference": "sharded_orm.ids.mixins",
    "id_filter": "sharded_orm.ids.mixins",
    "SequenceExhausted": "sharded_orm.ids.sequences",
    "SpannerSequence": "sharded_orm.ids.sequences",
    "TableSequence": "sharded_orm.ids.sequences",
    "BulkLoadError": "sharded_orm.load.bulk",
    "BulkLoadReport": "sharded_orm.load.bulk",
    "BulkValidationError": "sharded_orm.load.bulk",
    "bulk_load": "sharded_orm.load.bulk",
    "PresplitReport": "sharded_orm.load.presplit",
    "presplit": "sharded_orm.load.presplit",
    "VerifyReport": "sharded_orm.load.verify",
    "verify": "sharded_orm.load.verify",
    "FoundBound": "sharded_orm.read.merge",
    "MergeStats": "sharded_orm.read.merge",
    "merged": "sharded_orm.read.merge",
    "order_columns": "sharded_orm.read.merge",
    "CursorError": "sharded_orm.read.pagination",
    "Page": "sharded_orm.read.pagination",
    "page": "sharded_orm.read.pagination",
    "set_cursor_secret": "sharded_orm.read.pagination",
    "expand": "sharded_orm.read.plan",
    "sharded_select": "sharded_orm.read.plan",
    "ShardColumn": "sharded_orm.schema.columns",
    "ShardSpec": "sharded_orm.schema.columns",
    "get_shard_column": "sharded_orm.schema.columns",
    "shard_column": "sharded_orm.schema.columns",
    "shard_columns": "sharded_orm.schema.columns",
    "ShardedIndex": "sharded_orm.schema.indexes",
    "interleave_in": "sharded_orm.schema.interleave",
    "OrderedPrimaryKey": "sharded_orm.schema.keys",
    "key_column": "sharded_orm.schema.keys",
    "primary_key": "sharded_orm.schema.keys",
    "TimestampShardedMixin": "sharded_orm.schema.mixins",
    "set_naive_datetimes": "sharded_orm.schema.naive",
    "UTCDateTime": "sharded_orm.schema.types",
    "Diagnosis": "sharded_orm.tools.doctor",
    "HotspotFinding": "sharded_orm.tools.doctor",
    "doctor": "sharded_orm.tools.doctor",
    "Finding": "sharded_orm.tools.lint",
    "lint": "sharded_orm.tools.lint",
    "Comparison": "sharded_orm.tools.simulate",
    "Instance": "sharded_orm.tools.simulate",
    "SimulationResult": "sharded_orm.tools.simulate",
    "Workload": "sharded_orm.tools.simulate",
    "sample_rows": "sharded_orm.tools.simulate",
    "simulate": "sharded_orm.tools.simulate",
    "watch": "sharded_orm.write.engine_hook",
    "declare_successor": "sharded_orm.write.successor",
}


if not TYPE_CHECKING:  # hidden from mypy and IDEs: a misspelt name stays an error there

    def __getattr__(name: str) -> Any:
        if name == "__version__":  # read on first use: importlib.metadata is not free
            from sharded_orm.telemetry.version import version

            globals()[name] = version()
            return globals()[name]
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # once: later lookups do not come back here
        return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"__version__"})


__all__ = [
    "bit_reverse",
    "BitReversedPrimaryKeyMixin",
    "bulk_load",
    "BulkLoadError",
    "BulkLoadReport",
    "BulkValidationError",
    "canonical_string",
    "canonical_text",
    "Comparison",
    "compute_shard",
    "CursorError",
    "declare_successor",
    "Diagnosis",
    "doctor",
    "expand",
    "Finding",
    "FoundBound",
    "get_by_id",
    "get_shard_column",
    "hashed_id_of",
    "hashed_reference",
    "HashedPrimaryKeyMixin",
    "HotspotFinding",
    "id_filter",
    "Instance",
    "interleave_in",
    "key_column",
    "lint",
    "merged",
    "MergeStats",
    "order_columns",
    "OrderedPrimaryKey",
    "Page",
    "page",
    "presplit",
    "PresplitReport",
    "primary_key",
    "sample_rows",
    "SequenceExhausted",
    "set_cursor_secret",
    "set_naive_datetimes",
    "shard_column",
    "shard_columns",
    "ShardColumn",
    "ShardConfigError",
    "sharded_select",
    "ShardedIndex",
    "ShardingError",
    "ShardingWarning",
    "ShardMismatchError",
    "ShardReadError",
    "ShardSpec",
    "ShardTypeError",
    "ShardValueError",
    "simulate",
    "SimulationResult",
    "SpannerSequence",
    "TableSequence",
    "TimestampShardedMixin",
    "UnsupportedOnDialectError",
    "UTCDateTime",
    "UUIDPrimaryKeyMixin",
    "verify",
    "VerifyReport",
    "watch",
    "Workload",
]
