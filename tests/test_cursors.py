"""A page's cursor is bound to everything that shapes what its statement reads, every
malformed cursor is a ``CursorError``, cursors expire and secrets rotate (issue 33, item
4). Before: a cursor made for tenant a's query was accepted for tenant b's when the tenant
filter came from ``with_loader_criteria`` added in ``do_orm_execute``, or when the
statement had no cache key (a user's ``@compiles`` construct); a body edited to
``served=-10**9`` was read as it was; cursors never expired, and a new secret refused
every cursor at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    ORMExecuteState,
    Session,
    mapped_column,
    with_loader_criteria,
)
from sqlalchemy.sql.elements import ColumnElement

from sharded_orm import (
    CursorError,
    ShardConfigError,
    ShardedIndex,
    page,
    set_cursor_secret,
    shard_column,
    sharded_select,
)
from sharded_orm.read import cursors


class B(DeclarativeBase):
    pass


class Note(B):
    __tablename__ = "cursor_note"
    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    tenant: Mapped[str] = mapped_column(sa.String(8))
    ts: Mapped[int] = mapped_column(sa.BigInteger)
    s: Mapped[int] = shard_column("id", count=4)
    __table_args__ = (ShardedIndex("cursor_note_by_ts", sa.desc("ts"), shard="s"),)


@pytest.fixture(autouse=True)
def own_secret(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(cursors, "_secrets", cursors._secrets)  # restored afterwards
    set_cursor_secret("the secret of these tests, 32 b.")
    yield


@pytest.fixture
def db(engine: sa.Engine) -> sa.Engine:
    B.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.delete(Note.__table__).where(sa.true()))
        conn.execute(
            Note.__table__.insert(), [{"id": i, "tenant": "ab"[i % 2], "ts": i} for i in range(40)]
        )
    return engine


def newest() -> Any:
    return sharded_select(Note, index="cursor_note_by_ts")


def test_a_cursor_is_bound_to_criteria_a_listener_adds(db: sa.Engine) -> None:
    tenant = {"now": "a"}
    with Session(db) as session:

        @event.listens_for(session, "do_orm_execute")
        def tenancy(state: ORMExecuteState) -> None:
            if state.is_select:
                state.statement = state.statement.options(
                    with_loader_criteria(Note, Note.tenant == tenant["now"])
                )

        first = page(session, newest(), 5)
        assert {n.tenant for n in first.rows} == {"a"}
        second = page(session, newest(), 5, first.next_cursor)
        assert [n.id for n in second.rows] == [28, 26, 24, 22, 20]
        tenant["now"] = "b"
        with pytest.raises(CursorError, match="another query"):
            page(session, newest(), 5, first.next_cursor)
        assert {n.tenant for n in page(session, newest(), 5).rows} == {"b"}


class Tenant(ColumnElement[bool]):
    """A user's construct without a cache key (no ``inherit_cache``): ``tenant = :t``."""

    type = sa.Boolean()

    def __init__(self, value: str) -> None:
        self.value = sa.bindparam("tenant_value", value, sa.String(8))


@compiles(Tenant)
def _tenant(element: Tenant, compiler: Any, **kw: Any) -> str:
    value = compiler.process(element.value, **kw)
    return f"{compiler.process(Note.__table__.c.tenant, **kw)} = {value}"


@pytest.mark.filterwarnings("ignore:Class Tenant will not make use of SQL compilation caching")
def test_a_statement_without_a_cache_key_is_bound_by_its_sql_and_parameters(
    db: sa.Engine,
) -> None:
    assert newest().where(Tenant("a"))._generate_cache_key() is None
    with db.connect() as conn:
        a = page(conn, newest().where(Tenant("a")), 5)
        assert {r.tenant for r in a.rows} == {"a"}
        assert page(conn, newest().where(Tenant("a")), 5, a.next_cursor).rows[0].id == 28
        with pytest.raises(CursorError, match="another query"):
            page(conn, newest().where(Tenant("b")), 5, a.next_cursor)


def _forge(body: Any) -> str:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return cursors.seal(raw)


def test_an_edited_body_is_a_cursor_error(db: sa.Engine) -> None:
    with db.connect() as conn:
        stmt = newest().limit(20)
        first = page(conn, stmt, 5)
        body = json.loads(cursors.unseal(first.next_cursor or ""))
        for change in (
            {"n": -(10**9)},
            {"n": 10**9},
            {"n": "5"},
            {"v": [["i", "x"], ["i", "3"]]},
            {"v": [["s", "35"], ["i", "35"]]},  # a str where the order has an int
            {"v": [["b", True], ["i", "35"]]},
            {"v": [["i", "35"]]},
            {"v": [["i", "1" * 5000], ["i", "35"]]},
            {"h": [[[["i", "3"]], 1]]},
            {"h": [[[["i", "3"], ["i", "3"]], -1]]},
            {"q": None},
        ):
            with pytest.raises(CursorError):
                page(conn, stmt, 5, _forge({**body, **change}))
        for raw in (b"\xff\xfe", b"[" * 100_000, b"null", b"{}"):
            with pytest.raises(CursorError, match="bad body"):
                page(conn, stmt, 5, _forge(raw))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def fuzz_db() -> Iterator[sa.Engine]:
    eng = sa.create_engine("sqlite://")
    B.metadata.create_all(eng)
    with eng.begin() as conn:
        conn.execute(
            Note.__table__.insert(), [{"id": i, "tenant": "ab"[i % 2], "ts": i} for i in range(40)]
        )
    yield eng
    eng.dispose()


