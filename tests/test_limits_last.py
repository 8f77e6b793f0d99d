"""The last Spanner limits the library's builders could cross (issue 41), each at the
limit - 1, the limit and the limit + 1:

* presplit's ``AddSplitPoints`` requests: at most 100 points and at most 1 MiB each
  (``SPANNER_SPLIT_REQUEST_BYTES``), counted from the request as serialised;
* the stored-source read's key arrays (``write.stored``, and the dual write's
  ``mirror_io.read_keys`` that uses it): under 10 MiB a request
  (``SPANNER_REQUEST_BYTES``), its keys' values counted as sent (BYTES as base64);
* names the library makes (the doctor's successor tables, shard columns, indexes and
  sequences; ``hashed_reference``'s columns): refused when longer than Spanner's 128
  characters (``SPANNER_NAME_LENGTH``), naming the name, its length and what to shorten.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from test_doctor import row, ts
from test_presplit import WideEvent
from test_presplit import split_server as split_server  # the mock AddSplitPoints server

from sharded_orm import HashedPrimaryKeyMixin, UTCDateTime, bulk_load, doctor, hashed_reference
from sharded_orm.checks import check_name_length
from sharded_orm.errors import ShardConfigError, ShardingError
from sharded_orm.limits import (
    SPANNER_NAME_LENGTH,
    SPANNER_REQUEST_BYTES,
    SPANNER_REQUEST_OVERHEAD,
    SPANNER_SPLIT_POINTS,
    SPANNER_SPLIT_REQUEST_BYTES,
    param_bytes,
)
from sharded_orm.load import presplit as ps
from sharded_orm.tools.doctor.fix import fix
from sharded_orm.write.stored import StoredRows

STEPS = [-1, 0, 1]

# ---------------------------------------------------------------------- presplit: bytes


def _requests(points: list[ps.SplitPoint], per_request: int, byte_limit: int) -> list[Any]:
    """presplit's AddSplitPoints requests for ``points``, as the gateway builds them."""
    from types import SimpleNamespace

    from sharded_orm.spanner import admin

    database = SimpleNamespace(name="projects/p/instances/i/databases/d")
    expire = dt.datetime(2030, 1, 1, 12, 0, 0, 123456, tzinfo=dt.timezone.utc)
    return admin.split_point_requests(
        database, points, expire_at=expire, initiator="x", per_request=per_request,
        byte_limit=byte_limit,
    )  # fmt: skip


def _request_size(request: Any) -> int:
    from google.cloud.spanner_admin_database_v1.types import AddSplitPointsRequest

    return int(AddSplitPointsRequest.pb(request).ByteSize())


def _points_of_size(total: int, count: int) -> list[ps.SplitPoint]:
    """``count`` points on one index whose request is exactly ``total`` bytes serialised:
    long string keys (as a STRING key column of 10 KiB values would give), the first
    padded to the byte."""
    keys = ["k" * 10_500 for _ in range(count)]
    for _ in range(20):  # a varint's length may shift by a byte: converge
        points = [ps.SplitPoint("T", "TByKey", (k,)) for k in keys]
        [request] = _requests(points, count, 10 * total)
        missing = total - _request_size(request)
        if missing == 0:
            return points
        keys[0] += "k" * missing if missing > 0 else ""
        if missing < 0:
            keys[0] = keys[0][:missing]
    raise AssertionError("could not size the points")


@pytest.mark.parametrize("step", STEPS)
def test_split_requests_hold_at_most_one_mib(step: int) -> None:
    """100 points of 10 KiB keys, one request of exactly 1 MiB - 1, 1 MiB and 1 MiB + 1
    bytes: one request, one, and two (each under 1 MiB), every point once, in order."""
    points = _points_of_size(SPANNER_SPLIT_REQUEST_BYTES + step, SPANNER_SPLIT_POINTS)
    bodies = _requests(points, ps.MAX_POINTS_PER_REQUEST, SPANNER_SPLIT_REQUEST_BYTES)
    sizes = [_request_size(b) for b in bodies]
    assert len(bodies) == (2 if step > 0 else 1)
    assert max(sizes) <= SPANNER_SPLIT_REQUEST_BYTES
    sent = [k.key_parts[0] for b in bodies for g in b.split_points for k in g.keys]
    assert sent == [p.key[0] for p in points]


