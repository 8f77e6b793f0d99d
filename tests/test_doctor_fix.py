"""``doctor --fix`` (issue 34): every pattern and reason code, the revisions it writes (valid
Python, ruff-clean, in the project's versions folder after its head, the model change
beside each), what it refuses, tables the models do not declare, hostile names.

Spanner's split statistics exist only on real instances: the rows here are shaped as
SPANNER_SYS.SPLIT_STATS_TOP_* rows (the scenarios of tests/test_doctor.py, and simulated
rows of the seed scenarios of docs/hotspots.md with the reason codes a real instance
gives such splits). tests/test_doctor_fix_e2e.py applies the revisions on the emulator.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic_project import Project
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from test_doctor import MODELS, SCENARIOS, row, ts

from examples import hotspots as h
from sharded_orm import UTCDateTime, doctor
from sharded_orm.errors import ShardingError
from sharded_orm.tools.cli import main
from sharded_orm.tools.doctor.diagnose import PATTERNS, REASONS
from sharded_orm.tools.doctor.fix import fix
from sharded_orm.tools.simulate import Instance, Workload, simulate

ROOT = Path(__file__).resolve().parent.parent


def project(tmp_path: Path) -> Project:
    return Project(tmp_path / "proj", f"sqlite:///{tmp_path / 'app.db'}")


def ruff_clean(paths: list[Path]) -> None:
    """ruff (pyflakes and syntax rules) finds nothing but, where a revision uses no ``sa``,
    the ``import sqlalchemy as sa`` of Alembic's own template."""
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "E9,F,E4,E7"]
        + ["--output-format", "json", *map(str, paths)],
        capture_output=True,
        text=True,
    )
    found = json.loads(proc.stdout)
    bad = [f for f in found if not (f["code"] == "F401" and "`sqlalchemy`" in f["message"])]
    assert not bad, bad


def written(report: Any) -> list[Path]:
    return [r.path for revs in report.revisions for r in revs]


# --- each pattern: the change it becomes -----------------------------------------------------

# (scenario rows, models, expected change kind, words its upgrade holds)
PATTERN_CASES: dict[str, tuple[Any, Any, str, tuple[str, ...]]] = {
    "monotonic key": (
        SCENARIOS["timestamp_key"],
        MODELS,
        "key_reshard",
        ("op.create_table('LogsSharded'", "op.copy_table_rows('Logs', 'LogsSharded')"),
    ),
    "tenant_skew": (
        SCENARIOS["tenant_100x"],
        MODELS,
        "reshard_index",
        (
            "op.backfill_shard('LogEntries', 'EntryShardId20'",
            "op.create_index('LogEntriesByCompany20'",
        ),
    ),
    "sequence": (
        SCENARIOS["sequence"],
        MODELS,
        "bit_reversed",
        ("SpannerSequence.create_ddl('OrdersOrderIdSequence'", "MAX(`OrderId`)"),
    ),
}


@pytest.mark.parametrize("name", sorted(PATTERN_CASES))
def test_each_pattern_becomes_its_revision(tmp_path: Path, name: str) -> None:
    rows, models, kind, words = PATTERN_CASES[name]
    proj = project(tmp_path)
    report = fix(doctor(rows, models), models, alembic=proj.cfg)
    [change] = report.changes
    assert change.kind == kind
    revs = report.revisions[0]
    assert len(revs) == change.stages
    text = revs[0].path.read_text()
    for word in words:
        assert word in text, (word, text)
    for r in revs:  # valid Python, ruff-clean, the model change beside it
        compile(r.path.read_text(), str(r.path), "exec")
        assert r.path.with_suffix(".model.txt").read_text().strip() == change.model_text
    ruff_clean(written(report))
    # chained after each other; the contract says so in its message
    if len(revs) == 2:
        assert (
            f"down_revision: Union[str, Sequence[str], None] = '{revs[0].revision}'"
            in (revs[1].path.read_text())
            or f"down_revision = '{revs[0].revision}'" in revs[1].path.read_text()
        )
        assert "CONTRACT" in revs[1].message