#: what the fuzz draws: fields edited in a cursor's body, a key, text for a whole cursor
FUZZ = {
    "edits": st.dictionaries(st.sampled_from(["q", "v", "n", "h", "x"]), json_values, max_size=3),
    "item": st.lists(json_values, max_size=4),
    "text": st.text(max_size=40),
}


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(**FUZZ)
def test_fuzzed_cursors_are_a_page_or_a_cursor_error(
    fuzz_db: sa.Engine, edits: dict[str, Any], item: list[Any], text: str
) -> None:
    a_page_or_a_cursor_error(fuzz_db, edits, item, text)


# the fuzz's wide variant (many drawn cursors); quick loop:
# test_fuzzed_cursors_are_a_page_or_a_cursor_error
@pytest.mark.slow
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(**FUZZ)
def test_fuzzed_cursors_are_a_page_or_a_cursor_error_wide(
    fuzz_db: sa.Engine, edits: dict[str, Any], item: list[Any], text: str
) -> None:
    a_page_or_a_cursor_error(fuzz_db, edits, item, text)


def a_page_or_a_cursor_error(
    fuzz_db: sa.Engine, edits: dict[str, Any], item: list[Any], text: str
) -> None:
    stmt = newest().limit(30)
    with fuzz_db.connect() as conn:
        first = page(conn, stmt, 5)
        body = json.loads(cursors.unseal(first.next_cursor or ""))
        body["v"][0] = item if item else body["v"][0]
        for cursor in (_forge({**body, **edits}), text, first.next_cursor[:-2] + text):
            try:
                got = page(conn, stmt, 5, cursor)
            except CursorError:
                continue
            assert len(got.rows) <= 5


# ----------------------------------------------------------------------------- expiry, rotation


def _issued(seconds_ago: float, stmt: Any, conn: Any) -> str:
    """A cursor of ``stmt``'s first page, issued ``seconds_ago`` (Fernet's own stamp)."""
    import time

    body = cursors.unseal(page(conn, stmt, 5).next_cursor or "")
    _, fernets = cursors._current()
    return str(fernets[0].encrypt_at_time(body, int(time.time() - seconds_ago)).decode())


def test_cursors_expire_after_max_age(db: sa.Engine) -> None:
    with db.connect() as conn:
        set_cursor_secret("the secret of these tests, 32 b.", max_age=3600)
        fresh, old = _issued(60, newest(), conn), _issued(7200, newest(), conn)
        assert [n.id for n in page(conn, newest(), 5, fresh).rows] == [34, 33, 32, 31, 30]
        with pytest.raises(CursorError, match=r"expired: it was issued 720[01] s ago.*3600 s"):
            page(conn, newest(), 5, old)
        for bad in (0, -1, float("inf"), "60", True):
            with pytest.raises(ShardConfigError, match="max_age must be a positive number"):
                set_cursor_secret("the secret of these tests, 32 b.", max_age=bad)  # type: ignore[arg-type]


def test_a_rotated_secret_keeps_earlier_cursors_for_a_grace_period(db: sa.Engine) -> None:
    old_secret, new_secret = "the secret of these tests, 32 b.", "the next secret, also 32 bytes.."
    with db.connect() as conn:
        recent, older = _issued(10, newest(), conn), _issued(600, newest(), conn)
        set_cursor_secret(new_secret, previous=[old_secret], grace=300)
        assert page(conn, newest(), 5, recent).rows[0].id == 34
        with pytest.raises(CursorError, match="previous cursor secret 60[01] s ago, past"):
            page(conn, newest(), 5, older)
        made_now = page(conn, newest(), 5).next_cursor
        set_cursor_secret(new_secret)  # the previous secret retired: its cursors go
        with pytest.raises(CursorError, match="signed with another secret"):
            page(conn, newest(), 5, recent)
        assert page(conn, newest(), 5, made_now).rows[0].id == 34
        set_cursor_secret(new_secret, previous=[old_secret])  # no grace: while listed
        assert page(conn, newest(), 5, older).rows[0].id == 34
        with pytest.raises(CursorError, match="a list of secrets"):
            set_cursor_secret(new_secret, previous=old_secret)  # type: ignore[arg-type]
        with pytest.raises(CursorError, match="at least 16 bytes"):
            set_cursor_secret(new_secret, previous=["short"])


#: a cursor of ``page(conn, newest(), 5)`` over these 40 notes, made by sharded-orm before
#: cursors could expire or secrets rotate, signed with "the secret of these tests, 32 b."
EARLIER_CURSOR = (
    "gAAAAABrCWdSf4m1cbkLdNtZNMBlpQG33rtil7C2ePct2vQRzI7nxZF7sGCUyyMCbuZ7CHSd-W6ZAQmcHexne_314_c"
    "jte-QF49i-oxchA0r5FlDFvmch-yU0Udo8-nQzCEfW9ILUhaOumHhsdPnyQhT4324AyhpvCFIONFj-zJJVJSqVbHdAu"
    "YD58yyZB_28UigIZCn20GR"
)


def test_a_cursor_made_before_this_change_keeps_working(db: sa.Engine) -> None:
    with db.connect() as conn:
        assert [n.id for n in page(conn, newest(), 5, EARLIER_CURSOR).rows] == [34, 33, 32, 31, 30]
