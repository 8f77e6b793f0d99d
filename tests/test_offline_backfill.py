"""Offline mode (``alembic upgrade --sql``) of a reshard, applied statement by statement as
a DBA applies a reviewed script: it fills every row (farm_fingerprint: the UPDATE that
computes it) or stops with an error at the check that follows the fill (crc32, which
GoogleSQL cannot compute); never a comment alone that lets the script reach head."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import reshard_models as rm
import sqlalchemy as sa
from alembic_project import Project

from sharded_orm import compute_shard

pytestmark = pytest.mark.emulator

ROWS = 200


def _setup(tmp_path: Path, emulator: Any, algorithm: str, nullable: bool) -> Any:
    db = emulator.create_database()
    proj = Project(tmp_path, emulator.url(db))
    proj.revision(rm.logs(shard16=False), "init")
    proj.upgrade()
    engine = sa.create_engine(emulator.url(db))
    table = rm.logs(shard16=False).tables["Logs"]
    with engine.begin() as c:
        c.execute(table.insert(), [rm.row(i) for i in range(ROWS)])
    start = proj.revision(rm.logs(nullable16=nullable, algorithm16=algorithm), "expand")
    assert "backfill_shard" in start
    return proj, engine, emulator.database(db)


def _statements(sql: str) -> list[str]:
    out = []
    for raw in sql.split(";\n"):
        stmt = "\n".join(ln for ln in raw.splitlines() if not ln.startswith("--")).strip()
        if stmt:
            out.append(stmt)
    return out


def _apply(database: Any, sql: str) -> None:
    """One statement at a time, in order: DDL as a schema change, the rest as DML."""
    for stmt in _statements(sql):
        if stmt.split()[0].upper() in ("CREATE", "ALTER", "DROP"):
            database.update_ddl([stmt]).result(120)
        else:
            database.run_in_transaction(lambda t, s=stmt: t.execute_update(s))


def _version(engine: sa.Engine) -> str | None:
    with engine.connect() as c:
        return c.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()


# resharding journey; quick loop: test_offline_farm_fingerprint_reshard_fills_every_row
@pytest.mark.slow
@pytest.mark.parametrize("nullable", [True, False])
def test_offline_crc32_reshard_stops_where_rows_are_unfilled(
    tmp_path: Path, spanner_emulator: Any, nullable: bool
) -> None:
    proj, engine, database = _setup(tmp_path, spanner_emulator, "crc32", nullable)
    before = _version(engine)
    sql = proj.offline_sql(f"{before}:head")
    assert "UPDATE `Logs` SET `Shard16` = ERROR(" in sql
    with pytest.raises(Exception, match="Logs.Shard16 has unfilled rows; run: sharded-orm"):
        _apply(database, sql)
    assert _version(engine) == before  # the script stopped before recording the revision
    with engine.connect() as c:
        left = c.exec_driver_sql("SELECT COUNT(*) FROM Logs WHERE Shard16 IS NULL").scalar()
    assert left == ROWS
    engine.dispose()


def test_offline_farm_fingerprint_reshard_fills_every_row(
    tmp_path: Path, spanner_emulator: Any
) -> None:
    proj, engine, database = _setup(tmp_path, spanner_emulator, "farm_fingerprint", False)
    sql = proj.offline_sql(f"{_version(engine)}:head")
    assert "SET `Shard16` = MOD(MOD(FARM_FINGERPRINT(" in sql
    _apply(database, sql)
    with engine.connect() as c:
        rows = c.exec_driver_sql("SELECT CompanyId, Ts, Shard16 FROM Logs").all()
        head = _version(engine)
    assert len(rows) == ROWS
    assert all(compute_shard((a, b), 16, "farm_fingerprint") == s for a, b, s in rows)
    assert head is not None and head != "init"
    engine.dispose()
