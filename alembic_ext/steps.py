"""Where a migration runs a step that writes in its own transactions.

``op.backfill_shard`` and the key reshard's ``op.copy_table_rows``, ``op.retire_table``
and ``op.verify_tables`` read and write on their own connections, batch by batch, each
batch committed. The migration's work before them must be committed first: they must
see it, and the migration's open transaction must not hold locks they wait on.

Alembic's tool for this, ``MigrationContext.autocommit_block``, commits only a
transaction Alembic began itself: on a connection in the caller's transaction
(``Operations(MigrationContext.configure(conn))`` after any statement, which begins one,
or an env.py that configures a connection inside ``connection.begin()``) it fails with a
bare ``AssertionError``. It also switches the connection to AUTOCOMMIT, which none of
these steps needs: they never use the migration's connection.

So on Spanner the step is treated as a schema change is (Spanner has no transactional
DDL; MySQL does the same implicitly): the driver's open transaction, holding the work
before the step, commits; the SQLAlchemy transaction, Alembic's inside
``run_migrations`` or the caller's, stays open, its isolation level untouched, and the
statements after the step commit or roll back with it, as its owner decides. Other
databases get Alembic's ``autocommit_block``, and, in a transaction Alembic did not
begin, an error saying to commit or roll it back first instead of its bare assertion.

Their progress lines go to the ``alembic.sharded_orm`` logger (:func:`reporting`): a child
of ``alembic``, so the ``alembic.ini`` that ``alembic init`` writes shows them at ``INFO``
as it shows Alembic's own lines (it drops ``INFO`` of other loggers, and disables those
created before env.py's ``fileConfig`` that it does not name).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager

from alembic.runtime.migration import MigrationContext

from sharded_orm.progress import log_to

from .errors import MigrationError

#: the logger of the progress lines of a step inside a migration
PROGRESS_LOGGER = "alembic.sharded_orm"


def reporting() -> AbstractContextManager[None]:
    """Progress lines of the jobs started inside it go to :data:`PROGRESS_LOGGER`."""
    return log_to(logging.getLogger(PROGRESS_LOGGER))


@contextmanager
def own_transactions(ctx: MigrationContext) -> Iterator[None]:
    """Run the ``with`` body after the migration's work so far is committed."""
    end = getattr(ctx.impl, "end_transaction", None)
    if end is not None:
        end()
        with reporting():
            yield
        return
    with ExitStack() as stack:
        stack.enter_context(reporting())
        try:
            stack.enter_context(ctx.autocommit_block())
        except AssertionError as exc:  # Alembic's: a transaction it did not begin
            raise MigrationError(
                "this operation writes in its own transactions, so the work before it must "
                "be committed first, and the connection is in a transaction Alembic did not "
                "begin (Operations used directly after a statement, or inside "
                f"connection.begin()), which only its owner may end on {ctx.dialect.name!r}. "
                "Commit or roll it back (connection.commit()) before this operation."
            ) from exc
        yield
