"""Issue 42: a migration beside live writers waits for the database instead of failing.

A schema change refused because another schema change or a read-write transaction is in
progress is retried with backoff under the ``ddl_timeout``, each wait logged to
``alembic.sharded_orm``; past it, one error says what it waited for and what to do. An
aborted write of the version row is retried on its own, so the migration's work (a long
backfill) is not done again.

On the emulator (it refuses a schema change while any read-write transaction is open) a
thread holds one open; unit tests drive the classification and the backoff with a fake
admin API.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from alembic_project import Project
from google.api_core import exceptions as api
from hypothesis import given
from hypothesis import strategies as st

from alembic_ext.errors import MigrationError
from alembic_ext.impl import DDL_BATCH_ATTRIBUTE
from alembic_ext.schema_change import (
    BUSY_MESSAGES,
    BUSY_WAITS,
    DDL_TIMEOUT_ATTRIBUTE,
    SchemaChangeBusy,
    apply_ddl,
    is_busy_refusal,
)

BUSY = (
    "Schema change operation rejected because a concurrent schema change operation or "
    "read-write transaction is already in progress."
)
LOGGER = "alembic.sharded_orm"

# -- classification and backoff (no emulator)


@given(st.text(max_size=40), st.text(max_size=40))
def test_only_the_busy_refusal_is_retried(before: str, after: str) -> None:
    assert is_busy_refusal(api.FailedPrecondition(before + BUSY + after))
    assert is_busy_refusal(api.FailedPrecondition(BUSY.upper().replace(" ", "\n  ")))
    for other in (api.InvalidArgument, api.Aborted, api.PermissionDenied, api.NotFound):
        assert not is_busy_refusal(other(before + BUSY + after))
    assert not is_busy_refusal(RuntimeError(BUSY))
    if not any(m in (before + after).lower() for m in BUSY_MESSAGES):
        assert not is_busy_refusal(api.FailedPrecondition(before + after))
    assert not is_busy_refusal(api.FailedPrecondition("Duplicate name in schema: A."))


@given(st.integers(0, 2**32))
def test_busy_waits_grow_exponentially_with_jitter_and_are_capped(seed: int) -> None:
    """The waits between refusals: the library's one retry wait, [d/2, d] with d from
    0.5 s doubling up to 10 s."""
    rng = random.Random(seed)
    for n in range(40):
        ceiling = min(10.0, 0.5 * 2**n)
        assert ceiling / 2 <= BUSY_WAITS.delay(n, rng) <= ceiling


def test_busy_waits_are_jittered() -> None:
    delays = {BUSY_WAITS.delay(0, random.Random(s)) for s in range(20)}
    assert len(delays) == 20 and all(0.25 <= d <= 0.5 for d in delays)


class _BusyAdmin:
    """A fake admin API whose sends are refused as busy ``busy`` times (None: always),
    then accepted (the operation done at once), or refused with ``other``."""

    def __init__(self, busy: int | None, other: Exception | None = None) -> None:
        self.busy, self.other = busy, other
        self.sends: list[tuple[float, str]] = []

    def update_database_ddl(
        self, *, request: Any, metadata: Any, timeout: float, retry: Any
    ) -> Any:
        self.sends.append((time.monotonic(), request.operation_id))
        if self.other is not None:
            raise self.other
        if self.busy is None or len(self.sends) <= self.busy:
            raise api.FailedPrecondition(BUSY)
        error = SimpleNamespace(code=0, message="")
        return SimpleNamespace(operation=SimpleNamespace(done=True, error=error))

    def get_operation(self, **kw: Any) -> Any:  # pragma: no cover - done at the send
        raise AssertionError("not polled: the operation is done at once")


def _database(admin: Any) -> Any:
    return SimpleNamespace(
        name="projects/p/instances/i/databases/d",
        _instance=SimpleNamespace(_client=SimpleNamespace(database_admin_api=admin)),
    )


def test_busy_refusals_are_retried_with_backoff_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    admin = _BusyAdmin(busy=3)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        apply_ddl(_database(admin), ["CREATE INDEX A ON T (x)"], timeout=60, call_timeout=5)
    assert len(admin.sends) == 4
    gaps = [b[0] - a[0] for a, b in zip(admin.sends, admin.sends[1:], strict=False)]
    assert gaps[0] >= 0.25 and gaps[2] >= 1.0  # 0.5, 1, 2 s ceilings, jittered
    waits = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(waits) == 3
    assert "another schema change or a read-write transaction is in progress" in waits[0]
    assert "CREATE INDEX A ON T (x)" in waits[0] and "retry 1 in" in waits[0]


def test_a_database_busy_until_the_deadline_gives_one_clear_error() -> None:
    admin = _BusyAdmin(busy=None)
    start = time.monotonic()
    with pytest.raises(SchemaChangeBusy) as caught:
        apply_ddl(_database(admin), ["CREATE INDEX A ON T (x)"], timeout=2.0, call_timeout=5)
    assert 1.8 < time.monotonic() - start < 2.5
    message = str(caught.value)
    assert isinstance(caught.value, MigrationError)
    assert "was not applied: Spanner refused it" in message
    assert "another schema change or a read-write transaction was in progress" in message
    assert "Stop or pause the writers" in message and DDL_TIMEOUT_ATTRIBUTE in message
    assert "CREATE INDEX A ON T (x)" in message and "--instance=i --database=d" in message
    assert len(admin.sends) >= 3


@pytest.mark.parametrize(
    "other",
    [
        api.FailedPrecondition("Cannot add NOT NULL column T.x to existing table T."),
        api.InvalidArgument(BUSY),
    ],
)
def test_other_refusals_fail_at_once(other: Exception) -> None:
    admin = _BusyAdmin(busy=0, other=other)
    with pytest.raises(type(other)):
        apply_ddl(_database(admin), ["CREATE INDEX A ON T (x)"], timeout=60, call_timeout=5)
    assert len(admin.sends) == 1


class _FailingOperationAdmin(_BusyAdmin):
    """The send is accepted; the operation fails as busy ``busy`` times."""

    def update_database_ddl(
        self, *, request: Any, metadata: Any, timeout: float, retry: Any
    ) -> Any:
        self.sends.append((time.monotonic(), request.operation_id))
        code, message = (9, BUSY) if len(self.sends) <= (self.busy or 0) else (0, "")
        error = SimpleNamespace(code=code, message=message)
        return SimpleNamespace(operation=SimpleNamespace(done=True, error=error))


def test_an_operation_failed_as_busy_is_sent_again_under_a_new_id() -> None:
    admin = _FailingOperationAdmin(busy=2)
    apply_ddl(_database(admin), ["CREATE INDEX A ON T (x)"], timeout=60, call_timeout=5)
    assert len({op_id for _, op_id in admin.sends}) == 3


# -- on the emulator


class _Holder:
    """A thread holding a read-write transaction (a row inserted) open until released
    or ``seconds`` pass, as the app's writer does between its statements and commit."""

    def __init__(self, database: Any, seconds: float) -> None:
        self.database, self.seconds = database, seconds
        self.holding, self.release = threading.Event(), threading.Event()
        self.outcome: list[str] = []
        self.ended = float("inf")
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()
        assert self.holding.wait(30), self.outcome

    def _run(self) -> None:
        try:
            session = self.database.session()
            session.create()
            txn = session.transaction()
            txn.begin()
            txn.execute_update("INSERT INTO Events (Id, Kind) VALUES ('held', 'k')")
            self.holding.set()
            self.release.wait(self.seconds)
            txn.commit()
            self.outcome.append("committed")
            session.delete()
        except api.Aborted:
            self.outcome.append("aborted")
        except Exception as exc:
            self.outcome.append(repr(exc))
            self.holding.set()
        finally:
            self.ended = time.monotonic()

    def stop(self) -> None:
        self.release.set()
        self.thread.join(30)


