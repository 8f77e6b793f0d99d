"""The examples run, and say they found no inconsistent shard."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_activity_log_on_sqlite(capsys: pytest.CaptureFixture[str]) -> None:
    assert load("activity_log").main(["--sqlite"]) == 0
    out = capsys.readouterr().out
    assert "database: SQLite" in out
    assert "checked 400 rows: 0 with a shard that disagrees" in out


# the example end to end; quick loop: test_activity_log_on_sqlite
@pytest.mark.slow
def test_activity_log_on_the_emulator(
    spanner_emulator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert load("activity_log").main([]) == 0
    out = capsys.readouterr().out
    assert f"database: Spanner emulator at {spanner_emulator.host}" in out
    assert "checked 400 rows: 0 with a shard that disagrees" in out
