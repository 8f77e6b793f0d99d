"""The docs' lists of what the write-pair oracle covers, and of the limits each builder
keeps, are the code's: docs/shard_columns.md "Supported combinations" lists every entry
of tests/write_features.py's lists, and docs/migrations.md "Limits" names only limits
that sharded_orm.limits holds, each in the module it says keeps it."""

from __future__ import annotations

import re
from pathlib import Path

import write_features

import sharded_orm.limits

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\| `(?P<name>[A-Z_]+)` \| (?P<entries>[^|]*) \|", re.MULTILINE)


def section(page: str, heading: str) -> str:
    text = (ROOT / "docs" / page).read_text()
    start = text.index(f"\n{heading}\n")
    level = heading.split(" ")[0]
    end = text.find(f"\n{level} ", start + len(heading) + 2)
    return text[start : end if end != -1 else None]


def documented_lists() -> dict[str, list[str]]:
    rows = section("shard_columns.md", "## Supported combinations")
    return {m["name"]: re.findall(r"`([^`]+)`", m["entries"]) for m in ROW.finditer(rows)}


def test_the_supported_combinations_are_the_oracles_lists() -> None:
    docs = documented_lists()
    code = {
        name: [str(v) for v in getattr(write_features, name)]
        for name in dir(write_features)
        if name.isupper() and isinstance(getattr(write_features, name), list)
    }
    assert docs == code


def test_the_backend_only_entries_are_named_in_the_docs() -> None:
    rows = section("shard_columns.md", "## Supported combinations")
    for entry in [*write_features.ONLY_ON, *write_features.TYPE_ONLY_ON]:
        assert rows.count(f"`{entry}`") >= 2, entry  # in the table, and in the note


def test_the_limits_table_names_the_limits_module() -> None:
    rows = section("migrations.md", "## Limits")
    named = set(re.findall(r"`((?:SPANNER|SQLITE)_[A-Z_]+)`", rows))
    assert named, "the Limits table names no limit"
    assert named <= set(sharded_orm.limits.__all__)
    builders = list(
        re.finditer(
            r"^\|[^|]*\((?P<paths>`[\w/]+\.py`(?:, `[\w/]+\.py`)*)\) \|(?P<limits>[^|]*)\|",
            rows,
            re.M,
        )
    )
    assert len(builders) >= 9
    for m in builders:
        paths = re.findall(r"`([\w/]+\.py)`", m["paths"])
        texts = [
            (ROOT / p if p.startswith("alembic_ext") else ROOT / "sharded_orm" / p).read_text()
            for p in paths
        ]
        assert any(
            "sharded_orm.limits" in t or "from sharded_orm import limits" in t for t in texts
        ), paths
