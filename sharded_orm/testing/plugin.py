"""pytest plugin of sharded-orm: the Spanner emulator and mock server as fixtures.

Registered through the ``pytest11`` entry point, so it is active in every project that
installs sharded-orm. Importing it is cheap: the Spanner client is imported by the
fixtures, when a test asks for one.

Fixtures
    ``spanner_emulator`` (session): an :class:`~sharded_orm.testing.emulator.Emulator`.
    ``spanner_engine``: a SQLAlchemy engine on a fresh database of that emulator.
    ``mock_spanner``: a started :class:`~sharded_orm.testing.mock.MockSpanner`.

Where no emulator exists, tests using it are skipped with the reason, unless ``CI`` is
set to a true value or ``--require-emulator`` is given: then they fail.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

EMULATOR_FIXTURES = frozenset({"spanner_emulator", "spanner_engine"})


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sharded-orm")
    group.addoption(
        "--require-emulator",
        action="store_true",
        default=False,
        help="fail (instead of skip) emulator tests when no Spanner emulator is found "
        "(also on when the CI environment variable is true)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "emulator: needs the Cloud Spanner emulator (sharded_orm pytest plugin)"
    )


def emulator_required(config: pytest.Config) -> bool:
    ci = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes", "on"}
    return ci or bool(config.getoption("--require-emulator", default=False))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if EMULATOR_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.emulator)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Say how many tests really ran on the emulator (a skipped suite must be visible)."""
    passed = sum("emulator" in r.keywords for r in terminalreporter.stats.get("passed", []))
    skipped = sum("emulator" in r.keywords for r in terminalreporter.stats.get("skipped", []))
    if passed or skipped:
        terminalreporter.write_line(
            f"sharded-orm: {passed} emulator tests passed, {skipped} skipped"
        )


@pytest.fixture(scope="session")
def spanner_emulator(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A running Cloud Spanner emulator with an instance, for the whole session."""
    from .emulator import EmulatorNotFound, local_emulator

    try:
        ctx = local_emulator()
        emulator = ctx.__enter__()
    except EmulatorNotFound as exc:
        if emulator_required(request.config):
            pytest.fail(
                f"the Spanner emulator is required here (CI or --require-emulator): {exc}",
                pytrace=False,
            )
        pytest.skip(str(exc))
    try:
        yield emulator
    finally:
        ctx.__exit__(None, None, None)


@pytest.fixture
def spanner_engine(spanner_emulator: Any) -> Iterator[Any]:
    """A SQLAlchemy engine on a fresh, empty database of the emulator."""
    database_id = spanner_emulator.create_database()
    engine = spanner_emulator.engine(database_id)
    try:
        yield engine
    finally:
        engine.dispose()
        # the emulator going away at session end is not a test failure
        with contextlib.suppress(Exception):
            spanner_emulator.drop_database(database_id)


@pytest.fixture
def mock_spanner(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The in-process mock Spanner server (request assertions; executes nothing).

    ``SPANNER_EMULATOR_HOST`` is hidden while it runs: the client prefers it to the
    mock server's endpoint.
    """
    from .mock import MockSpanner

    monkeypatch.delenv("SPANNER_EMULATOR_HOST", raising=False)
    mock = MockSpanner()
    try:
        yield mock
    finally:
        mock.stop()
