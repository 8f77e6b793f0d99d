"""Every call of the Spanner gateway (``sharded_orm/spanner/``) faced with a server that is
silent, that resets the call, and that is slow but answers within the deadline (issue 44:
"one test per client call the library makes, with the server silent, reset and slow").

The matrix is generated: :data:`ENTRIES` names each gateway call (``module:function``,
with the gRPC method the fault lands on) and a small driver that makes it against the
emulator through a fault proxy; each entry is crossed with every kind in :data:`KINDS`:

* ``silent``: the call ends within its deadline (+ :data:`MARGIN`) with the error the
  gateway's own predicate reads as "Spanner did not answer" (what its callers word);
* ``reset``: the connection is reset under the call (UNAVAILABLE; a stream cut before
  its first message): a read stream is restarted by the client and answers; a unary call
  raises an error the gateway reads as retryable (its callers own the retry policy and
  send it again: the cell checks the same call then succeeds);
* ``slow``: the call waits :data:`SLOW` seconds, well within its deadline, and succeeds.

``AddSplitPoints`` is 501 on the emulator: ``admin:send_split_points`` runs against an
in-process gRPC server (as tests/test_presplit.py does) that plays each kind itself.
Cells other tests already cover are in :data:`COVERED` (checked to exist), the DB-API
paths among them. :func:`test_every_gateway_name_is_in_the_matrix` fails when a public
name of admin.py, snapshots.py, pdml.py or key_ranges.py is neither a matrix entry nor
listed as making no call, so a new gateway call must be added here.
"""

from __future__ import annotations

import ast
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from sharded_orm.retry import Deadline
from sharded_orm.testing.faults import FaultProxy

HERE = Path(__file__).parent
GATEWAY = HERE.parent / "sharded_orm" / "spanner"

#: The deadline of every call in the matrix (seconds).
DEADLINE = 1.5
#: How much past its deadline a call may end (the client unwinding).
MARGIN = 1.0
#: How long a slow server waits before it answers (well within :data:`DEADLINE`).
SLOW = 0.4
#: A silent server's silence (far past every deadline here).
SILENCE = 120.0
#: Session methods silenced with every call's own: a silent server answers nothing.
SESSION_METHODS = ("CreateSession", "BatchCreateSessions", "GetSession")
KINDS = ("silent", "reset", "slow")
ROWS = [(f"r{i}", i) for i in range(5)]


class SlowProxy(FaultProxy):
    """The fault proxy, plus a server that is slow but answers: :meth:`slow`."""

    def __init__(self, target: str) -> None:
        self.delays: dict[str, float] = {}
        super().__init__(target)

    def slow(self, method: str, seconds: float) -> None:
        """Every later call of ``method`` waits ``seconds``, then is forwarded."""
        self.delays[method] = seconds

    def clear(self) -> None:
        super().clear()
        self.delays.clear()

    def unary(self, method: str, name: str, request: bytes, context: Any) -> bytes:
        time.sleep(self.delays.get(name, 0.0))
        return super().unary(method, name, request, context)

    def stream(self, method: str, name: str, request: bytes, context: Any) -> Iterator[bytes]:
        time.sleep(self.delays.get(name, 0.0))
        yield from super().stream(method, name, request, context)


@dataclass
class World:
    """What the drivers reach: the proxied ``Database`` (as the callers get it), the
    operation id of a schema change already made, a read timestamp, the split server."""

    proxy: Any
    database: Any
    operation_id: str
    read_timestamp: Any
    splits: Any = None
    kept: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Entry:
    """One gateway call: ``call`` (module:function), the gRPC ``method`` its fault lands
    on, ``drive(world, deadline)`` making it, and ``expect(result)`` checking an answer.
    ``reset``: "retried" (the client restarts it and it answers) or "raised" (a
    retryable error, the caller sends it again)."""

    call: str
    method: str
    drive: Callable[[World, Deadline], Any]
    expect: Callable[[Any], None]
    reset: str
    streaming: bool = False
    #: how the call reads its error: True when it is the gateway's "no answer"
    silence: Callable[[BaseException], bool] = field(default=lambda e: _is_silence(e))
    #: run before the fault (what the call needs that is not the call itself)
    prepare: Callable[[World], None] = field(default=lambda world: None)

    @property
    def id(self) -> str:
        return f"{self.call}@{self.method}"


