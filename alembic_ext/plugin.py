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
on the comparator's first call). :func:`setup` also registers sharded-orm's Spanner
dialect (:func:`register_dialect`), so env.py needs no ``import sharded_orm`` in either
import order (docs/migrations.md). Importing ``alembic.autogenerate`` here was the
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


def register_dialect() -> None:
    """Make Alembic work on a Spanner engine whose dialect is sqlalchemy-spanner's own.

    Alembic calls :func:`setup` on ``import alembic``. An env.py that never imports the
    library (its engine made first, by the app's own engine module) has sqlalchemy-spanner's
    dialect, which brings no Alembic impl: Alembic failed with a bare ``KeyError:
    'spanner+spanner'``. A dialect-level listener defines our impl when such an engine
    connects inside an Alembic command (below); plain migrations then run on the stock
    dialect, and what needs the library's dialect is refused naming the fix (``import
    sharded_orm`` before ``create_engine``). The dialect itself is never switched: an app
    that merely has the library installed keeps sqlalchemy-spanner's dialect and loads
    nothing of the library until it imports it.
    """
    from sqlalchemy import event
    from sqlalchemy.engine import Dialect

    # a dialect event, not a connection event: an Engine keeps SQLAlchemy's no-events
    # path (``Engine._has_events``), and the listener runs once per DB-API connection
    if not event.contains(Dialect, "do_connect", _impl_for_stock_engine):
        event.listen(Dialect, "do_connect", _impl_for_stock_engine)


#: set once the listener below has defined alembic_ext.impl
_impl_defined = False
#: the names sqlalchemy-spanner's dialect goes by (sharded_orm.spanner.SPANNER_DIALECT_NAMES)
_SPANNER = ("spanner+spanner", "spanner")


def _impl_for_stock_engine(dialect: Any, *_connect_args: Any) -> None:
    """Define our impl when an engine made before ``import alembic`` connects in a command
    (its first DB-API connection: a connection pooled before the command began does not
    connect again, and then the command fails as before, on Alembic's ``KeyError``).

    Such an engine (a script that imports the app's engine module, then runs Alembic's
    command API) has sqlalchemy-spanner's own dialect, which brings no impl: Alembic
    failed on it with ``KeyError: 'spanner+spanner'``. Our impl runs plain migrations on
    it; what needs our dialect is refused naming the fix (``sharded_orm.spanner.stock``).
    An impl the app defines itself is still honoured (``.impl_guard``). Outside an Alembic
    command (env.py running) nothing is loaded: an app on the stock dialect stays as it is.
    """
    global _impl_defined
    if _impl_defined or getattr(dialect, "name", None) not in _SPANNER:
        return None
    import sys

    if getattr(sys.modules.get("alembic"), "__version__", None) is None:
        return None  # Alembic's own import is still under way
    from alembic import context

    try:
        context.config  # noqa: B018  (set while an Alembic command runs env.py)
    except (NameError, AttributeError):
        return None
    import importlib

    # its base class, sharded_orm.spanner.alembic_impl.SpannerImpl, registers for
    # spanner+spanner (unless the app's own impl is there) and builds it
    importlib.import_module("alembic_ext.impl")
    _impl_defined = True
    return None  # (a do_connect listener that returns None lets the dialect connect)


def setup(plugin: Plugin) -> None:
    """Register our comparators on ``plugin`` (Alembic's plugin protocol), and our dialect."""
    from alembic.util import DispatchPriority

    register_dialect()

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
