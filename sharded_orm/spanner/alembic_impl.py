"""Brings the Alembic impl with the dialect, so env.py needs no import for it.

Alembic looks its impl up by dialect name (``spanner+spanner``) in a registry that a
``DefaultImpl`` subclass joins when it is defined; without one, ``MigrationContext.
configure`` fails with ``KeyError: 'spanner+spanner'``. As sqlalchemy-cockroachdb does
for its dialect, our dialect module imports this one, which defines the impl
(:class:`alembic_ext.impl.SpannerImpl`) when Alembic is installed. ``import sharded_orm``
never gets here: the dialect module is loaded only when a Spanner engine or URL needs it.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("alembic") is not None:
    importlib.import_module("alembic_ext.impl")
