"""The installed distribution declares every third-party distribution the package imports,
and bounds each required one from below and above (issue 45: "declare what you import").

The imports are read with ``ast`` from the shipped packages (lazy imports inside functions
count: they run in someone's process). A module maps to the distribution whose files hold
it; a namespace package (``google``, ``opentelemetry``) maps through its first regular
package, so ``google.cloud.spanner_v1`` is google-cloud-spanner's and ``google.api_core``
google-api-core's. A module that is not installed here (``apache_beam`` when only the
``test`` extra is) maps to the distribution named like it, which an extra must declare.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import re
import sys
from functools import cache
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
OURS = ("sharded_orm", "sharded_orm_pytest", "alembic_ext")
DIST = "sharded-orm"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules(root: Path = ROOT) -> dict[str, set[str]]:
    """Each third-party module the shipped packages import, with the files importing it."""
    found: dict[str, set[str]] = {}
    for package in OURS:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    # ``from google.cloud import spanner``: the name may be a module of a
                    # namespace package, so it stays on (resolution stops at a regular package)
                    names = [
                        f"{node.module}.{alias.name}".removesuffix(".*") for alias in node.names
                    ]
                else:
                    continue
                for name in names:
                    top = name.partition(".")[0]
                    if top in sys.stdlib_module_names or top in OURS or top == "__future__":
                        continue
                    found.setdefault(name, set()).add(str(path.relative_to(root)))
    return found


@cache
def _files_to_distributions() -> dict[Path, str]:
    owners: dict[Path, str] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        for file in dist.files or ():
            if file.suffix in (".py", ".so", ".pyd"):
                owners[Path(str(dist.locate_file(file))).resolve()] = _canonical(name)
    return owners


def distribution_of(module: str) -> str:
    """The distribution providing ``module`` (its first non-namespace package's files)."""
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        prefix = ".".join(parts[:depth])
        try:
            spec = importlib.util.find_spec(prefix)
        except ModuleNotFoundError:
            spec = None
        if spec is None:
            # not installed here: the distribution named like the package
            return _canonical(prefix)
        if spec.origin not in (None, "namespace"):
            owner = _files_to_distributions().get(Path(spec.origin).resolve())
            if owner is None:  # a module outside any distribution's RECORD
                return _canonical(prefix)
            return owner
    return _canonical(module)


def declared() -> tuple[dict[str, Requirement], dict[str, set[str]]]:
    """The installed sharded-orm's required dependencies, and each extra's distributions."""
    required: dict[str, Requirement] = {}
    extras: dict[str, set[str]] = {}
    for line in md.requires(DIST) or ():
        req = Requirement(line)
        name = _canonical(req.name)
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", str(req.marker or ""))
        if extra is None:
            required[name] = req
        else:
            extras.setdefault(extra.group(1), set()).add(name)
            if name == DIST:  # an extra made of other extras
                extras[extra.group(1)] |= {f"{DIST}[{e}]" for e in req.extras}
    return required, extras


def _extra_closure(extras: dict[str, set[str]], extra: str) -> set[str]:
    names = set()
    for name in extras.get(extra, set()):
        if name.startswith(f"{DIST}["):
            names |= _extra_closure(extras, name[len(DIST) + 1 : -1])
        elif name != DIST:
            names.add(name)
    return names


def test_every_imported_distribution_is_declared() -> None:
    required, extras = declared()
    in_extras = set().union(*(_extra_closure(extras, e) for e in extras))
    missing: dict[str, set[str]] = {}
    for module, files in imported_modules().items():
        dist = distribution_of(module)
        if dist not in required and dist not in in_extras:
            missing.setdefault(dist, set()).update(f"{f} ({module})" for f in files)
    assert not missing, (
        "sharded_orm/alembic_ext import distributions the package does not declare; add them "
        "to [project] dependencies (with a floor and a ceiling) or to an extra in pyproject.toml, "
        "then reinstall (pip install -e '.[dev]'): "
        + "; ".join(f"{d}: {', '.join(sorted(fs)[:3])}" for d, fs in sorted(missing.items()))
    )


def test_the_google_clients_are_required_not_transitive() -> None:
    required, _ = declared()
    for module in ("google.cloud.spanner_v1", "google.cloud.spanner_dbapi", "google.api_core"):
        assert distribution_of(module) in required, module
    assert {"google-cloud-spanner", "google-api-core", "sqlalchemy-spanner"} <= set(required)


def test_every_required_dependency_has_a_floor_and_a_ceiling() -> None:
    required, _ = declared()
    unbounded = []
    for name, req in sorted(required.items()):
        ops = {spec.operator for spec in req.specifier}
        floor = ops & {">=", ">", "==", "~=", "==="}
        ceiling = ops & {"<", "<=", "==", "~=", "==="}
        if not floor or not ceiling:
            unbounded.append(f"{name} ({req.specifier or 'no version'})")
    assert not unbounded, (
        "required dependencies need a floor (the oldest release .ci/run's floors pass tests) "
        f"and a major-version ceiling: {', '.join(unbounded)}"
    )


def test_the_test_extra_has_no_beam_and_dev_is_test_plus_beam() -> None:
    _, extras = declared()
    test = _extra_closure(extras, "test")
    assert "pytest" in test and "hypothesis" in test
    assert "apache-beam" not in test, "the test extra must install without Beam"
    assert _extra_closure(extras, "dev") >= test | _extra_closure(extras, "beam")
    assert "apache-beam" in _extra_closure(extras, "dev")


def test_the_walk_finds_lazy_and_namespace_imports(tmp_path: Path) -> None:
    """The checker itself: imports inside functions count, and a namespace package maps to
    the distribution of its regular sub-package, not to every distribution under it."""
    pkg = tmp_path / "sharded_orm"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "import os\nfrom . import x\n"
        "def f():\n    from google.api_core import exceptions\n    import sqlparse\n",
        encoding="utf-8",
    )
    for other in OURS[1:]:
        (tmp_path / other).mkdir()
    found = imported_modules(tmp_path)
    assert set(found) == {"google.api_core.exceptions", "sqlparse"}
    assert distribution_of("google.api_core.exceptions") == "google-api-core"
    assert distribution_of("google.cloud.spanner") == "google-cloud-spanner"
    assert distribution_of("farmhash") == "cityhash"  # a C extension of another name
    assert distribution_of("google.cloud.spanner_v1.testing.mock_spanner") == (
        "google-cloud-spanner"
    )
    assert distribution_of("no_such_module_xyz.sub") == "no-such-module-xyz"


