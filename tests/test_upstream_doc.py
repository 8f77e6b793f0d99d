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


#: google-cloud-spanner's private names the library relies on (docs/upstream.md)
UPSTREAM_PRIVATE = {
    "_instance",
    "_client",
    "_mutations",
    "_multiplexed_session",
    "_multiplexed_session_lock",
    "_build_multiplexed_session",
    "_transaction_helper",
    "_spanner_transaction_started",
    "_client_transaction_started",
    "_own_pool",
    "_batch_dml_rows_count",
}


def test_upstream_private_names_are_reached_only_in_the_spanner_package() -> None:
    """One place holds every reach into the Spanner client's internals: sharded_orm/spanner/
    (an object's own attributes of the same name, ``self._client``, are not upstream's)."""
    import ast

    outside = []
    for package in ("sharded_orm", "alembic_ext"):
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("sharded_orm/spanner/"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr in UPSTREAM_PRIVATE
                    and not (isinstance(node.value, ast.Name) and node.value.id == "self")
                ):
                    outside.append(f"{rel}:{node.lineno} .{node.attr}")
    assert not outside, f"upstream internals reached outside sharded_orm/spanner/: {outside}"


def test_every_private_name_the_rule_knows_is_in_the_page() -> None:
    text = DOC.read_text(encoding="utf-8")
    missing = [n for n in sorted(UPSTREAM_PRIVATE) if n not in text]
    assert not missing, f"docs/upstream.md does not name {missing}"
