"""page(): encrypted, authenticated cursors, bound to their query."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from plans import walk
from seed_models import LogEntry, Sharded
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import (
    CursorError,
    ShardedIndex,
    merged,
    page,
    set_cursor_secret,
    shard_column,
    sharded_select,
)
from sharded_orm.read import cursors, pagination

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def conn() -> Iterator[sa.Connection]:
    eng = sa.create_engine("sqlite://")
    Sharded.metadata.create_all(eng)
    with eng.begin() as c:
        c.execute(
            LogEntry.__table__.insert(),
            [
                # three users per second: ties on the timestamp across shards
                {
                    "CompanyId": c,
                    "UserId": f"u{i % 3}",
                    "Timestamp": T0 + dt.timedelta(seconds=i // 3),
                }
                for i in range(30)
                for c in ("Acme", "Other")
            ],
        )
    with eng.connect() as c:
        yield c
    eng.dispose()


def acme() -> Any:
    return sharded_select(LogEntry, index="LogEntriesByCompany").where(
        LogEntry.company_id == "Acme"
    )


def test_pages_walk_the_whole_range_once(conn: sa.Connection) -> None:
    seen, cursor = [], None
    while True:
        p = page(conn, acme(), 4, cursor)
        seen.extend((r.Timestamp, r.UserId) for r in p.rows)
        if p.next_cursor is None:
            break
        cursor = p.next_cursor
    assert seen == sorted(seen, key=lambda r: (-r[0].timestamp(), r[1]))
    assert len(seen) == len(set(seen)) == 30


def test_last_page_has_no_cursor(conn: sa.Connection) -> None:
    assert page(conn, acme(), 30).next_cursor is None
    assert page(conn, acme(), 29).next_cursor is not None


def test_cursor_from_another_query(conn: sa.Connection) -> None:
    cursor = page(conn, acme(), 3).next_cursor
    assert cursor is not None
    for other in (
        acme().where(LogEntry.user_id != "u1"),
        sharded_select(LogEntry, index="LogEntriesByCompany").where(LogEntry.company_id == "Other"),
    ):
        with pytest.raises(CursorError, match="another query"):
            page(conn, other, 3, cursor)


def test_tampered_cursors(conn: sa.Connection) -> None:
    cursor = page(conn, acme(), 3).next_cursor
    assert cursor is not None
    raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    for i in (0, 9, 31, 32, len(raw) // 2, len(raw) - 1):  # header, IV, body and MAC bytes
        bad = bytearray(raw)
        bad[i] ^= 1
        edited = base64.urlsafe_b64encode(bytes(bad)).decode()
        with pytest.raises(CursorError, match="altered"):
            page(conn, acme(), 3, edited)
    # a body rewritten to jump ahead, encrypted with a key that is not the secret's
    from cryptography.fernet import Fernet

    body = b'{"n":3,"q":"x","v":[["t","2023-01-01T00:00:00+00:00",0]]}'
    with pytest.raises(CursorError, match="altered"):
        page(conn, acme(), 3, Fernet(Fernet.generate_key()).encrypt(body).decode())
    for junk in ("not-a-cursor", "", "%%%"):
        with pytest.raises(CursorError):
            page(conn, acme(), 3, junk)
    with pytest.raises(CursorError, match="is the str"):
        page(conn, acme(), 3, 12)  # type: ignore[arg-type]


def test_a_cursor_reveals_no_key_value(conn: sa.Connection) -> None:
    """Issue 24 item 10: cursors were signed base64 JSON, showing the last row's sort
    values (tenant ids, emails) to whoever held one. Now they are encrypted."""
    # user ids long enough not to turn up by chance in ~300 random base64 characters
    # (the fixture's "u2" did, now and then)
    conn.execute(sa.update(LogEntry).values(user_id=LogEntry.user_id + "-tenant-7f3a"))
    stmt = sharded_select(LogEntry, index="LogEntriesByCompany").where(
        LogEntry.company_id == "Acme"
    )
    p = page(Session(bind=conn), stmt, 3)
    assert p.next_cursor is not None
    last = p.rows[2]  # a LogEntry
    assert last.user_id.endswith("-tenant-7f3a")
    raw = base64.urlsafe_b64decode(p.next_cursor + "=" * (-len(p.next_cursor) % 4))
    values = (last.user_id, last.ts.isoformat(), last.ts.strftime("%Y-%m-%d"), "Acme")
    for value in map(str, values):
        for form in (raw, p.next_cursor.encode(), base64.b64encode(raw)):
            assert value.encode() not in form
    # the same values twice make two different cursors (a fresh IV each time)
    assert page(conn, stmt, 3).next_cursor != p.next_cursor


def test_cursor_signed_with_another_secret(
    conn: sa.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cursors, "_secrets", cursors._secrets)  # restored afterwards
    set_cursor_secret("first secret, long enough")
    cursor = page(conn, acme(), 3).next_cursor
    set_cursor_secret(b"second secret, long enough")
    with pytest.raises(CursorError, match="signed with another secret"):
        page(conn, acme(), 3, cursor)
    set_cursor_secret("first secret, long enough")
    assert page(conn, acme(), 3, cursor).rows == page(conn, acme(), 6).rows[3:]


def test_short_or_wrongly_typed_secret() -> None:
    with pytest.raises(CursorError, match="at least 16 bytes"):
        set_cursor_secret("short")
    with pytest.raises(CursorError, match="str or bytes"):
        set_cursor_secret(1234567890123456789)  # type: ignore[arg-type]


def test_cursor_values_round_trip() -> None:
    from decimal import Decimal
    from uuid import UUID

    from google.api_core.datetime_helpers import DatetimeWithNanoseconds

    ns = DatetimeWithNanoseconds(2024, 1, 1, 12, 0, 0, nanosecond=123456789, tzinfo=dt.UTC)
    values = [
        None,
        True,
        2**63 - 1,
        "é",
        T0,
        ns,
        dt.date(2024, 2, 29),
        Decimal("1.50"),
        UUID(int=7),
        b"\x00\xff",
        -1.5,
    ]
    stmt = acme()
    back = pagination.decode_cursor(stmt, pagination.encode_cursor(stmt, values))
    assert back == values
    assert back[5].nanosecond == 123456789
    assert [type(v) for v in back] == [type(v) for v in values]


# ----------------------------------------------------------------------------- secret


@pytest.mark.parametrize("value", ["k", "abc", "fifteen bytes!!", ""])
def test_weak_secret_in_the_environment_is_refused(
    conn: sa.Connection, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """Issue 12 item 10: a 1-byte SHARDED_ORM_CURSOR_SECRET used to sign cursors (a short
    key is recovered from one cursor and cursors forged)."""
    monkeypatch.setenv("SHARDED_ORM_CURSOR_SECRET", value)
    set_cursor_secret(None)  # back to the environment
    try:
        with pytest.raises(CursorError, match="SHARDED_ORM_CURSOR_SECRET holds .* at least 16"):
            page(conn, acme(), 3)
    finally:
        monkeypatch.delenv("SHARDED_ORM_CURSOR_SECRET")
        set_cursor_secret(None)


def test_secret_from_the_environment_signs_across_processes(
    conn: sa.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDED_ORM_CURSOR_SECRET", "a shared secret of 32 bytes.....")
    set_cursor_secret(None)
    try:
        cursor = page(conn, acme(), 3).next_cursor
        set_cursor_secret(None)  # as a second process would: read the variable again
        assert page(conn, acme(), 3, cursor).rows == page(conn, acme(), 6).rows[3:]
        # a cursor made with another secret is refused
        from cryptography.fernet import Fernet

        body = b'{"n":3,"q":"x","v":[["t","2023-01-01T00:00:00+00:00",0]]}'
        for key in (b"", b"abc", b"a shared secret of 32 bytes....!"):
            fkey = base64.urlsafe_b64encode(hashlib.sha256(b"sharded-orm cursor\0" + key).digest())
            forged = Fernet(fkey).encrypt(body).decode()
            with pytest.raises(CursorError, match="altered"):
                page(conn, acme(), 3, forged)
    finally:
        monkeypatch.delenv("SHARDED_ORM_CURSOR_SECRET")
        set_cursor_secret(None)


# ----------------------------------------------------------------------------- shapes


def test_offset_and_limit_of_the_statement(conn: sa.Connection) -> None:
    everything = walk(conn, acme(), 4)
    assert len(everything) == 30
    assert walk(conn, acme().offset(5), 4) == everything[5:]
    assert walk(conn, acme().limit(11), 4) == everything[:11]
    assert walk(conn, acme().offset(3).limit(9), 2) == everything[3:12]
    assert page(conn, acme().limit(8), 8).next_cursor is None


class F(DeclarativeBase):
    pass


class Scored(F):
    __tablename__ = "scored"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    score: Mapped[float | None] = mapped_column(sa.Float)
    s: Mapped[int] = shard_column("id", count=5)
    __table_args__ = (
        ShardedIndex("scored_desc", sa.desc("score"), shard="s"),
        ShardedIndex("scored_asc", "score", shard="s"),
    )


@pytest.mark.parametrize("index", ["scored_desc", "scored_asc"])
def test_float_and_null_ordering_columns(engine: sa.Engine, index: str) -> None:
    """Issue 11 items 9 and 10: page() over a nullable float (NULLs where the unsharded
    ORDER BY puts them: first ascending, last descending, on SQLite and Spanner)."""
    F.metadata.create_all(engine)
    values = [None, -1.5, 0.25, 0.25, 2.0, None, 1e-9, 7.75]
    with engine.begin() as c:
        c.execute(Scored.__table__.insert(), [{"id": i, "score": values[i % 8]} for i in range(37)])
    order = Scored.score.desc() if index == "scored_desc" else Scored.score
    stmt = sharded_select(Scored, index=index).order_by(order)
    with engine.connect() as c:
        oracle = c.execute(sa.select(Scored.__table__).order_by(order, Scored.id)).all()
        assert walk(c, stmt, 4) == oracle
        assert merged(c, stmt, 37) == oracle
        assert merged(c, stmt, 6) == oracle[:6]


def test_async_connection_and_session() -> None:
    """Issue 11 item 10: merged() on an AsyncConnection raised TypeError ('coroutine' is
    not iterable); now ``await merged(...)`` and ``await page(...)`` work."""
    import asyncio

    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    async def main() -> None:
        eng = create_async_engine("sqlite+aiosqlite://")
        async with eng.begin() as c:
            await c.run_sync(lambda sc: F.metadata.create_all(sc))
            await c.execute(
                Scored.__table__.insert(), [{"id": i, "score": i / 2} for i in range(20)]
            )
        stmt = sharded_select(Scored, index="scored_desc").order_by(Scored.score.desc())
        async with eng.connect() as c:
            rows = await merged(c, stmt, 5)
            assert [r.id for r in rows] == [19, 18, 17, 16, 15]
            first = await page(c, stmt, 5)
            second = await page(c, stmt, 5, first.next_cursor)
            assert [r.id for r in second.rows] == [14, 13, 12, 11, 10]
        async with AsyncSession(eng) as s:
            got = await merged(s, stmt, 3)
            assert [type(e) for e in got] == [Scored] * 3
            assert [e.id for e in got] == [19, 18, 17]
        await eng.dispose()

    asyncio.run(main())


class WalkBase(DeclarativeBase):
    pass


class Walked(WalkBase):
    __tablename__ = "walked"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    ts: Mapped[dt.datetime] = mapped_column()
    s: Mapped[int] = shard_column("id", count=16)
    __table_args__ = (ShardedIndex("walked_by_ts", sa.desc("ts"), shard="s"),)


@pytest.fixture()
def walk_conn() -> Iterator[sa.Connection]:
    eng = sa.create_engine("sqlite://")
    WalkBase.metadata.create_all(eng)
    with eng.begin() as c:
        c.execute(
            Walked.__table__.insert(),
            [{"id": i, "ts": T0 + dt.timedelta(seconds=(i * 7919) % 1500)} for i in range(3000)],
        )
    with eng.connect() as c:
        yield c
    eng.dispose()


def _walk(conn: sa.Connection, size: int, between: Any = None) -> tuple[list[int], list[int]]:
    stmt = sharded_select(Walked, index="walked_by_ts")
    ids, statements, cursor = [], [], None
    while True:
        p = page(conn, stmt, size, cursor)
        ids += [r.id for r in p.rows]
        statements.append(p.stats.statements)
        if (cursor := p.next_cursor) is None:
            return ids, statements
        if between is not None:
            between(ids)


def test_a_walk_takes_one_statement_for_most_pages(walk_conn: sa.Connection) -> None:
    """The bound round of one page finds the bounds of the next ten: those pages take one
    statement each, so a walk sends about 1.1 statements a page (an unsharded keyset walk:
    one)."""
    t = Walked.__table__
    truth = [r.id for r in walk_conn.execute(sa.select(t.c.id).order_by(t.c.ts.desc(), t.c.id))]
    ids, statements = _walk(walk_conn, 100)
    assert ids == truth
    # an unsharded keyset walk sends 31 (the last one finds the end); ours: two for the
    # pages that run the bound round (every 11th, and the last one, which has no bound)
    assert len(statements) == 30 and sum(statements) <= 1.1 * 31, statements


def test_a_walk_stays_exact_when_rows_go_between_pages(walk_conn: sa.Connection) -> None:
    """A bound found before rows were deleted may hold fewer than a page: the page then
    falls back to both rounds. No remaining row is skipped or repeated."""
    t = Walked.__table__
    gone: set[int] = set()

    def delete_ahead(ids: list[int]) -> None:
        rows = walk_conn.execute(
            sa.select(t.c.id).order_by(t.c.ts.desc(), t.c.id).offset(len(ids) + len(gone))
        ).all()
        doomed = [r.id for r in rows[:150:3]]  # a third of the next page and a half
        walk_conn.execute(t.delete().where(t.c.id.in_(doomed)))
        gone.update(doomed)

    ids, statements = _walk(walk_conn, 100, delete_ahead)
    remaining = [r.id for r in walk_conn.execute(sa.select(t.c.id).order_by(t.c.ts.desc(), t.c.id))]
    assert ids == remaining and not gone & set(ids)
    assert max(statements) == 3  # a bounded page that came back short, then both rounds