@pytest.mark.parametrize("limit", [150, 300, 1000, 5000])
def test_presplit_cuts_its_requests_by_bytes_as_sent(split_server: Any, limit: int) -> None:
    """presplit(request_bytes=...) on the mock server: each request it sent is at most the
    limit as serialised, each but the last could not have held the next point, and every
    point is sent once, in order."""
    from google.cloud.spanner_admin_database_v1.types import AddSplitPointsRequest

    engine, recorder = split_server
    report = presplit_all(engine, limit)
    sizes = [AddSplitPointsRequest.pb(r).ByteSize() for r in recorder.requests]
    assert report.requests == len(recorder.requests) and max(sizes) <= limit
    sent = [
        (sp.table, sp.index, k.key_parts[0]) for r in recorder.requests for sp in r.split_points
        for k in sp.keys
    ]  # fmt: skip
    assert sent == [(p.table, p.index or "", str(p.key[0])) for p in report.points]
    for r, after in zip(recorder.requests, recorder.requests[1:], strict=False):
        # the next request's first point, added to this one, would pass the limit
        first = after.split_points[0]
        grown = copy.deepcopy(AddSplitPointsRequest.pb(r))
        same = [g for g in grown.split_points if (g.table, g.index) == (first.table, first.index)]
        if same:
            same[0].keys.append(AddSplitPointsRequest.pb(after).split_points[0].keys[0])
        else:
            g = grown.split_points.add()
            g.CopyFrom(AddSplitPointsRequest.pb(after).split_points[0])
            del g.keys[1:]
        assert grown.ByteSize() > limit or sum(len(g.keys) for g in r.split_points) == 100


def presplit_all(engine: Any, limit: int) -> ps.PresplitReport:
    return ps.presplit(engine, WideEvent, request_bytes=limit)


def test_presplit_refuses_a_bad_request_bytes(split_server: Any) -> None:
    engine, _ = split_server
    with pytest.raises(ShardingError, match="request_bytes"):
        ps.presplit(engine, WideEvent, request_bytes=0)


# ---------------------------------------------------------------------- the key arrays' bytes

#: a key of 8,000 bytes: under Spanner's 8 KiB a key, 10,676 bytes as base64 in a request
KEY_BYTES = 8000


class _Keys(DeclarativeBase):
    pass


class BlobKeyed(_Keys):
    __tablename__ = "LlBlobKeyed"
    k: Mapped[bytes] = mapped_column("K", sa.LargeBinary(), primary_key=True)
    a: Mapped[str] = mapped_column("A", sa.String(20))


