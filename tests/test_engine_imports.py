"""A Spanner engine loads nothing of alembic_ext; Alembic still gets our impl (issue 45).

The dialect module used to import ``alembic_ext.impl`` (21 modules of ``alembic_ext``,
+23 % CPU over sqlalchemy-spanner's own import) through an import by name that the
architecture test did not see, closing a cycle back to the dialect. Now the dialect
registers a small class for ``spanner+spanner`` (``sharded_orm.spanner.alembic_impl``)
that builds the full impl when Alembic builds one. Import checks run in clean
interpreters (subprocesses); the cycle check reads the source with ``ast``.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sharded_orm", "alembic_ext")
DIALECT = "sharded_orm.spanner.dialect"
URL = "spanner+spanner:///projects/p/instances/i/databases/d"
#: what Alembic's ``alembic.plugins`` entry point loads on ``import alembic``, which
#: sqlalchemy-spanner's module does: the light plugin, nothing else of alembic_ext
#: what Alembic's entry point loads with any ``import alembic`` (stock's too): the plugin,
#: and the stand-ins of our operations (``alembic_ext.stand_ins``, which the dialect shares)
ENTRY_POINT_MODULES = {"alembic_ext", "alembic_ext.plugin", "alembic_ext.stand_ins"}


def _python(code: str) -> Any:
    env = {**os.environ, "SPANNER_DISABLE_BUILTIN_METRICS": "true"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


LOADED = """
import json, sys
{imports}
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("alembic", "alembic_ext"))))
"""


def test_an_engine_loads_nothing_of_alembic_ext_and_no_more_of_alembic_than_stock() -> None:
    engine = (
        "import sqlalchemy as sa, sharded_orm\n"
        f"engine = sa.create_engine({URL!r})\n"
        "assert type(engine.dialect).__module__ == 'sharded_orm.spanner.dialect'"
    )
    ours = set(_python(LOADED.format(imports=engine)))
    stock = set(_python(LOADED.format(imports="import google.cloud.sqlalchemy_spanner")))
    assert {m for m in ours if m.startswith("alembic_ext")} <= ENTRY_POINT_MODULES, sorted(ours)
    assert "alembic_ext.impl" not in ours
    assert ours - stock == set(), sorted(ours - stock)


# -- import graph (module-level imports only; imports by name included)


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _with_parents(name: str) -> list[str]:
    """``a.b.c`` runs ``a`` and ``a.b`` first: each is an edge too (ours only)."""
    parts = name.split(".")
    names = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return [n for n in names if n in MODULES]


def _resolve(module: str, node: ast.ImportFrom) -> list[str]:
    if node.level:
        is_pkg = MODULES[module].name == "__init__.py"
        base = module.split(".")
        base = base if is_pkg else base[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    found = _with_parents(prefix)
    for alias in node.names:  # `from pkg import module`
        found += _with_parents(f"{prefix}.{alias.name}")
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements run when the module loads: not in functions; classes, ``if``/``try``
    bodies included; ``if TYPE_CHECKING:`` excluded."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If):
            if not _is_type_checking(node):
                out += _top_level(node.body) + _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody, *[h.body for h in node.handlers]):
                out += _top_level(part)
        elif isinstance(node, (ast.ClassDef, ast.With)):
            out += _top_level(node.body)
    return out


def _by_name(node: ast.stmt) -> list[str]:
    """``importlib.import_module("a.literal")`` run at load time (in this statement, not
    in a function or class body it defines)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.Try)):
        return []
    found = []
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == "import_module"
            and sub.args
            and isinstance(sub.args[0], ast.Constant)
            and isinstance(sub.args[0].value, str)
        ):
            found += _with_parents(sub.args[0].value)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports when it loads (under an ``if`` too)."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        edges: set[str] = set()
        for node in _top_level(ast.parse(path.read_text()).body):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    edges.update(_with_parents(alias.name))
            elif isinstance(node, ast.ImportFrom):
                edges.update(_resolve(module, node))
            edges.update(_by_name(node))
        edges.discard(module)
        graph[module] = edges
    return graph


