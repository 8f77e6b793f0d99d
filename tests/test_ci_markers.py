"""The SQLAlchemy 2.0 pass leaves out the files named in conftest's SA_NEUTRAL: each name
must be a test file here (a renamed file would otherwise run twice or, worse, a typo hide
nothing and the list drift), and none of them may exercise SQLAlchemy's ORM events."""

from __future__ import annotations

from pathlib import Path

from conftest import SA_NEUTRAL

HERE = Path(__file__).parent


def test_every_sa_neutral_name_is_a_test_file() -> None:
    missing = sorted(n for n in SA_NEUTRAL if not (HERE / f"{n}.py").is_file())
    assert not missing, f"SA_NEUTRAL names files that do not exist: {missing}"


def test_no_sa_neutral_file_uses_the_orm_session() -> None:
    using = sorted(
        n for n in SA_NEUTRAL if "Session(" in (HERE / f"{n}.py").read_text(encoding="utf-8")
    )
    assert not using, f"these files open ORM sessions, so SQLAlchemy's version matters: {using}"
