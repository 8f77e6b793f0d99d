"""Every Python block in the README and docs parses, and every name it imports from our
packages exists: a renamed or removed API breaks this test before it breaks a reader.

(The runnable examples are checked further by test_examples.py, test_docs.py and
test_alembic_docs.py.)
"""

from __future__ import annotations

import ast
import importlib
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _blocks() -> list[object]:
    out = []
    for page in PAGES:
        for i, code in enumerate(BLOCK.findall(page.read_text())):
            out.append(pytest.param(code, id=f"{page.name}#{i + 1}"))
    return out


BLOCKS = _blocks()


def test_there_are_snippets_to_check() -> None:
    assert len(BLOCKS) >= 20


@pytest.mark.parametrize("code", BLOCKS)
def test_snippet_parses_and_its_imports_exist(code: str) -> None:
    # generated migration bodies are shown indented, under a "# generated" line
    body = "\n".join(line for line in code.splitlines() if not line.startswith("#"))
    tree = ast.parse(textwrap.dedent(body))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            root = node.module.split(".")[0]
            if root not in ("sharded_orm", "alembic_ext"):
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(
                    f"{node.module}.{alias.name}"
                ), f"from {node.module} import {alias.name}: no such name"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("sharded_orm", "alembic_ext"):
                    importlib.import_module(alias.name)
