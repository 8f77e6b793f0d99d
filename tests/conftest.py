"""Shared fixtures: the same behaviour checked on SQLite and on the Spanner emulator.

The emulator fixtures (``spanner_emulator``, ``spanner_engine``, ``mock_spanner``)
come from our own pytest plugin, ``sharded_orm.testing``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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


@pytest.fixture
def beam_db(spanner_emulator: Any) -> Iterator[tuple[Any, dict[str, str]]]:
    """A fresh emulator database with CrcLogEntry's table, and a Beam pipeline's ids."""
    from at_scale_models import CrcBase

    database_id = spanner_emulator.create_database()
    engine = spanner_emulator.engine(database_id)
    CrcBase.metadata.create_all(engine)
    ids = {
        "project_id": spanner_emulator.project,
        "instance_id": spanner_emulator.instance_id,
        "database_id": database_id,
    }
    try:
        yield engine, ids
    finally:
        engine.dispose()


@pytest.fixture
def otel() -> Iterator[Any]:
    """In-memory OpenTelemetry providers the library records through (otel_fixtures)."""
    from otel_fixtures import recording

    with recording() as recorded:
        yield recorded
