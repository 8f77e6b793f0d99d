"""The hotspot linter: catches the seeds' anti-patterns, passes their fixes, no false alarms."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from seed_models import Naive, Sharded
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import (
    HashedPrimaryKeyMixin,
    ShardConfigError,
    UTCDateTime,
    hashed_reference,
    shard_column,
)
from sharded_orm.tools.cli import main
from sharded_orm.tools.lint import LINT_IGNORE, lint


def rules(target: Any) -> set[tuple[str, str, str]]:
    return {(f.rule, f.table, f.target) for f in lint(target)}


def test_catches_every_seed_anti_pattern() -> None:
    found = rules(Naive)
    assert ("SO101", "Events", "column Timestamp") in found
    assert ("SO101", "Users", "column LastAccessTimestamp") in found
    assert ("SO107", "LogEntries", "index LogEntriesByCompany") in found


def test_fixed_seeds_pass() -> None:
    assert lint(Sharded) == []


def model(*cols: tuple[str, Any], args: tuple[Any, ...] = ()) -> type:
    class B(DeclarativeBase):
        pass

    ns: dict[str, Any] = {"__tablename__": "t", "__annotations__": {}, "__table_args__": args}
    for name, col in cols:
        ns[name] = col
    return type("M", (B,), ns)


def test_no_false_positive_for_user_or_shard_then_timestamp() -> None:
    by_user = model(
        ("user_id", mapped_column(sa.String(36), primary_key=True)),
        ("ts", mapped_column(UTCDateTime, primary_key=True, info={"sharded_orm.descending": True})),
    )
    by_shard = model(
        ("ts", mapped_column(UTCDateTime)),
        ("shard", shard_column("ts", count=8, primary_key=True, sort_order=-1)),
        (
            "ts2",
            mapped_column(UTCDateTime, primary_key=True, info={"sharded_orm.descending": True}),
        ),
    )
    assert lint(by_user) == [] and lint(by_shard) == []


def test_time_ordered_uuid_and_shard_rules() -> None:
    uuid7_key = model(
        ("id", mapped_column(sa.String(36), primary_key=True, default=lambda: str(uuid.uuid1())))
    )
    assert {f.rule for f in lint(uuid7_key)} == {"SO101"}
    v4_key = model(
        ("id", mapped_column(sa.String(36), primary_key=True, default=lambda: str(uuid.uuid4())))
    )
    assert lint(v4_key) == []
    shard_second = model(
        ("id", mapped_column(sa.Integer, primary_key=True)),
        ("ts", mapped_column(UTCDateTime)),
        ("s", shard_column("ts", count=1)),
        args=(sa.Index("t_by_ts", "id", "s"),),
    )
    assert {f.rule for f in lint(shard_second)} == {"SO103", "SO106"}
    index_on_time = model(
        ("id", mapped_column(sa.Integer, primary_key=True)),
        ("ts", mapped_column(UTCDateTime)),
        args=(sa.Index("t_ts", "ts"),),
    )
    assert {f.rule for f in lint(index_on_time)} == {"SO102"}


def test_reference_to_hashed_table_by_id_alone() -> None:
    class B(DeclarativeBase):
        pass

    class Customer(HashedPrimaryKeyMixin, B):
        __tablename__ = "customers"

    class Bad(B):
        __tablename__ = "bad"
        id: Mapped[int] = mapped_column(primary_key=True)
        customer_id: Mapped[int] = mapped_column(sa.ForeignKey("customers.id"))

    class Good(B):
        __tablename__ = "good"
        id: Mapped[int] = mapped_column(primary_key=True)

    hashed_reference(Good, Customer, prefix="customer")
    found = lint(B)
    assert [(f.rule, f.table) for f in found] == [("SO105", "bad")]


def test_silencing_a_rule_per_table() -> None:
    noisy = model(
        ("ts", mapped_column(UTCDateTime, primary_key=True)),
        args=({"info": {LINT_IGNORE: ["SO101"]}},),
    )
    assert lint(noisy) == []


def test_bad_targets() -> None:
    with pytest.raises(ShardConfigError, match="no tables"):
        lint(sa.MetaData())
    with pytest.raises(ShardConfigError, match="not a MetaData"):
        lint(42)


@pytest.fixture
def models_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "hot_models.py").write_text(
        "import sqlalchemy as sa\n"
        "from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column\n"
        "import datetime as dt\n"
        "class Base(DeclarativeBase):\n    pass\n"
        "class Event(Base):\n"
        "    __tablename__ = 'events'\n"
        "    ts: Mapped[dt.datetime] = mapped_column(primary_key=True)\n"
        "empty = sa.MetaData()\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return tmp_path


def test_cli_text_json_and_exit_codes(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", "hot_models:Base"]) == 1
    out = capsys.readouterr().out
    assert "ERROR   SO101 events: column ts" in out and "1 findings, 1 errors" in out
    assert main(["lint", "hot_models:Base", "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["command"] == "lint" and data["summary"]["error"] == 1
    assert data["findings"][0]["rule"] == "SO101" and data["findings"][0]["severity"] == "error"
    assert main(["lint", "hot_models:empty"]) == 2
    assert "no tables" in capsys.readouterr().err
    assert main(["lint", "no_such_module:Base"]) == 2
    assert "cannot import 'no_such_module'" in capsys.readouterr().err
    assert main(["lint", "hot_models:Nope"]) == 2
    assert "has no attribute 'Nope'" in capsys.readouterr().err
    assert main(["lint", "hot_models:sa"]) == 2
    assert "not a MetaData" in capsys.readouterr().err
