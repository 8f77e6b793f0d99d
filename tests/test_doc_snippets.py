"""Every Python block of the README and docs/*.md parses and imports what exists; the blocks
of the pages in ``EXECUTED`` also RUN, in page order, in one namespace per page.

The harness, for snippets that are fragments of a larger program (their own lines always run):

- A page's blocks share one namespace, as a reader reads them: a later block uses the
  models an earlier one declared.
- ``PRELUDE[page]`` (below) runs first: the names the page's prose takes as given (an
  ``engine`` on SQLite or, for a page marked ``emulator``, on a fresh emulator database, a
  ``session``, ``Base``, the usual imports). A page may also carry hidden setup right
  before a block, in an HTML comment (invisible on GitHub)::

      <!-- snippet-setup
      lo, hi = ...
      -->

- ``...`` standing for elided statements in a class body (``class LogEntry(Base): ...``)
  is replaced by ``ELIDED[class name]``, defined by the prelude or a setup comment, and the
  class is declared on a fresh ``Base`` (the page declared one of that name already).
- A block defining ``test_*`` functions has them called with the pytest fixtures they name.
- A block with a top-level ``await`` runs in an event loop.
- A block that is an indented ``upgrade()`` body (a generated migration) runs inside a
  function called with ``op`` from the prelude.

A new block on an executed page runs with no change here; a new page is parse-checked until
it is added to ``EXECUTED``.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
import re
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!--\s*snippet-setup\n(.*?)-->\s*\n)?```python\n(.*?)```", re.S)

COMMON = """
import datetime as dt
import os
import sqlalchemy as sa
from sqlalchemy import select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
import sharded_orm
from sharded_orm import *  # the names the prose takes as imported
"""

#: what each executed page's prose takes as given; ``engine`` is made by the harness
PRELUDE: dict[str, str] = {
    "README.md": """
ts = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
lo, hi = ts - dt.timedelta(hours=1), ts + dt.timedelta(hours=1)
ELIDED = {
    "LogEntry": '''
__tablename__ = "LogEntries"
company_id: Mapped[str] = mapped_column("CompanyId", sa.String(64), primary_key=True)
entry_id: Mapped[int] = mapped_column("EntryId", primary_key=True, autoincrement=False)
ts: Mapped[dt.datetime] = mapped_column("Timestamp", UTCDateTime)
entry: Mapped[str | None] = mapped_column("LogEntry", sa.String(1024))
entry_shard_id: Mapped[int] = shard_column("company_id", "ts", count=10, name="EntryShardId")
''',
    "UserSession": '''
__tablename__ = "UserSessions"
user_id: Mapped[int] = key_column("UserId", sa.BigInteger, autoincrement=False)
last_access: Mapped[dt.datetime] = key_column("LastAccessTimestamp", UTCDateTime, descending=True)
session_id: Mapped[str] = key_column("SessionId", sa.String(36))
''',
}
""",
    "schema.md": """
class Base(DeclarativeBase):
    pass
""",
    "shard_columns.md": """
class Base(DeclarativeBase):
    pass


def utcnow():
    return dt.datetime.now(dt.timezone.utc)


ts = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
""",
    "testing.md": """
class Base(DeclarativeBase):
    pass


class Item(Base):
    __tablename__ = "items"
    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)


t = sa.Table("t", sa.MetaData(), sa.Column("id", sa.BigInteger, primary_key=True),
             sa.Column("c", sa.BigInteger))
