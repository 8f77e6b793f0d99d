"""A connection SQLAlchemy invalidated (a disconnect, a task cancelled mid-statement) can
be rolled back on a watched engine, as on a plain one.

The successor listeners read ``conn.info`` on every rollback; SQLAlchemy refuses that read
on an invalidated connection until the rollback ends, so the app's own ``rollback()`` (or
the pool's, or an ``AsyncSession`` closing after a cancel) raised ``PendingRollbackError``.
"""

from __future__ import annotations

import sqlalchemy as sa

from sharded_orm.write.engine_hook import watch


def _watched() -> sa.Engine:
    engine = sa.create_engine("sqlite://")
    watch(engine)
    return engine


def test_an_invalidated_connection_rolls_back_on_a_watched_engine() -> None:
    engine = _watched()
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))
        conn.invalidate()
        conn.rollback()  # raised PendingRollbackError before
        assert conn.execute(sa.text("SELECT 2")).scalar() == 2  # and the connection is usable


def test_an_invalidated_savepoint_rolls_back_on_a_watched_engine() -> None:
    engine = _watched()
    with engine.connect() as conn:
        conn.begin()
        conn.begin_nested()
        conn.execute(sa.text("SELECT 1"))
        conn.invalidate()
        conn.rollback()
        assert conn.execute(sa.text("SELECT 3")).scalar() == 3


def test_a_failed_statement_on_an_invalidated_connection_keeps_its_own_error() -> None:
    engine = _watched()
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))
        conn.invalidate()
        conn.rollback()
        try:
            conn.execute(sa.text("SELEC nonsense"))
        except sa.exc.OperationalError as exc:
            assert "syntax error" in str(exc)
        else:  # pragma: no cover - the statement is invalid
            raise AssertionError("the invalid statement ran")
