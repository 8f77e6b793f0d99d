"""An 8 -> 16 reshard of a non-key shard column on the emulator, with a separate process
writing with the OLD model (count 8) from before the expand to after the contract, and a
``kill -9`` of ``alembic upgrade`` mid-backfill: after the contract, every row of the
table is findable through the new index and by point lookup, and ``verify`` is clean
(docs/migrations.md, 'The reshard invariant')."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import reshard_models as rm
import sqlalchemy as sa
from alembic_project import Project, body
from old_writer import env as writer_env
from old_writer import stats as writer_stats
from old_writer import stop as stop_writer
from old_writer import wait_for

from alembic_ext.errors import MigrationError
from alembic_ext.ops import PROGRESS_ATTRIBUTE
from sharded_orm import compute_shard, sharded_select
from sharded_orm.load.verify import verify

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

HERE = Path(__file__).parent
SEED = 3_000


def _seed(engine: sa.Engine, n: int) -> None:
    rows = [rm.row(i, "seed-") for i in range(n)]
    values = [
        [r["Id"], r["CompanyId"], r["Ts"], r["Body"], compute_shard((r["CompanyId"], r["Ts"]), 8)]
        for r in rows
    ]
    with engine.connect() as c:
        database: Any = c.connection.dbapi_connection.database  # type: ignore[union-attr]
    with database.batch() as batch:
        batch.insert("Logs", columns=["Id", "CompanyId", "Ts", "Body", "Shard8"], values=values)


def _upgrade(proj: Project) -> None:
    """``alembic upgrade head``, run again while the emulator refuses DDL beside the old
    writer's transaction (it runs one at a time; Spanner does not refuse this): the
    re-run rule of docs/migrations.md, each statement safe to repeat."""
    for _ in range(20):
        try:
            proj.upgrade(**{PROGRESS_ATTRIBUTE: None})
            return
        except MigrationError as exc:
            if "concurrent schema change operation or read-write transaction" not in str(exc):
                raise
            time.sleep(0.2)
    raise AssertionError("the emulator refused the DDL 20 times")


def test_reshard_with_an_old_writer_throughout_and_a_kill_9(
    tmp_path: Path, spanner_emulator: Any
) -> None:
    url = spanner_emulator.url(spanner_emulator.create_database())
    proj = Project(tmp_path / "proj", url)
    engine = sa.create_engine(url)
    out = tmp_path / "writer"
    out.mkdir()
    proj.revision(rm.logs(shard16=False), "init")
    proj.upgrade()
    _seed(engine, SEED)

    writer = subprocess.Popen(
        [sys.executable, str(HERE / "reshard_models.py"), "writer", url, str(out)],
        env=writer_env(),
    )
    try:
        wait_for("the old writer's first rows", lambda: writer_stats(out)["ok"] >= 5)
        # expand: new column nullable (old writers keep working), backfill, new index
        expand = proj.revision(rm.logs(), "expand")
        rev = body(expand, "upgrade")
        assert "backfill_shard('Logs', 'Shard16'" in rev and "alter_column" not in rev
        scripts = str(tmp_path / "proj" / "migrations")
        upgrade = subprocess.Popen(
            [sys.executable, str(HERE / "reshard_models.py"), "upgrade", url, scripts, "head"],
            env=writer_env(), stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert upgrade.stdout is not None
        seen = [upgrade.stdout.readline() for _ in range(2)]
        assert all(line.startswith("batch") for line in seen), seen
        os.kill(upgrade.pid, signal.SIGKILL)  # kill -9 mid-backfill
        upgrade.wait(30)
        with engine.connect() as c:
            filled = c.exec_driver_sql(
                "SELECT COUNT(*) FROM Logs WHERE Shard16 IS NOT NULL"
            ).scalar_one()
        assert 0 < filled < SEED
        _upgrade(proj)  # the re-run completes the expand
        during = writer_stats(out)["ok"]
        # old code keeps writing between the revisions: the contract must fill those rows
        wait_for("old rows after the expand", lambda: writer_stats(out)["ok"] >= during + 3)

        # contract, with the old writer still running: fence, then fill and check
        contract = proj.revision(rm.logs(shard8=False), "contract")
        up = body(contract, "upgrade")
        assert up.index("drop_column('Logs', 'Shard8')") < up.index("backfill_shard('Logs'")
        _upgrade(proj)
        # the old writer now fails loudly (its INSERT names the dropped column)
        before = writer_stats(out)["failed"]
        wait_for("the fenced writer's errors", lambda: writer_stats(out)["failed"] >= before + 3)
    finally:
        stop_writer(writer, out)
    stats = writer_stats(out)
    assert stats["ok"] > during > 5  # it wrote before, during and after the expand
    assert any("Shard8" in e for e in stats["errors"]), stats["errors"][-3:]

    final = rm.logs(shard8=False).tables["Logs"]
    with engine.connect() as c:
        stored = c.execute(sa.select(final.c.Id, final.c.CompanyId, final.c.Ts)).all()
        found = c.execute(sharded_select(final, index="LogsByShard16")).all()
    ids = {r.Id for r in stored}
    assert len(ids) >= SEED + stats["ok"] - 5  # nothing lost (a few commits may be unknown)
    assert {r.Id for r in found} == ids  # 0 rows unfindable through the new index
    unfindable = []
    with engine.connect() as c:  # point lookups of every row the old writer added
        for r in stored:
            if not r.Id.startswith("old-"):
                continue
            q = sharded_select(final, index="LogsByShard16").where(
                final.c.CompanyId == r.CompanyId, final.c.Ts == r.Ts
            )
            assert q.point_shard is not None
            if r.Id not in {x.Id for x in c.execute(q)}:
                unfindable.append(r.Id)
    assert unfindable == []
    report = verify(engine, final, progress_mode="off")
    assert report.ok and report.rows_checked == len(ids), report.as_dict()
    engine.dispose()
