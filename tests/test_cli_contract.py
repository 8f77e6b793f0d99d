"""The ``sharded-orm`` contract (issue 24 items 1, 3 and 7), checked on the real command in a
subprocess with a timeout: exit 0 ok, 1 findings, 2 could not run with ONE line
``sharded-orm: error: ...`` and no traceback, whatever the user's files and modules do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sharded_orm.tools.cli import build_parser, main

MODELS = """
import datetime as dt
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sharded_orm import UTCDateTime, shard_column


class Base(DeclarativeBase):
    pass


class Hot(Base):
    __tablename__ = "Hot"
    ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime, primary_key=True)


class Sharded(Base):
    __tablename__ = "Sharded"
    company_id: Mapped[str] = mapped_column("CompanyId", sa.String(64), primary_key=True)
    entry_id: Mapped[int] = mapped_column("EntryId", primary_key=True, autoincrement=False)
    ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime)
    shard: Mapped[int] = shard_column("company_id", "ts", count=4, name="ShardId")
"""

# a default that must never run: it leaves a marker file, then does something hostile
DEFAULT = """
import pathlib, sys, time
import sqlalchemy as sa

def hostile():
    pathlib.Path("DEFAULT_RAN").write_text("lint called a default")
    {action}

md = sa.MetaData()
sa.Table("Events", md, sa.Column("Ts", sa.DateTime, primary_key=True),
         sa.Column("Id", sa.String(36), default=hostile))
