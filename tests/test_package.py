"""Package-level promises: a light import, types that keep sources hashable."""

from __future__ import annotations

import ast
import datetime as dt
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

import sharded_orm
from sharded_orm import ShardValueError, UTCDateTime


def test_import_does_not_load_the_spanner_client() -> None:
    code = (
        "import sys, sharded_orm, alembic_ext\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('google.cloud.spanner', 'grpc')))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_utc_datetime_round_trips_aware_on_sqlite() -> None:
    md = sa.MetaData()
    t = sa.Table(
        "t", md, sa.Column("id", sa.Integer, primary_key=True), sa.Column("ts", UTCDateTime)
    )
    eng = sa.create_engine("sqlite://")
    md.create_all(eng)
    paris = dt.timezone(dt.timedelta(hours=2))
    value = dt.datetime(2024, 6, 1, 12, 0, 0, 123456, tzinfo=paris)
    with eng.begin() as conn:
        conn.execute(t.insert(), {"id": 1, "ts": value})
        back = conn.execute(sa.select(t.c.ts)).scalar_one()
    assert back == value and back.tzinfo == dt.timezone.utc
    # SQLAlchemy wraps errors of bind processors; ours is the cause
    with pytest.raises(sa.exc.StatementError, match="naive datetime") as info, eng.begin() as conn:
        conn.execute(t.insert(), {"id": 2, "ts": dt.datetime(2024, 1, 1)})
    assert isinstance(info.value.orig, ShardValueError)


# --- a lazy package: the tools and everything else load on first use (issue 33 item 10) ---

#: what ``import sharded_orm`` may load of the package: the registrations (the dialect
#: names, the shard DDL, the ORM and Session hooks) and what they stand on (telemetry: the
#: engine hook counts rows per shard; it imports no OpenTelemetry until an operation runs;
#: memo: the one cache mechanism, stdlib only)
EAGER_LAYERS = (
    "errors", "checks", "hashing", "limits", "memo", "telemetry", "schema", "spanner", "write",
)  # fmt: skip


def _loaded_by(code: str) -> set[str]:
    """The modules a fresh interpreter holds after ``import sqlalchemy.orm`` then ``code``."""
    probe = (
        "import json, sys, sqlalchemy.orm\n"
        "before = set(sys.modules)\n"
        f"{code}\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def test_import_loads_the_registrations_and_nothing_else() -> None:
    loaded = _loaded_by("import sharded_orm")
    ours = {m for m in loaded if m.startswith("sharded_orm.")}
    assert ours, loaded
    unexpected = sorted(m for m in ours if m.split(".")[1] not in EAGER_LAYERS)
    assert not unexpected, f"import sharded_orm loads {unexpected}"
    others = sorted(
        m
        for m in loaded
        if m.split(".")[0] not in ("sharded_orm", "sqlalchemy", *sys.stdlib_module_names)
    )
    assert not others, f"import sharded_orm loads {others}"


@pytest.mark.parametrize(
    ("name", "module"),
    [("lint", "sharded_orm.tools.lint"), ("simulate", "sharded_orm.tools.simulate")],
)
def test_a_name_loads_its_module_on_first_use(name: str, module: str) -> None:
    loaded = _loaded_by(f"from sharded_orm import {name}")
    assert module in loaded
    assert "sharded_orm.tools.doctor" not in loaded  # only what the name needs


def _init_tree() -> ast.Module:
    return ast.parse(Path(sharded_orm.__file__).read_text())


def test_every_public_name_is_lazy_typed_and_exported() -> None:
    """``_LAZY``, the ``TYPE_CHECKING`` imports (mypy, IDEs) and ``__all__`` name the same
    things, and each name is what its module defines."""
    typed: dict[str, str] = {}
    for node in _init_tree().body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module
                typed.update((a.name, imp.module) for a in imp.names)
    lazy = sharded_orm._LAZY  # type: ignore[attr-defined]
    assert typed == lazy
    assert sorted(sharded_orm.__all__) == sorted(lazy)
    for name, module in lazy.items():
        assert getattr(sharded_orm, name) is getattr(importlib.import_module(module), name)
    assert set(lazy) <= set(dir(sharded_orm))


def test_star_import_and_unknown_names() -> None:
    namespace: dict[str, object] = {}
    exec("from sharded_orm import *", namespace)
    assert set(sharded_orm.__all__) <= set(namespace)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        sharded_orm.nope  # noqa: B018
    with pytest.raises(ImportError):
        exec("from sharded_orm import nope", {})
