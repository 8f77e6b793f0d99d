"""docs/async.md: its FastAPI-style app runs on the emulator's async engine (issue 46)."""

from __future__ import annotations

import asyncio
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.emulator

DOC = Path(__file__).resolve().parent.parent / "docs" / "async.md"


def app_snippet() -> str:
    text = DOC.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return next(b for b in blocks if "async def latest" in b)


def test_the_fastapi_style_snippet_runs(spanner_emulator: Any) -> None:
    url = spanner_emulator.url(spanner_emulator.create_database())
    module = types.ModuleType("async_doc_app")  # a module, as the app's would be
    module.URL = url.replace("spanner+spanner:", "spanner+spanner_async:")  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        exec(compile(app_snippet(), str(DOC), "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    namespace = module.__dict__

    async def main() -> None:
        await namespace["startup"]()
        added = await asyncio.gather(*(namespace["add_note"](i, f"a{i}") for i in range(3)))
        assert [a["id"] for a in added] == [0, 1, 2]
        assert await namespace["latest"](2) == [2, 1]
        await namespace["engine"].dispose()

    asyncio.run(main())