SEEDS = {
    # docs/hotspots.md's four scenarios, scaled down: (model, workload, instance, kind)
    "1 company 3x": (
        h.NaiveLogEntry,
        Workload(rows_per_second=6000, duration=90, tenants=3, tenant_weights=(1, 3, 1)),
        Instance(nodes=6),
        "shard_index",
    ),
    "2 company 100x, 10 shards": (
        h.sharded_log_entry(10),
        # a tenth of the docs' rates on nodes of a tenth of the capacity: the same shape
        Workload(rows_per_second=3000, duration=60, tenants=11, tenant_weights=(100,) + (1,) * 10),
        Instance(nodes=30, node_capacity=350, tick=5),
        "reshard_index",
    ),
    "3 timestamp key": (
        h.NaiveUser,
        Workload(rows_per_second=5000, duration=90, users_per_tenant=1_000_000),
        Instance(nodes=4),
        "key_reshard",
    ),
    "4 timestamp index": (
        h.NaiveEvent,
        Workload(rows_per_second=5000, duration=90),
        Instance(nodes=4),
        "shard_index",
    ),
}


def seed_export(name: str, path: Path) -> Path:
    """The seed scenario's predicted split statistics, exported as a real instance's CSV
    would be: the reason a growing key's tail gives (MOVING_HOT_SPOT) filled in."""
    model, workload, instance, _ = SEEDS[name]
    rows = simulate(model, workload, instance, progress_mode="off").hot_split_rows()
    assert isinstance(rows, list) and rows
    with path.open("w", newline="") as f:
        f.write(
            "INTERVAL_END,SPLIT_START,SPLIT_LIMIT,CPU_USAGE_SCORE,AFFECTED_TABLES,UNSPLITTABLE_REASONS\n"
        )
        for r in rows:
            end = r["INTERVAL_END"].isoformat().replace("+00:00", "Z")
            cells = [end, r["SPLIT_START"], r["SPLIT_LIMIT"], str(r["CPU_USAGE_SCORE"])]
            cells += [json.dumps(r["AFFECTED_TABLES"]), json.dumps(["MOVING_HOT_SPOT"])]
            f.write(",".join('"' + c.replace('"', '""') + '"' for c in cells) + "\n")
    return path


# a project per seed scenario; quick loop: test_each_pattern_becomes_its_revision
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SEEDS))
def test_seed_scenarios_get_their_fix(tmp_path: Path, name: str) -> None:
    model, _, _, kind = SEEDS[name]
    export = seed_export(name, tmp_path / "splits.csv")
    proj = project(tmp_path)
    report = fix(doctor(export, [model]), [model], alembic=proj.cfg)
    assert [c.kind for c in report.changes] == [kind]
    assert not report.refusals
    for p in written(report):
        compile(p.read_text(), str(p), "exec")
    ruff_clean(written(report))


# --- what no migration fixes -----------------------------------------------------------------


def _reason_rows(reason: str, start: str, limit: str) -> list[dict[str, Any]]:
    return [row(m, start, limit, reasons=[reason]) for m in range(12)]


