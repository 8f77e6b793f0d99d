"""The class Alembic finds for ``spanner+spanner``; the impl itself loads when Alembic builds one.

Alembic looks its impl up by dialect name in a registry that a ``DefaultImpl`` subclass
joins when its class body sets ``__dialect__``, and builds it at once
(``MigrationContext`` does ``DefaultImpl.get_by_dialect(dialect)(dialect, connection,
...)``); without one, ``MigrationContext.configure`` fails with ``KeyError:
'spanner+spanner'``. Our dialect module imports this one so env.py needs no import for
it, as sqlalchemy-cockroachdb does, but an application's engine must not pay for
migrations: this module defines only :class:`SpannerImpl`, which joins the registry and,
when Alembic builds one, loads :mod:`alembic_ext.impl` and builds its full impl (a
subclass of this class that does not register itself). Alembic reads nothing of the
class before building it, so the full impl is in place, with everything
``alembic_ext`` registers (operations, renderers, the inspector), before a migration
runs, renders or compiles any DDL.

sqlalchemy-spanner's own module imports Alembic, so this costs nothing more of it. An
impl the application defined for ``spanner+spanner`` before the dialect loaded is
honoured: this class then does not register over it (``alembic_ext.impl_guard``).

Our operations (``op.backfill_shard``, ...) are methods Alembic sets on its one
``Operations`` class, whatever impl a migration runs, so they cannot wait for our impl to
be built: an application's impl, defined before or after this module loaded, is built
instead of ours, in or outside an Alembic command. This module registers each name
(:data:`OPERATIONS`) with a stand-in that loads :data:`OPERATIONS_MODULE` on its first
call, which registers the operation itself in its place, and calls it: on an impl not
ours, it refuses saying why and what to do (``alembic_ext.impl_guard``). The stand-ins
are ``alembic_ext.stand_ins.register_operations``, the one function ``import
alembic_ext`` calls too; that module is a leaf (it imports nothing of either package,
and Alembic's entry point loads it with ``alembic_ext`` when the package is installed).
"""

from __future__ import annotations

import importlib
from typing import Any

from alembic.ddl.impl import DefaultImpl

from alembic_ext.stand_ins import OPERATIONS, OPERATIONS_MODULE, register_operations

__all__ = ["FULL_IMPL", "OPERATIONS", "OPERATIONS_MODULE", "SpannerImpl"]

#: module and class of the full impl, built in this class's place
FULL_IMPL = ("alembic_ext.impl", "SpannerImpl")


class _Named:
    name = "spanner+spanner"


def _app_impl_defined() -> bool:
    """Whether Alembic already has an impl for spanner+spanner (an application's own)."""
    try:
        DefaultImpl.get_by_dialect(_Named())  # type: ignore[arg-type]
    except KeyError:
        return False
    return True


#: an impl for spanner+spanner defined before ours (the application's): honoured
_APP_IMPL = _app_impl_defined()


class SpannerImpl(DefaultImpl):
    """Registered for ``spanner+spanner``; building it builds ``alembic_ext.impl.SpannerImpl``.

    ``__new__`` returns an instance of the full impl, a subclass of this class, so Python
    then runs the full impl's ``__init__`` with Alembic's arguments. Subclasses (the full
    impl, an application's subclass of it) are built as they are.
    """

    if not _APP_IMPL:
        __dialect__ = "spanner+spanner"
    transactional_ddl = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is SpannerImpl:
            module, name = FULL_IMPL
            cls = getattr(importlib.import_module(module), name)
        return super().__new__(cls)


# our operations' names, whatever impl is built (alembic_ext.stand_ins)
register_operations()