def _project(tmp_path: Path, emulator: Any) -> tuple[Project, Any, str]:
    """Revision 1 (table Events) applied; revision 2, not run, starts the holder (the
    config attribute ``hold``) and then creates an index."""
    db = emulator.create_database()
    proj = Project(tmp_path, emulator.url(db))
    proj.cfg.attributes["target_metadata"] = None
    proj.hand_written("table", """
        op.create_table("Events", sa.Column("Id", sa.String(36), primary_key=True),
                        sa.Column("Kind", sa.String(20)))
    """)  # fmt: skip
    proj.upgrade()
    second = proj.hand_written("index", """
        from alembic import context
        op.get_context().impl.end_transaction()  # the reads so far committed: no abort
        context.config.attributes["hold"]()
        op.create_index("EventsByKind", "Events", ["Kind"])
    """)  # fmt: skip
    return proj, emulator.database(db), second


def _state(database: Any) -> tuple[list[str], list[str]]:
    with database.snapshot(multi_use=True) as snap:
        versions = [r[0] for r in snap.execute_sql("SELECT version_num FROM alembic_version")]
        indexes = [
            r[0]
            for r in snap.execute_sql(
                "SELECT INDEX_NAME FROM INFORMATION_SCHEMA.INDEXES WHERE TABLE_NAME = 'Events'"
                " AND INDEX_TYPE = 'INDEX'"
            )
        ]
    return versions, indexes


