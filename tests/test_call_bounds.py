"""Every Spanner call the library makes ends within the caller's deadline, and the
failures it meets are survived or worded (issue 44, the reliability half).

* Batched DML (``executemany``: the client's ``batch_update``) and its replays of an
  ABORTED transaction, in a transaction and in autocommit mode (where the DB-API runs
  it through ``Database.run_in_transaction``: the batch under the client's own 30 s, its
  retries until 120 s; ``timeout=4`` ended at 30.0 s with an error claiming 4 s).

Faults come from ``FaultProxy`` in front of the emulator. Each test prints
``requested`` and ``observed`` seconds (``pytest -s``) for the closing note. The emulator
cases run through both engines: the sync one, and the async one (``spanner+spanner_async``:
the same body on ``AsyncEngine.sync_engine`` in SQLAlchemy's greenlet, ``run_through``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
import sqlalchemy.dialects
import sqlalchemy.engine.default
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session
from test_cli_errors import EchoingDialect

from sharded_orm.testing.async_engines import dispose, run_through

DEADLINE = 4.0
#: Slack for the client to notice and unwind (the deadline itself is the bound).
SLACK = 2.5
SILENCE = 120.0

INSERT = "INSERT INTO BoundRows (Id) VALUES (:id)"
ROWS = [{"id": f"r{i}"} for i in range(5)]


@pytest.fixture
def bound_rows(spanner_emulator: Any, spanner_faults: Any) -> Iterator[tuple[sa.Engine, Any, Any]]:
    db = spanner_emulator.create_database()
    direct = spanner_emulator.engine(db)
    with direct.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE BoundRows (Id STRING(36)) PRIMARY KEY (Id)")
    try:
        with spanner_faults.engine(spanner_emulator, db, commit_timeout=DEADLINE) as engine:
            yield engine, spanner_faults, direct
    finally:
        direct.dispose()


def _database_of(engine: sa.Engine) -> str:
    return str(engine.url.database).rsplit("/", 1)[-1]


def _select_one(engine: sa.Engine) -> None:
    with engine.connect() as conn:  # a session before any fault
        assert conn.execute(sa.text("SELECT 1")).scalar() == 1


@pytest.fixture
def bound_rows_async(
    spanner_emulator: Any, spanner_faults: Any, bound_rows: tuple[sa.Engine, Any, Any]
) -> Iterator[tuple[Any, Any, Any]]:
    """``bound_rows``' database through the fault proxy, on an async engine."""
    engine, proxy, direct = bound_rows
    async_engine = spanner_faults.emulator(spanner_emulator).async_engine(
        _database_of(engine), commit_timeout=DEADLINE
    )
    run_through(async_engine, _select_one)
    try:
        yield async_engine, proxy, direct
    finally:
        spanner_faults.clear()
        dispose(async_engine)


def _ids(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return [r[0] for r in conn.exec_driver_sql("SELECT Id FROM BoundRows ORDER BY Id")]


def _silent(proxy: Any) -> None:
    proxy.hang("ExecuteBatchDml", SILENCE, times=1000)
    proxy.hang("ExecuteStreamingSql", SILENCE, times=1000)


def _aborted(proxy: Any) -> None:
    proxy.fail("ExecuteBatchDml", "ABORTED", times=100_000)
    proxy.fail("ExecuteStreamingSql", "ABORTED", times=100_000)


def _autocommit_batch(conn: sa.Connection) -> None:
    conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text(INSERT), ROWS)


def _autocommit_one(conn: sa.Connection) -> None:
    conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text(INSERT), ROWS[0])


def _transaction_batch(conn: sa.Connection) -> None:
    conn.execute(sa.text(INSERT), ROWS)
    conn.commit()


WRITES: dict[str, Callable[[sa.Connection], None]] = {
    "autocommit executemany": _autocommit_batch,
    "autocommit one DML": _autocommit_one,
    "transaction executemany": _transaction_batch,
}