def cycles_through(graph: dict[str, set[str]], start: str) -> list[list[str]]:
    """One shortest way back to ``start`` from each module it imports, if any."""
    found = []
    for first in sorted(graph.get(start, ())):
        parent: dict[str, str | None] = {first: None}
        queue = [first]
        while queue:
            node = queue.pop(0)
            if node == start:
                path = [node]
                while parent[path[-1]] is not None:
                    path.append(parent[path[-1]])  # type: ignore[arg-type]
                found.append([start, *reversed(path)])
                break
            for nxt in sorted(graph.get(node, ())):
                if nxt not in parent:
                    parent[nxt] = node
                    queue.append(nxt)
    return found


def test_the_graph_sees_imports_by_name() -> None:
    """The reader finds a load-time ``importlib.import_module("...")`` and ignores one in
    a function, so a cycle hidden behind it cannot pass unseen."""
    tree = ast.parse(
        "import importlib\n"
        "if True:\n"
        "    importlib.import_module('alembic_ext.impl')\n"
        "def later():\n"
        "    importlib.import_module('alembic_ext.ops')\n"
    )
    found = [m for node in _top_level(tree.body) for m in _by_name(node)]
    assert found == ["alembic_ext", "alembic_ext.impl"]


def test_no_runtime_import_cycle_through_the_dialect() -> None:
    bad = cycles_through(import_graph(), DIALECT)
    assert not bad, "\n".join(" -> ".join(c) for c in bad)


#: load-time ways from the dialect to alembic_ext: none beyond the modules Alembic's entry
#: point loads anyway (``alembic_impl`` registers our operations' names through
#: ``alembic_ext.stand_ins``, each loading ``alembic_ext.ops`` on its first call)
MIGRATION_PROCESS_ONLY: set[tuple[str, str]] = set()


def test_the_dialect_loads_alembic_ext_in_no_way_the_source_shows() -> None:
    """No chain of load-time imports leads from the dialect to alembic_ext beyond what
    Alembic's entry point loads with any ``import alembic``."""
    graph = import_graph()
    seen, todo = {DIALECT}, [DIALECT]
    while todo:
        node = todo.pop()
        for nxt in graph[node]:
            if nxt not in seen and (node, nxt) not in MIGRATION_PROCESS_ONLY:
                seen.add(nxt)
                todo.append(nxt)
    assert {m for m in seen if m.startswith("alembic_ext")} <= ENTRY_POINT_MODULES
    assert {
        ("sharded_orm.spanner.alembic_impl", m) for m in graph["sharded_orm.spanner.alembic_impl"]
    } >= MIGRATION_PROCESS_ONLY


# -- Alembic still gets the full impl, and migrations run on it


@pytest.mark.emulator
def test_a_migration_context_builds_the_full_impl_and_runs_an_op(spanner_engine: Any) -> None:
    from alembic.ddl.impl import DefaultImpl
    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext

    from alembic_ext.impl import SpannerImpl
    from sharded_orm.spanner.alembic_impl import SpannerImpl as Registered

    assert DefaultImpl.get_by_dialect(spanner_engine.dialect) is Registered
    with spanner_engine.connect() as conn:
        ctx = MigrationContext.configure(conn)
        assert type(ctx.impl) is SpannerImpl
        assert ctx.impl.transactional_ddl is False
        op = Operations(ctx)
        op.create_table(
            "Made", sa.Column("Id", sa.BigInteger, primary_key=True, autoincrement=False)
        )
        op.bulk_insert(sa.table("Made", sa.column("Id", sa.BigInteger)), [{"Id": 7}])
        conn.commit()
    with spanner_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT Id FROM Made")).scalars().all() == [7]


OFFLINE = """
import io, json, sqlalchemy as sa, sharded_orm
from alembic.migration import MigrationContext
from alembic.operations import Operations
sa.create_engine({url!r})
buf = io.StringIO()
ctx = MigrationContext.configure(
    dialect_name="spanner+spanner", opts={{"as_sql": True, "output_buffer": buf}}
)
op = Operations(ctx)
op.create_table("T", sa.Column("Id", sa.BigInteger, primary_key=True, autoincrement=False))
op.backfill_shard("T", "S", sources=["Id"], count=4)
print(json.dumps([type(ctx.impl).__module__, buf.getvalue()]))
"""


def test_offline_sql_mode_gets_the_full_impl_and_its_operations() -> None:
    """``alembic upgrade --sql``: no connection, the impl built all the same; our
    operation (registered by alembic_ext when the impl loads) is there."""
    module, sql = _python(OFFLINE.format(url=URL))
    assert module == "alembic_ext.impl"
    assert "CREATE TABLE IF NOT EXISTS `T`" in sql