REFUSED = {
    "HOT_ROW": (_reason_rows("HOT_ROW", 'Counters("a")', 'Counters("a2")'), "row design"),
    "UNISOLATABLE_HOT_ROW": (
        _reason_rows("UNISOLATABLE_HOT_ROW", 'Counters("a")', 'Counters("b")'),
        "row design",
    ),
    # a range of bit-reversed ids: no key part grows, so only the reason speaks
    "LARGE_SCAN_HOT_SPOT": (
        _reason_rows("LARGE_SCAN_HOT_SPOT", "Tickets(100)", "<end>"),
        "merged() and page()",
    ),
    "MOVING_HOT_SPOT": (
        _reason_rows("MOVING_HOT_SPOT", "Tickets(100)", "<end>"),
        "MOVING_HOT_SPOT",
    ),
    "UNSPECIFIED": (_reason_rows("UNSPECIFIED", "Tickets(100)", "<end>"), "UNSPECIFIED"),
    "hot_key": ([row(m, 'Counters("a")', 'Counters("a2")') for m in range(9)], "row design"),
    "unknown table": (
        [row(m, f"Ghosts({m})", "<end>") for m in range(5)],
        "no table or index of the models",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_no_migration_fixes_is_said_plainly(tmp_path: Path, name: str) -> None:
    rows, words = REFUSED[name]
    proj = project(tmp_path)
    diagnosis = doctor(rows, MODELS)
    report = fix(diagnosis, MODELS, alembic=proj.cfg)
    assert not report.changes and report.refusals
    assert words in report.text(), report.text()
    assert "no migration" in report.text()
    assert not list((tmp_path / "proj" / "migrations" / "versions").glob("*.py"))


def test_every_reason_code_and_pattern_is_covered() -> None:
    seen_reasons = {n for n in REFUSED if n in REASONS}
    assert seen_reasons == set(REASONS)
    patterns = {"hot_key", "large_scan", "unknown", "unsharded_index"} | {
        "monotonic",
        "tenant_skew",
        "sequence",
    }
    assert patterns == set(PATTERNS)


def test_a_growing_key_with_moving_hot_spot_is_still_fixed(tmp_path: Path) -> None:
    # MOVING_HOT_SPOT on a timestamp-led key: the key explains it, the key reshard fixes it
    report = fix(doctor(SCENARIOS["timestamp_key"], MODELS), MODELS)
    assert [c.kind for c in report.changes] == ["key_reshard"]
    assert report.changes[0].finding.reasons == ["MOVING_HOT_SPOT"]


def test_a_monotonic_sharded_key_is_resharded_with_a_bigger_count() -> None:
    rows = [
        row(m, f"ShardedUsers({s},{ts(m)},{m})", f"ShardedUsers({s + 1},{ts(0)},0)")
        for m in range(10)
        for s in range(16)
    ]
    report = fix(doctor(rows, [h.ShardedUser]), [h.ShardedUser], count=64)
    [change] = report.changes
    assert change.kind == "key_reshard" and change.count == 64
    assert change.after.name == "ShardedUsers64"
    assert [c.name for c in change.after.primary_key.columns][0] == "ShardId"


def test_nothing_is_written_without_a_project_and_nothing_applied(tmp_path: Path) -> None:
    report = fix(doctor(SCENARIOS["sequence"], MODELS), MODELS)
    assert report.revisions[0][0].path is None
    assert "def upgrade" in report.text()


def test_a_project_with_two_heads_is_refused(tmp_path: Path) -> None:
    proj = project(tmp_path)
    proj.hand_written("a", "pass")
    from alembic import command

    command.revision(proj.cfg, "b", head="base", splice=True)
    with pytest.raises(ShardingError, match="2 heads"):
        fix(doctor(SCENARIOS["sequence"], MODELS), MODELS, alembic=proj.cfg)


def test_a_missing_alembic_ini_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ShardingError, match="no Alembic configuration"):
        fix(doctor(SCENARIOS["sequence"], MODELS), MODELS, alembic=tmp_path / "alembic.ini")


# --- names: every identifier written is validated and quoted -------------------------------

NAME = st.from_regex(r"[A-Z][A-Za-z0-9_]{0,20}", fullmatch=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=NAME, column=NAME, index=NAME, tenant=NAME)
def test_generated_code_compiles_for_any_valid_names(
    table: str, column: str, index: str, tenant: str
) -> None:
    if len({table, column, index, tenant, "Id"}) < 5:
        return

    class B(DeclarativeBase):
        pass

    t = sa.Table(
        table,
        B.metadata,
        sa.Column("Id", sa.String(36), primary_key=True),
        # NOT NULL: a nullable source is refused (tests/test_fix_schemas.py)
        sa.Column(tenant + "Company", sa.String(10), nullable=False),
        sa.Column(column, UTCDateTime, nullable=False),
        sa.Index(index, tenant + "Company", column),
    )
    rows = [
        row(m, f'{index}("c1",{ts(m)},"x")', f'{index}("c1",{ts(m + 1)},"y")') for m in range(6)
    ]
    report = fix(doctor(rows, B.metadata), B.metadata)
    [change] = report.changes
    assert change.kind == "shard_index" and change.table is t
    for r in report.revisions[0]:
        compile(f"def upgrade():\n{r.upgrade}\n\ndef downgrade():\n{r.downgrade}\n", "rev", "exec")
        assert repr(table) in r.upgrade


def test_a_name_spanner_refuses_is_refused_not_written(tmp_path: Path) -> None:
    long = "I" * 125  # valid; the new index's name (+ "Sharded") would pass Spanner's 128

    class B(DeclarativeBase):
        pass

    class Bad(B):
        __tablename__ = "Logs"
        id: Mapped[str] = mapped_column("Id", sa.String(36), primary_key=True)
        ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime)
        __table_args__ = (sa.Index(long, "Ts"),)

    rows = [row(m, f"{long}({ts(m)})", "<end>") for m in range(3)]
    diagnosis = doctor(rows, [Bad])
    assert [f.pattern for f in diagnosis.findings] == ["unsharded_index"]
    with pytest.raises(ShardingError, match="128"):
        fix(diagnosis, [Bad], alembic=project(tmp_path).cfg)
    assert not list((tmp_path / "proj" / "migrations" / "versions").glob("*.py"))


