"""Alembic support for sharded-orm on Cloud Spanner.

Nothing to import in env.py: with the package installed, Alembic loads the autogenerate
plugin ``sharded_orm.autogenerate`` through its ``alembic.plugins`` entry point (enable it
with ``autogenerate_plugins=["alembic.autogenerate.*", "sharded_orm.*"]``), and the
Spanner dialect of sharded-orm brings the Alembic impl (``spanner+spanner``), which
registers the renderers. Our operations (``op.backfill_shard``, ``op.alter_index_storing``,
``op.copy_table_rows``, ``op.retire_table``, ``op.verify_tables``) are on Alembic's
``Operations`` once this package is imported, on any database (SQLite too): Alembic
imports it itself through the entry point, sharded-orm's Spanner dialect imports it, and
``import alembic_ext`` does. Each loads :mod:`alembic_ext.ops` on its first call
(:mod:`alembic_ext.stand_ins`). In a source tree that is not installed, ``import
alembic_ext`` also registers the plugin. See docs/migrations.md.

This ``__init__`` stays light because Alembic imports the plugin module (and so this
package) while its own import is half done: the public names are loaded on first use,
and registering the operations imports nothing of Alembic then (:mod:`.stand_ins`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .plugin import PLUGIN_NAME, register
from .stand_ins import register_operations

if TYPE_CHECKING:
    from .backfill import BackfillProgress, BackfillResult, backfill_shard
    from .impl import SpannerImpl
    from .ops import BackfillShardOp
    from .render import render_item
    from .shaping import index_warnings
    from .split import split_reshard

_LAZY = {
    "BackfillProgress": "backfill",
    "BackfillResult": "backfill",
    "backfill_shard": "backfill",
    "index_warnings": "shaping",
    "SpannerImpl": "impl",
    "BackfillShardOp": "ops",
    "render_item": "render",
    "split_reshard": "split",
}

register()
register_operations()


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'alembic_ext' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "PLUGIN_NAME",
    "BackfillProgress",
    "BackfillResult",
    "BackfillShardOp",
    "SpannerImpl",
    "backfill_shard",
    "index_warnings",
    "render_item",
    "split_reshard",
]