def _key(i: int) -> bytes:
    return i.to_bytes(4, "big") * (KEY_BYTES // 4)


class _Requests:
    """The SELECTs an engine sends on a table, each as the bytes its request carries: the
    SQL text and its parameters' values (BYTES as base64, as the wire carries them)."""

    def __init__(self, engine: sa.Engine, table: str) -> None:
        self.engine, self.table = engine, table
        self.sizes: list[int] = []
        self.sql: list[str] = []
        sa.event.listen(engine, "before_cursor_execute", self._record)

    def _record(self, conn: Any, cursor: Any, sql: str, params: Any, *_: Any) -> None:
        if sql.lstrip().upper().startswith("SELECT") and self.table in sql:
            values = params.values() if isinstance(params, dict) else params or ()
            wire = [_wire(v) for v in values]
            self.sizes.append(len(sql.encode()) + sum(len(w) for w in wire))
            self.sql.append(sql)

    def close(self) -> None:
        sa.event.remove(self.engine, "before_cursor_execute", self._record)


def _wire(v: Any) -> bytes:
    """A parameter's value as the Spanner client sends it: BYTES as base64 (bytes that are
    valid base64 already, as the dialect's bind processor makes them, as they are)."""
    if isinstance(v, (list, tuple)):
        return b"".join(_wire(x) for x in v)
    if isinstance(v, (bytes, bytearray)):
        try:
            base64.b64decode(v, validate=True)
        except ValueError:
            return base64.b64encode(v)
        return bytes(v)
    return str(v).encode()


def _read(engine: sa.Engine, n: int) -> tuple[dict[bytes, Any], _Requests]:
    """StoredRows' read of column A at the first ``n`` keys, and the requests it sent."""
    table = BlobKeyed.__table__
    pinned = {"K": sa.bindparam("so_key_0")}
    rows = [{"so_key_0": _key(i)} for i in range(n)]
    requests = _Requests(engine, "LlBlobKeyed")
    try:
        with engine.connect() as c:
            found = StoredRows(c, table, list(table.primary_key.columns), pinned, rows).batch(["A"])
    finally:
        requests.close()
    return {bytes(k): v for k, v in found.items()}, requests


def _keys_fitting(sql: str) -> int:
    """How many of these keys one read may hold under 10 MiB: as the library counts a
    key (param_bytes, and 8 for its place in the array), its SQL text and the request's
    own fields (SPANNER_REQUEST_OVERHEAD) left their room."""
    room = SPANNER_REQUEST_BYTES - len(sql.encode()) - SPANNER_REQUEST_OVERHEAD
    return room // (param_bytes(_key(0)) + 8)


@pytest.fixture
def blob_engine(engine: sa.Engine) -> Iterator[sa.Engine]:
    _Keys.metadata.create_all(engine)
    yield engine
    _Keys.metadata.drop_all(engine)


@pytest.mark.slow
@pytest.mark.parametrize("step", [*STEPS, "batch"])
def test_the_key_arrays_stay_under_ten_mib(blob_engine: sa.Engine, step: Any) -> None:
    """Stored rows read at about a thousand 8,000-byte BYTES keys (10,668 bytes each as
    sent, base64; by count alone 1,000 go in one read, 10.7 MB): one under, at and one
    over what one read holds under 10 MiB, and 999 keys (one read by count, which sent
    10.66 MB before): every row read, exactly, and on Spanner each read under 10 MiB as
    sent, in as few reads as that allows."""
    engine = blob_engine
    _, one = _read(engine, 1)  # its SQL text, to count the keys that fit beside it
    fits = _keys_fitting(one.sql[0])
    n = 999 if step == "batch" else fits + step
    assert 900 < n < 1000  # under the 1,000 keys a read holds by count
    bulk_load(
        engine,
        BlobKeyed,
        [{"K": _key(i), "A": f"a{i}"} for i in range(n + 5)],
        progress=False,
        workers=1,
    )
    found, requests = _read(engine, n)
    assert found == {_key(i): f"a{i}" for i in range(n)}
    if engine.dialect.name != "sqlite":
        assert max(requests.sizes) <= SPANNER_REQUEST_BYTES
        assert len(requests.sizes) == (1 if n <= fits else 2)


def test_param_bytes_counts_bytes_as_base64() -> None:
    assert param_bytes(b"x" * 3000) == 4000 + 8
    assert param_bytes("é" * 10) == 20 + 8
    assert param_bytes([b"abc", "d"]) == 8 + (4 + 8) + (1 + 8)


# ---------------------------------------------------------------------- names: 128 characters


@pytest.mark.parametrize("step", STEPS)
def test_check_name_length_at_the_limit(step: int) -> None:
    name = "N" * (SPANNER_NAME_LENGTH + step)
    if step <= 0:
        assert check_name_length(name, "the table", "Shorten it.") == name
        return
    with pytest.raises(ShardConfigError) as err:
        check_name_length(name, "the table", "Shorten it.")
    text = str(err.value)
    assert name in text and "129 characters long" in text and "at most 128" in text


def _index_model(index: str) -> tuple[Any, list[dict[str, Any]]]:
    class B(DeclarativeBase):
        pass

    class Logs(B):
        __tablename__ = "Logs"
        id: Mapped[str] = mapped_column("Id", sa.String(36), primary_key=True)
        ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime)
        __table_args__ = (sa.Index(index, "Ts"),)

    return Logs, [row(m, f"{index}({ts(m)})", "<end>") for m in range(3)]


