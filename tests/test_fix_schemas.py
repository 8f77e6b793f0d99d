"""``doctor --fix`` on the schemas people have (issue 43), through the CLI as users run it.

Each schema whose change the revisions cannot carry is refused at ``--fix`` time with the
reason and the manual path, and nothing is written: an interleaved child whose parent's key
grows, a parent with interleaved children, an interleaved index, a table in a FOREIGN KEY
(either direction), a table in a named schema, an index over a nullable timestamp, an index
over a commit-timestamp column. ``--fix`` run again finds what it wrote before (pending or
applied) and writes nothing new; on the emulator, with the expand applied.

The split statistics are rows in SPANNER_SYS's shape (tests/test_doctor.py ``row``), or the
seed scenario's simulated export (tests/test_doctor_fix.py ``seed_export``).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic_project import Project
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from test_doctor import row, ts
from test_doctor_fix import seed_export

from sharded_orm import UTCDateTime, doctor, interleave_in
from sharded_orm.tools.cli import main
from sharded_orm.tools.doctor.fix import fix

# --- the schemas (one declarative base each: the CLI loads "test_fix_schemas:<Base>") ------


class Hierarchy(DeclarativeBase):
    pass


class Day(Hierarchy):
    __tablename__ = "Days"
    created_at: Mapped[dt.datetime] = mapped_column("CreatedAt", UTCDateTime, primary_key=True)


class Reading(Hierarchy):
    __tablename__ = "Readings"
    created_at: Mapped[dt.datetime] = mapped_column("CreatedAt", UTCDateTime, primary_key=True)
    reading_id: Mapped[str] = mapped_column("ReadingId", sa.String(36), primary_key=True)
    __table_args__ = {**interleave_in("Days")}


class Tenants(DeclarativeBase):
    pass


class Tenant(Tenants):
    __tablename__ = "Tenants"
    tenant_id: Mapped[str] = mapped_column("TenantId", sa.String(36), primary_key=True)


class Note(Tenants):
    __tablename__ = "Notes"
    tenant_id: Mapped[str] = mapped_column("TenantId", sa.String(36), primary_key=True)
    note_id: Mapped[str] = mapped_column("NoteId", sa.String(36), primary_key=True)
    at: Mapped[dt.datetime] = mapped_column("WrittenAt", UTCDateTime)
    __table_args__ = (
        sa.Index("NotesByWrittenAt", "TenantId", "WrittenAt", spanner_interleave_in="Tenants"),
        interleave_in("Tenants"),
    )


class Billing(DeclarativeBase):
    pass


class Invoice(Billing):
    __tablename__ = "Invoices"
    issued_at: Mapped[dt.datetime] = mapped_column("IssuedAt", UTCDateTime, primary_key=True)
    invoice_id: Mapped[str] = mapped_column("InvoiceId", sa.String(36), primary_key=True)


class Payment(Billing):
    __tablename__ = "Payments"
    payment_id: Mapped[str] = mapped_column("PaymentId", sa.String(36), primary_key=True)
    issued_at: Mapped[dt.datetime] = mapped_column("IssuedAt", UTCDateTime)
    invoice_id: Mapped[str] = mapped_column("InvoiceId", sa.String(36))
    __table_args__ = (
        sa.ForeignKeyConstraint(
            ["IssuedAt", "InvoiceId"], ["Invoices.IssuedAt", "Invoices.InvoiceId"], name="FK_Inv"
        ),
    )


class Shipping(DeclarativeBase):
    pass


class Customer(Shipping):
    __tablename__ = "Customers"
    customer_id: Mapped[str] = mapped_column("CustomerId", sa.String(36), primary_key=True)


class Shipment(Shipping):
    __tablename__ = "Shipments"
    shipped_at: Mapped[dt.datetime] = mapped_column("ShippedAt", UTCDateTime, primary_key=True)
    shipment_id: Mapped[str] = mapped_column("ShipmentId", sa.String(36), primary_key=True)
    customer_id: Mapped[str] = mapped_column(
        "CustomerId", sa.String(36), sa.ForeignKey("Customers.CustomerId")
    )


class Audit(DeclarativeBase):
    pass


class AuditLog(Audit):
    __tablename__ = "AuditLogs"
    logged_at: Mapped[dt.datetime] = mapped_column("LoggedAt", UTCDateTime, primary_key=True)
    log_id: Mapped[str] = mapped_column("LogId", sa.String(36), primary_key=True)
    __table_args__ = {"schema": "audit"}


class Nullable(DeclarativeBase):
    pass


class Visit(Nullable):
    __tablename__ = "Visits"
    visit_id: Mapped[str] = mapped_column("VisitId", sa.String(36), primary_key=True)
    left_at: Mapped[dt.datetime | None] = mapped_column("LeftAt", UTCDateTime)
    __table_args__ = (sa.Index("VisitsByLeftAt", "LeftAt", spanner_null_filtered=True),)


class Commits(DeclarativeBase):
    pass


class Commit(Commits):
    __tablename__ = "Commits"
    commit_id: Mapped[str] = mapped_column("CommitId", sa.String(36), primary_key=True)
    committed_at: Mapped[dt.datetime] = mapped_column(
        "CommittedAt", UTCDateTime, spanner_allow_commit_timestamp=True
    )
    __table_args__ = (sa.Index("CommitsByCommittedAt", "CommittedAt"),)


def _growing(key: str) -> list[dict[str, Any]]:
    """Rows of a hot split at the tail of a growing key ``key(<ts>, "id")`` (a table keyed
    by time and an id, or an index on a time whose entries end with the table's id)."""
    return [
        row(m, f'{key}({ts(m, -5)},"a")', "<end>", reasons=["MOVING_HOT_SPOT"]) for m in range(12)
    ]


# (base, split rows, what the finding is on, words the refusal says)
REFUSED: dict[str, tuple[str, list[dict[str, Any]], str, tuple[str, ...]]] = {
    "interleaved child, growing parent key": (
        "Hierarchy",
        _growing("Readings"),
        "Readings",
        ("INTERLEAVE IN PARENT Days", "(ShardId, CreatedAt, ReadingId)", "parent first"),
    ),
    "parent with interleaved children": (
        "Hierarchy",
        [row(m, f"Days({ts(m, -5)})", "<end>", reasons=["MOVING_HOT_SPOT"]) for m in range(12)],
        "Days",
        ("has interleaved children (Readings)", "op.retire_table each child, then the parent"),
    ),
    "interleaved index": (
        "Tenants",
        [row(m, f'NotesByWrittenAt("t1",{ts(m, -5)},"n")', "<end>", 90) for m in range(12)],
        "NotesByWrittenAt",
        ("INTERLEAVE IN Tenants", "without interleave_in"),
    ),
    "referenced by a foreign key": (
        "Billing",
        _growing("Invoices"),
        "Invoices",
        ("Payments(IssuedAt, InvoiceId) -> Invoices", "op.drop_constraint", "same expand"),
    ),
    "referencing by a foreign key": (
        "Shipping",
        _growing("Shipments"),
        "Shipments",
        ("Shipments(CustomerId) -> Customers", "outgoing foreign keys under new"),
    ),
    "named schema": (
        "Audit",
        # Spanner names a named schema's key spaces schema.Name in its split keys
        _growing("audit.AuditLogs"),
        "audit.AuditLogs",
        ("audit.AuditLogs is in the named schema audit", "schema='audit'"),
    ),
    "index over a nullable timestamp": (
        "Nullable",
        _growing("VisitsByLeftAt"),
        "VisitsByLeftAt",
        ("Visits.LeftAt is nullable", "a NULL has no shard", "make it NOT NULL first"),
    ),
    "index over a commit timestamp": (
        "Commits",
        _growing("CommitsByCommittedAt"),
        "CommitsByCommittedAt",
        ("commit timestamp", "PENDING_COMMIT_TIMESTAMP()", "shard by a column the app writes"),
    ),
}


def _project(tmp_path: Path, url: str = "sqlite://") -> tuple[Project, Path]:
    """An Alembic project (tests/alembic_project.py) and the alembic.ini the CLI reads."""
    proj = Project(tmp_path / "proj", url)
    ini = tmp_path / "proj" / "alembic.ini"
    ini.write_text(
        f"[alembic]\nscript_location = {tmp_path / 'proj' / 'migrations'}\nsqlalchemy.url = {url}\n"
    )
    return proj, ini


def _export(rows: list[dict[str, Any]], path: Path) -> Path:
    """``rows`` as a CSV export of SPANNER_SYS.SPLIT_STATS_TOP_MINUTE."""
    with path.open("w", newline="") as f:
        f.write(
            "INTERVAL_END,SPLIT_START,SPLIT_LIMIT,CPU_USAGE_SCORE,AFFECTED_TABLES,"
            "UNSPLITTABLE_REASONS\n"
        )
        for r in rows:
            end = r["INTERVAL_END"].isoformat().replace("+00:00", "Z")
            cells = [end, r["SPLIT_START"], r["SPLIT_LIMIT"], str(r["CPU_USAGE_SCORE"])]
            cells += [json.dumps(r["AFFECTED_TABLES"]), json.dumps(r["UNSPLITTABLE_REASONS"])]
            f.write(",".join('"' + c.replace('"', '""') + '"' for c in cells) + "\n")
    return path


def _versions(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "proj" / "migrations" / "versions").glob("*.py"))


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_schema_the_revisions_cannot_carry_is_refused_with_the_manual_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    base, rows, on, words = REFUSED[name]
    _, ini = _project(tmp_path)
    export = _export(rows, tmp_path / "splits.csv")
    argv = ["doctor", str(export), f"{__name__}:{base}", "--fix", "--alembic-ini", str(ini)]
    capsys.readouterr()
    main(argv)
    out, err = capsys.readouterr()
    assert f"== {on}: " in out and "no migration" in out, (out, err)
    text = " ".join(out.split())
    for word in words:
        assert word in text, (word, out)
    assert "No revision is written" in text
    assert not _versions(tmp_path)  # nothing written
    main([*argv, "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert data["summary"]["revisions_written"] == []
    [refused] = [f for f in data["findings"] if f["table"] == on]
    assert refused["fix"] is None and words[0] in " ".join(refused["no_migration"].split())


NAME = st.from_regex(r"[A-Z][A-Za-z0-9]{0,15}", fullmatch=True)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    table=NAME,
    column=NAME,
    index=NAME,
    shape=st.sampled_from(["nullable", "commit_timestamp", "schema", "interleaved"]),
)
def test_each_unsupported_shape_is_refused_for_any_names(
    table: str, column: str, index: str, shape: str
) -> None:
    if len({table, column, index, "Id", "Parents"}) < 5:
        return

    class B(DeclarativeBase):
        pass

    sa.Table("Parents", B.metadata, sa.Column("Id", sa.String(36), primary_key=True))
    kw: dict[str, Any] = {"spanner_allow_commit_timestamp": shape == "commit_timestamp"}
    table_kw: dict[str, Any] = {"schema": "s1"} if shape == "schema" else {}
    index_kw: dict[str, Any] = (
        {"spanner_interleave_in": "Parents"} if shape == "interleaved" else {}
    )
    sa.Table(
        table,
        B.metadata,
        sa.Column("Id", sa.String(36), primary_key=True),
        sa.Column(column, UTCDateTime, nullable=shape == "nullable", **kw),
        sa.Index(index, "Id", column, **index_kw) if index_kw else sa.Index(index, column),
        **table_kw,
    )
    key = '"p",{}' if index_kw else '{},"x"'
    # a named schema's index is named s1.Index in Spanner's split keys
    space = f"s1.{index}" if table_kw else index
    rows = [row(m, f"{space}({key.format(ts(m))})", "<end>") for m in range(6)]
    report = fix(doctor(rows, B.metadata), B.metadata)
    assert not report.changes and not report.revisions
    [refusal] = report.refusals
    assert "No revision is written" in refusal.reason
    said = {
        "nullable": f"{table}.{column} is nullable",
        "commit_timestamp": f"{table}.{column} is a commit timestamp",
        "schema": f"s1.{table} is in the named schema s1",
        "interleaved": f"index {index} is INTERLEAVE IN Parents",
    }[shape]
    assert said in refusal.reason


# --- run twice: what the first run wrote is said, not written again ---------------------------


def _fix_argv(tmp_path: Path, ini: Path) -> list[str]:
    export = seed_export("4 timestamp index", tmp_path / "splits.csv")
    argv = ["doctor", str(export), "examples.hotspots:NaiveEvent", "--threshold", "30s"]
    return [*argv, "--fix", "--alembic-ini", str(ini)]


# CLI journey; quick loop:
# test_a_schema_the_revisions_cannot_carry_is_refused_with_the_manual_path
@pytest.mark.slow
def test_fix_run_twice_says_the_first_revisions_are_pending(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proj, ini = _project(tmp_path, f"sqlite:///{tmp_path / 'app.db'}")
    argv = _fix_argv(tmp_path, ini)
    assert main(argv) == 1  # hot longer than the threshold: exit 1, with or without --fix
    capsys.readouterr()
    first = _versions(tmp_path)
    assert len(first) == 2
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert _versions(tmp_path) == first  # nothing new written
    assert "already written by doctor --fix" in out and "nothing new was written" in out
    for path in first:
        assert "(pending): doctor fix: unsharded_index on EventsByTimestamp" in out
        assert str(path) in out
    assert main([*argv, "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["summary"]["revisions_written"] == []
    assert sorted(data["summary"]["already_written"]) == sorted(map(str, first))
    [finding] = data["findings"]
    assert finding["fix"] == "shard_index"
    assert [r["state"] for r in finding["already_written"]] == ["pending", "pending"]
    # marked applied in the database (alembic stamp): said applied
    proj.cfg.attributes["target_metadata"] = sa.MetaData()
    command.stamp(proj.cfg, "head")
    assert main([*argv, "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [r["state"] for r in data["findings"][0]["already_written"]] == ["applied", "applied"]
    assert _versions(tmp_path) == first


@pytest.mark.emulator
@pytest.mark.slow
def test_fix_run_again_after_the_expand_on_the_emulator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spanner_emulator: Any
) -> None:
    """The expand applied on the emulator: the second run says it is applied and the
    contract pending, writes nothing; the contract then applies, and a third run says both
    are applied."""
    from examples import hotspots as h
    from sharded_orm.tools.doctor.diagnose import metadata_of_models

    url = spanner_emulator.url(spanner_emulator.create_database())
    proj, ini = _project(tmp_path, url)
    old_md = metadata_of_models([h.NaiveEvent])
    proj.revision(old_md, "init")
    proj.upgrade()
    argv = _fix_argv(tmp_path, ini)
    capsys.readouterr()
    assert main([*argv, "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    expand, contract = data["findings"][0]["revisions"]
    proj.upgrade(expand["revision"])
    capsys.readouterr()
    before = _versions(tmp_path)
    assert main([*argv, "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    states = {r["revision"]: r["state"] for r in data["findings"][0]["already_written"]}
    assert states == {expand["revision"]: "applied", contract["revision"]: "pending"}
    assert data["summary"]["revisions_written"] == [] and _versions(tmp_path) == before
    # the contract, with the model change applied (fix() without a project writes nothing)
    [change] = fix(doctor(argv[1], [h.NaiveEvent]), [h.NaiveEvent]).changes
    proj.upgrade("head", target_metadata=change.metadata)
    capsys.readouterr()
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert out.count("(applied): doctor fix:") == 2 and "they are applied" in out
    assert _versions(tmp_path) == before
