"""The pytest plugin we ship: emulator fixtures, skip/fail rules, the mock server."""

from __future__ import annotations

import base64
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from sharded_orm.testing import emulator as emu
from sharded_orm.testing.plugin import emulator_required

pytest_plugins = ["pytester"]

USES_EMULATOR = """
def test_uses_emulator(spanner_engine):
    pass
"""


def _executable(path: Path, body: str = "exit 0") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# --- finding the binary ------------------------------------------------------------------


@pytest.fixture
def empty_lookup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No env override, an empty PATH and no SDK location: nothing can be found."""
    monkeypatch.delenv(emu.BINARY_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    monkeypatch.setattr(emu, "SDK_LOCATIONS", (str(tmp_path / "sdk" / "emulator_main"),))
    return tmp_path


def test_lookup_finds_nothing_and_says_where_it_looked(empty_lookup: Path) -> None:
    with pytest.raises(emu.EmulatorNotFound) as exc:
        emu.find_binary()
    message = str(exc.value)
    assert "emulator_main on PATH" in message
    assert str(empty_lookup / "sdk" / "emulator_main") in message
    assert emu.BINARY_ENV in message and "SPANNER_EMULATOR_HOST" in message


def test_lookup_order_env_then_path_then_gcloud_sdk(
    empty_lookup: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gcloud is a symlink into an SDK: the emulator is found beside the symlink's target
    sdk_bin = empty_lookup / "google-cloud-sdk" / "bin"
    in_sdk = _executable(sdk_bin / "cloud_spanner_emulator" / "emulator_main")
    _executable(sdk_bin / "gcloud")
    path_dir = empty_lookup / "path-bin"
    path_dir.mkdir()
    (path_dir / "gcloud").symlink_to(sdk_bin / "gcloud")
    monkeypatch.setenv("PATH", str(path_dir))
    assert emu.find_binary() == str(in_sdk)

    on_path = _executable(path_dir / "emulator_main")
    assert emu.find_binary() == str(on_path)

    explicit = _executable(empty_lookup / "pinned" / "emulator_main")
    monkeypatch.setenv(emu.BINARY_ENV, str(explicit))
    assert emu.find_binary() == str(explicit)


def test_env_override_is_the_only_place_looked_at(
    empty_lookup: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path_dir = empty_lookup / "path-bin"
    _executable(path_dir / "emulator_main")
    monkeypatch.setenv("PATH", str(path_dir))
    monkeypatch.setenv(emu.BINARY_ENV, "/nonexistent/emulator_main")
    with pytest.raises(emu.EmulatorNotFound, match="/nonexistent/emulator_main is not an exec"):
        emu.find_binary()


def test_binary_that_dies_reports_its_output(tmp_path: Path) -> None:
    broken = _executable(tmp_path / "emulator_main", 'echo "unknown flag --host_port" >&2; exit 3')
    with pytest.raises(emu.EmulatorFailed, match="exited with code 3: unknown flag --host_port"):
        emu.start(str(broken))


def test_unreachable_emulator_host_is_a_clear_error() -> None:
    with socket.socket() as s:  # a port nobody listens on (bound, never listening)
        s.bind(("127.0.0.1", 0))
        host = f"127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(emu.EmulatorFailed, match="nothing accepts connections there"):
            emu.check_reachable(host)


# --- skip or fail where no emulator exists -----------------------------------------------


@pytest.fixture
def no_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child pytest that can find no emulator: no host, a binary path that doesn't exist."""
    monkeypatch.delenv("SPANNER_EMULATOR_HOST", raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("SHARDED_ORM_EMULATOR_BIN", "/nonexistent/emulator_main")


def test_missing_emulator_skips_with_reason(pytester: pytest.Pytester, no_emulator: None) -> None:
    pytester.makepyfile(USES_EMULATOR)
    result = pytester.runpytest_inprocess("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [
            "sharded-orm: emulator tests: 0 passed, 0 failed, 0 errors, 1 skipped",
            "*SKIPPED*no Cloud Spanner emulator*/nonexistent/emulator_main is not an exec*",
        ]
    )


