"""Shared fixtures: the same behaviour checked on SQLite and on the Spanner emulator.

The emulator fixtures (``spanner_emulator``, ``spanner_engine``, ``mock_spanner``)
come from our own pytest plugin, ``sharded_orm.testing``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

BACKENDS = ["sqlite", pytest.param("spanner", marks=pytest.mark.emulator)]


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest) -> Iterator[sa.Engine]:
    """An empty database: in-memory SQLite, or a fresh database on the emulator."""
    if request.param == "sqlite":
        eng = sa.create_engine("sqlite://")
        yield eng
        eng.dispose()
    else:
        yield request.getfixturevalue("spanner_engine")