# 6 fault cases; quick loop:
# test_a_transaction_that_lost_its_session_fails_clearly_and_commits_nothing
@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.parametrize("fault", ["silent", "aborted"])
@pytest.mark.parametrize("write", list(WRITES))
def test_batched_dml_ends_within_the_statement_s_deadline(
    bound_rows: tuple[sa.Engine, Any, Any], write: str, fault: str
) -> None:
    batched_dml_case(*bound_rows, write, fault)


# async variant; quick loop:
# test_a_lost_session_fails_clearly_through_the_async_engine
@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.parametrize("fault", ["silent", "aborted"])
@pytest.mark.parametrize("write", list(WRITES))
def test_batched_dml_ends_within_the_deadline_through_the_async_engine(
    bound_rows_async: tuple[Any, Any, Any], write: str, fault: str
) -> None:
    async_engine, proxy, direct = bound_rows_async
    run_through(async_engine, batched_dml_case, proxy, direct, write, fault)


def batched_dml_case(
    engine: sa.Engine, proxy: Any, direct: sa.Engine, write: str, fault: str
) -> None:
    start = time.monotonic()
    with pytest.raises(sa.exc.OperationalError) as caught, engine.connect() as conn:
        conn = conn.execution_options(timeout=DEADLINE)
        (_silent if fault == "silent" else _aborted)(proxy)
        WRITES[write](conn)
    took = time.monotonic() - start
    print(f"\n{write}, {fault}: requested {DEADLINE:g} s, observed {took:.1f} s")
    assert took < DEADLINE + SLACK, f"took {took:.1f} s, deadline {DEADLINE:g} s"
    message = str(caught.value)
    assert f"within its deadline of {DEADLINE:g} s" in message
    assert "Nothing of it is committed" in message
    assert "run it again" in message
    proxy.clear()
    assert _ids(direct) == []
    with engine.connect() as conn:  # the engine works on
        WRITES[write](conn.execution_options(timeout=DEADLINE))
        conn.commit()
    assert _ids(direct) == sorted(r["id"] for r in (ROWS if "many" in write else ROWS[:1]))


# --------------------------------------------------------------------------- raw-SQL memo


# quick loop: test_the_raw_sql_memo_still_warns_once_per_text
@pytest.mark.slow
def test_the_raw_sql_memo_is_bounded_by_bytes_whatever_the_texts_size() -> None:
    """300 raw statements of 200 KB each left 57 MiB in the memo of texts already checked
    (it kept the texts); it keeps fixed-size digests now, and still checks a text once."""
    import gc
    import tracemalloc

    from sharded_orm.write.engine_hook import watch

    engine = sa.create_engine("sqlite://", connect_args={"cached_statements": 0})
    watch(engine)
    pad = "x" * 200_000
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")  # warm up SQLAlchemy's and sqlite3's first use
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(300):
                conn.exec_driver_sql(f"SELECT {i} /* {pad} */").all()
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    print(f"\nmemo after 300 texts of 200 KB: {held / 2**20:.2f} MiB")
    assert held < 2 * 2**20, f"{held / 2**20:.1f} MiB held after 300 texts of 200 KB"
    engine.dispose()


def test_the_raw_sql_memo_still_warns_once_per_text() -> None:
    import warnings

    from sharded_orm import ShardingWarning, shard_column
    from sharded_orm.write.engine_hook import watch

    metadata = sa.MetaData()
    sa.Table(
        "MemoEvents",
        metadata,
        sa.Column("Id", sa.String(36), primary_key=True),
        shard_column("Id", count=4, name="ShardId").column,
    )
    engine = sa.create_engine("sqlite://")
    watch(engine)
    metadata.create_all(engine)
    pad = "y" * 100_000
    with engine.begin() as conn, warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for n in range(3):
            conn.exec_driver_sql(
                f"INSERT INTO MemoEvents (Id, ShardId) VALUES ('{n}', 0) /* {pad} */"
            )
            conn.exec_driver_sql(  # the same text again: checked (and warned) once
                f"UPDATE MemoEvents SET ShardId = 1 WHERE Id = '{n}' /* {pad} */"
            )
            conn.exec_driver_sql(f"UPDATE MemoEvents SET ShardId = 1 WHERE Id = '{n}' /* {pad} */")
    raw = [w for w in seen if issubclass(w.category, ShardingWarning)]
    assert len(raw) == 6, [str(w.message)[:80] for w in raw]
    assert all("raw SQL writes sharded table 'MemoEvents'" in str(w.message) for w in raw)
    engine.dispose()