# 3 pytest subprocesses; quick loop: test_missing_emulator_skips_with_reason,
# test_unreachable_emulator_host_errors_instead_of_skipping
@pytest.mark.slow
@pytest.mark.parametrize("how", ["CI=true", "CI=1", "--require-emulator"])
def test_missing_emulator_fails_when_required(
    pytester: pytest.Pytester, no_emulator: None, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    pytester.makepyfile(USES_EMULATOR)
    args = ["-p", "no:cacheprovider"]
    if how.startswith("CI="):
        monkeypatch.setenv("CI", how[3:])
    else:
        args.append(how)
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [f"*the Spanner emulator is required here ({how}*): no Cloud Spanner emulator*"]
    )


def test_ci_false_still_skips(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    config = pytester.parseconfig()
    for value in ("", "false", "0", "no"):
        monkeypatch.setenv("CI", value)
        assert emulator_required(config) is None
    monkeypatch.setenv("CI", "Yes")
    assert emulator_required(config) == "CI=Yes is set"


def test_unreachable_emulator_host_errors_instead_of_skipping(
    pytester: pytest.Pytester, no_emulator: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(USES_EMULATOR)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("SPANNER_EMULATOR_HOST", f"127.0.0.1:{s.getsockname()[1]}")
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*could not be used*nothing accepts connections there*"])


def test_emulator_tests_are_marked(pytester: pytest.Pytester, no_emulator: None) -> None:
    pytester.makepyfile(
        USES_EMULATOR
        + "\ndef test_session(spanner_emulator):\n    pass\n"
        + "\ndef test_plain():\n    pass\n"
    )
    result = pytester.runpytest_inprocess("-m", "not emulator", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, deselected=2)


def test_plugin_import_does_not_load_the_spanner_client() -> None:
    code = (
        "import sys, sharded_orm.testing.plugin\n"
        "bad = [m for m in sys.modules if m.startswith(('google.cloud.spanner', 'grpc'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- the emulator ------------------------------------------------------------------------


def test_engine_is_a_fresh_database_that_works(spanner_engine: sa.Engine) -> None:
    assert sa.inspect(spanner_engine).get_table_names() == []
    md = sa.MetaData()
    t = sa.Table(
        "t",
        md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("v", sa.String(10)),
    )
    md.create_all(spanner_engine)
    with spanner_engine.begin() as conn:
        conn.execute(t.insert(), [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
    with spanner_engine.connect() as conn:
        assert conn.execute(sa.select(t.c.v).order_by(t.c.id)).scalars().all() == ["a", "b"]


def test_each_spanner_engine_gets_its_own_database(
    pytester: pytest.Pytester, spanner_emulator: Any
) -> None:
    """Two tests create the same table: the second would fail on a shared database."""
    pytester.makepyfile(
        """
        import sqlalchemy as sa

        SEEN = set()

        def _create_t(engine):
            assert sa.inspect(engine).get_table_names() == []
            t = sa.Table("t", sa.MetaData(), sa.Column("id", sa.BigInteger, primary_key=True))
            t.create(engine)
            SEEN.add(engine.url.database)

        def test_one(spanner_engine):
            _create_t(spanner_engine)

        def test_two(spanner_engine):
            _create_t(spanner_engine)
            assert len(SEEN) == 2
        """
    )
    # in-process: the child session reuses this session's emulator via SPANNER_EMULATOR_HOST
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["sharded-orm: emulator tests: 2 passed, 0 failed, 0 errors, 0 skipped (emulator at*"]
    )
    assert os.environ["SPANNER_EMULATOR_HOST"] == spanner_emulator.host


def test_create_database_with_ddl_and_the_client_objects(spanner_emulator: Any) -> None:
    ddl = ["CREATE TABLE kv (k STRING(10) NOT NULL, v INT64) PRIMARY KEY (k)"]
    first, second = spanner_emulator.create_database(ddl), spanner_emulator.create_database()
    assert first != second
    database = spanner_emulator.database(first)
    with database.batch() as batch:
        batch.insert("kv", columns=("k", "v"), values=[("a", 1), ("b", 2)])
    with database.snapshot() as snap:
        assert sorted(snap.execute_sql("SELECT k, v FROM kv")) == [["a", 1], ["b", 2]]
    assert spanner_emulator.url(first) == (
        f"spanner+spanner:///projects/{spanner_emulator.project}"
        f"/instances/{spanner_emulator.instance_id}/databases/{first}"
    )
    other = spanner_emulator.engine(second)
    try:
        assert sa.inspect(other).get_table_names() == []
    finally:
        other.dispose()


@pytest.fixture
def emulator_binary(request: pytest.FixtureRequest) -> str:
    try:
        return emu.find_binary()
    except emu.EmulatorNotFound as exc:
        if emulator_required(request.config):
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@pytest.mark.emulator
def test_local_emulator_sets_host_then_stops_by_pid_and_restores_env(
    emulator_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPANNER_EMULATOR_HOST", raising=False)
    with emu.local_emulator() as running:
        assert running.pid is not None
        assert os.environ["SPANNER_EMULATOR_HOST"] == running.host
        assert running.host.startswith("127.0.0.1:")
        pid = running.pid
        os.kill(pid, 0)  # alive
    assert "SPANNER_EMULATOR_HOST" not in os.environ
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_emulator_engine_still_reaches_the_emulator_beside_the_mock(
    spanner_engine: sa.Engine, mock_spanner: Any
) -> None:
    assert "SPANNER_EMULATOR_HOST" not in os.environ  # hidden by mock_spanner
    with spanner_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT 41 + 1")).scalar() == 42
    assert mock_spanner.executed_sql() == []


# --- the mock server ---------------------------------------------------------------------

T = sa.table("unsharded_t", sa.column("c"), sa.column("id"))


def test_mock_server_answers_a_select_and_records_its_sql(mock_spanner: Any) -> None:
    engine = mock_spanner.engine()
    stmt = sa.select(T.c.c).where(T.c.id == 3)
    mock_spanner.add_result(str(stmt.compile(engine)), [("c", "INT64")], [[7], [None]])
    with engine.connect() as conn:
        assert conn.execute(stmt).all() == [(7,), (None,)]
    assert mock_spanner.executed_sql() == [
        "SELECT unsharded_t.c\nFROM unsharded_t\nWHERE unsharded_t.id = @a0"
    ]
    engine.dispose()


def test_mock_server_typed_results_and_ready_result_sets(mock_spanner: Any) -> None:
    from google.cloud.spanner_v1 import ResultSet, ResultSetMetadata, StructType, Type, TypeCode

    engine = mock_spanner.engine()
    cols = [("b", "BOOL"), ("f", "FLOAT64"), ("s", "STRING"), ("y", "BYTES")]
    mock_spanner.add_result("SELECT b, f, s, y FROM x", cols, [[True, 1.5, "z", b"\x00\xff"]])
    field = StructType.Field(name="n", type_=Type(code=TypeCode.INT64))
    empty = ResultSet(metadata=ResultSetMetadata(row_type=StructType(fields=[field])))
    mock_spanner.add_result("SELECT n FROM nothing", empty)
    with engine.connect() as conn:
        row = conn.execute(sa.text("SELECT b, f, s, y FROM x")).one()
        # BYTES arrive base64-encoded, as the Spanner DB-API returns them from the emulator
        assert tuple(row) == (True, 1.5, "z", base64.b64encode(b"\x00\xff"))
        assert conn.execute(sa.text("SELECT n FROM nothing")).all() == []
    engine.dispose()
    with pytest.raises(ValueError, match="2 values for 1 columns"):
        mock_spanner.add_result("SELECT 2", [("a", "INT64")], [[1, 2]])


def test_mock_server_dml_commit_and_injected_errors(mock_spanner: Any) -> None:
    engine = mock_spanner.engine()
    insert = T.insert().values(c=1, id=2)
    mock_spanner.add_update_count(str(insert.compile(engine)), 1)
    sent = "INSERT INTO unsharded_t (c, id) VALUES (@a0, @a1)"

    with engine.begin() as conn:
        assert conn.execute(insert).rowcount == 1
    assert mock_spanner.executed_sql() == [sent]
    assert len(mock_spanner.commits()) == 1

    # ABORTED commits are retried by the DB-API: the transaction is replayed
    mock_spanner.clear()
    mock_spanner.add_error("Commit", "ABORTED", "aborted by the test", times=2)
    with engine.begin() as conn:
        conn.execute(insert)
    assert mock_spanner.executed_sql() == [sent] * 3
    assert len(mock_spanner.commits()) == 3

    # other errors reach the caller with their message
    mock_spanner.clear()
    mock_spanner.add_error("Commit", "FAILED_PRECONDITION", "refused by the test")
    with pytest.raises(Exception, match="refused by the test"), engine.begin() as conn:
        conn.execute(insert)
    assert len(mock_spanner.commits()) == 1
    engine.dispose()


def test_mock_server_unregistered_sql_fails_showing_the_sql(mock_spanner: Any) -> None:
    engine = mock_spanner.engine()
    with pytest.raises(Exception, match="No result found for SELECT nothing"):  # noqa: SIM117
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT nothing")).all()
    engine.dispose()


HOLDS_AN_EMULATOR = """
import os, time

def test_hold(spanner_emulator):
    path = os.environ["EMULATOR_PID_FILE"]
    with open(path + ".tmp", "w") as f:
        f.write(str(spanner_emulator.pid))
    os.replace(path + ".tmp", path)
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


# a child pytest started, killed, and its emulator waited for (seconds); quick loop:
# test_local_emulator_sets_host_then_stops_by_pid_and_restores_env
@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_emulator_dies_when_pytest_is_killed(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """SIGKILL to pytest (a CI timeout) runs no cleanup: the emulator must go anyway."""
    try:
        emu.find_binary()
    except emu.EmulatorNotFound as exc:
        why = emulator_required(request.config)
        if why:
            pytest.fail(f"the Spanner emulator is required here ({why}): {exc}")
        pytest.skip(str(exc))
    (tmp_path / "test_hold.py").write_text(HOLDS_AN_EMULATOR)
    pid_file = tmp_path / "emulator.pid"
    env = {k: v for k, v in os.environ.items() if k != emu.HOST_ENV}  # it starts its own
    env["EMULATOR_PID_FILE"] = str(pid_file)
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_hold.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    emulator_pid = 0
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        emulator_pid = int(pid_file.read_text())
        assert _alive(emulator_pid)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        deadline = time.monotonic() + 10
        while _alive(emulator_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(emulator_pid), "the emulator outlived the pytest that started it"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if emulator_pid and _alive(emulator_pid):
            os.kill(emulator_pid, signal.SIGKILL)


@pytest.mark.emulator
def test_a_full_instance_makes_way_for_a_new_one() -> None:
    """The emulator holds 100 databases an instance: the 101st goes to a new instance and
    every database keeps answering at its own URL, through a fault proxy's handle made
    before the move as well (a fixture that made its handle first, then the database,
    once met "database not found" there)."""
    from sharded_orm.testing.emulator import find_binary, start
    from sharded_orm.testing.faults import FaultProxy

    if find_binary() is None:
        pytest.fail("no emulator binary")
    emulator = start()
    try:
        emulator.ensure_instance()
        with FaultProxy(emulator.host) as proxy:
            through = proxy.emulator(emulator)  # made before the instance fills
            made = [emulator.create_database() for _ in range(101)]
            assert emulator.instance_id != "test-instance"  # moved on
            for database_id in (made[0], made[-1]):
                for handle in (emulator, through):
                    engine = handle.engine(database_id)
                    with engine.connect() as conn:
                        assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1
                    engine.dispose()
                    assert handle.url(database_id) == emulator.url(database_id)
                assert database_id in emulator.url(database_id)
        assert emulator.url(made[0]) != emulator.url(made[-1]).replace(made[-1], made[0])
    finally:
        emulator.stop()
