"""``merged()``/``page()`` ``timeout=`` bounds the whole read, however many statements it
sends (a bound round, the rows, a read again under AUTOCOMMIT): each statement gets what
is left of it. Before, each statement got the whole ``timeout`` again, so a read of
two statements could take twice it (six times, read again)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from plans import forced
from sqlalchemy import event
from sqlalchemy.orm import Session
from test_read_deadlines import Base, Tick  # the same model, its faults apart

from sharded_orm import merged, page, sharded_select
from sharded_orm.errors import ShardConfigError

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


STMT = sharded_select(Tick, index="ticks_by_ts").order_by(Tick.ts.desc())


def _seeded(engine: sa.Engine) -> sa.Engine:
    Base.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.add_all(Tick(id=i, ts=T0 + dt.timedelta(seconds=i)) for i in range(50))
    return engine


def _slow(engine: sa.Engine, seconds: float) -> list[Any]:
    """Each statement's ``timeout`` option, as it starts; then it waits ``seconds``."""
    seen: list[Any] = []

    @event.listens_for(engine, "before_cursor_execute")
    def slow(conn: Any, cursor: Any, statement: str, params: Any, ctx: Any, many: bool) -> None:
        seen.append(ctx.execution_options.get("timeout"))
        time.sleep(seconds)

    return seen


@pytest.fixture
def sqlite() -> Iterator[sa.Engine]:
    engine = _seeded(sa.create_engine("sqlite://"))
    yield engine
    engine.dispose()


@pytest.mark.parametrize("read", ["merged", "page"])
def test_each_statement_gets_what_is_left(sqlite: sa.Engine, read: str) -> None:
    seen = _slow(sqlite, 0.2)
    with forced("two rounds"), Session(sqlite) as session:
        if read == "merged":
            got = [t.id for t in merged(session, STMT, 10, timeout=30)]
        else:
            got = [t.id for t in page(session, STMT, 10, timeout=30).rows]
    assert got == list(range(49, 39, -1))
    assert len(seen) == 2  # the bound round, then the rows
    assert 29 < seen[0] <= 30
    assert seen[1] <= seen[0] - 0.2  # the first statement's time is spent


def test_without_timeout_each_statement_keeps_the_connection_s(sqlite: sa.Engine) -> None:
    seen = _slow(sqlite, 0)
    with forced("two rounds"), sqlite.connect() as conn:
        merged(conn.execution_options(timeout=7), STMT, 10)
    assert seen == [7, 7]


@pytest.mark.parametrize(
    ("bad", "error"),
    [(0, ShardConfigError), (-1.5, ShardConfigError), (float("nan"), ShardConfigError),
     (float("inf"), ShardConfigError), ("5", ShardConfigError), (True, ShardConfigError)],
)  # fmt: skip
def test_a_bad_timeout_is_refused_before_any_statement(
    sqlite: sa.Engine, bad: object, error: type[Exception]
) -> None:
    seen = _slow(sqlite, 0)
    with sqlite.connect() as conn:
        with pytest.raises(error, match="timeout"):
            merged(conn, STMT, 10, timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(error, match="timeout"):
            page(conn, STMT, 10, timeout=bad)  # type: ignore[arg-type]
    assert seen == []


@pytest.mark.emulator
def test_a_page_ends_at_its_timeout_on_the_emulator(spanner_engine: sa.Engine) -> None:
    """Two statements of 1.2 s each under ``timeout=2``: the second has 0.8 s left, and
    the read fails (before, each had 2 s, and the page came back after 2.4 s)."""
    engine = _seeded(spanner_engine)
    with forced("two rounds"), engine.connect() as conn:
        first = page(conn, STMT, 10, timeout=30)
        assert len(first.rows) == 10 and first.stats.statements == 2  # bound round, rows
        seen = _slow(engine, 1.2)
        started = time.monotonic()
        with pytest.raises(sa.exc.OperationalError) as caught:
            page(conn, STMT, 10, timeout=2.0)
    took = time.monotonic() - started
    assert len(seen) == 2 and seen[1] < 0.9
    assert "deadline" in str(caught.value) and "can be retried" in str(caught.value)
    assert took < 2.0 + 1.2 + 1.0  # the deadline, the listener's last sleep, slack