def _is_silence(exc: BaseException) -> bool:
    from sharded_orm.spanner import admin

    return admin.is_silence(exc)


def _timed_out(exc: BaseException) -> bool:
    from sharded_orm.spanner import snapshots

    failure = snapshots.call_failure(exc)
    return failure is not None and failure.status in ("DEADLINE_EXCEEDED", "UNAVAILABLE")


# --------------------------------------------------------------------------- drivers


def _send_ddl(world: World, deadline: Deadline) -> Any:
    from sharded_orm.spanner import admin

    name = f"T{uuid.uuid4().hex[:12]}"
    op = world.kept.setdefault("ddl_op", f"op_{uuid.uuid4().hex[:16]}")
    return admin.send_ddl(
        world.database, [f"CREATE TABLE {name} (Id INT64) PRIMARY KEY (Id)"], op, deadline
    )


def _sent_ddl(result: Any) -> None:
    from sharded_orm.spanner.admin import DdlOperation

    assert result is None or isinstance(result, DdlOperation), result


def _poll_ddl(world: World, deadline: Deadline) -> Any:
    from sharded_orm.spanner import admin

    return admin.poll_ddl(world.database, world.operation_id, deadline)


def _polled(result: Any) -> None:
    assert result.done and result.code == 0, result


@dataclass(frozen=True)
class _Point:
    table: str
    index: str | None
    key: tuple[Any, ...]


def _send_split_points(world: World, deadline: Deadline) -> Any:
    import datetime as dt

    from sharded_orm.spanner import admin

    database, recorder = world.splits
    (request,) = admin.split_point_requests(
        database, [_Point("Events", None, (1,))],
        expire_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1),
        initiator="test", per_request=100, byte_limit=1 << 20,
    )  # fmt: skip
    admin.send_split_points(database, request, deadline)
    return recorder.answered


def _split_answered(result: Any) -> None:
    assert result >= 1, result


def _strong_first_row(world: World, deadline: Deadline) -> Any:
    from sharded_orm.spanner import snapshots

    return snapshots.strong_first_row(world.database, "SELECT COUNT(*) FROM GwRows", deadline)


def _first_row(result: Any) -> None:
    row, at = result
    assert row == [len(ROWS)] and at is not None, result


def _key_range_session(world: World) -> Any:
    from sharded_orm.spanner.key_ranges import KeyRangeSession

    reader = world.kept.get("key_ranges")
    if reader is None:
        reader = world.kept["key_ranges"] = KeyRangeSession(world.database)
    return reader


def _read_range_with(reader: Any, deadline: Deadline) -> list[list[Any]]:
    """A key-range read as ``copy_table`` makes it: read whole, the session forgotten after
    a failure (the retry starts a new one)."""
    try:
        return list(reader.read_range("GwRows", ["Id", "V"], None, ["r9"], 10, deadline))
    except Exception:
        reader.forget()
        raise


def _read_range(world: World, deadline: Deadline) -> Any:
    return _read_range_with(_key_range_session(world), deadline)


def _key_range_session_made(world: World) -> None:
    _key_range_session(world).query("SELECT 1", Deadline.after(30.0))  # its session, made


def _first_read_range(world: World, deadline: Deadline) -> Any:
    from sharded_orm.spanner.key_ranges import KeyRangeSession

    # a new one: its first call makes its session (not deleted: left to expire, as a dead
    # server's would be)
    return _read_range_with(KeyRangeSession(world.database), deadline)


def _all_rows(result: Any) -> None:
    assert sorted(tuple(r) for r in result) == ROWS, result


def _partitions(world: World, deadline: Deadline) -> Any:
    from sharded_orm.spanner import snapshots

    with snapshots.snapshot_at(world.database, world.read_timestamp) as snapshot:
        return list(snapshots.partitions(snapshot, "SELECT Id, V FROM GwRows", deadline))


