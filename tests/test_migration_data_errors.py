"""Issue 42: a migration's data statement (``op.execute``, ``op.get_bind().execute``,
``op.bulk_insert``) whose transaction Spanner aborted, the Spanner DB-API's retries spent,
fails as one ``FAILED:`` line (a :class:`MigrationError` chained to the original) saying
what failed, what was applied and what to do, not as a raw traceback; any other error
keeps its own type and message.

On the emulator through the fault proxy (``fail("ExecuteStreamingSql", "ABORTED")``
armed by the migration itself, so Alembic's own reads pass), and on SQLite, where a
``before_cursor_execute`` listener raises the errors the Spanner DB-API gives up with.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.config import CommandLine
from alembic_project import Project
from hypothesis import given, settings
from hypothesis import strategies as st

from alembic_ext.data_errors import report_aborted_statements
from alembic_ext.errors import MigrationError

#: what the migrations under test call (the CLI makes its own Config: a module is shared)
HOOKS: dict[str, Any] = {}

_SEED = """
    op.create_table("DataErrEvents", sa.Column("Id", sa.String(36), primary_key=True),
                    sa.Column("Kind", sa.String(20)))
    op.execute("INSERT INTO DataErrEvents (Id, Kind) VALUES ('e1', 'old')")
"""


def _kinds(database: Any) -> list[list[Any]]:
    with database.snapshot() as snap:
        return [list(r) for r in snap.execute_sql("SELECT Id, Kind FROM DataErrEvents ORDER BY Id")]


def _versions(database: Any) -> list[str]:
    with database.snapshot() as snap:
        return [r[0] for r in snap.execute_sql("SELECT version_num FROM alembic_version")]


def _project(tmp_path: Path, emulator: Any, work: str, *, autocommit: bool = False,
             cli: bool = False) -> tuple[Project, Any, str, str]:  # fmt: skip
    """Revision 1 (table DataErrEvents, one row) applied; revision 2 (``work``, not run) arms the
    proxy through ``HOOKS["arm"]`` first."""
    db = emulator.create_database()
    proj = Project(tmp_path, emulator.url(db))
    env = tmp_path / "migrations" / "env.py"
    text = env.read_text()
    if autocommit:  # sqlalchemy-spanner's env.py recipe
        text = text.replace(
            "poolclass=pool.NullPool,", 'poolclass=pool.NullPool, isolation_level="AUTOCOMMIT",'
        )
        assert "AUTOCOMMIT" in text
    if cli:
        text = text.replace(
            "if config.config_file_name is not None:", "if False:  # tests: loggers kept"
        ).replace(
            "target_metadata = config.attributes['target_metadata']", "target_metadata = None"
        )
        ini = tmp_path / "alembic.ini"
        ini.write_text(
            ini.read_text().replace(
                "sqlalchemy.url = driver://user:pass@localhost/dbname",
                f"sqlalchemy.url = {emulator.url(db)}",
            )
        )
    env.write_text(text)
    proj.cfg.attributes["target_metadata"] = None
    first = proj.hand_written("table", _SEED)
    proj.upgrade()
    arm = "import test_migration_data_errors as t\nt.HOOKS['arm']()\nTIMEOUT = {'timeout': 3}\n"
    second = proj.hand_written("work", arm + work)
    return proj, emulator.database(db), first, second


def _arm(faults: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        HOOKS, "arm", lambda: faults.fail("ExecuteStreamingSql", "ABORTED", times=100_000)
    )


_UPDATE = (
    "op.execute(\"UPDATE DataErrEvents SET Kind = 'new' WHERE TRUE\", execution_options=TIMEOUT)"
)


@pytest.mark.emulator
def test_an_aborted_op_execute_is_one_failed_line_from_the_cli(
    tmp_path: Path, spanner_emulator: Any, spanner_faults: Any,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``alembic upgrade head``: exit status not 0, one ``FAILED:`` line naming the
    statement, what was applied and what to do; no traceback; nothing applied."""
    proj, database, first, _ = _project(tmp_path, spanner_emulator, _UPDATE, cli=True)
    monkeypatch.setenv("SPANNER_EMULATOR_HOST", spanner_faults.host)
    _arm(spanner_faults, monkeypatch)
    capsys.readouterr()
    start = time.monotonic()
    with pytest.raises(SystemExit) as exited:
        CommandLine(prog="alembic").main(["-c", str(tmp_path / "alembic.ini"), "upgrade", "head"])
    assert time.monotonic() - start < 30
    assert exited.value.code not in (0, None)
    out = capsys.readouterr()
    both = out.out + out.err
    assert "Traceback" not in both
    failed = [ln for ln in both.splitlines() if ln.startswith("FAILED:")]
    assert len(failed) == 1, both
    line = failed[0]
    statement = "`UPDATE DataErrEvents SET Kind = 'new' WHERE TRUE`"
    assert line.startswith(f"FAILED: The migration's statement {statement} was aborted"), line
    assert "Nothing of its transaction was applied" in line
    assert "The revision is not recorded" in line
    assert "`alembic current`" in line and "`alembic upgrade` again" in line
    assert spanner_faults.count("ExecuteStreamingSql") >= 2  # the DB-API did retry
    spanner_faults.clear()
    assert _versions(database) == [first]
    assert _kinds(database) == [["e1", "old"]]


