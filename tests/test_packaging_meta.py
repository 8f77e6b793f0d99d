"""A package a company can approve (issue 42, item 3): the licence the metadata declares is in
the repository and in the wheel, the version is one and the same everywhere a user looks,
and the metadata carries classifiers and a changelog exists.

Before: no LICENSE file in the repository or the wheel (pyproject.toml said Apache-2.0),
no classifiers, no changelog, and no ``sharded_orm.__version__``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from importlib.metadata import metadata
from pathlib import Path

import pytest

import sharded_orm

ROOT = Path(__file__).resolve().parent.parent
#: what a wheel is built from (pyproject.toml's packages and its license-files)
SOURCES = (
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "CHANGELOG.md",
    "MANIFEST.in",
    "sharded_orm",
    "sharded_orm_pytest",
    "alembic_ext",
)


def pyproject_field(name: str) -> str:
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(rf'^{name} = "([^"]+)"$', text, re.M)
    assert m is not None, name
    return m.group(1)


def test_the_license_file_is_the_apache_license_the_metadata_declares() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert pyproject_field("license") == "Apache-2.0"
    assert "Apache License" in text.splitlines()[1] and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    # the full text: its nine sections, not a pointer to it
    for n, title in enumerate(
        ["Definitions", "Grant of Copyright License", "Grant of Patent License",
         "Redistribution", "Submission of Contributions", "Trademarks",
         "Disclaimer of Warranty", "Limitation of Liability",
         "Accepting Warranty or Additional Liability"], start=1,
    ):  # fmt: skip
        assert f"{n}. {title}" in text


def test_one_version_everywhere() -> None:
    """pyproject.toml, the installed metadata, ``sharded_orm.__version__``, the CLI."""
    version = pyproject_field("version")
    assert metadata("sharded-orm")["Version"] == version
    assert sharded_orm.__version__ == version
    out = subprocess.run(
        [sys.executable, "-m", "sharded_orm.tools.cli", "--version"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert version in out.stdout + out.stderr
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{version}]" in changelog


def test_the_version_costs_nothing_at_import() -> None:
    """``__version__`` is read on first use: ``import sharded_orm`` stays light."""
    code = (
        "import json, sys, sharded_orm\n"
        "before = '__version__' in vars(sharded_orm)\n"
        "v = sharded_orm.__version__\n"
        "print(json.dumps([before, v, '__version__' in dir(sharded_orm)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, version, listed = json.loads(out.stdout)
    assert (before, version, listed) == (False, pyproject_field("version"), True)


def test_installed_metadata_declares_the_license_and_classifiers() -> None:
    meta = metadata("sharded-orm")
    assert meta["License-Expression"] == "Apache-2.0"
    classifiers = meta.get_all("Classifier") or []
    assert "Programming Language :: Python :: 3" in classifiers
    assert any(c.startswith("Development Status ::") for c in classifiers)
    assert not [c for c in classifiers if c.startswith("License ::")]  # PEP 639: the expression


def copy_sources(tmp_path: Path) -> Path:
    """The sources a release is built from, in a copy (a build leaves files behind)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    return src


@pytest.mark.slow
def test_the_sdist_carries_the_license_and_the_changelog(tmp_path: Path) -> None:
    """What a reviewer unpacks: the licence, the changelog and the README beside the code.

    Before: no MANIFEST.in, so the source distribution had no CHANGELOG.md.
    """
    src = copy_sources(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "-o", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    version = pyproject_field("version")
    (sdist,) = (tmp_path / "dist").glob("sharded_orm-*.tar.gz")
    assert sdist.name == f"sharded_orm-{version}.tar.gz"
    top = f"sharded_orm-{version}"
    with tarfile.open(sdist) as tf:
        names = set(tf.getnames())
        for name in ("LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "PKG-INFO"):
            assert f"{top}/{name}" in names, name
        member = tf.extractfile(f"{top}/CHANGELOG.md")
        assert member is not None
        assert member.read() == (ROOT / "CHANGELOG.md").read_bytes()
        assert f"{top}/sharded_orm/py.typed" in names


@pytest.mark.slow
def test_the_wheel_carries_the_license_and_the_version(tmp_path: Path) -> None:
    """A wheel built from the sources."""
    src = copy_sources(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-q", "-w", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = tmp_path.glob("sharded_orm-*.whl")
    version = pyproject_field("version")
    assert wheel.name.startswith(f"sharded_orm-{version}-")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = f"sharded_orm-{version}.dist-info"
        assert f"{info}/licenses/LICENSE" in names
        assert zf.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        meta = Parser().parsestr(zf.read(f"{info}/METADATA").decode())
    assert meta["Version"] == version
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["License-File"] == "LICENSE"
    assert meta.get_all("Classifier")
