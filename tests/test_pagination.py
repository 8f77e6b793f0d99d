"""page(): signed cursors, bound to their query."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from seed_models import LogEntry, Sharded

from sharded_orm import CursorError, page, set_cursor_secret, sharded_select
from sharded_orm.read import pagination

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
    for i in (0, 31, 32, len(raw) // 2, len(raw) - 1):  # signature and body bytes
        bad = bytearray(raw)
        bad[i] ^= 1
        edited = base64.urlsafe_b64encode(bytes(bad)).decode().rstrip("=")
        with pytest.raises(CursorError, match="altered"):
            page(conn, acme(), 3, edited)
    # a body rewritten to jump ahead, re-encoded without the key
    assert b"2024-01-01" in raw
    forged = raw[:32] + raw[32:].replace(b"2024-01-01", b"2023-01-01")
    with pytest.raises(CursorError):
        page(conn, acme(), 3, base64.urlsafe_b64encode(forged).decode())
    for junk in ("not-a-cursor", "", "%%%"):
        with pytest.raises(CursorError):
            page(conn, acme(), 3, junk)
    with pytest.raises(CursorError, match="is the str"):
        page(conn, acme(), 3, 12)  # type: ignore[arg-type]


def test_cursor_signed_with_another_secret(
    conn: sa.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pagination, "_secret", pagination._secret)  # restored afterwards
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
