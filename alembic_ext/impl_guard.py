"""sharded-orm's migration features on Spanner need sharded-orm's impl and dialect.

sqlalchemy-spanner's README tells apps to define an impl in env.py (``class
SpannerImpl(DefaultImpl): __dialect__ = "spanner+spanner"``). Such an app's impl is
honoured, whichever is defined first (``sharded_orm.spanner.alembic_impl`` does not
register ours over it, and Alembic keeps the last one defined): plain migrations run as
they did. What of ours needs our impl (its DDL batching, reflection and comparisons)
refuses, saying why and what to do, when it is used on Spanner: the autogenerate plugin
and our operations (``op.backfill_shard``, ``op.alter_index_storing``,
``op.copy_table_rows``, ``op.retire_table``, ``op.verify_tables``). An engine on the
stock dialect class is refused the same way (``sharded_orm.spanner.stock``). Elsewhere
(SQLite, PostgreSQL) nothing is checked: Alembic's own impls are the right ones there.
"""

from __future__ import annotations

from typing import Any

from sharded_orm.spanner import is_spanner
from sharded_orm.spanner.stock import refuse_stock

from .errors import MigrationError

#: class attribute of alembic_ext.SpannerImpl (and its subclasses)
MARK = "sharded_orm_impl"


def require_our_impl(migration_context: Any, what: str) -> None:
    """Refuse ``what`` on a Spanner migration that does not run our impl and dialect."""
    dialect = getattr(migration_context, "dialect", None)
    if not is_spanner(dialect):
        return
    refuse_stock(dialect, what)
    impl = migration_context.impl
    if getattr(impl, MARK, False):
        return
    cls = type(impl)
    raise MigrationError(
        f"{what} needs sharded-orm's Alembic impl (alembic_ext.SpannerImpl), but this "
        f"migration runs {cls.__module__}.{cls.__qualname__}, an impl the application "
        "defined for spanner+spanner (as sqlalchemy-spanner's README shows), which "
        "Alembic uses instead of ours. Make it a subclass of ours (`from alembic_ext "
        "import SpannerImpl as ShardedSpannerImpl`, then `class SpannerImpl("
        "ShardedSpannerImpl): ...`), or delete it: sharded-orm's dialect brings its impl."
    )
