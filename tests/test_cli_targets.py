"""A module target means all the tables of every MetaData it holds, for every subcommand
(issue 31 item 6): ``sharded-orm lint examples.hotspots`` used to be refused ("module
examples.hotspots has 2 MetaData objects") although README and ``--help`` said a module
means all its tables. A table two of them declare is shown as ``Attr.name``; ``verify`` and
``doctor``, which read one database, ask which declaration is meant.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from sharded_orm.tools.cli import main
from sharded_orm.tools.lint import lint
from sharded_orm.tools.targets import load_target, metadata_of, tables_of

ROOT = Path(__file__).resolve().parent.parent

#: two declarative bases and a MetaData: "Events" is declared twice (naive and fixed), the
#: others once each
TWO_BASES = """
import datetime as dt
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sharded_orm import UTCDateTime, shard_column


class Naive(DeclarativeBase):
    pass


class Fixed(DeclarativeBase):
    pass


class NaiveEvent(Naive):
    __tablename__ = "Events"
    ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime, primary_key=True)


class FixedEvent(Fixed):
    __tablename__ = "Events"
    shard: Mapped[int] = shard_column("ts", count=8, name="ShardId", primary_key=True)
    ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime, primary_key=True)


class Log(Naive):
    __tablename__ = "Log"
    ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime, primary_key=True)


class Audit(Fixed):
    __tablename__ = "Audit"
    id: Mapped[str] = mapped_column("Id", sa.String(36), primary_key=True)
    ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime)
    shard: Mapped[int] = shard_column("ts", count=8, name="ShardId")


extra = sa.MetaData()
sa.Table("Counters", extra, sa.Column("Id", sa.Integer, primary_key=True))
"""

#: two MetaData objects with no table name in common (two databases' models in one module)
DISTINCT = """
import datetime as dt
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sharded_orm import shard_column

first = sa.MetaData()
sa.Table("A", first, sa.Column("Ts", sa.DateTime(timezone=True), primary_key=True))


class Base(DeclarativeBase):
    pass


class B(Base):
    __tablename__ = "B"
    k: Mapped[str] = mapped_column("K", sa.String(10), primary_key=True)
    shard: Mapped[int] = shard_column("k", count=4, name="S")
"""


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "two_bases.py").write_text(textwrap.dedent(TWO_BASES))
    (tmp_path / "distinct.py").write_text(textwrap.dedent(DISTINCT))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("two_bases", "distinct"):
        sys.modules.pop(name, None)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_lint_of_the_hotspots_example_lints_both_schemas(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's own command: the naive schema's errors, the fixed schema clean."""
    monkeypatch.chdir(ROOT)
    code, out, err = run(capsys, "lint", "examples.hotspots", "--format", "json")
    assert code == 1, err
    data = json.loads(out)
    tables = {f["table"] for f in data["findings"] if f["severity"] == "error"}
    assert tables and all(t.startswith("Naive.") for t in tables), tables
    assert data["summary"]["error"] == len(tables)


def test_a_module_means_every_metadata_it_holds(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = load_target("two_bases")
    labels = sorted(f.table for f in lint(module) if f.severity == "error")
    # Events is declared by both bases: named by base; Log once: by name
    assert labels == ["Log", "Naive.Events"], labels
    assert {t.name for t in tables_of(module)} == {"Events", "Log", "Audit", "Counters"}
    assert len(tables_of(module)) == 5
    code, out, _ = run(capsys, "lint", "two_bases")
    assert code == 1 and "SO101 Naive.Events:" in out and "SO104 Fixed.Events:" in out
    # the ones that read one database ask which declaration of Events is meant
    for argv in (("verify", "sqlite://", "two_bases"), ("doctor", "x.csv", "two_bases")):
        code, _, err = run(capsys, *argv)
        assert code == 2, err
        assert "two_bases:Naive or two_bases:Fixed" in err and "'Events'" in err, err
    # naming one works, as it always did
    code, out, err = run(capsys, "lint", "two_bases:Fixed")
    assert code == 0 and "0 errors" in out and "Naive" not in out, (out, err)


def test_simulate_of_a_module_compares_its_schemas(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ("simulate", "two_bases", "--rows-per-second", "10", "--duration", "30")
    code, out, err = run(capsys, *argv, "--format", "json")
    assert code == 0, err
    names = [r["name"] for r in json.loads(out)["results"]]
    assert sorted(names) == ["Audit", "Counters", "Fixed.Events", "Log", "Naive.Events"]


def test_distinct_metadata_objects_are_one_schema(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = load_target("distinct")
    assert sorted(t.name for t in tables_of(module)) == ["A", "B"]
    assert sorted(metadata_of(module).tables) == ["A", "B"]  # doctor's catalog: both
    code, out, _ = run(capsys, "lint", "distinct")
    assert code == 1 and "SO101 A:" in out
    db = workdir / "d.db"
    engine = sa.create_engine(f"sqlite:///{db}")
    for md in (module.first, module.Base.metadata):
        md.create_all(engine)
    engine.dispose()
    code, out, err = run(capsys, "verify", f"sqlite:///{db}", "distinct", "--format", "json")
    assert code == 0, err
    assert [t["table"] for t in json.loads(out)["summary"]["tables"]] == ["B"]