@pytest.mark.emulator
@pytest.mark.parametrize(
    ("autocommit", "work", "applied"),
    [
        (False, _UPDATE, "Nothing of its transaction was applied"),
        (
            True,
            "op.get_bind().execute(sa.text(\"UPDATE DataErrEvents SET Kind = 'new' WHERE TRUE\"),"
            " execution_options=TIMEOUT)",
            "It was not applied; the migration's statements before it were",
        ),
    ],
    ids=["transaction", "autocommit"],
)
def test_an_aborted_data_statement_is_a_migration_error_chained_to_the_abort(
    tmp_path: Path, spanner_emulator: Any, spanner_faults: Any,
    monkeypatch: pytest.MonkeyPatch, autocommit: bool, work: str, applied: str,
) -> None:  # fmt: skip
    proj, database, first, _ = _project(tmp_path, spanner_emulator, work, autocommit=autocommit)
    monkeypatch.setenv("SPANNER_EMULATOR_HOST", spanner_faults.host)
    _arm(spanner_faults, monkeypatch)
    with pytest.raises(MigrationError) as caught:
        proj.upgrade()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("The migration's statement `UPDATE DataErrEvents SET Kind = 'new'")
    assert "was aborted by Spanner" in message and applied in message
    cause = caught.value.__cause__
    assert cause is not None and not isinstance(cause, MigrationError)
    assert "abort" in str(cause).lower() or "injected by FaultProxy" in str(cause)
    spanner_faults.clear()
    assert _versions(database) == [first]
    assert _kinds(database) == [["e1", "old"]]


