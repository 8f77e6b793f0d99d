"""docs/upstream.md stays true: every module and test it names exists, and the one
workaround with no other test (a pool the app passes) trips when upstream changes."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "upstream.md"


def named_paths() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    return sorted(set(re.findall(r"`((?:tests|sharded_orm|alembic_ext)/[\w/]+\.py)`", text)))


def test_every_module_and_test_the_page_names_exists() -> None:
    paths = named_paths()
    assert len(paths) >= 10, paths
    missing = [p for p in paths if not (ROOT / p).is_file()]
    assert not missing, f"docs/upstream.md names files that do not exist: {missing}"


def test_every_spanner_module_named_in_an_entry_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    bare = set(re.findall(r"\(`(\w+\.py)`", text))
    assert bare, "entries name their module as (`name.py`)"
    missing = [m for m in bare if not (ROOT / "sharded_orm" / "spanner" / m).is_file()]
    assert not missing, missing


def test_upstream_connection_still_takes_no_own_pool_argument() -> None:
    """U7: trips when the DB-API's Connection takes ``own_pool``; then pass it instead."""
    from google.cloud.spanner_dbapi.connection import Connection

    assert "own_pool" not in inspect.signature(Connection.__init__).parameters
    assert "self._own_pool = True" in inspect.getsource(Connection.__init__)


def test_a_pool_the_app_passes_outlives_the_connections_made_on_it(spanner_engine: Any) -> None:
    """U7: closing a connection of ours leaves the app's session pool alone."""
    from google.cloud.spanner_v1.pool import FixedSizePool

    cleared: list[int] = []

    class CountingPool(FixedSizePool):  # type: ignore[misc]
        def clear(self) -> None:
            cleared.append(1)
            super().clear()

    pool = CountingPool(size=1)
    engine = sa.create_engine(
        spanner_engine.url, connect_args={"pool": pool}, poolclass=sa.pool.NullPool
    )
    try:
        for _ in range(2):
            with engine.connect() as conn:
                assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()
    assert cleared == []