# --------------------------------------------------------------------------- passwords


class _QueryEchoingDialect(EchoingDialect):
    """test_cli_errors' echoing driver (it refuses every connection and echoes what it was
    given), given the URL's query too, as drivers quoting a DSN do."""

    name = "queryecho"

    def create_connect_args(self, url: Any) -> Any:
        return [], {**url.translate_connect_args(), **url.query}


sa.dialects.registry.register("queryecho.echo", __name__, "_QueryEchoingDialect")

_MODELS = """
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sharded_orm import shard_column


class Base(DeclarativeBase):
    pass


class Sharded(Base):
    __tablename__ = "Sharded"
    company_id: Mapped[str] = mapped_column("CompanyId", sa.String(64), primary_key=True)
    shard: Mapped[int] = shard_column("company_id", count=4, name="ShardId")
"""


@pytest.fixture(scope="module")
def url_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import sys

    d = tmp_path_factory.mktemp("url_models")
    (d / "query_secret_models.py").write_text(_MODELS)
    sys.path.insert(0, str(d))
    yield "query_secret_models:Base"
    sys.path.remove(str(d))


#: URLs that carry a password (``{pw}`` as typed, %-escaped), and words their error shows
_SECRET_URLS = {
    "query, unknown driver": ("nosuch://u@h/db?password={pw}&sslmode=require",
                              ("password=***", "sslmode=require")),
    "query, refused": ("queryecho+echo://u@127.0.0.1:1/db?password={pw}",
                       ("password=***", "refused")),
    "query and userinfo": ("queryecho+echo://u:{pw}@127.0.0.1:1/db?pwd={pw}&auth_token={pw}",
                           ("u:***@", "pwd=***", "auth_token=***")),
    "not a Spanner URL": ("spanner+spanner:///projects/p?password={pw}", ("password=***",)),
}  # fmt: skip

_PASSWORDS = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=6
).filter(lambda s: s.strip() == s and len(set(s)) > 2)