def _key_model(table: str) -> tuple[Any, list[dict[str, Any]]]:
    class B(DeclarativeBase):
        pass

    attrs = {
        "__tablename__": table,
        "ts": mapped_column("Timestamp", UTCDateTime, primary_key=True),
        "log_id": mapped_column("LogId", sa.String(36), primary_key=True),
    }
    model = type("LongLog", (B,), attrs)
    rows = [
        row(m, f'{table}({ts(m, -5)},"a1")', "<end>", reasons=["MOVING_HOT_SPOT"])
        for m in range(15)
    ]
    return model, rows


def _sequence_model(table: str) -> tuple[Any, list[dict[str, Any]]]:
    class B(DeclarativeBase):
        pass

    attrs = {
        "__tablename__": table,
        "id": mapped_column(
            "OrderId", sa.BigInteger, primary_key=True, info={"sharded_orm.sequential": True}
        ),
    }
    model = type("LongOrder", (B,), attrs)
    return model, [row(m, f"{table}({1000 * m + 17})", "<end>") for m in range(12)]


# (the model maker, the fixed part the doctor adds to the given name, the change, what)
NAMED = {
    "index": (_index_model, len("Sharded"), "shard_index", "index name"),
    "successor table": (_key_model, len("Sharded"), "key_reshard", "table name"),
    "sequence": (_sequence_model, len("OrderIdSequence"), "bit_reversed", "sequence name"),
}


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("kind", sorted(NAMED))
def test_the_doctors_names_are_held_to_128(kind: str, step: int) -> None:
    """The name the doctor makes for a new index (``<Index>Sharded``), a successor table
    (``<Table>Sharded``) or a sequence (``<Table><Column>Sequence``) of 127, 128 and 129
    characters: planned, planned, refused before any DDL, naming the name, its length and
    the given name to shorten."""
    make, added, change, what = NAMED[kind]
    given = "G" * (SPANNER_NAME_LENGTH + step - added)
    model, rows = make(given)
    diagnosis = doctor(rows, [model])
    if step <= 0:
        report = fix(diagnosis, [model])
        assert [c.kind for c in report.changes] == [change]
        return
    with pytest.raises(ShardConfigError) as err:
        fix(diagnosis, [model])
    text = str(err.value)
    assert f"the new {what}" in text and "129 characters long" in text
    assert f"made from {given!r}" in text
    assert "shorter name" in text


@pytest.mark.parametrize("step", STEPS)
def test_hashed_reference_columns_are_held_to_128(step: int) -> None:
    """``hashed_reference(prefix=...)`` makes ``<prefix>_hashed_id``: a prefix of 117, 118
    and 119 characters gives a name of 127, 128 and 129: the last refused, saying so."""

    class B(DeclarativeBase):
        pass

    class Parent(HashedPrimaryKeyMixin, B):
        __tablename__ = "LlParents"

    class Child(B):
        __tablename__ = "LlChildren"
        id: Mapped[int] = mapped_column("Id", sa.BigInteger, primary_key=True)

    prefix = "p" * (SPANNER_NAME_LENGTH + step - len("_hashed_id"))
    if step <= 0:
        hashed_reference(Child, Parent, prefix=prefix)
        assert f"{prefix}_hashed_id" in Child.__table__.c
        return
    with pytest.raises(ShardConfigError, match="129 characters long.*at most 118 characters"):
        hashed_reference(Child, Parent, prefix=prefix)