def _some_partitions(result: Any) -> None:
    assert len(result) >= 1, result


def _partition_rows(world: World, deadline: Deadline) -> Any:
    from sharded_orm.spanner import snapshots

    with snapshots.snapshot_at(world.database, world.read_timestamp) as snapshot:
        rows: list[Any] = []
        for batch in snapshots.partitions(snapshot, "SELECT Id, V FROM GwRows", deadline):
            rows.extend(list(r) for r in snapshots.partition_rows(snapshot, batch, deadline))
        return rows


def _calls(world: World) -> Any:
    from sharded_orm.spanner.pdml import SpannerCalls

    calls = world.kept.get("calls")
    if calls is None:
        calls = world.kept["calls"] = SpannerCalls(world.database)
    return calls


def _pdml_calls_made(world: World) -> None:
    _calls(world).query("SELECT 1", Deadline.after(30.0))  # its session, made


def _pdml_query(world: World, deadline: Deadline) -> Any:
    return _calls(world).query("SELECT COUNT(*) FROM GwRows", deadline)


def _counted(result: Any) -> None:
    assert result == [[len(ROWS)]], result


def _pdml_first_query(world: World, deadline: Deadline) -> Any:
    from sharded_orm.spanner.pdml import SpannerCalls

    calls = SpannerCalls(world.database)  # a new one: its first call makes its session
    try:
        return calls.query("SELECT COUNT(*) FROM GwRows", deadline)
    finally:
        calls.session = None  # (not deleted: left to expire, as a dead server's would be)


def _pdml_update(world: World, deadline: Deadline) -> Any:
    return _calls(world).partitioned_update("UPDATE GwRows SET V = V WHERE TRUE", deadline)


def _updated(result: Any) -> None:
    assert result >= 0, result


def _pdml_session(world: World) -> None:
    from sharded_orm.spanner.pdml import SpannerCalls

    calls = world.kept["closing"] = SpannerCalls(world.database)
    calls.query("SELECT 1", Deadline.after(30.0))  # a session to delete


def _pdml_close(world: World, deadline: Deadline) -> Any:
    calls = world.kept.pop("closing")
    calls.close()
    return calls.session


def _closed(result: Any) -> None:
    assert result is None


def _never(exc: BaseException) -> bool:
    return False


ENTRIES: list[Entry] = [
    Entry("admin:send_ddl", "UpdateDatabaseDdl", _send_ddl, _sent_ddl, "raised"),
    Entry("admin:poll_ddl", "GetOperation", _poll_ddl, _polled, "raised"),
    Entry("admin:send_split_points", "AddSplitPoints", _send_split_points, _split_answered,
          "raised"),
    Entry("snapshots:strong_first_row", "ExecuteStreamingSql", _strong_first_row, _first_row,
          "retried", streaming=True, silence=_timed_out),
    # (its read-only transaction is begun at the first listing of partitions)
    Entry("snapshots:snapshot_at", "BeginTransaction", _partitions, _some_partitions,
          "retried", silence=_timed_out),
    Entry("snapshots:partitions", "PartitionQuery", _partitions, _some_partitions, "retried",
          silence=_timed_out),
    Entry("snapshots:partition_rows", "ExecuteStreamingSql", _partition_rows, _all_rows,
          "retried", streaming=True, silence=_timed_out),
    Entry("pdml:SpannerCalls.query", "CreateSession", _pdml_first_query, _counted, "raised"),
    # (the kept SpannerCalls' session made first: a cell run alone reaches its method)
    Entry("pdml:SpannerCalls.query", "ExecuteStreamingSql", _pdml_query, _counted, "raised",
          streaming=True, prepare=_pdml_calls_made),
    Entry("pdml:SpannerCalls.partitioned_update", "BeginTransaction", _pdml_update, _updated,
          "raised", prepare=_pdml_calls_made),
    Entry("pdml:SpannerCalls.partitioned_update", "ExecuteStreamingSql", _pdml_update,
          _updated, "raised", streaming=True, prepare=_pdml_calls_made),
    # copy_table's reads (the backfill's are in test_backfill_faults.py): the stub's stream,
    # which the client does not restart; a cut one is raised and read again
    Entry("key_ranges:KeyRangeSession.read_range", "CreateSession", _first_read_range,
          _all_rows, "raised", silence=_timed_out),
    Entry("key_ranges:KeyRangeSession.read_range", "StreamingRead", _read_range, _all_rows,
          "raised", streaming=True, silence=_timed_out, prepare=_key_range_session_made),
    # best effort: it swallows every error, and must still end in time
    Entry("pdml:SpannerCalls.close", "DeleteSession", _pdml_close, _closed, "raised",
          silence=_never, prepare=_pdml_session),
]  # fmt: skip

