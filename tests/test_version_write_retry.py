"""Issue 42: an aborted write of the revision to ``alembic_version`` is retried on its
own (the migration's work, e.g. a long backfill, is not done again), and what cannot be
retried ends as one ``FAILED:`` line, not a raw traceback.

On the emulator through the fault proxy (``fail("Commit", "ABORTED", times=N)`` armed by
the migration once its work is committed); in AUTOCOMMIT the DELETE + INSERT of a
revision change is one transaction. Also: a migration's DDL over Spanner's request size
is sent as several requests (a mock server).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import CommandLine
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from alembic_project import Project

from alembic_ext.commit import COMMIT_TIMEOUT_ATTRIBUTE
from alembic_ext.errors import MigrationError
from sharded_orm.limits import SPANNER_DDL_BYTES

LOGGER = "alembic.sharded_orm"
#: config.attributes the CLI test's env.py takes (the CLI makes its own Config)
CLI_HOOKS: dict[str, Any] = {}


def _versions(database: Any) -> list[str]:
    with database.snapshot() as snap:
        return [r[0] for r in snap.execute_sql("SELECT version_num FROM alembic_version")]


def _project(
    tmp_path: Path, emulator: Any, *, autocommit: bool = False
) -> tuple[Project, Any, str, str]:
    """Revision 1 (table Events) applied; revision 2, not run, does its work in its own
    transactions (as op.backfill_shard does: ``step``, counted), reads, then ``arm``s."""
    db = emulator.create_database()
    proj = Project(tmp_path, emulator.url(db))
    if autocommit:  # sqlalchemy-spanner's env.py recipe
        env = tmp_path / "migrations" / "env.py"
        text = env.read_text().replace(
            "poolclass=pool.NullPool,", 'poolclass=pool.NullPool, isolation_level="AUTOCOMMIT",'
        )
        assert "AUTOCOMMIT" in text
        env.write_text(text)
    proj.cfg.attributes["target_metadata"] = None
    first = proj.hand_written("table", """
        op.create_table("Events", sa.Column("Id", sa.String(36), primary_key=True),
                        sa.Column("Kind", sa.String(20)))
    """)  # fmt: skip
    proj.upgrade()
    second = proj.hand_written("work", """
        from alembic import context
        op.get_context().impl.end_transaction()  # what op.backfill_shard does first
        context.config.attributes["step"]()
        op.get_bind().execute(sa.text("SELECT COUNT(*) FROM Events")).scalar()
        context.config.attributes["arm"]()
    """)  # fmt: skip
    return proj, emulator.database(db), first, second


def _steps(proj: Project, database: Any) -> list[int]:
    """The migration's work: a row written in its own transaction, per run."""
    done: list[int] = []

    def step() -> None:
        done.append(1)
        with database.batch() as batch:
            batch.insert("Events", ["Id", "Kind"], [[f"work{len(done)}", "w"]])

    proj.cfg.attributes["step"] = step
    return done


