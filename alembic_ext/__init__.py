"""Alembic support for sharded-orm on Cloud Spanner.

``import alembic_ext`` in env.py registers the Spanner impl (``spanner+spanner``), the
custom op ``op.backfill_shard`` and the autogenerate plugin ``sharded_orm.autogenerate``
(enable it with ``autogenerate_plugins=["alembic.autogenerate.*", "sharded_orm.*"]``).
See docs/migrations.md.
"""

from __future__ import annotations

from . import render as _render  # noqa: F401  (registers renderers)
from .backfill import BackfillProgress, BackfillResult, backfill_shard
from .compare import index_warnings
from .impl import SpannerImpl
from .ops import BackfillShardOp
from .plugin import PLUGIN_NAME, register
from .render import render_item

register()

__all__ = [
    "PLUGIN_NAME",
    "BackfillProgress",
    "BackfillResult",
    "BackfillShardOp",
    "SpannerImpl",
    "backfill_shard",
    "index_warnings",
    "render_item",
]