@pytest.mark.parametrize("name", list(_SECRET_URLS))
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(password=_PASSWORDS)
def test_a_password_in_a_url_is_never_printed(
    name: str, password: str, url_models: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from urllib.parse import quote, quote_plus

    from sharded_orm.tools.cli import main

    template, words = _SECRET_URLS[name]
    url = template.format(pw=quote(password, safe=""))
    for form in ((), ("--format", "json")):
        code = main(["verify", url, url_models, *form])
        out, err = capsys.readouterr()
        assert code == 2, (out, err)
        text = out + err
        if form:
            message = json.loads(out)["error"]["message"]
        else:
            message = err.removeprefix("sharded-orm: error: ").strip()
        for secret in {password, quote(password, safe=""), quote_plus(password)}:
            assert secret not in text, (secret, text)
        for word in words:
            assert word in message, (word, message)


# --------------------------------------------------------------------------- lost sessions


def _forget_every_session(engine: sa.Engine) -> int:
    """Delete every session of the engine's database on the server, as Spanner does after
    an hour idle (or a restart): the client still holds them. Returns how many."""
    raw = engine.raw_connection()
    try:
        database = raw.driver_connection.database
        api = database.spanner_api
        names = [s.name for s in api.list_sessions(request={"database": database.name})]
        for name in names:
            api.delete_session(request={"name": name})
        return len(names)
    finally:
        raw.close()


@pytest.fixture
def lost_rows(spanner_emulator: Any) -> Iterator[tuple[sa.Engine, sa.Engine]]:
    db = spanner_emulator.create_database()
    engine = spanner_emulator.engine(db)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE BoundRows (Id STRING(36)) PRIMARY KEY (Id)")
        conn.execute(sa.text(INSERT), ROWS)
    admin = spanner_emulator.engine(db)
    try:
        yield engine, admin
    finally:
        engine.dispose()
        admin.dispose()


def _read(conn: sa.Connection) -> list[str]:
    return [r[0] for r in conn.execute(sa.text("SELECT Id FROM BoundRows ORDER BY Id"))]


def _read_on_a_connection(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return _read(conn)


def _read_in_autocommit(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return _read(conn.execution_options(isolation_level="AUTOCOMMIT"))


def _read_in_a_session(engine: sa.Engine) -> list[str]:
    with Session(engine) as session:
        return list(session.scalars(sa.text("SELECT Id FROM BoundRows ORDER BY Id")))


READS: dict[str, Callable[[sa.Engine], list[str]]] = {
    "connection": _read_on_a_connection,
    "autocommit": _read_in_autocommit,
    "orm session": _read_in_a_session,
}
EXPECTED = sorted(r["id"] for r in ROWS)


@pytest.fixture
def lost_rows_async(
    spanner_emulator: Any, lost_rows: tuple[sa.Engine, sa.Engine]
) -> Iterator[tuple[Any, sa.Engine]]:
    """``lost_rows``' database on an async engine, and its admin engine."""
    engine, admin = lost_rows
    async_engine = spanner_emulator.async_engine(_database_of(engine))
    try:
        yield async_engine, admin
    finally:
        dispose(async_engine)


@pytest.mark.emulator
@pytest.mark.parametrize("read", list(READS))
def test_reads_survive_a_session_spanner_lost(
    lost_rows: tuple[sa.Engine, sa.Engine], read: str
) -> None:
    """After the server forgot every session the same engine failed 4 of 4 page reads
    with 'Session not found'; now each read runs again on a new session."""
    reads_survive(*lost_rows, read)


# async variant; quick loop: test_a_lost_session_fails_clearly_through_the_async_engine
@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.parametrize("read", list(READS))
def test_reads_survive_a_lost_session_through_the_async_engine(
    lost_rows_async: tuple[Any, sa.Engine], read: str
) -> None:
    async_engine, admin = lost_rows_async
    run_through(async_engine, reads_survive, admin, read)


def reads_survive(engine: sa.Engine, admin: sa.Engine, read: str) -> None:
    assert READS[read](engine) == EXPECTED  # the engine holds a session now
    assert _forget_every_session(admin) >= 1
    for _ in range(4):
        assert READS[read](engine) == EXPECTED


@pytest.mark.emulator
def test_a_transaction_s_first_write_survives_a_lost_session(
    lost_rows: tuple[sa.Engine, sa.Engine],
) -> None:
    first_write_survives(*lost_rows)


# async variant; quick loop: test_a_lost_session_fails_clearly_through_the_async_engine
@pytest.mark.slow
@pytest.mark.emulator
def test_a_first_write_survives_a_lost_session_through_the_async_engine(
    lost_rows_async: tuple[Any, sa.Engine],
) -> None:
    async_engine, admin = lost_rows_async
    run_through(async_engine, first_write_survives, admin)


def first_write_survives(engine: sa.Engine, admin: sa.Engine) -> None:
    assert _read_on_a_connection(engine) == EXPECTED
    _forget_every_session(admin)
    with engine.begin() as conn:
        conn.execute(sa.text(INSERT), {"id": "s1"})  # first statement: run again
        conn.execute(sa.text(INSERT), [{"id": "s2"}, {"id": "s3"}])
    assert _read_on_a_connection(admin) == sorted([*EXPECTED, "s1", "s2", "s3"])


#: Spanner's answer for a session it no longer knows (the emulator crashes when a session
#: holding a transaction is deleted under it, so the proxy gives this answer instead)
LOST = "Session not found: projects/p/instances/i/databases/d/sessions/lost"


@pytest.mark.emulator
@pytest.mark.parametrize("at", ["ExecuteStreamingSql", "ExecuteBatchDml", "Commit"])
def test_a_transaction_that_lost_its_session_fails_clearly_and_commits_nothing(
    bound_rows: tuple[sa.Engine, Any, Any], at: str
) -> None:
    """Not safe to run again: the transaction's earlier statements were lost with it."""
    lost_session_case(*bound_rows, at)


@pytest.mark.emulator
def test_a_lost_session_fails_clearly_through_the_async_engine(
    bound_rows_async: tuple[Any, Any, Any],
) -> None:
    async_engine, proxy, direct = bound_rows_async
    run_through(async_engine, lost_session_case, proxy, direct, "ExecuteBatchDml")


# async variant; quick loop: test_a_lost_session_fails_clearly_through_the_async_engine
@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.parametrize("at", ["ExecuteStreamingSql", "Commit"])
def test_a_transaction_that_lost_its_session_fails_clearly_through_the_async_engine(
    bound_rows_async: tuple[Any, Any, Any], at: str
) -> None:
    async_engine, proxy, direct = bound_rows_async
    run_through(async_engine, lost_session_case, proxy, direct, at)


def lost_session_case(engine: sa.Engine, proxy: Any, direct: sa.Engine, at: str) -> None:
    from sharded_orm.spanner.connection import SessionLost

    with pytest.raises(sa.exc.OperationalError) as caught, engine.begin() as conn:
        conn.execute(sa.text(INSERT), {"id": "t1"})
        proxy.fail(at, "NOT_FOUND", message=LOST)
        if at == "ExecuteStreamingSql":
            conn.execute(sa.text(INSERT), {"id": "t2"})
        elif at == "ExecuteBatchDml":
            conn.execute(sa.text(INSERT), [{"id": "t2"}, {"id": "t3"}])
    assert isinstance(caught.value.orig, SessionLost), caught.value
    message = str(caught.value)
    assert "Spanner no longer knows the session" in message
    assert "nothing of it is committed" in message
    assert "run the whole transaction again" in message
    assert _ids(direct) == []  # t1 was never committed
    with engine.begin() as conn:  # the engine works on, on a new session
        conn.execute(sa.text(INSERT), [{"id": "t1"}, {"id": "t2"}])
    assert _ids(direct) == ["t1", "t2"]


# --------------------------------------------------------------------------- streaming reads


def _copy_tables() -> tuple[sa.Table, sa.Table]:
    from sharded_orm import shard_column

    metadata = sa.MetaData()
    src = sa.Table(
        "CopySrc",
        metadata,
        sa.Column("Id", sa.String(36), primary_key=True),
        sa.Column("V", sa.Integer, nullable=False),
    )
    dst = sa.Table(
        "CopyDst",
        metadata,
        shard_column("Id", count=4, name="ShardId", primary_key=True).column,
        sa.Column("Id", sa.String(36), primary_key=True),
        sa.Column("V", sa.Integer, nullable=False),
    )
    return src, dst


COPY_DEADLINE = 10.0
COPY_ROWS = 600


@pytest.mark.emulator
@pytest.mark.slow
def test_copy_table_ends_within_its_deadline_when_the_server_goes_away_mid_read(
    spanner_emulator: Any, spanner_faults: Any
) -> None:
    """The connection refused and reset mid-read: copy_table(deadline=10) ran 18.9-49 s,
    blocked in the client's restart of the stream (each restart under a new timeout, for
    as long as the server refused). Now every restart is under the read's own timeout."""
    import threading

    from sharded_orm.load.copy import copy_table

    db = spanner_emulator.create_database()
    direct = spanner_emulator.engine(db)
    src, dst = _copy_tables()
    src.metadata.create_all(direct)
    with direct.begin() as conn:
        conn.execute(src.insert(), [{"Id": f"k{i:04d}", "V": i} for i in range(COPY_ROWS)])
    engine = spanner_faults.emulator(spanner_emulator).engine(db)
    proxy = spanner_faults
    back = threading.Timer(45.0, proxy.come_back)

    def away(progress: Any) -> None:
        if progress.batches == 1:  # the next read's stream is reset, its restarts refused
            proxy.go_away()
            back.start()

    start = time.monotonic()
    try:
        with pytest.raises(Exception) as caught:
            copy_table(engine, src, dst, batch_size=100, deadline=COPY_DEADLINE,
                       call_timeout=5.0, on_batch=away)  # fmt: skip
        took = time.monotonic() - start
    finally:
        back.cancel()
        proxy.come_back()
    print(f"\ncopy_table, refused mid-read: requested {COPY_DEADLINE:g} s, observed {took:.1f} s")
    assert took < COPY_DEADLINE + SLACK + 2, f"took {took:.1f} s"
    assert "Run copy_table again" in str(caught.value), str(caught.value)
    with direct.connect() as conn:  # what it copied before stays copied, nothing else
        copied = conn.execute(sa.select(sa.func.count()).select_from(dst)).scalar_one()
    assert 100 <= copied < COPY_ROWS
    engine.dispose()
    direct.dispose()


@pytest.mark.emulator
def test_copy_table_still_copies_every_row_when_a_read_s_stream_is_cut(
    spanner_emulator: Any, spanner_faults: Any
) -> None:
    """A read whose stream is cut is read again, on a new session: every row is copied, once."""
    from sharded_orm.load.copy import copy_table

    db = spanner_emulator.create_database()
    direct = spanner_emulator.engine(db)
    src, dst = _copy_tables()
    src.metadata.create_all(direct)
    with direct.begin() as conn:
        conn.execute(src.insert(), [{"Id": f"k{i:04d}", "V": i} for i in range(300)])
    engine = spanner_faults.emulator(spanner_emulator).engine(db)
    spanner_faults.cut_stream("StreamingRead", after=0, times=3)
    result = copy_table(engine, src, dst, batch_size=100, deadline=COPY_DEADLINE * 3)
    assert spanner_faults.count("StreamingRead", "cut after 0") == 3
    assert result.rows == 300
    with direct.connect() as conn:
        got = conn.execute(sa.select(dst.c.Id, dst.c.V).order_by(dst.c.Id)).all()
    assert [tuple(r) for r in got] == [(f"k{i:04d}", i) for i in range(300)]
    engine.dispose()
    direct.dispose()


def test_upstream_still_has_the_hooks_these_bounds_rely_on() -> None:
    """Trips when google-cloud-spanner changes what sharded_orm.spanner relies on here:
    run_in_transaction's retry bound and delay (autocommit writes), the multiplexed
    session a lost one is replaced by, and a stream restart being a new call."""
    import inspect

    from google.cloud.spanner_v1 import snapshot
    from google.cloud.spanner_v1.database_sessions_manager import DatabaseSessionsManager
    from google.cloud.spanner_v1.session import Session as SpannerSession

    source = inspect.getsource(SpannerSession.run_in_transaction)
    assert 'kw.pop("timeout_secs"' in source and 'kw.pop("default_retry_delay"' in source
    manager = inspect.getsource(DatabaseSessionsManager)
    assert "self._multiplexed_session_lock" in manager
    assert "def _build_multiplexed_session(self)" in manager
    restart = inspect.getsource(snapshot._restart_on_unavailable)
    assert "except ServiceUnavailable:" in restart and "iterator = None" in restart
