"""The quick loop (`pytest -m "not slow"`) keeps a test for every feature it leaves to the
slow one: a `@pytest.mark.slow` whose comment (the lines just above it) says
`quick loop: <test>, ...` names tests that exist and are not slow themselves
(docs/testing.md, "The quick loop"). Marking the named test slow too, or renaming it,
would leave that feature without fast feedback."""

from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).parent

QUICK = re.compile(r"quick loop:\s*(?P<names>.*)", re.DOTALL)
NAME = re.compile(r"(?:(?P<file>test_\w+\.py)::)?(?P<test>test_\w+)")
MODULE_SLOW = re.compile(r"^pytestmark\s*=.*\bpytest\.mark\.slow\b", re.MULTILINE)


def decorators_of(lines: list[str], test: str) -> list[str] | None:
    """The decorator lines above ``def test(`` (None: no such function at module level)."""
    for i, line in enumerate(lines):
        if re.match(rf"(?:async )?def {test}\(", line):
            top = i
            while top > 0 and (lines[top - 1].startswith(("@", " ", ")", "]"))):
                top -= 1
            return lines[top:i]
    return None


def promises() -> list[tuple[str, str, str, str]]:
    """(file of the slow test, its comment, file of the named test, the named test)."""
    found = []
    for path in sorted(HERE.glob("test_*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("@pytest.mark.slow"):
                continue
            top = i
            while top > 0 and lines[top - 1].startswith("#"):
                top -= 1
            comment = " ".join(ln.lstrip("# ") for ln in lines[top:i])
            match = QUICK.search(comment)
            if not match:
                continue
            for name in NAME.finditer(match["names"]):
                found.append((path.name, comment, name["file"] or path.name, name["test"]))
    return found


def test_slow_marks_name_the_quick_tests_that_stay() -> None:
    assert promises(), "no slow mark names its quick-loop test: the pattern changed?"


def test_each_named_quick_test_exists_and_is_not_slow() -> None:
    broken = []
    for slow_file, comment, file, test in promises():
        text = (HERE / file).read_text(encoding="utf-8") if (HERE / file).is_file() else ""
        decorators = decorators_of(text.splitlines(), test)
        if decorators is None:
            broken.append(f"{slow_file}: {comment!r} names {file}::{test}, not found")
        elif MODULE_SLOW.search(text) or any("mark.slow" in d for d in decorators):
            broken.append(f"{slow_file}: {comment!r} names {file}::{test}, which is slow")
    assert not broken, "\n".join(broken)
