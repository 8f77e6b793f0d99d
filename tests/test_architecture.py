"""The package's shape, read from its imports: layers, no cycles, no private names across modules.

Layers, lowest first (a module imports only its own layer or below):
errors/checks/hashing/limits/retry/progress/telemetry -> schema -> spanner -> write -> read -> ids
-> load (and beam) -> tools.
``testing`` and the package ``__init__`` sit on top. ``alembic_ext`` is a client of the
package, outside it. Imports under ``if TYPE_CHECKING:`` are annotations only and not counted.
"""

from __future__ import annotations

import ast
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sharded_orm", "alembic_ext")
LAYERS = {
    "errors": 0,
    "checks": 0,
    "hashing": 0,
    "retry": 0,
    "progress": 0,
    "telemetry": 0,
    "limits": 0,
    "memo": 0,
    "greenlets": 0,
    "schema": 1,
    "spanner": 2,
    "write": 3,
    "read": 4,
    "ids": 5,
    "load": 6,
    "beam": 6,
    "tools": 7,
    "testing": 8,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            found[_module_name(path)] = path
    return found


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_import_module(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "import_module"
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


def _dynamic_imports(path: Path) -> set[str]:
    """The modules ``importlib.import_module("a.literal.name")`` imports in the module."""
    tree = ast.parse(path.read_text(), str(path))
    found = {n.args[0].value for n in ast.walk(tree) if _is_import_module(n)}  # type: ignore[attr-defined]
    return {m for m in found if m.split(".")[0] in PACKAGES}


def _imports(name: str, path: Path) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for every runtime import in the module."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    out: list[tuple[str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                out.extend((a.name, []) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = here[: len(here) - child.level + 1]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                names = [a.name for a in child.names]
                # "from pkg import submodule" imports the submodule
                subs = [n for n in names if f"{mod}.{n}" in MODULES]
                out.extend((f"{mod}.{n}", []) for n in subs)
                out.append((mod, [n for n in names if n not in subs]))
            visit(child)

    visit(tree)
    return [(m, n) for m, n in out if m.split(".")[0] in PACKAGES]


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}
DYNAMIC = {name: _dynamic_imports(path) for name, path in MODULES.items()}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "sharded_orm" or len(parts) < 2:
        return None
    return LAYERS[parts[1]]  # a new top-level module must be given its layer here


def _edges(*, dynamic: bool = False) -> dict[str, set[str]]:
    """Who imports whom. A package's ``__init__`` is a module like any other: its imports of
    its own modules count, and so does a module taking names from its package's
    ``__init__``. Only ``from . import sibling`` is not an edge into the ``__init__``: it
    needs the sibling, and the package object, which exists before its modules run.
    ``dynamic``: ``importlib.import_module("literal")`` counts too."""
    edges: dict[str, set[str]] = {}
    for m, deps in GRAPH.items():
        edges[m] = {
            t
            for t, names in deps
            if t in MODULES and t != m and not (m.startswith(t + ".") and not names)
        }
        if dynamic:
            edges[m] |= {t for t in DYNAMIC[m] if t in MODULES and t != m}
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def walk(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t) :] + [t])
            elif t not in state:
                walk(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            walk(m)
    return cycles


def test_no_import_cycles() -> None:
    cycles = _cycles(_edges())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _components(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        for t in edges[m]:
            if t not in index:
                visit(t)
                low[m] = min(low[m], low[t])
            elif t in stack:
                low[m] = min(low[m], index[t])
        if low[m] == index[m]:
            part = set()
            while True:
                t = stack.pop()
                part.add(t)
                if t == m:
                    break
            if len(part) > 1:
                found.append(part)

    for m in sorted(edges):
        if m not in index:
            visit(m)
    return found


def test_no_import_cycle_through_a_package_init() -> None:
    """A package's ``__init__`` runs before any of its modules, so a cycle through it ties
    every module on the cycle to every import of the package. ``import sharded_orm`` used
    to import the tools, the loaders and the ids, which reach the Alembic impl (by name,
    from the dialect), whose backfill imported ``sharded_orm`` again: 17 modules of
    ``sharded_orm`` and ``alembic_ext`` in one circle. Imports by name
    (``importlib.import_module("a.literal")``) count here."""
    inits = {m for m, path in MODULES.items() if path.name == "__init__.py"}
    bad = [sorted(c) for c in _components(_edges(dynamic=True)) if c & inits]
    assert not bad, "import cycles through a package __init__:\n" + "\n".join(
        f"{len(c)} modules: " + ", ".join(c) for c in bad
    )


def test_no_private_names_across_modules() -> None:
    bad = [
        f"{m} takes {n} from {t}"
        for m, deps in GRAPH.items()
        for t, names in deps
        for n in names
        if n.startswith("_") and not n.startswith("__") and t != m
    ]
    assert not bad, "\n".join(bad)


def test_each_layer_imports_only_below_itself() -> None:
    bad = []
    for m, deps in GRAPH.items():
        mine = _layer(m)
        if mine is None:
            continue
        for t, _ in deps:
            theirs = _layer(t)
            if theirs is not None and theirs > mine:
                bad.append(f"{m} (layer {mine}) imports {t} (layer {theirs})")
    assert not bad, "\n".join(bad)


#: a module longer than this is listed in the test report, never refused: a module is one
#: idea a maintainer can state in two sentences (its docstring), whatever its length
LONG_MODULE_LINES = 450


class LongModule(UserWarning):
    """Modules over :data:`LONG_MODULE_LINES` lines: information for a reviewer."""


def _long_modules(limit: int) -> list[tuple[str, int]]:
    """(module, lines) for every module over ``limit`` lines, longest first."""
    counted = [(name, path.read_text().count("\n")) for name, path in MODULES.items()]
    return sorted(
        ((n, lines) for n, lines in counted if lines > limit), key=lambda x: (-x[1], x[0])
    )


def test_long_modules_are_listed_never_refused() -> None:
    """Lists the long modules as a warning in the report; a module's length fails nothing."""
    every = [name for name, _ in _long_modules(0)]
    assert sorted(every) == sorted(n for n, p in MODULES.items() if p.read_text().count("\n"))
    long = _long_modules(LONG_MODULE_LINES)
    if long:
        listing = "\n".join(f"  {lines:5d}  {name}" for name, lines in long)
        warnings.warn(
            LongModule(
                f"{len(long)} modules over {LONG_MODULE_LINES} lines (information, not a "
                f"failure: split a module only where it holds two ideas):\n{listing}"
            ),
            stacklevel=1,
        )


def _docstring(path: Path) -> str:
    return (ast.get_docstring(ast.parse(path.read_text(), str(path))) or "").strip()


def test_every_module_states_its_idea_in_a_docstring() -> None:
    missing = sorted(name for name, path in MODULES.items() if not _docstring(path))
    assert not missing, (
        "modules without a docstring (add one: two sentences saying the module's one idea):\n"
        + "\n".join(missing)
    )


def test_the_memo_imports_only_the_standard_library() -> None:
    """``sharded_orm.memo`` is the one cache mechanism of every layer, so it sits below
    them all: it imports nothing but the standard library."""
    path = MODULES["sharded_orm.memo"]
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, "sharded_orm.memo imports a module of the package"
            imported.add((node.module or "").split(".")[0])
    outside = sorted(imported - set(sys.stdlib_module_names) - {"__future__"})
    assert not outside, f"sharded_orm.memo imports {outside}: only the standard library"