"""

MODULES = {
    "models.py": MODELS,
    "exits0.py": "import sys\nsys.exit(0)\n",
    "exits3.py": "raise SystemExit(3)\n",
    "raises.py": "raise RuntimeError('model module broke\\non two lines')\n",
    "interrupts.py": "raise KeyboardInterrupt\n",
    "sleeps.py": "import time\ntime.sleep(1)\nfrom models import Base\n",
    "writes.py": "open('IMPORT_WROTE', 'w').write('x')\nfrom models import Base\n",
    "default_writes.py": DEFAULT.format(action="return 'x'"),
    "default_exits.py": DEFAULT.format(action="sys.exit(0)"),
    "default_raises.py": DEFAULT.format(action="raise RuntimeError('boom')"),
    "default_sleeps.py": DEFAULT.format(action="time.sleep(120)"),
    "many.py": "import sqlalchemy as sa\nmd = sa.MetaData()\nfor i in range(400):\n"
    "    sa.Table(f'T{i}', md, sa.Column('Ts', sa.DateTime, primary_key=True))\n",
}

SPLIT_ROW = {
    "INTERVAL_END": "2024-01-01T00:01:00Z",
    "SPLIT_START": "Hot(2024-01-01T00:00:00Z)",
    "SPLIT_LIMIT": "Hot(2024-01-01T00:00:30Z)",
    "CPU_USAGE_SCORE": 100,
    "AFFECTED_TABLES": "Hot",
}
CSV_HEAD = "INTERVAL_END,SPLIT_START,SPLIT_LIMIT,CPU_USAGE_SCORE,AFFECTED_TABLES\n"
CSV_ROW = '2024-01-01T00:01:00Z,"Hot(2024-01-01T00:00:00Z)","Hot(2024-01-01T00:00:30Z)",100,Hot\n'

FILES: dict[str, bytes] = {
    "nested.json": b"[" * 200_000 + b"]" * 200_000,
    "nested_objects.json": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "truncated.json": json.dumps([SPLIT_ROW, SPLIT_ROW]).encode()[:-25],
    "truncated.csv": (CSV_HEAD + CSV_ROW + CSV_ROW[:30]).encode(),
    "latin1.csv": (CSV_HEAD + CSV_ROW.replace("Hot", "Hôt")).encode("latin-1"),
    "utf16.json": json.dumps([SPLIT_ROW]).encode("utf-16"),
    "huge_field.csv": (CSV_HEAD + '"' + "x" * 3_000_000 + '",a,b,1,c\n').encode(),
    "huge_number.csv": (CSV_HEAD + CSV_ROW.replace(",100,", ",1e999,")).encode(),
    "huge_int.json": b'[{"INTERVAL_END": 1' + b"0" * 10_000 + b"}]",
    "nul.csv": (CSV_HEAD + CSV_ROW).encode().replace(b",100,", b",1\x000,"),
    "empty.json": b"",
    "garbage.db": os.urandom(4096),
    "not_rows.json": b'"a string"',
}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    for name, text in MODULES.items():
        (d / name).write_text(textwrap.dedent(text))
    for name, data in FILES.items():
        (d / name).write_bytes(data)
    (d / "a_directory").mkdir()
    return d


def run_cli(cwd: Path, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    code = "import sys; from sharded_orm.tools.cli import main; sys.exit(main())"
    env = {**os.environ, "PYTHONPATH": str(cwd), "SHARDED_ORM_PROGRESS": "off"}
    env.pop("SHARDED_ORM_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sharded-orm: error: "), proc.stderr[-2000:]
    for word in words:
        assert word.lower() in lines[0].lower(), (word, lines[0])


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    code: int
    words: tuple[str, ...] = ()
    absent: str | None = None  # a file the command must not create


SIM = ("--rows-per-second", "10", "--duration", "60")
SQLITE_MISSING = "sqlite:///no_such.db"
CASES = {
    # modules that exit, raise or are interrupted while importing: exit 2, never 0
    "lint exits0": Case(("lint", "exits0:Base"), 2, ("sys.exit(0)", "nothing was checked")),
    "lint exits3": Case(("lint", "exits3"), 2, ("sys.exit(3)",)),
    "lint raises": Case(("lint", "raises:Base"), 2, ("RuntimeError", "two lines")),
    "lint interrupted": Case(("lint", "interrupts:Base"), 2, ("interrupted",)),
    "simulate exits0": Case(("simulate", "exits0:Hot", *SIM), 2, ("sys.exit(0)",)),
    "doctor exits0": Case(("doctor", "truncated.csv", "exits0:Base"), 2, ("sys.exit(0)",)),
    "verify exits0": Case(("verify", "sqlite://", "exits0:Base"), 2, ("sys.exit(0)",)),
    # modules that sleep or write at import still get checked
    "lint sleeps": Case(("lint", "sleeps:Base"), 1),
    "lint writes": Case(("lint", "writes:Base"), 1),
    # defaults that write, exit, raise or sleep are never called: lint reports the table
    "lint default writes": Case(("lint", "default_writes:md"), 1, absent="DEFAULT_RAN"),
    "lint default exits": Case(("lint", "default_exits:md"), 1, absent="DEFAULT_RAN"),
    "lint default raises": Case(("lint", "default_raises:md"), 1, absent="DEFAULT_RAN"),
    "lint default sleeps": Case(("lint", "default_sleeps"), 1, absent="DEFAULT_RAN"),
    # targets, the same everywhere
    "lint a class": Case(("lint", "models:Hot"), 1),
    "lint a clean class": Case(("lint", "models:Sharded"), 0),
    "lint not a target": Case(("lint", "models:sa"), 2, ("not a MetaData",)),
    "lint no module": Case(("lint", "nowhere:Base"), 2, ("nowhere",)),
    # hostile files for doctor
    **{
        f"doctor {name}": Case(("doctor", name, "models:Base"), 2, (name,))
        for name in FILES
        if name != "garbage.db"
    },
    "doctor a directory": Case(("doctor", "a_directory", "models:Base"), 2, ("a_directory",)),
    "doctor missing": Case(("doctor", "missing.csv", "models:Base"), 2, ("missing.csv",)),
    "doctor bad since": Case(("doctor", "x.csv", "models:Base", "--since", "1e400d"), 2),
    # absurd simulations are refused at once
    "simulate history": Case(
        ("simulate", "models:Hot", *SIM, "--history", "1e15"), 2, ("history",)
    ),
    "simulate tenants": Case(
        ("simulate", "models:Hot", *SIM, "--tenants", "1000000000"), 2, ("tenants",)
    ),
    "simulate duration": Case(
        ("simulate", "models:Hot", "--rows-per-second", "1e-12", "--duration", "1e13"),
        2,
        ("duration",),
    ),
    "simulate no rate": Case(
        ("simulate", "models:Hot", "--duration", "60"), 2, ("rows-per-second",)
    ),
    # databases that cannot be opened: never a traceback, never an empty file left behind
    "verify missing sqlite": Case(
        ("verify", SQLITE_MISSING, "models:Sharded"), 2, ("no_such.db",), absent="no_such.db"
    ),
    "verify sqlite dir": Case(
        ("verify", "sqlite:///no/such/dir/x.db", "models:Base"), 2, ("does not exist",)
    ),
    "verify directory": Case(("verify", "sqlite:///a_directory", "models:Base"), 2, ("directory",)),
    "verify not a database": Case(
        ("verify", "sqlite:///garbage.db", "models:Base"), 2, ("not a database",)
    ),
    "verify missing driver": Case(
        ("verify", "postgresql://u@localhost/db", "models:Base"), 2, ("driver", "postgresql")
    ),
    "verify bad url": Case(("verify", "not a url", "models:Base"), 2, ("not a database URL",)),
    "verify nothing sharded": Case(("verify", "sqlite://", "models:Hot"), 2, ("no shard columns",)),
    "backfill missing sqlite": Case(
        ("backfill", SQLITE_MISSING, "T", "C", "--sources", "A", "--count", "4"),
        2,
        ("no_such.db",),
        absent="no_such.db",
    ),
    "backfill bad algorithm": Case(
        ("backfill", "sqlite://", "T", "C", "--sources", "A", "--count", "4", "--algorithm", "md5"),
        2,
        ("md5",),
    ),
    "usage": Case(("lint",), 2, ("lint", "target", "--help")),
    "unknown subcommand": Case(("frobnicate",), 2, ("frobnicate",)),
}


@pytest.mark.slow  # ~50 subprocesses, ~3 s each
@pytest.mark.parametrize("name", list(CASES))
def test_cli_contract(workdir: Path, name: str) -> None:
    case = CASES[name]
    for leftover in ("DEFAULT_RAN", "no_such.db"):
        (workdir / leftover).unlink(missing_ok=True)
    proc = run_cli(workdir, *case.argv, timeout=60)
    if case.code == 2:
        assert_one_line_error(proc, *case.words)
    else:
        assert proc.returncode == case.code, (proc.stdout[-1000:], proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr and proc.stdout.strip()
    if case.absent:
        assert not (workdir / case.absent).exists(), f"{case.absent} was created"


def test_a_closed_pipe_is_one_line_and_exit_2(workdir: Path) -> None:
    code = "import sys; from sharded_orm.tools.cli import main; sys.exit(main())"
    script = f'"{sys.executable}" -c "{code}" lint many:md --format json | head -c 100 >/dev/null'
    proc = subprocess.run(
        ["bash", "-c", script + "; exit ${PIPESTATUS[0]}"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(workdir)},
    )
    assert_one_line_error(proc, "broken pipe")


# --- one JSON envelope ------------------------------------------------------------------------

ENVELOPE_KEYS = {"command", "version", "summary"}


def check_envelope(data: Any, command: str, items: str) -> list[Any]:
    assert isinstance(data, dict)
    assert set(data) == ENVELOPE_KEYS | {items}, sorted(data)
    assert data["command"] == command
    assert isinstance(data["version"], str) and data["version"]
    assert isinstance(data["summary"], dict) and data["summary"]
    assert isinstance(data[items], list)
    return list(data[items])


# a subprocess per command; quick loop: test_a_closed_pipe_is_one_line_and_exit_2
@pytest.mark.slow
def test_every_json_output_is_the_envelope(workdir: Path, tmp_path: Path) -> None:
    lint_out = run_cli(workdir, "lint", "models:Base", "--format", "json")
    found = check_envelope(json.loads(lint_out.stdout), "lint", "findings")
    assert {f["rule"] for f in found} == {"SO101"}

    sim = run_cli(workdir, "simulate", "models:Hot", "models:Sharded", *SIM, "--format", "json")
    results = check_envelope(json.loads(sim.stdout), "simulate", "results")
    assert [r["name"] for r in results] == ["Hot", "Sharded"]

    export = workdir / "ok.json"
    export.write_text(json.dumps([SPLIT_ROW] * 3))
    doc = run_cli(workdir, "doctor", "ok.json", "models:Base", "--format", "json")
    assert doc.returncode in (0, 1), doc.stderr
    check_envelope(json.loads(doc.stdout), "doctor", "findings")

    db = tmp_path / "app.db"
    import sqlalchemy as sa

    engine = sa.create_engine(f"sqlite:///{db}")
    sys.path.insert(0, str(workdir))
    try:
        import models  # type: ignore[import-not-found]

        models.Base.metadata.create_all(engine)
    finally:
        sys.path.remove(str(workdir))
        sys.modules.pop("models", None)
        engine.dispose()
    ver = run_cli(workdir, "verify", f"sqlite:///{db}", "models:Base", "--format", "json")
    assert ver.returncode == 0, ver.stderr
    data = json.loads(ver.stdout)
    assert check_envelope(data, "verify", "findings") == []
    assert [t["table"] for t in data["summary"]["tables"]] == ["Sharded"]  # a Base: all sharded

    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:  # a column to fill: two rows, no shard yet
        conn.exec_driver_sql('CREATE TABLE "T" ("Id" INTEGER PRIMARY KEY, "K" TEXT, "S" INTEGER)')
        conn.exec_driver_sql("INSERT INTO \"T\" VALUES (1, 'a', NULL), (2, 'b', NULL)")
    engine.dispose()
    url = f"sqlite:///{db}"
    fill = ("backfill", url, "T", "S", "--sources", "K", "--count", "4", "--format", "json")
    back = run_cli(workdir, *fill)
    assert back.returncode == 0, back.stderr
    data = json.loads(back.stdout)  # stdout is the envelope alone (progress is on stderr)
    [result] = check_envelope(data, "backfill", "results")
    assert data["summary"]["rows_filled"] == result["rows"] == 2
    assert result["table"] == "T" and result["column"] == "S" and result["method"]


# --- help, defaults, version ------------------------------------------------------------------


def _subparsers() -> dict[str, Any]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return dict(action.choices)


def test_every_option_has_help_and_shows_its_default() -> None:
    subs = _subparsers()
    assert set(subs) == {"lint", "simulate", "doctor", "verify", "backfill", "advise"}
    for name, sub in subs.items():
        text = sub.format_help()
        for action in sub._actions:
            if action.dest == "help":
                continue
            assert action.help, f"{name} {action.dest} has no help"
            if action.option_strings and action.default not in (None, False, []):
                assert f"(default: {action.default})" in " ".join(text.split()), (name, action)


def test_backfill_engines_are_the_alembic_backfills() -> None:
    from alembic_ext.backfill import ENGINES
    from sharded_orm.tools.database import BACKFILL_ENGINES

    assert BACKFILL_ENGINES == ENGINES


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"sharded-orm {version('sharded-orm')}"


#: what ``--version`` and ``--help`` may load of the package: what ``import sharded_orm``
#: loads (its registrations, tests/test_package.py) and the parsers
PARSER_MODULES = {
    "sharded_orm.tools",
    "sharded_orm.tools.advise_cli",
    "sharded_orm.tools.cli",
    "sharded_orm.tools.commands",
    "sharded_orm.tools.contract",
    "sharded_orm.tools.database",
    "sharded_orm.tools.fix_cli",
    "sharded_orm.tools.targets",
}


# 7 subprocesses; quick loop: test_version, test_simulate_help_has_text_and_defaults
@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [("--version",), ("--help",)]
    + [(sub, "--help") for sub in ("lint", "simulate", "doctor", "verify", "backfill")],
    ids=" ".join,
)
def test_version_and_help_load_only_the_parsers(argv: tuple[str, ...]) -> None:
    """They took 2-3 s when the command imported the whole package and the tools first;
    each subcommand now imports what it runs when it runs (timing: benchmarks/bench_import.py)."""
    from test_package import EAGER_LAYERS

    code = (
        "import json, sys, sqlalchemy.orm\n"
        "before = set(sys.modules)\n"
        "from sharded_orm.tools.cli import main\n"
        f"assert main({list(argv)!r}) == 0\n"
        "print(json.dumps(sorted(set(sys.modules) - before)), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = set(json.loads(proc.stderr.strip().splitlines()[-1]))
    ours = {m for m in loaded if m.startswith("sharded_orm.")}
    extra = sorted(m for m in ours - PARSER_MODULES if m.split(".")[1] not in EAGER_LAYERS)
    assert not extra, f"{' '.join(argv)} loads {extra}"
    others = {
        m
        for m in loaded
        if m.split(".")[0] not in ("sharded_orm", "sqlalchemy", *sys.stdlib_module_names)
    }
    assert not others, sorted(others)


def test_simulate_help_has_text_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "(default: 3500.0)" in out and "(default: time)" in out and "seconds per time step" in out
    )


# --- the rest of item 7 -----------------------------------------------------------------------


def test_simulate_reports_progress_through_sharded_orm_progress(workdir: Path) -> None:
    env_proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from sharded_orm.tools.cli import main; sys.exit(main())",
            "simulate",
            "models:Hot",
            *SIM,
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(workdir), "SHARDED_ORM_PROGRESS": "log"},
    )
    assert env_proc.returncode == 0, env_proc.stderr
    assert "simulate Hot: started (600 rows)" in env_proc.stderr
    assert "simulate Hot: done, 600 rows" in env_proc.stderr


def test_backfill_subcommand_runs_the_alembic_backfill(tmp_path: Path) -> None:
    import sqlalchemy as sa

    from sharded_orm import compute_shard

    db = tmp_path / "b.db"
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        conn.exec_driver_sql('CREATE TABLE "T" ("Id" INTEGER PRIMARY KEY, "K" TEXT, "S" INTEGER)')
        conn.exec_driver_sql("INSERT INTO \"T\" VALUES (1, 'a', NULL), (2, 'b', NULL)")
    proc = run_cli(
        tmp_path, "backfill", f"sqlite:///{db}", "T", "S", "--sources", "K", "--count", "4"
    )
    assert proc.returncode == 0, proc.stderr
    assert "2 rows filled" in proc.stdout
    with engine.connect() as conn:
        got = dict(conn.exec_driver_sql('SELECT "K", "S" FROM "T"').all())
    engine.dispose()
    assert got == {k: compute_shard(k, 4) for k in ("a", "b")}


def test_verify_prints_no_alembic_info_lines(workdir: Path) -> None:
    """verify used to call logging.basicConfig(INFO): every library's INFO line showed."""
    code = (  # Alembic logs this line on every Spanner connection verify opens
        "import logging, sys; from sharded_orm.tools.cli import main; rc = main(); "
        "logging.getLogger('alembic.runtime.migration').info('Context impl SpannerImpl.'); "
        "sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "verify", "sqlite://", "models:Base"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(workdir), "SHARDED_ORM_PROGRESS": "log"},
    )
    assert "Context impl" not in proc.stderr and "INFO" not in proc.stderr


# runs the example in a subprocess; quick loop: test_a_closed_pipe_is_one_line_and_exit_2
@pytest.mark.slow
def test_hotspots_example_creates_the_heatmaps_directory(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "new" / "dir"
    argv = ["--scale", "0.01", "--only", "timestamp_key", "--heatmaps", str(out)]
    proc = subprocess.run(
        [sys.executable, str(root / "examples" / "hotspots.py"), *argv],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SHARDED_ORM_PROGRESS": "off"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "hotspots_timestamp_key.png").stat().st_size > 1000
