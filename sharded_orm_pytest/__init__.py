"""pytest plugin of sharded-orm: the Spanner emulator and mock server as fixtures.

Registered through the ``pytest11`` entry point, so it is active in every project that
installs sharded-orm. It lives outside the ``sharded_orm`` package so that loading it
imports nothing of the library: a project that only has sharded-orm installed runs its
tests exactly as without it. The fixtures import the library (and the Spanner client)
when a test asks for one. ``sharded_orm.testing.plugin`` re-exports its helpers.

Fixtures
    ``spanner_emulator`` (session): an :class:`~sharded_orm.testing.emulator.Emulator`.
    ``spanner_engine``: a SQLAlchemy engine on a fresh database of that emulator.
    ``spanner_async_engine``: an ``AsyncEngine`` (``spanner+spanner_async``) on the same
    database as ``spanner_engine``; ``sharded_orm.testing.async_engines.run_through``
    runs a sync test body through it.
    ``mock_spanner``: a started :class:`~sharded_orm.testing.mock.MockSpanner`.
    ``spanner_faults``: a :class:`~sharded_orm.testing.faults.FaultProxy` in front of the
    emulator; ``spanner_faults.emulator(spanner_emulator).engine(db)`` talks through it.

Where no emulator exists, tests using it are skipped with the reason, unless ``CI`` is
set to a true value or ``--require-emulator`` is given: then they fail.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

EMULATOR_FIXTURES = frozenset(
    {"spanner_emulator", "spanner_engine", "spanner_async_engine", "spanner_faults"}
)


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


_CI_TRUE = {"1", "true", "yes", "on"}
_EMULATOR_TESTS = pytest.StashKey[set[str]]()
_EMULATOR_USED = pytest.StashKey[str]()


def emulator_required(config: pytest.Config) -> str | None:
    """Why a missing emulator is a failure here (``None``: it is a skip)."""
    if config.getoption("--require-emulator", default=False):
        return "--require-emulator was given"
    ci = os.environ.get("CI", "")
    if ci.strip().lower() in _CI_TRUE:
        return f"CI={ci} is set"
    return None


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects, so ``-m "not emulator"`` works
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    emulator_tests = config.stash.setdefault(_EMULATOR_TESTS, set())
    for item in items:
        if EMULATOR_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.emulator)
        if item.get_closest_marker("emulator") is not None:
            emulator_tests.add(item.nodeid)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    """Say how many tests really ran on the emulator: a skipped suite must be visible."""
    emulator_tests = config.stash.get(_EMULATOR_TESTS, set())
    counts = {}
    for category, label in (
        ("passed", "passed"),
        ("failed", "failed"),
        ("error", "errors"),
        ("skipped", "skipped"),
    ):
        reports = terminalreporter.stats.get(category, [])
        nodeids = {getattr(r, "nodeid", None) for r in reports}
        counts[label] = len(nodeids & emulator_tests)
    if not any(counts.values()):
        return
    line = "sharded-orm: emulator tests: " + ", ".join(f"{n} {c}" for c, n in counts.items())
    used = config.stash.get(_EMULATOR_USED, None)
    if used:
        line += f" ({used})"
    terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def spanner_emulator(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A running Cloud Spanner emulator with an instance, for the whole session.

    ``SPANNER_EMULATOR_HOST`` points at it while the session runs (restored afterwards).
    """
    from sharded_orm.testing.emulator import EmulatorFailed, EmulatorNotFound, local_emulator

    with contextlib.ExitStack() as stack:
        try:
            emulator = stack.enter_context(local_emulator())
        except EmulatorNotFound as exc:
            why = emulator_required(request.config)
            if why:
                pytest.fail(f"the Spanner emulator is required here ({why}): {exc}", pytrace=False)
            pytest.skip(str(exc))
        except EmulatorFailed as exc:
            pytest.fail(f"the Spanner emulator could not be used: {exc}", pytrace=False)
        request.config.stash[_EMULATOR_USED] = (
            f"emulator_main pid {emulator.pid} at {emulator.host}"
            if emulator.pid is not None
            else f"emulator at SPANNER_EMULATOR_HOST={emulator.host}"
        )
        yield emulator


@pytest.fixture
def spanner_engine(spanner_emulator: Any) -> Iterator[Any]:
    """A SQLAlchemy engine on a fresh, empty database of the emulator (dropped afterwards)."""
    database_id = spanner_emulator.create_database()
    engine = spanner_emulator.engine(database_id)
    try:
        yield engine
    finally:
        engine.dispose()
        # dropping is only housekeeping: a failure to drop is not the test's failure
        with contextlib.suppress(Exception):
            spanner_emulator.drop_database(database_id)


@pytest.fixture
def spanner_async_engine(spanner_emulator: Any, spanner_engine: Any) -> Iterator[Any]:
    """An ``AsyncEngine`` (our ``spanner+spanner_async`` dialect) on the database of
    ``spanner_engine``: what one writes, the other reads (disposed afterwards)."""
    from sharded_orm.testing.async_engines import dispose

    engine = spanner_emulator.async_engine(spanner_engine.url.database.rsplit("/", 1)[-1])
    try:
        yield engine
    finally:
        dispose(engine)


@pytest.fixture
def spanner_faults(spanner_emulator: Any) -> Iterator[Any]:
    """A fault-injecting gRPC proxy in front of the emulator (closed afterwards)."""
    from sharded_orm.testing.faults import FaultProxy

    with FaultProxy(spanner_emulator.host) as proxy:
        yield proxy


@pytest.fixture
def mock_spanner(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The in-process mock Spanner server (request assertions; executes nothing).

    While it runs, ``SPANNER_EMULATOR_HOST`` is hidden (the client would prefer it to the
    mock's endpoint) and ``SPANNER_DISABLE_BUILTIN_METRICS=true`` (else an engine built
    from ``mock_spanner.url`` starts a metrics exporter that holds the process ~30 s at
    exit).
    """
    from sharded_orm.testing.mock import MockSpanner

    monkeypatch.delenv("SPANNER_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("SPANNER_DISABLE_BUILTIN_METRICS", "true")
    mock = MockSpanner()
    try:
        yield mock
    finally:
        mock.stop()