#: Public names of the gateway modules that make no call to Spanner, and why.
NO_CALL = {
    "admin:DdlOperation": "a value",
    "admin:SplitKey": "a protocol",
    "admin:admin_api": "hands out the client's admin stub; no RPC",
    "admin:is_failed_precondition": "a predicate on errors",
    "admin:is_not_implemented": "a predicate on errors",
    "admin:is_silence": "a predicate on errors",
    "admin:operation_error": "builds an exception",
    "admin:split_point_requests": "builds requests",
    "snapshots:CallFailure": "a value",
    "snapshots:call_failure": "reads an error",
    "pdml:list_value": "wire encoding",
    "pdml:param_type": "wire encoding",
    "pdml:wire_value": "wire encoding",
}

#: Cells other tests cover (an entry's id or a DB-API path, the kind): the test's id.
COVERED = {
    ("admin:send_ddl@UpdateDatabaseDdl", "lost reply"):
        "test_schema_change_deadlines.py::test_lost_reply_of_the_send_finds_the_operation_by_its_id",
    ("admin:send_split_points@AddSplitPoints", "silent, through presplit"):
        "test_gateway.py::test_presplit_on_a_silent_server_ends_within_its_timeout",
    ("dbapi:read (connection.py, statements.py)", "silent"):
        "test_read_deadlines.py::test_silent_server_before_the_first_row",
    ("dbapi:read (connection.py, statements.py)", "silent mid-result"):
        "test_read_deadlines.py::test_silent_server_mid_result",
    ("dbapi:read (connection.py, statements.py)", "reset"):
        "test_read_deadlines.py::test_a_cut_stream_is_resumed",
    ("dbapi:read (connection.py, statements.py)", "reset, server gone"):
        "test_read_deadlines.py::test_a_cut_stream_with_the_server_gone_fails_within_the_deadline",
    ("dbapi:executemany (statements.py)", "silent"):
        "test_call_bounds.py::test_batched_dml_ends_within_the_statement_s_deadline",
    ("dbapi:commit (commits.py)", "silent"):
        "test_commit_deadlines.py::test_a_commit_that_does_not_finish_ends_in_time_with_its_outcome_unknown",
    ("dbapi:autocommit DML commit (connection.py)", "silent"):
        "test_deadline_leftovers.py::test_the_commit_inside_run_in_transaction_ends_within_the_statement_s_deadline",
    ("dbapi:autocommit partitioned DML (connection.py)", "silent"):
        "test_deadline_leftovers.py::test_partitioned_dml_in_autocommit_mode_ends_within_the_statement_s_deadline",
    ("dbapi:lost session rebuilt (connection.py)", "silent"):
        "test_deadline_leftovers.py::test_rebuilding_a_lost_session_ends_within_the_statement_s_deadline",
    ("dbapi:lost session (connection.py)", "reset"):
        "test_call_bounds.py::test_a_transaction_that_lost_its_session_fails_clearly_and_commits_nothing",
}  # fmt: skip


# --------------------------------------------------------------------------- the split server