@pytest.mark.emulator
@pytest.mark.slow
def test_an_aborted_bulk_insert_in_autocommit_is_a_migration_error(
    tmp_path: Path, spanner_emulator: Any, spanner_faults: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """op.bulk_insert (a batch of DML) in AUTOCOMMIT: the client's run_in_transaction
    gives up with a raw Aborted after its own retries (about 30 s)."""
    work = """
t = sa.table("DataErrEvents", sa.column("Id", sa.String), sa.column("Kind", sa.String))
op.bulk_insert(t, [{"Id": "e2", "Kind": "b"}, {"Id": "e3", "Kind": "b"}])
"""
    proj, database, first, _ = _project(tmp_path, spanner_emulator, work, autocommit=True)
    monkeypatch.setenv("SPANNER_EMULATOR_HOST", spanner_faults.host)
    monkeypatch.setitem(
        HOOKS, "arm", lambda: spanner_faults.fail("ExecuteBatchDml", "ABORTED", times=100_000)
    )
    with pytest.raises(MigrationError) as caught:
        proj.upgrade()
    message = str(caught.value)
    assert message.startswith("The migration's statement `INSERT INTO")
    assert "It was not applied" in message and "`alembic current`" in message
    spanner_faults.clear()
    assert _versions(database) == [first]
    assert _kinds(database) == [["e1", "old"]]


@pytest.mark.emulator
def test_a_syntax_error_keeps_its_own_message(
    tmp_path: Path, spanner_emulator: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setitem(HOOKS, "arm", lambda: None)
    proj, database, first, _ = _project(
        tmp_path, spanner_emulator, 'op.execute("UPDATE DataErrEvents SET WHERE TRUE")'
    )
    with pytest.raises(sa.exc.DBAPIError) as caught:
        proj.upgrade()
    assert not isinstance(caught.value, MigrationError)
    assert "syntax error" in str(caught.value).lower()
    assert "was aborted" not in str(caught.value)
    assert _versions(database) == [first]


# -- SQLite: the listener itself, on errors a public hook raises where the driver would


def _google() -> tuple[Any, Any]:
    """google.api_core's exceptions and the Spanner DB-API's (untyped packages)."""
    from google.api_core import exceptions as api
    from google.cloud.spanner_dbapi import exceptions as dbapi

    return api, dbapi


def _aborted(kind: str) -> BaseException:
    api, dbapi = _google()
    error: BaseException
    if kind == "Aborted":
        error = api.Aborted("Transaction 5257 aborted due to active transaction 5256")
    if kind == "RetryAborted":
        error = dbapi.RetryAborted(
            "The transaction was aborted and could not be retried due to a concurrent modification."
        )
    else:
        error = dbapi.OperationalError("injected")  # the library's dialect: from an Aborted
        error.__cause__ = api.Aborted("injected")
    return error


def _raising(conn: sa.Connection, error: BaseException) -> None:
    """``error`` raised where the driver runs ``conn``'s statements (the dialect's
    ``do_execute``: inside SQLAlchemy's error handling on 2.0 and 2.1 alike, as a driver's
    own error is; a ``before_cursor_execute`` raise skips it on 2.0)."""

    def run(cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
        if context.root_connection is conn:
            raise error
        return False  # another connection's: the next listener's, or the driver's

    sa.event.listen(conn.engine, "do_execute", run)


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(["Aborted", "RetryAborted", "OperationalError"]),
    statement=st.text(max_size=400),
)
def test_sqlite_an_aborted_statement_is_one_line_chained(kind: str, statement: str) -> None:
    engine = sa.create_engine("sqlite://")
    with engine.connect() as conn:
        report_aborted_statements(conn)
        error = _aborted(kind)
        _raising(conn, error)
        with pytest.raises(MigrationError) as caught:
            conn.exec_driver_sql("SELECT 1 -- " + statement.replace("\x00", ""))
    message = str(caught.value)
    assert len(message.splitlines()) == 1
    assert len(message) < 1500
    assert message.startswith("The migration's statement `SELECT 1 --")
    assert "was aborted by Spanner" in message and "`alembic current`" in message
    assert caught.value.__cause__ is error


def test_sqlite_other_errors_and_other_connections_are_left_alone() -> None:
    api, _ = _google()

    engine = sa.create_engine("sqlite://")
    with engine.connect() as migrating, engine.connect() as other:
        report_aborted_statements(migrating)
        with pytest.raises(sa.exc.OperationalError, match="no such table: Nope"):
            migrating.exec_driver_sql("UPDATE Nope SET a = 1")
        _raising(other, api.Aborted("aborted elsewhere"))  # not a migration's connection
        with pytest.raises(api.Aborted):
            other.exec_driver_sql("SELECT 1")
        # a permanent error that quotes abort text in its message is still itself
        quoting = api.InvalidArgument("Syntax error near 'transaction was aborted'")
        _raising(migrating, quoting)
        with pytest.raises(api.InvalidArgument) as caught:
            migrating.exec_driver_sql("SELECT 'transaction was aborted'")
        assert caught.value is quoting
        assert not re.search("alembic current", str(caught.value))
