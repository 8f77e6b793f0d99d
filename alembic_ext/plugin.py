"""The Alembic plugin ``sharded_orm.autogenerate``.

Enable it in env.py with
``context.configure(..., autogenerate_plugins=["alembic.autogenerate.*", "sharded_orm.*"])``.

Alembic (>= 1.18) finds third-party plugins through the ``alembic.plugins`` entry point
group, calling this module's :func:`setup` with a ``Plugin`` named after the entry
point. Where that entry point is not installed (a source checkout), ``import
alembic_ext`` registers the plugin itself through :func:`register`.
"""

from __future__ import annotations

from importlib import metadata

from alembic.runtime.plugins import Plugin
from alembic.util import DispatchPriority

#: The plugin's name; matched by ``"sharded_orm.*"`` in ``autogenerate_plugins``.
PLUGIN_NAME = "sharded_orm.autogenerate"
ENTRY_POINT_GROUP = "alembic.plugins"


def setup(plugin: Plugin) -> None:
    """Register our comparator on ``plugin`` (Alembic's plugin protocol)."""
    from .compare import rewrite_for_spanner

    plugin.add_autogenerate_comparator(
        rewrite_for_spanner,  # type: ignore[arg-type]  # returns None: CONTINUE
        "autogenerate",
        priority=DispatchPriority.LAST,
    )


def _entry_point_installed() -> bool:
    return any(ep.name == PLUGIN_NAME for ep in metadata.entry_points(group=ENTRY_POINT_GROUP))


def register() -> None:
    """Register the plugin unless Alembic does it through the entry point (idempotent)."""
    from alembic.runtime import plugins

    if PLUGIN_NAME in plugins._all_plugins or _entry_point_installed():
        return
    import sys

    Plugin.setup_plugin_from_module(sys.modules[__name__], PLUGIN_NAME)