class _Splits:
    """AddSplitPoints on an in-process server, playing the kind it is set to."""

    def __init__(self) -> None:
        self.kind = "normal"
        self.answered = 0

    def add_split_points(self, request: Any, context: Any) -> Any:
        import grpc
        from google.cloud.spanner_admin_database_v1.types import AddSplitPointsResponse

        kind, self.kind = self.kind, "normal"  # one fault, as the proxy's
        if kind == "silent":
            end = time.monotonic() + SILENCE
            while context.is_active() and time.monotonic() < end:
                time.sleep(0.02)
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "silent")
        if kind == "reset":
            context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset")
        if kind == "slow":
            time.sleep(SLOW)
        self.answered += 1
        return AddSplitPointsResponse()


@pytest.fixture(scope="module")
def split_server() -> Iterator[tuple[Any, _Splits]]:
    from sharded_orm.testing.split_server import split_server

    splits = _Splits()
    with split_server(splits.add_split_points, workers=4) as server:
        yield server.database, splits


# --------------------------------------------------------------------------- the world


@pytest.fixture(scope="module")
def world(spanner_emulator: Any, split_server: tuple[Any, _Splits]) -> Iterator[World]:
    from sharded_orm.spanner import admin, snapshots
    from sharded_orm.spanner.mutations import database_of

    db = spanner_emulator.create_database(
        ["CREATE TABLE GwRows (Id STRING(36), V INT64) PRIMARY KEY (Id)"]
    )
    direct = spanner_emulator.engine(db)
    with direct.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO GwRows (Id, V) VALUES (:i, :v)"),
            [{"i": i, "v": v} for i, v in ROWS],
        )
    with SlowProxy(spanner_emulator.host) as proxy:
        engine = proxy.emulator(spanner_emulator).engine(db)
        database = database_of(engine)
        operation_id = f"op_{uuid.uuid4().hex[:16]}"
        admin.send_ddl(
            database, ["CREATE TABLE Done (Id INT64) PRIMARY KEY (Id)"], operation_id,
            Deadline.after(60.0),
        )  # fmt: skip
        for _ in range(600):
            if admin.poll_ddl(database, operation_id, Deadline.after(10.0)).done:
                break
            time.sleep(0.1)
        _, at = snapshots.strong_first_row(database, "SELECT 1", Deadline.after(30.0))
        here = World(proxy, database, operation_id, at, splits=split_server)
        try:
            yield here
        finally:
            engine.dispose()
            direct.dispose()


def _fault(world: World, entry: Entry, kind: str) -> None:
    proxy = world.proxy
    if entry.method == "AddSplitPoints":
        world.splits[1].kind = kind
        return
    if kind == "silent":
        for method in (entry.method, *SESSION_METHODS):
            proxy.hang(method, SILENCE, times=1000)
    elif kind == "reset" and entry.streaming:
        proxy.cut_stream(entry.method, after=0)
    elif kind == "reset":
        proxy.fail(entry.method, "UNAVAILABLE", message="connection reset by FaultProxy")
    else:
        proxy.slow(entry.method, SLOW)


def _calls_of(world: World, entry: Entry) -> int:
    if entry.method == "AddSplitPoints":
        return 1  # (the split server counts its answers, checked by the driver)
    return int(world.proxy.count(entry.method))


def run_cell(world: World, entry: Entry, kind: str) -> None:
    """Make ``entry``'s call with the server ``kind`` and check what it did."""
    world.proxy.clear()
    entry.prepare(world)
    _fault(world, entry, kind)
    start = time.monotonic()
    error: BaseException | None = None
    result: Any = None
    try:
        try:
            result = entry.drive(world, Deadline.after(DEADLINE, "the matrix's deadline"))
        except Exception as exc:  # judged below
            error = exc
        took = time.monotonic() - start
        reached = _calls_of(world, entry)
    finally:
        world.proxy.clear()
        world.splits[1].kind = "normal"
    bound = (2.0 if entry.call.endswith(".close") else DEADLINE) + MARGIN
    print(f"\n{entry.id}, {kind}: requested {DEADLINE:g} s, observed {took:.2f} s")
    assert reached >= 1, f"{entry.id}: the fault's method {entry.method} was never called"
    assert took < bound, f"{entry.id}, {kind}: took {took:.2f} s (deadline {DEADLINE:g} s)"
    if kind == "slow" or (kind == "reset" and entry.reset == "retried"):
        assert error is None, f"{entry.id}, {kind}: {error!r}"
        entry.expect(result)
        return
    if entry.silence is _never:  # best effort: it ends in time, whatever the server did
        assert error is None, f"{entry.id}, {kind}: {error!r}"
        return
    assert error is not None, f"{entry.id}, {kind}: no error, got {result!r}"
    assert entry.silence(error), f"{entry.id}, {kind}: not read as 'no answer': {error!r}"
    if kind == "reset":  # what the caller does with it: send it again, and it answers
        entry.prepare(world)
        entry.expect(entry.drive(world, Deadline.after(30.0)))


