"""docs/migrations.md runs as written, and shows what autogenerate really writes.

Its ``python`` blocks run in order, on the emulator, in one namespace holding ``cfg``
(an ``alembic init`` project's Config) and ``engine``; blocks headed ``# generated`` are
checked line by line against the files autogenerate wrote (the seeds' block against a
revision of the seeds' models); the env.py block is a template and is not run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import seed_models
import sqlalchemy as sa
from alembic_project import Project

pytestmark = pytest.mark.emulator

DOC = Path(__file__).resolve().parent.parent / "docs" / "migrations.md"


def _blocks() -> list[str]:
    # 'Resharding a key' has its own runner (tests/test_key_reshard.py): its blocks need
    # the models of the key reshard and rows in between
    text = re.sub(r"### Resharding a key\n.*?(?=\n### )", "", DOC.read_text(), flags=re.S)
    return re.findall(r"```python\n(.*?)```", text, re.S)


def _lines(text: str) -> set[str]:
    return {ln.strip() for ln in text.splitlines() if ln.strip()}


# the page's whole journey; quick loop: test_alembic_emulator.py::test_seed_models_roundtrip
@pytest.mark.slow
def test_examples_run_and_generated_code_is_real(tmp_path: Path, spanner_emulator: Any) -> None:
    blocks = _blocks()
    runnable = [b for b in blocks if not b.startswith(("# migrations/env.py", "# generated"))]
    generated = [b for b in blocks if b.startswith("# generated")]
    assert len(runnable) == 3 and len(generated) == 3

    url = spanner_emulator.url(spanner_emulator.create_database())
    proj = Project(tmp_path / "doc", url)
    engine = sa.create_engine(url)
    namespace: dict[str, Any] = {"cfg": proj.cfg, "engine": engine, "__name__": "doc"}
    try:
        for block in runnable:
            exec(compile(block, str(DOC), "exec"), namespace)  # noqa: S102
    finally:
        engine.dispose()
    versions = Path(proj.cfg.get_main_option("script_location") or "") / "versions"
    written = set().union(*(_lines(p.read_text()) for p in versions.glob("*.py")))

    seeds_url = spanner_emulator.url(spanner_emulator.create_database())
    seeds = Project(tmp_path / "seeds", seeds_url)
    written |= _lines(seeds.revision(seed_models.Sharded.metadata, "seeds"))

    for block in generated:
        missing = _lines(block) - {"# generated"} - written
        assert not missing, missing