# --- the command line ------------------------------------------------------------------------


# CLI journey; quick loop: test_each_pattern_becomes_its_revision
@pytest.mark.slow
def test_cli_fix_writes_prints_and_keeps_the_contract(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    proj = Project(tmp_path / "proj", "sqlite://")
    export = seed_export("4 timestamp index", tmp_path / "splits.csv")
    ini = tmp_path / "proj" / "alembic.ini"
    ini.write_text(
        f"[alembic]\nscript_location = {tmp_path / 'proj' / 'migrations'}\n"
        "sqlalchemy.url = sqlite://\n"
    )
    del proj
    monkeypatch.syspath_prepend(str(ROOT))
    argv = ["doctor", str(export), "examples.hotspots:NaiveEvent", "--threshold", "30s"]
    argv += ["--fix", "--alembic-ini", str(ini)]
    assert main(argv) == 1  # hot longer than the threshold: exit 1, as without --fix
    out = capsys.readouterr().out
    assert "op.create_index('EventsByTimestampSharded'" in out and "nothing was applied" in out
    assert main([*argv, "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    # the second run finds the first's revisions, pending, and writes none (issue 43)
    assert data["command"] == "doctor" and data["summary"]["revisions_written"] == []
    assert len(data["summary"]["already_written"]) == 2
    [finding] = data["findings"]
    assert finding["fix"] == "shard_index" and finding["already_written"][0]["path"]
    versions = list((tmp_path / "proj" / "migrations" / "versions").glob("*.py"))
    assert len(versions) == 2  # one expand and one contract, chained
    # no project: one line, exit 2
    assert main([*argv[:5], "--fix", "--alembic-ini", str(tmp_path / "none.ini")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no Alembic configuration" in err[0]


def test_a_second_change_to_one_table_waits_for_the_first() -> None:
    class B(DeclarativeBase):
        pass

    class Ev(B):
        __tablename__ = "Evs"
        ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime, primary_key=True)
        id: Mapped[str] = mapped_column("Id", sa.String(36), primary_key=True)
        at: Mapped[dt.datetime] = mapped_column("At", UTCDateTime)
        __table_args__ = (sa.Index("EvsByAt", "At"),)

    rows = [row(m, f'Evs({ts(m)},"a")', "<end>") for m in range(6)]
    rows += [row(m, f'EvsByAt({ts(m)},{ts(m)},"a")', "<end>", 90) for m in range(6)]
    report = fix(doctor(rows, [Ev]), [Ev])
    assert [c.kind for c in report.changes] == ["key_reshard"]
    [refusal] = report.refusals
    assert refusal.finding.pattern == "unsharded_index"
    assert "then run doctor --fix again" in refusal.reason


@pytest.mark.parametrize("window", ["minute", "10minute", "hour"])
def test_every_view_with_reason_codes_goes_through_fix(window: str) -> None:
    # the 10-minute and hour views keep each split's highest score per interval: same rows
    step = {"minute": 1, "10minute": 10, "hour": 60}[window]
    rows = [
        {**r, "INTERVAL_END": r["INTERVAL_END"] + dt.timedelta(minutes=i * (step - 1))}
        for i, r in enumerate(SCENARIOS["timestamp_key"])
    ]
    diagnosis = doctor(rows, MODELS, window=window)
    assert diagnosis.findings[0].reasons == ["MOVING_HOT_SPOT"]
    report = fix(diagnosis, MODELS)
    assert [c.kind for c in report.changes] == ["key_reshard"]