# --------------------------------------------------------------------------- the tests

CELLS = [(e, k) for e in ENTRIES for k in KINDS]
QUICK = {
    "silent": "key_ranges:KeyRangeSession.read_range@StreamingRead",
    "reset": "pdml:SpannerCalls.query@ExecuteStreamingSql",
    "slow": "admin:send_split_points@AddSplitPoints",
}


def _entry(entry_id: str) -> Entry:
    (entry,) = [e for e in ENTRIES if e.id == entry_id]
    return entry


@pytest.mark.emulator
def test_a_silent_server_ends_a_gateway_call_within_its_deadline(world: World) -> None:
    run_cell(world, _entry(QUICK["silent"]), "silent")


@pytest.mark.emulator
def test_a_reset_gateway_call_is_retried_or_raised_as_retryable(world: World) -> None:
    run_cell(world, _entry(QUICK["reset"]), "reset")


@pytest.mark.emulator
def test_a_slow_server_within_the_deadline_answers_a_gateway_call(world: World) -> None:
    run_cell(world, _entry(QUICK["slow"]), "slow")


# every gateway call x {silent, reset, slow}, ~30 s; quick loop:
# test_a_silent_server_ends_a_gateway_call_within_its_deadline,
# test_a_reset_gateway_call_is_retried_or_raised_as_retryable,
# test_a_slow_server_within_the_deadline_answers_a_gateway_call
@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.parametrize(
    ("entry", "kind"),
    [(e, k) for e, k in CELLS if QUICK[k] != e.id],
    ids=[f"{e.id}-{k}" for e, k in CELLS if QUICK[k] != e.id],
)
def test_every_gateway_call_under_every_fault(world: World, entry: Entry, kind: str) -> None:
    run_cell(world, entry, kind)


def _public(module: str) -> list[str]:
    tree = ast.parse((GATEWAY / f"{module}.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [str(name) for name in ast.literal_eval(node.value)]
    raise AssertionError(f"sharded_orm/spanner/{module}.py has no __all__")


def test_every_gateway_name_is_in_the_matrix() -> None:
    """A new public call in admin.py, snapshots.py, pdml.py or key_ranges.py must get an
    entry (or be listed in NO_CALL with why it makes no call)."""
    covered = {e.call.split(".")[0] for e in ENTRIES}
    missing, both = [], []
    for module in ("admin", "snapshots", "pdml", "key_ranges"):
        for name in _public(module):
            key = f"{module}:{name}"
            if key in covered and key in NO_CALL:
                both.append(key)
            elif key not in covered and key not in NO_CALL:
                missing.append(key)
    assert not missing, f"gateway calls with no entry in ENTRIES (or NO_CALL): {missing}"
    assert not both, f"in both ENTRIES and NO_CALL: {both}"
    stale = [k for k in NO_CALL if k.split(":")[1] not in _public(k.split(":")[0])]
    assert not stale, f"NO_CALL names no longer public: {stale}"


def test_the_covered_cells_name_tests_that_exist() -> None:
    for cell, test in COVERED.items():
        file, name = test.split("::")
        text = (HERE / file).read_text(encoding="utf-8")
        assert f"def {name}(" in text, f"{cell}: {test} not found"
