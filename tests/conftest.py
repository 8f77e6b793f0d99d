"""Shared fixtures: the same behaviour checked on SQLite and on the Spanner emulator.

The emulator fixtures (``spanner_emulator``, ``spanner_engine``, ``mock_spanner``)
come from our own pytest plugin, ``sharded_orm.testing``.
"""

from __future__ import annotations

import itertools
import keyword
import re
from collections.abc import Iterator
from pathlib import Path
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


# Files whose outcome SQLAlchemy's version cannot change: hashing, the simulator and advise's
# models, the Spanner client's deadlines, faults and schema-change waits (below SQLAlchemy, in
# the driver), bulk loading through mutations, the CLI's inputs, packaging and the layers.
# The main pass runs them; the SQLAlchemy 2.0 pass in .ci/run deselects them
# (`-m "not sa_neutral"`) to keep CI under its hour. Keep a file here only if nothing it
# checks goes through SQLAlchemy's compiler, ORM or events.
SA_NEUTRAL = frozenset(
    {
        "test_advise",
        "test_advise_progress",
        "test_advise_sweep",
        "test_architecture",
        "test_backfill_faults",
        "test_bulk",
        "test_bulk_mock",
        "test_bulk_streaming",
        "test_cli_errors",
        "test_cli_targets",
        "test_commit_deadlines",
        "test_dependency_bounds",
        "test_docs",
        "test_doctor",
        "test_doctor_inputs",
        "test_doctor_memory",
        "test_doctor_value_roles_fix",
        "test_faults_policy",
        "test_hashing",
        "test_heatmap",
        "test_load_deadlines",
        "test_migration_waits",
        "test_package",
        "test_packaging_meta",
        "test_presplit",
        "test_progress",
        "test_progress_gaps",
        "test_schema_change_deadlines",
        "test_simulate",
        "test_simulate_flags",
        "test_simulate_limits",
        "test_simulate_text",
        "test_testing_plugin",
        "test_value_codec",
        "test_version_write_retry",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem in SA_NEUTRAL:
            item.add_marker(pytest.mark.sa_neutral)


# Test files whose every test is marked beam and which import apache_beam at the top
# (tests/test_dependency_bounds.py checks this list). The `test` extra has no Beam: a run
# that deselects beam (-m "not slow and not beam", the quick loop) does not import them; a
# run that selects them without Beam fails on the import, it is never skipped.
BEAM_ONLY = frozenset(
    {"test_beam.py", "test_beam_deadlines.py", "test_beam_io.py", "test_key_reshard_beam.py"}
)


def deselects(markexpr: str, mark: str) -> bool:
    """Whether the ``-m`` expression is false for every test carrying ``mark``, whatever
    its other marks (an expression this cannot read selects, so the file is collected)."""
    tokens = re.findall(r"[()]|[^\s()]+", markexpr)
    names = sorted({t for t in tokens if t not in ("and", "or", "not", "(", ")")})
    if mark not in names or any(not n.isidentifier() or keyword.iskeyword(n) for n in names):
        return False
    others = [n for n in names if n != mark]
    try:
        code = compile(" ".join(tokens), "<markexpr>", "eval")
    except SyntaxError:
        return False
    for values in itertools.product((False, True), repeat=len(others)):
        env = {**dict(zip(others, values, strict=True)), mark: True}
        if eval(code, {"__builtins__": {}}, env):
            return False
    return True


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.name in BEAM_ONLY and deselects(config.option.markexpr or "", "beam"):
        return True
    return None