@pytest.mark.emulator
def test_an_aborted_revision_write_is_retried_and_the_work_not_repeated(
    tmp_path: Path, spanner_emulator: Any, spanner_faults: Any, monkeypatch: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """AUTOCOMMIT (where the DB-API's run_in_transaction gave up with a raw Aborted after
    waits of 2, 4, 8 s): four aborts of the revision's commit are retried."""
    proj, database, _, second = _project(tmp_path, spanner_emulator, autocommit=True)
    monkeypatch.setenv("SPANNER_EMULATOR_HOST", spanner_faults.host)  # env.py's engine
    steps = _steps(proj, database)
    proj.cfg.attributes["arm"] = lambda: spanner_faults.fail("Commit", "ABORTED", times=4)
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        proj.cfg.attributes[COMMIT_TIMEOUT_ATTRIBUTE] = 30
        proj.upgrade()
    assert time.monotonic() - start < 15
    assert spanner_faults.pending == 0  # all four aborts were met
    assert _versions(database) == [second]
    assert steps == [1]
    with database.snapshot() as snap:
        assert list(snap.execute_sql("SELECT Id FROM Events")) == [["work1"]]
    waits = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    # logged at the first abort and when it got through (not a line per wait: a loop)
    assert len([w for w in waits if "aborted by a concurrent transaction" in w]) == 1
    assert f"The write of revision {second} to alembic_version" in waits[0]
    assert "done, after 4 aborted attempt(s)" in waits[-1], waits


@pytest.mark.emulator
@pytest.mark.parametrize(
    "autocommit",
    [
        False,
        # the same retry loop to the same deadline, waited for again (seconds); quick loop:
        # test_a_revision_write_aborted_until_the_deadline_is_one_clear_error[False],
        # test_an_aborted_revision_write_is_retried_and_the_work_not_repeated
        pytest.param(True, marks=pytest.mark.slow),
    ],
)
def test_a_revision_write_aborted_until_the_deadline_is_one_clear_error(
    tmp_path: Path, spanner_emulator: Any, spanner_faults: Any, monkeypatch: Any,
    autocommit: bool,
) -> None:  # fmt: skip
    """Aborted forever: a MigrationError (one FAILED: line) within the commit timeout,
    nothing of the revision change applied (AUTOCOMMIT: the DELETE not committed apart
    from the INSERT); `alembic stamp` then records it without repeating the work."""
    proj, database, first, second = _project(tmp_path, spanner_emulator, autocommit=autocommit)
    monkeypatch.setenv("SPANNER_EMULATOR_HOST", spanner_faults.host)
    steps = _steps(proj, database)
    proj.cfg.attributes["arm"] = lambda: spanner_faults.fail("Commit", "ABORTED", times=10_000)
    start = time.monotonic()
    with pytest.raises(MigrationError) as caught:
        proj.cfg.attributes[COMMIT_TIMEOUT_ATTRIBUTE] = 3
        proj.upgrade()
    took = time.monotonic() - start
    assert 2.5 < took < 3 + 4, took
    message = str(caught.value)
    assert "\n" not in message
    assert f"The write of revision {second} to alembic_version was aborted" in message
    assert "another read-write transaction kept conflicting with it" in message
    assert f"`alembic stamp {second}`" in message and COMMIT_TIMEOUT_ATTRIBUTE in message
    assert spanner_faults.count("Commit") >= 3
    spanner_faults.clear()
    assert _versions(database) == [first]  # never empty: DELETE and INSERT are one
    command.stamp(proj.cfg, second)  # the advice: record it, the work not run again
    assert _versions(database) == [second]
    assert steps == [1]


@pytest.mark.emulator
def test_the_cli_prints_one_failed_line(
    tmp_path: Path, spanner_emulator: Any, spanner_faults: Any, monkeypatch: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``alembic upgrade head`` (Alembic's CommandLine): `FAILED: ...` on one line and exit
    status 1, no traceback."""
    proj, database, first, second = _project(tmp_path, spanner_emulator)
    env = tmp_path / "migrations" / "env.py"
    text = env.read_text().replace(
        "if config.config_file_name is not None:", "if False:  # tests: loggers kept"
    )
    text = text.replace(
        "target_metadata = config.attributes['target_metadata']",
        f"config.attributes[{COMMIT_TIMEOUT_ATTRIBUTE!r}] = 2\n"
        "import test_version_write_retry\n"
        "config.attributes.update(test_version_write_retry.CLI_HOOKS)\n"
        "target_metadata = None",
    )
    env.write_text(text)
    ini = tmp_path / "alembic.ini"
    ini.write_text(
        ini.read_text().replace(
            "sqlalchemy.url = driver://user:pass@localhost/dbname",
            f"sqlalchemy.url = {proj.cfg.get_main_option('sqlalchemy.url')}",
        )
    )
    monkeypatch.setenv("SPANNER_EMULATOR_HOST", spanner_faults.host)
    arm = lambda: spanner_faults.fail("Commit", "ABORTED", times=10_000)  # noqa: E731
    monkeypatch.setitem(CLI_HOOKS, "arm", arm)
    monkeypatch.setitem(CLI_HOOKS, "step", lambda: None)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        CommandLine(prog="alembic").main(["-c", str(ini), "upgrade", "head"])
    assert exited.value.code not in (0, None)
    out = capsys.readouterr()
    failed = [ln for ln in (out.out + out.err).splitlines() if ln.startswith("FAILED:")]
    assert len(failed) == 1, out
    assert f"FAILED: The write of revision {second} to alembic_version was aborted" in failed[0]
    assert "Traceback" not in out.out + out.err
    spanner_faults.clear()
    assert _versions(database) == [first]


# -- DDL over Spanner's request size: several requests (a mock server)


@pytest.fixture
def big_mock(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[sa.Engine, Any]]:
    """google-cloud-spanner's mock servicers on a server that takes 64 MB messages (the
    stock mock takes gRPC's 4 MB), and an engine on it."""
    import grpc
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import spanner
    from google.cloud.spanner_v1.testing.mock_database_admin import DatabaseAdminServicer
    from google.cloud.spanner_v1.testing.mock_spanner import SpannerServicer
    from google.cloud.spanner_v1.testing.spanner_database_admin_pb2_grpc import (
        add_DatabaseAdminServicer_to_server,
    )
    from google.cloud.spanner_v1.testing.spanner_pb2_grpc import add_SpannerServicer_to_server

    monkeypatch.delenv("SPANNER_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("SPANNER_DISABLE_BUILTIN_METRICS", "true")
    size = 64 * 1024 * 1024
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        options=[("grpc.max_receive_message_length", size)],
    )
    admin = DatabaseAdminServicer()  # type: ignore[no-untyped-call]
    spanner_svc = SpannerServicer()  # type: ignore[no-untyped-call]
    add_SpannerServicer_to_server(spanner_svc, server)  # type: ignore[no-untyped-call]
    # alembic_version exists (the impl looks before the migrations run)
    from google.cloud.spanner_v1.types import result_set
    from google.cloud.spanner_v1.types import type as spanner_type

    bool_column = spanner_type.StructType.Field(
        name="", type_=spanner_type.Type(code=spanner_type.TypeCode.BOOL)
    )
    spanner_svc.mock_spanner.add_result(
        "SELECT true FROM information_schema.tables WHERE table_schema = @schema "
        "AND table_name = @name LIMIT 1",
        result_set.ResultSet(
            metadata=result_set.ResultSetMetadata(
                row_type=spanner_type.StructType(fields=[bool_column])
            ),
            rows=[[True]],
        ),
    )
    add_DatabaseAdminServicer_to_server(admin, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = spanner.Client(
        project="p",
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        client_options=ClientOptions(api_endpoint=f"127.0.0.1:{port}"),
        disable_builtin_metrics=True,
    )
    engine = sa.create_engine(
        "spanner+spanner:///projects/p/instances/i/databases/d", connect_args={"client": client}
    )
    try:
        yield engine, admin
    finally:
        engine.dispose()
        server.stop(0)


def test_ddl_over_the_request_limit_is_sent_as_several_requests(
    big_mock: tuple[sa.Engine, Any],
) -> None:
    engine, admin = big_mock
    pad = "x" * (1024 * 1024)
    statements = [
        f"CREATE TABLE IF NOT EXISTS T{i} (A STRING(MAX)) PRIMARY KEY (A) /* {pad} */"
        for i in range(12)
    ]
    sent: list[list[str]] = []
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn)
        impl: Any = ctx.impl
        impl.start_migrations()
        for s in statements:
            Operations(ctx).execute(s)
        impl.flush_ddl()
        sent = impl.ddl_batches
    requests = [list(r.statements) for r in admin.requests if hasattr(r, "statements")]
    assert len(requests) >= 2
    assert requests == sent
    assert [s for r in requests for s in r] == statements  # all, once, in order
    assert all(sum(len(s.encode()) for s in r) <= SPANNER_DDL_BYTES for r in requests)