insert_stmt = sa.insert(t).values(id=1, c=2)
""",
}

#: pages whose blocks run (a page needing Spanner is listed in EMULATOR_PAGES too)
EXECUTED = tuple(PRELUDE)
EMULATOR_PAGES = {"README.md", "testing.md"}
SLOW_PAGES = {"README.md"}  # the tour simulates 1.8 M rows, as the README says


def _blocks(page: Path) -> list[tuple[str, str]]:
    """(hidden setup, code) of each Python block, in page order."""
    return [(setup or "", code) for setup, code in BLOCK.findall(page.read_text())]


def _all_blocks() -> list[Any]:
    out = []
    for page in PAGES:
        for i, (_, code) in enumerate(_blocks(page)):
            out.append(pytest.param(code, id=f"{page.name}#{i + 1}"))
    return out


BLOCKS = _all_blocks()


def test_there_are_snippets_to_check() -> None:
    assert len(BLOCKS) >= 20


def _source(code: str) -> str:
    # generated migration bodies are shown indented, under a "# generated" line
    body = "\n".join(line for line in code.splitlines() if not line.startswith("#"))
    return textwrap.dedent(body)


@pytest.mark.parametrize("code", BLOCKS)
def test_snippet_parses_and_its_imports_exist(code: str) -> None:
    tree = ast.parse(_source(code))
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


# --- execution --------------------------------------------------------------------------------


class _Elision(ast.NodeTransformer):
    """``...`` in a class body -> the statements ``ELIDED[class name]`` stands for."""

    def __init__(self, elided: dict[str, str]) -> None:
        self.elided = elided
        self.classes: list[str] = []

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        body: list[ast.stmt] = []
        for stmt in node.body:
            is_dots = (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and stmt.value.value is Ellipsis
            )
            if is_dots and node.name in self.elided and len(node.body) > 1:
                body.extend(ast.parse(textwrap.dedent(self.elided[node.name])).body)
                self.classes.append(node.name)
            else:
                body.append(stmt)
        node.body = body
        return node


def _run_block(code: str, ns: dict[str, Any], name: str, request: pytest.FixtureRequest) -> None:
    source = code
    indented = any(line.startswith("    op.") for line in code.splitlines()) and not any(
        line.startswith("def ") for line in code.splitlines()
    )
    if indented:  # a generated upgrade() body
        source = "def _upgrade():\n" + textwrap.indent(textwrap.dedent(code), "    ")
        source += "\n_upgrade()\n"
    tree = ast.parse(source, filename=name)
    elision = _Elision(ns.get("ELIDED", {}))
    tree = ast.fix_missing_locations(elision.visit(tree))
    if elision.classes:  # declared again, elided parts filled: on a fresh Base
        exec("class Base(DeclarativeBase):\n    pass\n", ns)
    before = dict(ns)
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    compiled = compile(tree, name, "exec", flags=flags)
    if compiled.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(compiled, ns))
    else:
        exec(compiled, ns)
    for key, fn in list(ns.items()):
        if key.startswith("test_") and callable(fn) and before.get(key) is not fn:
            params = inspect.signature(fn).parameters
            fn(**{p: request.getfixturevalue(p) for p in params})


def _pages() -> list[Any]:
    out = []
    for page in PAGES:
        if page.name not in EXECUTED:
            continue
        marks = [pytest.mark.slow] if page.name in SLOW_PAGES else []
        if page.name in EMULATOR_PAGES:
            marks.append(pytest.mark.emulator)
        out.append(pytest.param(page, id=page.name, marks=marks))
    return out


@pytest.mark.parametrize("page", _pages())
def test_page_snippets_run(
    page: Path, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # snippets that write files (heatmaps) write them here
    module = types.ModuleType(f"snippets_{page.stem}")  # SQLAlchemy resolves annotations
    sys.modules[module.__name__] = module  # in the module that declared them
    ns: dict[str, Any] = module.__dict__
    exec(COMMON, ns)
    if page.name in EMULATOR_PAGES:
        engine = request.getfixturevalue("spanner_engine")
    else:
        import sqlalchemy as sa

        engine = sa.create_engine("sqlite://")
    ns["engine"] = engine
    exec(PRELUDE[page.name], ns)
    try:
        for i, (setup, code) in enumerate(_blocks(page)):
            name = f"{page.name}#{i + 1}"
            try:
                if setup:
                    exec(setup, ns)
                _run_block(code, ns, name, request)
            except Exception as exc:
                raise AssertionError(f"{name}: {type(exc).__name__}: {exc}\n{code}") from exc
    finally:
        del sys.modules[module.__name__]
        for name in [m for m in sys.modules if m.split(".")[0] == "myapp"]:
            del sys.modules[name]  # the stand-in for the reader's package (env.py snippets)


# --- the Quickstart and the README's figures (issue 24 item 11) -------------------------------


def test_quickstart_tells_a_newcomer_everything() -> None:
    readme = (ROOT / "README.md").read_text()
    quick = readme[readme.index("## Quickstart") : readme.index("## A tour")]
    for needed in (
        "python -m venv",  # a virtual environment first
        "pip install sharded-orm",  # the user install
        "pip install -e .",  # from a clone
        'pip install -e ".[dev]"',  # the contributor install
        "gcloud components install cloud-spanner-emulator",  # three ways to the emulator
        "google-cloud-cli-spanner-emulator",
        "gcr.io/cloud-spanner-emulator/emulator",
        'pytest -m "not slow"',  # the quick loop, and the full run with its time
    ):
        assert needed in quick, needed
    assert re.search(r"^pytest -m \"not slow\"\s+#.*minutes", quick, re.M), "the quick loop's time"
    assert re.search(r"^pytest\s+#.*(minutes|longer)", quick, re.M), "the full run's time"


def test_the_readme_statement_count_of_merged_is_what_the_example_prints() -> None:
    import subprocess

    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "activity_log.py"), "--sqlite"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = int(re.search(r"rows read in (\d+) statements", proc.stdout).group(1))  # type: ignore[union-attr]
    readme = (ROOT / "README.md").read_text()
    claim = re.search(
        r"merged\(session.connection\(\), stmt, 100\)\s+#.*?(<=|at most)?\s*(\d) statements", readme
    )
    assert claim is not None
    assert claim.group(1), "merged takes AT MOST that many statements; the example may take fewer"
    assert printed <= int(claim.group(2))


def test_the_simulator_speed_claim_says_how_it_was_measured() -> None:
    """docs/hotspots.md once claimed 300k-560k writes/s (wall clock); 1 M writes measured
    2.5-4.9 s of CPU. The claim now gives CPU time, its method and its range."""
    text = " ".join((ROOT / "docs" / "hotspots.md").read_text().split())
    claim = text[text.index("Speed, measured in CPU time") :][:900]
    assert "time.process_time()" in claim and "1,000,000 simulated writes" in claim
    assert "560,000" not in text and "2.5 to 4.9 s of CPU" in claim
