"""A migration's schema change ends within its limits: the impl's ``UpdateDatabaseDdl``
and the polls of its long-running operation each carry a timeout (the client's
``update_ddl().result()`` waited for hours on a silent server).

On the emulator through the fault proxy: silent at the send, a lost reply (the re-sent
request, with the same ``operation_id``, finds the first), silent while polling. With a
fake admin API: an operation still running at the ``ddl_timeout``, and one that fails.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from alembic_project import Project
from google.api_core import exceptions as api

from alembic_ext.errors import MigrationError
from alembic_ext.schema_change import (
    DDL_CALL_TIMEOUT_ATTRIBUTE,
    DDL_TIMEOUT_ATTRIBUTE,
    SchemaChangeTimeout,
    apply_ddl,
    ddl_timeouts,
)


def _project(tmp_path: Path, emulator: Any, proxy: Any, monkeypatch: Any) -> tuple[Any, str, str]:
    """A project at revision 1 (table Events); revision 2, not run, creates an index."""
    db = emulator.create_database()
    proj = Project(tmp_path, emulator.url(db))
    monkeypatch.setenv("SPANNER_EMULATOR_HOST", proxy.host)  # env.py's engine: the proxy
    proj.cfg.attributes["target_metadata"] = None
    first = proj.hand_written("table", """
        op.create_table("Events", sa.Column("Id", sa.String(36), primary_key=True),
                        sa.Column("Kind", sa.String(20)))
    """)  # fmt: skip
    proj.upgrade()
    second = proj.hand_written("index", 'op.create_index("EventsByKind", "Events", ["Kind"])')
    return proj, first, second


def _state(emulator: Any, proj: Any) -> tuple[str, list[str]]:
    database = emulator.database(proj.cfg.get_main_option("sqlalchemy.url").rsplit("/", 1)[1])
    with database.snapshot() as snap:
        version = [r[0] for r in snap.execute_sql("SELECT version_num FROM alembic_version")]
    with database.snapshot() as snap:
        indexes = [
            r[0]
            for r in snap.execute_sql(
                "SELECT INDEX_NAME FROM INFORMATION_SCHEMA.INDEXES WHERE TABLE_NAME = 'Events'"
                " AND INDEX_TYPE = 'INDEX'"
            )
        ]
    return version[0], indexes


@pytest.mark.emulator
def test_silent_server_at_the_send_ends_within_the_call_timeout(
    tmp_path: Path, spanner_emulator: Any, spanner_faults: Any, monkeypatch: Any
) -> None:
    proj, first, second = _project(tmp_path, spanner_emulator, spanner_faults, monkeypatch)
    spanner_faults.hang("UpdateDatabaseDdl", 120, times=1000)
    start = time.monotonic()
    with pytest.raises(SchemaChangeTimeout) as caught:
        proj.upgrade(**{DDL_CALL_TIMEOUT_ATTRIBUTE: 2})
    took = time.monotonic() - start
    assert took < 2 + 4, took
    message = str(caught.value)
    assert "did not answer for 2 s (the ddl_call_timeout) when it was sent" in message
    assert "CREATE INDEX IF NOT EXISTS `EventsByKind` ON `Events` (`Kind`)" in message
    assert "Spanner may still apply it" in message and "gcloud spanner operations" in message
    assert "run `alembic upgrade` again: this revision is not recorded" in message
    assert spanner_faults.count("UpdateDatabaseDdl", "hung") >= 1
    assert _state(spanner_emulator, proj) == (first, [])
    spanner_faults.clear()
    proj.upgrade()
    assert _state(spanner_emulator, proj) == (second, ["EventsByKind"])


@pytest.mark.emulator
def test_lost_reply_of_the_send_finds_the_operation_by_its_id(
    tmp_path: Path, spanner_emulator: Any, spanner_faults: Any, monkeypatch: Any
) -> None:
    """Spanner applied the batch, its reply was lost: the re-sent request (same
    operation_id) is refused as ALREADY_EXISTS and the first operation is polled: one
    schema change, and the upgrade succeeds."""
    proj, _, second = _project(tmp_path, spanner_emulator, spanner_faults, monkeypatch)
    spanner_faults.lose_reply("UpdateDatabaseDdl")
    proj.upgrade(**{DDL_CALL_TIMEOUT_ATTRIBUTE: 10})
    assert spanner_faults.count("UpdateDatabaseDdl", "reply lost") == 1
    assert spanner_faults.count("UpdateDatabaseDdl", "upstream ALREADY_EXISTS") == 1
    assert spanner_faults.count("GetOperation", "passed") >= 1
    assert _state(spanner_emulator, proj) == (second, ["EventsByKind"])


@pytest.mark.emulator
def test_silent_server_while_polling_ends_within_the_call_timeout(
    tmp_path: Path, spanner_emulator: Any, spanner_faults: Any, monkeypatch: Any
) -> None:
    proj, first, second = _project(tmp_path, spanner_emulator, spanner_faults, monkeypatch)
    spanner_faults.lose_reply("UpdateDatabaseDdl")
    spanner_faults.hang("GetOperation", 120, times=1000)
    start = time.monotonic()
    with pytest.raises(SchemaChangeTimeout, match="did not answer for 2 s .* while it ran"):
        proj.upgrade(**{DDL_CALL_TIMEOUT_ATTRIBUTE: 2})
    assert time.monotonic() - start < 2 + 4
    # Spanner applied the index; the revision is not recorded, and its re-run skips it
    assert _state(spanner_emulator, proj) == (first, ["EventsByKind"])
    spanner_faults.clear()
    proj.upgrade()
    assert _state(spanner_emulator, proj) == (second, ["EventsByKind"])


class _Admin:
    """A fake admin API: the send answers at once; the operation is done after ``polls``
    polls (never when None), with ``error`` (a google.rpc code, message) if given."""

    def __init__(self, polls: int | None, error: tuple[int, str] | None = None) -> None:
        self.polls, self.error, self.seen = polls, error, 0
        self.timeouts: list[float] = []

    def _op(self, done: bool) -> Any:
        code, message = self.error if done and self.error else (0, "")
        return SimpleNamespace(done=done, error=SimpleNamespace(code=code, message=message))

    def update_database_ddl(
        self, *, request: Any, metadata: Any, timeout: float, retry: Any
    ) -> Any:
        self.timeouts.append(timeout)
        return SimpleNamespace(operation=self._op(False))

    def get_operation(self, *, request: Any, metadata: Any, timeout: float, retry: Any) -> Any:
        self.timeouts.append(timeout)
        self.seen += 1
        return self._op(self.polls is not None and self.seen >= self.polls)


def _database(admin: _Admin) -> Any:
    client = SimpleNamespace(database_admin_api=admin)
    return SimpleNamespace(
        name="projects/p/instances/i/databases/d",
        _instance=SimpleNamespace(_client=client),
    )


def test_an_operation_still_running_at_the_ddl_timeout_ends_the_wait() -> None:
    admin = _Admin(polls=None)
    start = time.monotonic()
    with pytest.raises(SchemaChangeTimeout) as caught:
        apply_ddl(_database(admin), ["CREATE INDEX A ON T (x)"], timeout=1.0, call_timeout=60)
    assert time.monotonic() - start < 1.5
    message = str(caught.value)
    assert "not done within 1 s (the ddl_timeout)" in message
    assert "--instance=i --database=d" in message and "CREATE INDEX A ON T (x)" in message
    assert admin.seen >= 2 and all(t <= 1.0 for t in admin.timeouts)


def test_an_operation_that_fails_raises_its_error() -> None:
    admin = _Admin(polls=2, error=(9, "Duplicate name in schema: A."))
    with pytest.raises(api.FailedPrecondition, match="Duplicate name in schema"):
        apply_ddl(_database(admin), ["CREATE INDEX A ON T (x)"], timeout=30, call_timeout=5)
    assert admin.seen == 2


@pytest.mark.parametrize("value", [0, -1, "60", True, None, float("nan")])
def test_limits_must_be_positive_seconds(value: Any) -> None:
    with pytest.raises(MigrationError, match="must be a positive number of seconds"):
        ddl_timeouts({DDL_TIMEOUT_ATTRIBUTE: value})
    assert ddl_timeouts({}) == {"timeout": 6 * 3600.0, "call_timeout": 60.0}


def test_upstream_update_ddl_still_takes_no_timeout() -> None:
    """Why the impl sends through the admin API: ``Database.update_ddl`` takes no
    timeout. Trips when upstream adds one (then pass it there)."""
    import inspect

    from google.cloud.spanner_v1.database import Database

    params = inspect.signature(Database.update_ddl).parameters
    assert "timeout" not in params and "retry" not in params
