"""copy_table reads its key ranges on one session of its own (the gateway's
``KeyRangeSession``, as the backfill does): made at its first read, given up after a failed
read so that the retry starts a new one, and deleted when the copy ends.

A proxy in front of the emulator notes the session of every call it forwards, so the tests
see which sessions the copy's ``StreamingRead`` calls ran on, where they came from, and
what became of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from sharded_orm import shard_column
from sharded_orm.testing.faults import FaultProxy

ROWS = 30
BATCH = 7


class SessionsProxy(FaultProxy):
    """The fault proxy, noting ``(method, session name)`` of the calls it forwards: the
    session a call ran on, the one ``CreateSession`` made, the one ``DeleteSession``
    deleted."""

    def __init__(self, target: str) -> None:
        self.sessions: list[tuple[str, str]] = []
        super().__init__(target)

    def unary(self, method: str, name: str, request: bytes, context: Any) -> bytes:
        from google.cloud.spanner_v1 import types

        reply = super().unary(method, name, request, context)
        if name == "CreateSession":
            self.sessions.append((name, types.Session.deserialize(reply).name))
        elif name == "DeleteSession":
            self.sessions.append((name, types.DeleteSessionRequest.deserialize(request).name))
        elif name == "Commit":
            self.sessions.append((name, types.CommitRequest.deserialize(request).session))
        return reply

    def stream(self, method: str, name: str, request: bytes, context: Any) -> Iterator[bytes]:
        from google.cloud.spanner_v1 import types

        if name == "StreamingRead":
            self.sessions.append((name, types.ReadRequest.deserialize(request).session))
        elif name == "ExecuteStreamingSql":
            self.sessions.append((name, types.ExecuteSqlRequest.deserialize(request).session))
        yield from super().stream(method, name, request, context)

    def of(self, method: str) -> list[str]:
        """The sessions of the ``method`` calls forwarded, in arrival order."""
        return [s for m, s in self.sessions if m == method]


def _tables() -> tuple[sa.Table, sa.Table]:
    md = sa.MetaData()
    src = sa.Table(
        "ReaderSrc", md,
        sa.Column("Id", sa.String(36), primary_key=True),
        sa.Column("V", sa.Integer, nullable=False),
    )  # fmt: skip
    dst = sa.Table(
        "ReaderDst", md,
        shard_column("Id", count=4, name="ShardId", primary_key=True).column,
        sa.Column("Id", sa.String(36), primary_key=True),
        sa.Column("V", sa.Integer, nullable=False),
    )  # fmt: skip
    return src, dst


@pytest.fixture
def copied(spanner_emulator: Any) -> Iterator[tuple[SessionsProxy, sa.Engine, sa.Engine]]:
    """A source table of :data:`ROWS` rows, its target, a proxy noting sessions, an
    engine through it and one straight to the emulator."""
    db = spanner_emulator.create_database()
    direct = spanner_emulator.engine(db)
    src, _ = _tables()
    src.metadata.create_all(direct)
    with direct.begin() as conn:
        conn.execute(src.insert(), [{"Id": f"k{i:04d}", "V": i} for i in range(ROWS)])
    proxy = SessionsProxy(spanner_emulator.host)
    engine = proxy.emulator(spanner_emulator).engine(db)
    try:
        yield proxy, engine, direct
    finally:
        engine.dispose()
        direct.dispose()
        proxy.stop()


def _target_rows(direct: sa.Engine) -> list[tuple[Any, ...]]:
    _, dst = _tables()
    with direct.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(dst.c.Id, dst.c.V).order_by(dst.c.Id))]


EVERY_ROW = [(f"k{i:04d}", i) for i in range(ROWS)]


@pytest.mark.emulator
def test_a_copy_reads_on_one_session_of_its_own_and_deletes_it_at_the_end(
    copied: tuple[SessionsProxy, sa.Engine, sa.Engine],
) -> None:
    from sharded_orm.load.copy import copy_table

    proxy, engine, direct = copied
    src, dst = _tables()
    result = copy_table(engine, src, dst, batch_size=BATCH, progress_mode="off")
    assert result.rows == ROWS and _target_rows(direct) == EVERY_ROW
    reads = proxy.of("StreamingRead")
    assert len(reads) == -(-ROWS // BATCH)  # one read a batch (the last one short)
    (session,) = set(reads)  # every read on one session
    assert proxy.of("CreateSession").count(session) == 1  # made for the copy
    assert proxy.of("DeleteSession").count(session) == 1  # and deleted when it ended
    others = proxy.of("ExecuteStreamingSql") + proxy.of("Commit")
    assert session not in others  # the copy's reads, nothing else


@pytest.mark.emulator
def test_a_failed_read_is_retried_on_a_new_session_and_the_copy_completes(
    copied: tuple[SessionsProxy, sa.Engine, sa.Engine],
) -> None:
    """A read that failed may have lost its session (a server restart, an expired
    session): the copy's retry reads on a new one, never again on the old one, and the
    copy still copies every row once."""
    from sharded_orm.load.copy import copy_table

    proxy, engine, direct = copied
    src, dst = _tables()
    proxy.fail("StreamingRead", "UNAVAILABLE", times=1)  # the first read fails
    result = copy_table(engine, src, dst, batch_size=BATCH, progress_mode="off")
    assert proxy.count("StreamingRead", "failed UNAVAILABLE") == 1
    assert result.rows == ROWS and _target_rows(direct) == EVERY_ROW
    failed, *rest = proxy.of("StreamingRead")
    assert len(rest) == -(-ROWS // BATCH)
    (retried,) = set(rest)  # the retry and every later read: one new session
    assert retried != failed
    made = proxy.of("CreateSession")
    assert made.index(retried) > made.index(failed)  # made after the failure
    deleted = proxy.of("DeleteSession")
    assert retried in deleted  # the one in use is deleted at the end
    assert failed not in deleted  # (given up: the server may have lost it; it expires)
