"""Alembic's own backend suite, unchanged (what sqlalchemy-cockroachdb's CI runs too)."""

from alembic.testing.suite import *  # noqa: F403
