"""Spanner-specific parts of sharded-orm.

Nothing here imports google-cloud-spanner at import time; DDL hooks are keyed by
dialect name. sqlalchemy-spanner's dialect calls itself ``spanner+spanner``; we
accept plain ``spanner`` too, the name users write in hints and kwargs.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.dialects import registry

#: Names under which the Spanner dialect may present itself.
SPANNER_DIALECT_NAMES = ("spanner+spanner", "spanner")


def is_spanner(dialect: Any) -> bool:
    """True for sqlalchemy-spanner's dialect (or a Connection/Engine on it)."""
    dialect = getattr(dialect, "dialect", dialect)
    return getattr(dialect, "name", None) in SPANNER_DIALECT_NAMES


# Our subclass of sqlalchemy-spanner's dialect, with its gaps closed (see .dialect), for
# both names. Registered by module path: nothing is imported until it is used.
registry.register("spanner.spanner", "sharded_orm.spanner.dialect", "SpannerDialect")
registry.register("spanner", "sharded_orm.spanner.dialect", "SpannerDialect")
# ``create_async_engine("spanner+spanner_async:///...")``: the same dialect for asyncio (.asyncio)
registry.register("spanner.spanner_async", "sharded_orm.spanner.asyncio", "AsyncSpannerDialect")
