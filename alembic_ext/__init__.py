"""Alembic support for sharded-orm on Cloud Spanner."""
