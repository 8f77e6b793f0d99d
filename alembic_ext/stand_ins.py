"""Our operations' names on Alembic's ``Operations``, each loading the real one on its first call.

Alembic's ``Operations.register_operation`` is global: a method set on its one
``Operations`` class, whatever impl or dialect a migration runs. So ``op.backfill_shard``
and the others (:data:`OPERATIONS`) must be there before a migration calls them, on
Spanner (whichever impl Alembic builds) and elsewhere (SQLite), yet the real operations
(:data:`OPERATIONS_MODULE`) load much of sharded-orm. :func:`register_operations` sets a
stand-in for each name, which imports :data:`OPERATIONS_MODULE` on its first call (that
registers the real operation in its place) and calls the real one.

Two callers, one function: ``import alembic_ext`` (which Alembic itself does through its
``alembic.plugins`` entry point when the package is installed) and sharded-orm's Spanner
dialect (``sharded_orm.spanner.alembic_impl``, for a source tree that is not installed).
This module imports nothing of sharded-orm or of Alembic at its top: Alembic imports it
while its own import is half done, and then the stand-ins are registered only if
Alembic's ``Operations`` is already complete (nothing of Alembic is imported mid-way).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = ["OPERATIONS", "OPERATIONS_MODULE", "register_operations"]

#: the module whose import registers every operation of alembic_ext (``alembic_ext.ops``
#: imports ``alembic_ext.key_reshard``)
OPERATIONS_MODULE = "alembic_ext.ops"
#: the operations it registers on Alembic's ``Operations``
#: (``tests/test_app_impl_after_dialect.py`` checks none is missing)
OPERATIONS = (
    "backfill_shard",
    "alter_index_storing",
    "copy_table_rows",
    "retire_table",
    "verify_tables",
)


def _alembic_operations() -> Any:
    """Alembic's ``Operations`` class, or None while Alembic's import is under way and has
    not yet finished ``alembic.operations`` (nothing is imported then)."""
    alembic = sys.modules.get("alembic")
    if alembic is not None and getattr(alembic, "__version__", None) is None:
        # Alembic is importing this package (its plugins' entry points load during
        # ``import alembic``): ``alembic.operations`` binds ``Operations`` once complete
        return getattr(sys.modules.get("alembic.operations"), "Operations", None)
    from alembic.operations import Operations

    return Operations


def _stand_in(operations_cls: Any, name: str) -> None:
    """Register operation ``name`` as a call that loads :data:`OPERATIONS_MODULE` (which
    registers the real one over it) and calls the real one."""
    registered: list[Any] = []

    # (Alembic requires the parameters ``cls, operations`` first)
    def load_and_call(cls: type, operations: Any, *args: Any, **kwargs: Any) -> Any:
        importlib.import_module(OPERATIONS_MODULE)
        real = getattr(operations_cls, name)
        if real is registered[0]:  # (not registered by that module: never call this again)
            raise NotImplementedError(
                f"op.{name}: {OPERATIONS_MODULE} did not register it; sharded-orm's "
                "operations and alembic_ext.stand_ins disagree (report it as a bug)"
            )
        return real(operations, *args, **kwargs)

    load_and_call.__name__ = name
    load_and_call.__doc__ = f"sharded-orm's op.{name} (loaded on its first call)."
    cls = type(f"{name}_stand_in", (), {name: classmethod(load_and_call)})
    operations_cls.register_operation(name)(cls)
    registered.append(getattr(operations_cls, name))


def register_operations() -> bool:
    """Register a stand-in for each of :data:`OPERATIONS` not yet on Alembic's
    ``Operations`` (idempotent; a real operation already registered is kept). False when
    Alembic's import is under way and its ``Operations`` not yet complete."""
    operations = _alembic_operations()
    if operations is None:
        return False
    for name in OPERATIONS:
        if not hasattr(operations, name):  # (the real one, if alembic_ext.ops is loaded)
            _stand_in(operations, name)
    return True
