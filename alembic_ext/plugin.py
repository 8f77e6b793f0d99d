"""The Alembic plugin ``sharded_orm.autogenerate``.

Enable it in env.py with
``context.configure(..., autogenerate_plugins=["alembic.autogenerate.*", "sharded_orm.*"])``.

Alembic (>= 1.18) finds it through the ``alembic.plugins`` entry point and calls
:func:`setup` while ``import alembic`` is still half done (``alembic.ddl`` imports
``alembic.autogenerate``, which imports ``alembic.runtime.plugins``, which loads the entry
points). So this module imports nothing of Alembic at its top (``import alembic_ext``
done first imports Alembic, which loads this module again: ``setup`` must exist by
then), the ``alembic_ext`` package ``__init__`` that Python runs first imports only this
module, and :func:`setup` and the comparator import what they need when called
(``alembic.util`` is complete when Alembic calls ``setup``; :mod:`alembic_ext.compare`
on the comparator's first call). Importing ``alembic.autogenerate`` here was the
circular import that kept the entry point out. Without the entry point (a source tree
that is not installed), ``import alembic_ext`` registers the plugin through
:func:`register`.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from alembic.runtime.plugins import Plugin
    from alembic.util import PriorityDispatchResult

#: The plugin's name; matched by ``"sharded_orm.*"`` in ``autogenerate_plugins``.
PLUGIN_NAME = "sharded_orm.autogenerate"
ENTRY_POINT_GROUP = "alembic.plugins"


def compare(autogen_context: Any, upgrade_ops: Any) -> PriorityDispatchResult:
    """The comparator: rewrite Alembic's finished ops for Spanner (imported on first use)."""
    from alembic.util import PriorityDispatchResult

    from .compare import rewrite_for_spanner
    from .impl_guard import require_our_impl

    require_our_impl(autogen_context.migration_context, "sharded-orm's autogenerate plugin")
    rewrite_for_spanner(autogen_context, upgrade_ops)
    return PriorityDispatchResult.CONTINUE


def compare_shard_server_default(
    autogen_context: Any,
    alter_column_op: Any,
    schema: str | None,
    table_name: str,
    column_name: str,
    conn_col: Any,
    metadata_col: Any,
) -> PriorityDispatchResult:
    """Keep Alembic's generated-column check off the shard columns sharded-orm owns.

    A server-side shard column is a ``Computed`` whose SQL text is a placeholder (the
    dialect renders the real expression), so Alembic's own check warned "Computed default
    on T.C cannot be modified" on every run, changed or not. The rewriter compares those
    columns with the database itself and stops with what to do when they differ; every
    other ``Computed`` column still gets Alembic's check.
    """
    from alembic.util import PriorityDispatchResult

    from sharded_orm.schema.columns import ShardComputed

    if isinstance(metadata_col.computed, ShardComputed):
        return PriorityDispatchResult.STOP
    return PriorityDispatchResult.CONTINUE


def setup(plugin: Plugin) -> None:
    """Register our comparators on ``plugin`` (Alembic's plugin protocol)."""
    from alembic.util import DispatchPriority

    plugin.add_autogenerate_comparator(
        compare,
        "autogenerate",
        priority=DispatchPriority.LAST,
    )
    # FIRST: before Alembic's generated-column check; after its compare_server_default
    # hook when "alembic.autogenerate.*" comes first in autogenerate_plugins (the docs)
    plugin.add_autogenerate_comparator(
        compare_shard_server_default,
        "column",
        "server_default",
        priority=DispatchPriority.FIRST,
    )


def _entry_point_installed() -> bool:
    return any(ep.name == PLUGIN_NAME for ep in metadata.entry_points(group=ENTRY_POINT_GROUP))


def register() -> None:
    """Register the plugin unless Alembic does it through the entry point (idempotent)."""
    from alembic.runtime import plugins

    if PLUGIN_NAME in plugins._all_plugins or _entry_point_installed():
        return
    import sys

    plugins.Plugin.setup_plugin_from_module(sys.modules[__name__], PLUGIN_NAME)