def _top_level_imports(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.partition(".")[0])
    return names


def _marks_whole_module_beam(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return "pytest.mark.beam" in ast.unparse(node.value)
    return False


def test_test_files_importing_beam_at_the_top_are_beam_only() -> None:
    """The quick loop on the `test` extra (no Beam) collects every file but these, and these
    hold only beam-marked tests: nothing is skipped, and CI's .[dev] pass runs them all."""
    from conftest import BEAM_ONLY

    importing = set()
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if "apache_beam" in _top_level_imports(tree):
            importing.add(path.name)
            assert _marks_whole_module_beam(tree), f"{path.name}: pytestmark must include beam"
    assert importing == BEAM_ONLY


def test_a_run_deselecting_beam_does_not_import_the_beam_only_files() -> None:
    from conftest import deselects

    for expr in (
        "not beam",
        "not slow and not beam",
        "not (beam or slow)",
        "emulator and not beam",
    ):
        assert deselects(expr, "beam"), expr
    for expr in ("", "beam", "not slow", "slow or beam", "beam or not beam", "not and", "a(b=1)"):
        assert not deselects(expr, "beam"), expr


def test_ci_installs_every_floor_in_its_floors_pass() -> None:
    """.ci/run's last pass installs exactly the floor of each required dependency."""
    required, _ = declared()
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    block = re.search(r"^floors=\((.*?)^\)", text, re.S | re.M)
    assert block is not None, ".ci/run has no floors=( ... ) array"
    pins = {}
    for pin in re.findall(r'"([^"]+)"', block.group(1)):
        req = Requirement(pin)
        (spec,) = req.specifier
        assert spec.operator == "==", pin
        pins[_canonical(req.name)] = spec.version
    floors = {}
    for name, req in required.items():
        lows = [s.version for s in req.specifier if s.operator in (">=", "==", "~=")]
        assert len(lows) == 1, f"{name}: one floor ({req.specifier})"
        floors[name] = lows[0]
    mismatched = {
        n: (floors.get(n), pins.get(n))
        for n in floors.keys() | pins.keys()
        if floors.get(n) is None or pins.get(n) is None or Version(floors[n]) != Version(pins[n])
    }
    assert not mismatched, f"pyproject floor vs .ci/run floors pin: {mismatched}"
