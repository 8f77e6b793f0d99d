"""Every commit through our dialect ends within ``commit_timeout`` (the DB-API's commit has
no timeout: a silent server held it for the client's hour, and an aborted transaction
was replayed without end). Alembic's commits (a migration's last one, ``autocommit_block``)
go through the same ``do_commit``; ``sqlalchemy.commit_timeout`` in alembic.ini sets it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic_project import Project
from google.cloud.spanner_dbapi.exceptions import ProgrammingError

from alembic_ext.errors import MigrationError
from sharded_orm.spanner.commits import DEFAULT_COMMIT_TIMEOUT, CommitTimeout

URL = "spanner+spanner:///projects/p/instances/i/databases/d"


def _events(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE Events (Id STRING(36)) PRIMARY KEY (Id)")


def _ids(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return [r[0] for r in conn.exec_driver_sql("SELECT Id FROM Events ORDER BY Id")]


@pytest.mark.emulator
@pytest.mark.parametrize("fault", ["silent", "aborted"])
def test_a_commit_that_does_not_finish_ends_in_time_with_its_outcome_unknown(
    spanner_emulator: Any, spanner_faults: Any, fault: str
) -> None:
    db = spanner_emulator.create_database()
    direct = spanner_emulator.engine(db)
    _events(direct)
    engine = spanner_faults.emulator(spanner_emulator).engine(db, commit_timeout=2)
    if fault == "silent":
        spanner_faults.hang("Commit", 120, times=1000)
    else:  # every attempt aborted: the DB-API replays the transaction and commits again
        spanner_faults.fail("Commit", "ABORTED", times=10_000)
    start = time.monotonic()
    with pytest.raises(sa.exc.OperationalError) as caught, engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO Events (Id) VALUES ('a')"))
    assert time.monotonic() - start < 2 + 3
    assert isinstance(caught.value.orig, CommitTimeout)
    assert "did not finish within 2 s" in str(caught.value)
    assert "its outcome is unknown" in str(caught.value)
    assert caught.value.connection_invalidated  # never handed out again
    seen = spanner_faults.count("Commit")
    assert seen >= 1
    time.sleep(0.5)  # a replay under way when the deadline passed stops at its next statement
    assert spanner_faults.count("Commit") - seen <= 1
    spanner_faults.clear()
    time.sleep(0.5)
    assert _ids(direct) == []  # never reached Spanner, and no replay commits it later
    with engine.begin() as conn:  # the engine works on: a new connection
        conn.execute(sa.text("INSERT INTO Events (Id) VALUES ('b')"))
    assert _ids(direct) == ["b"]
    engine.dispose()
    direct.dispose()


def test_commit_timeout_is_an_engine_argument_and_an_ini_option() -> None:
    assert sa.create_engine(URL).dialect.commit_timeout == DEFAULT_COMMIT_TIMEOUT  # type: ignore[attr-defined]
    assert sa.create_engine(URL, commit_timeout=None).dialect.commit_timeout is None  # type: ignore[attr-defined]
    ini = {"sqlalchemy.url": URL, "sqlalchemy.commit_timeout": "7.5"}
    assert sa.engine_from_config(ini).dialect.commit_timeout == 7.5  # type: ignore[attr-defined]
    for bad in (0, -1, "60", True):
        with pytest.raises(ProgrammingError, match="commit_timeout="):
            sa.create_engine(URL, commit_timeout=bad)


@pytest.mark.emulator
@pytest.mark.parametrize(
    "block",
    [
        pytest.param(False, id="last commit"),
        # the same commit timeout inside autocommit_block, waited for again (seconds); quick
        # loop: test_silent_server_at_a_migrations_commit_ends_in_time[last commit]
        pytest.param(True, id="autocommit_block", marks=pytest.mark.slow),
    ],
)
def test_silent_server_at_a_migrations_commit_ends_in_time(
    tmp_path: Path, spanner_emulator: Any, spanner_faults: Any, monkeypatch: Any, block: bool
) -> None:
    db = spanner_emulator.create_database()
    direct = spanner_emulator.engine(db)
    _events(direct)
    proj = Project(tmp_path, spanner_emulator.url(db))
    proj.cfg.set_main_option("sqlalchemy.commit_timeout", "3")  # as in alembic.ini
    monkeypatch.setenv("SPANNER_EMULATOR_HOST", spanner_faults.host)
    proj.cfg.attributes["target_metadata"] = None
    first = proj.hand_written("nothing", "pass")
    proj.upgrade()
    insert = "op.execute(\"INSERT OR UPDATE INTO Events (Id) VALUES ('x')\")"
    body = (
        f"{insert}\nwith op.get_context().autocommit_block():  # commits the insert\n    pass"
        if block
        else insert
    )
    second = proj.hand_written("data", body)
    spanner_faults.hang("Commit", 120, times=1000)
    start = time.monotonic()
    # the engine's commit deadline (alembic.ini) bounds the migration's own commit, and it
    # ends as one FAILED: line (a MigrationError), not a raw OperationalError
    with pytest.raises(MigrationError, match="whether it was applied is unknown"):
        proj.upgrade()
    assert time.monotonic() - start < 3 + 4
    spanner_faults.clear()
    with direct.connect() as conn:
        version = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar_one()
    assert version == first
    proj.upgrade()
    with direct.connect() as conn:
        version = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar_one()
    assert version == second and _ids(direct) == ["x"]
    direct.dispose()


def test_upstream_commit_still_takes_no_timeout() -> None:
    """Why the commit runs in a thread: neither the DB-API's commit nor the client's
    Transaction.commit takes a timeout or retry. Trips when upstream adds one: then pass
    it per call instead (sharded_orm.spanner.commits)."""
    import inspect

    from google.cloud.spanner_dbapi.connection import Connection
    from google.cloud.spanner_v1.transaction import Transaction

    assert list(inspect.signature(Connection.commit).parameters) == ["self"]
    params = inspect.signature(Transaction.commit).parameters
    assert "timeout" not in params and "retry" not in params