@pytest.mark.emulator
def test_schema_change_waits_for_an_open_transaction_then_applies(
    tmp_path: Path, spanner_emulator: Any, caplog: pytest.LogCaptureFixture
) -> None:
    proj, database, second = _project(tmp_path, spanner_emulator)
    holder = _Holder(database, seconds=3.0)
    proj.cfg.attributes["hold"] = holder.start
    applied: list[float] = []
    proj.cfg.attributes[DDL_BATCH_ATTRIBUTE] = lambda statements: applied.append(time.monotonic())
    try:
        with caplog.at_level(logging.INFO, logger=LOGGER):
            proj.upgrade()
    finally:
        holder.stop()
    # Two outcomes, both seen on the emulator: it refuses the schema change while the
    # holder's transaction is open (the migration waits, logs each wait, and applies it
    # once the transaction ends), or it applies the change at once and aborts the open
    # transaction at its commit (a real writer retries). Never an error, never silent.
    assert holder.outcome and holder.outcome[0] in ("committed", "aborted"), holder.outcome
    assert len(applied) == 1
    waits = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    if holder.outcome == ["committed"]:
        assert applied[0] >= holder.ended
    if waits or holder.outcome == ["committed"]:
        assert waits and all("schema change waiting" in w for w in waits), holder.outcome
        assert "read-write transaction is in progress" in waits[0]
        assert "CREATE INDEX IF NOT EXISTS `EventsByKind`" in waits[0]
    else:  # applied at once: the emulator aborted the holder, ending it after the change
        assert holder.outcome == ["aborted"] and holder.ended >= applied[0]
    assert _state(database) == ([second], ["EventsByKind"])


# a migration refused until its DDL timeout, waited for (seconds) then rerun; quick loop:
# test_a_database_busy_until_the_deadline_gives_one_clear_error (the same wait and error),
# test_schema_change_waits_for_an_open_transaction_then_applies (the wait on the emulator)
@pytest.mark.slow
@pytest.mark.emulator
def test_a_database_busy_past_the_deadline_gives_one_clear_error(
    tmp_path: Path, spanner_emulator: Any, spanner_faults: Any, monkeypatch: Any
) -> None:
    """A writer that never lets go (on the emulator a refused schema change aborts the
    open transaction, so the proxy answers every send as Spanner does while busy)."""
    proj, database, second = _project(tmp_path, spanner_emulator)
    proj.cfg.attributes["hold"] = lambda: None
    monkeypatch.setenv("SPANNER_EMULATOR_HOST", spanner_faults.host)  # env.py's engine
    spanner_faults.fail("UpdateDatabaseDdl", "FAILED_PRECONDITION", times=1000, message=BUSY)
    start = time.monotonic()
    with pytest.raises(SchemaChangeBusy) as caught:
        proj.upgrade(**{DDL_TIMEOUT_ATTRIBUTE: 3})
    took = time.monotonic() - start
    assert 2.5 < took < 3 + 3, took
    message = str(caught.value)
    assert "The schema change of this migration was not applied" in message
    assert "read-write transaction was in progress" in message
    assert f"config.attributes[{DDL_TIMEOUT_ATTRIBUTE!r}]" in message
    assert spanner_faults.count("UpdateDatabaseDdl") >= 3
    versions, indexes = _state(database)
    assert second not in versions and indexes == []
    spanner_faults.clear()  # the writer stopped: the rerun applies it
    proj.upgrade()
    assert _state(database) == ([second], ["EventsByKind"])


@pytest.mark.emulator
def test_the_first_command_on_a_busy_database_waits_to_create_alembic_version(
    tmp_path: Path,
    spanner_emulator: Any,
    spanner_faults: Any,
    monkeypatch: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Alembic creates ``alembic_version`` through the connection, so the DB-API sent its
    CREATE TABLE at its own commit, outside the impl's wait: the first command on a new
    database failed whenever the app was writing (a raw FailedPrecondition). It is now
    created by the impl before the migrations run, where a busy database is waited for."""
    db = spanner_emulator.create_database()
    proj = Project(tmp_path, spanner_emulator.url(db))
    proj.cfg.attributes["target_metadata"] = None
    first = proj.hand_written("table", """
        op.create_table("Events", sa.Column("Id", sa.String(36), primary_key=True))
    """)  # fmt: skip
    monkeypatch.setenv("SPANNER_EMULATOR_HOST", spanner_faults.host)  # env.py's engine
    spanner_faults.fail("UpdateDatabaseDdl", "FAILED_PRECONDITION", times=2, message=BUSY)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        proj.upgrade()
    waits = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any("schema change waiting" in w and "alembic_version" in w for w in waits), waits
    with spanner_emulator.database(db).snapshot() as snap:
        versions = [r[0] for r in snap.execute_sql("SELECT version_num FROM alembic_version")]
    assert versions == [first]
