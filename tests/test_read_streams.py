"""A result stream that fails after some rows ends the read with an error, never with
fewer rows.

Spanner sends resume tokens as it streams, so the client hands rows over as they arrive;
when the stream then stalls past its deadline or is cut for good, the Spanner DB-API's
fetch caught the error and returned the rows read so far: ``merged()`` returned 1,011 of
3,000 rows, ``page()`` 34 rows and no next cursor, a plain ``.all()`` 10,055 of 60,000,
all without an error. The emulator sends no resume tokens (the client reads a whole
result before its first row, so every fault landed in ``execute``), and our fault proxy
now adds them (``FaultProxy(resume_tokens=True)``), as Spanner does.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from google.api_core import exceptions as api
from google.cloud.spanner_dbapi import Cursor
from google.cloud.spanner_dbapi import exceptions as dbapi
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import ShardedIndex, UTCDateTime, merged, page, shard_column, sharded_select
from sharded_orm.spanner.deadlines import DeadlineCursor
from sharded_orm.testing.faults import FaultProxy

DEADLINE = 2.0
SLACK = 3.0
ROWS = 60
PAD = 50_000  # 3 MB in all: a result of several messages
T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


class Base(DeclarativeBase):
    pass


class Big(Base):
    __tablename__ = "bigs"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    pad: Mapped[str] = mapped_column(sa.String(PAD))
    s: Mapped[int] = shard_column("id", count=8)
    __table_args__ = (ShardedIndex("bigs_by_ts", sa.desc("ts"), shard="s"),)


@pytest.fixture
def streamed(spanner_emulator: Any) -> Iterator[tuple[sa.Engine, FaultProxy]]:
    """An engine through a proxy that streams as Spanner does, on a table of big rows."""
    with FaultProxy(spanner_emulator.host, resume_tokens=True) as proxy:
        engine = proxy.emulator(spanner_emulator).engine(spanner_emulator.create_database())
        Base.metadata.create_all(engine)
        for start in range(0, ROWS, 20):  # a commit stays under the 4 MB request limit
            with engine.begin() as conn:
                conn.execute(
                    Big.__table__.insert(),
                    [
                        {"id": i, "ts": T0 + dt.timedelta(seconds=i), "pad": "x" * PAD}
                        for i in range(start, start + 20)
                    ],
                )
        proxy.clear()
        try:
            yield engine, proxy
        finally:
            proxy.clear()
            engine.dispose()


def newest() -> Any:
    return sharded_select(Big, index="bigs_by_ts").order_by(Big.ts.desc())


def _reads(engine: sa.Engine) -> dict[str, Any]:
    """Each way a user reads the table, within ``DEADLINE``: (what it returns)."""
    opts = {"timeout": DEADLINE}

    def merged_rows() -> list[Any]:
        with engine.connect() as conn:
            return merged(conn, newest(), ROWS, timeout=DEADLINE)

    def merged_entities() -> list[Any]:
        with Session(engine) as session:
            return merged(session, newest(), ROWS, timeout=DEADLINE)

    def a_page() -> list[Any]:
        with engine.connect() as conn:
            got = page(conn, newest(), ROWS - 1, timeout=DEADLINE)
            assert got.next_cursor is not None
            return got.rows

    def orm_all() -> list[Any]:
        with Session(engine) as session:
            return session.execute(newest(), execution_options=opts).scalars().all()

    def yield_per() -> list[Any]:  # fetchmany
        with Session(engine) as session:
            opts_many = {**opts, "yield_per": 7}
            return list(session.execute(newest(), execution_options=opts_many).scalars())

    def core_one_by_one() -> list[Any]:  # fetchone
        with engine.connect() as conn:
            result = conn.execution_options(**opts).execute(sa.select(Big.__table__))
            rows = []
            while (row := result.fetchone()) is not None:
                rows.append(row)
            return rows

    return {
        "merged, rows": merged_rows,
        "merged, entities": merged_entities,
        "page": a_page,
        "ORM .all()": orm_all,
        "yield_per": yield_per,
        "fetchone": core_one_by_one,
    }


READS = ["merged, rows", "merged, entities", "page", "ORM .all()", "yield_per", "fetchone"]


@pytest.mark.emulator
@pytest.mark.parametrize("read", READS)
def test_every_read_is_whole_through_resume_tokens(
    streamed: tuple[sa.Engine, FaultProxy], read: str
) -> None:
    """The proxy's tokens change nothing for a healthy stream, and a stream cut once is
    resumed from its token with no row lost or repeated."""
    engine, proxy = streamed
    run = _reads(engine)[read]
    ids = sorted(r.id for r in run())
    want = list(range(ROWS)) if read != "page" else sorted(range(1, ROWS))
    assert ids == want
    proxy.cut_stream("ExecuteStreamingSql", after=1)
    assert sorted(r.id for r in run()) == want
    assert proxy.pending == 0  # the cut happened, and the read resumed past it


# 12 fault cases; quick loop: test_every_read_is_whole_through_resume_tokens,
# test_our_fetches_raise_what_ended_the_stream
@pytest.mark.slow
@pytest.mark.emulator
@pytest.mark.parametrize("fault", ["silent", "cut for good"])
@pytest.mark.parametrize("read", READS)
def test_a_stream_that_fails_mid_result_ends_the_read_with_an_error(
    streamed: tuple[sa.Engine, FaultProxy], read: str, fault: str
) -> None:
    engine, proxy = streamed
    if fault == "silent":
        proxy.stall_stream("ExecuteStreamingSql", 3600, after=1, times=100)
    else:
        proxy.cut_stream("ExecuteStreamingSql", after=1, times=1000)
    started = time.monotonic()
    with pytest.raises(sa.exc.OperationalError, match="can be retried") as caught:
        got = _reads(engine)[read]()
        pytest.fail(f"{len(got)} of {ROWS} rows came back with no error")
    took = time.monotonic() - started
    assert took < DEADLINE + SLACK, f"the read took {took:.1f} s, deadline {DEADLINE} s"
    assert "deadline" in str(caught.value) or "connection" in str(caught.value)


# ------------------------------------------------- the DB-API's fetch, and ours over it


class _Connection:
    read_only = True
    is_closed = False
    _client_transaction_started = False


def _cursor(kind: type[Cursor], rows: list[list[int]], error: Exception) -> Cursor:
    """A cursor whose result gives ``rows``, then fails with ``error``."""

    def stream() -> Iterator[list[int]]:
        yield from rows
        raise error

    cursor = kind.__new__(kind)  # no connection: only the fetch is exercised
    cursor.connection = _Connection()
    cursor._is_closed = False
    cursor._in_retry_mode = True  # no transaction to record the fetch for
    cursor._itr = stream()
    if isinstance(cursor, DeadlineCursor):
        cursor.deadline_seconds = DEADLINE
        cursor.stream_error = None
    return cursor


def test_upstream_fetch_still_returns_the_rows_before_a_stream_error() -> None:
    """Trips when the Spanner DB-API raises a stream's error from its fetches itself:
    ``DeadlineCursor`` then need not keep it."""
    cursor = _cursor(Cursor, [[1], [2]], api.DeadlineExceeded("stalled"))
    assert cursor.fetchall() == [[1], [2]]


@pytest.mark.parametrize("fetch", ["fetchall", "fetchmany", "fetchone"])
@pytest.mark.parametrize(
    ("error", "says"),
    [
        (api.DeadlineExceeded("stalled"), "can be retried"),
        (api.ServiceUnavailable("gone"), "can be retried"),
        (api.InternalServerError("boom"), "the result is incomplete"),
        (api.ResourceExhausted("busy"), "the result is incomplete"),
    ],
)
def test_our_fetches_raise_what_ended_the_stream(fetch: str, error: Exception, says: str) -> None:
    cursor = _cursor(DeadlineCursor, [[1]] if fetch == "fetchone" else [[1], [2]], error)
    if fetch == "fetchone":
        assert cursor.fetchone() == [1]
    with pytest.raises(dbapi.OperationalError, match=says) as caught:
        getattr(cursor, fetch)(*([5] if fetch == "fetchmany" else []))
    assert caught.value.__cause__ is error
    cursor._itr = iter([[3]])  # a later fetch that succeeds raises nothing
    assert cursor.fetchall() == [[3]]
