"""What the write path hashes and sends (issue 22 items 2, 4, 5, 6), on SQLite and the emulator.

* A TypeDecorator source is hashed as the decorator stores it, on every write path, and
  found by a point lookup with the stored or the written value (``server_side`` too).
* Changing one source of a loaded object sends that source and the shard, never the
  other sources' in-memory values (another writer's committed change survives).
* A source change the session discards (expire, refresh, rollback) takes its derived
  shard with it.
* Wide NUMERIC values are hashed exactly; an UPDATE that matches no row changes nothing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.orm.exc import StaleDataError

from sharded_orm import (
    BitReversedPrimaryKeyMixin,
    ShardConfigError,
    ShardedIndex,
    UTCDateTime,
    compute_shard,
    shard_column,
    sharded_select,
    verify,
)
from sharded_orm.schema.coerce import stored_value

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 5, 1, 12, tzinfo=UTC)
N = 8


class LowerCase(sa.types.TypeDecorator[str]):
    """An e-mail column: stored lower-cased, whatever case it is given in."""

    impl = sa.String(80)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> Any:
        return None if value is None else value.lower()


class Base(DeclarativeBase):
    pass


class Person(Base):
    __tablename__ = "wv_people"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    email: Mapped[str] = mapped_column(LowerCase)
    shard: Mapped[int] = shard_column("email", count=N)
    __table_args__ = (ShardedIndex("ix_wv_people_email", "email", shard="shard"),)


class FarmPerson(Base):
    __tablename__ = "wv_farm_people"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    email: Mapped[str] = mapped_column(LowerCase)
    shard: Mapped[int] = shard_column(
        "email", count=N, algorithm="farm_fingerprint", server_side=True
    )
    __table_args__ = (ShardedIndex("ix_wv_farm_people_email", "email", shard="shard"),)


def write_every_path(engine: sa.Engine, model: Any) -> dict[int, str]:
    """Writes ``model`` rows through every path; returns id -> the e-mail as written."""
    table = model.__table__
    written: dict[int, str] = {}

    def rows(*ids: int) -> list[dict[str, Any]]:
        out = [{"id": i, "email": f"User{i}@Example.COM"} for i in ids]
        written.update({r["id"]: r["email"] for r in out})
        return out

    with Session(engine) as s:
        s.add_all([model(**r) for r in rows(1, 2)])
        s.commit()
        s.execute(sa.insert(model), rows(3, 4))
        s.commit()
        s.bulk_insert_mappings(model, rows(5, 6))
        s.bulk_save_objects([model(**r) for r in rows(7, 8)])
        s.commit()
    with engine.begin() as conn:
        conn.execute(table.insert(), rows(9)[0])
        conn.execute(table.insert(), rows(10, 11))
        conn.execute(table.insert().values(rows(12, 13)))
        # updates: Core by key, and the ORM's own
        conn.execute(table.update().where(table.c.id == 9).values(email="Changed9@X.COM"))
        written[9] = "Changed9@X.COM"
    with Session(engine) as s:
        obj = s.get(model, 10)
        assert obj is not None
        obj.email = "Changed10@Y.ORG"
        written[10] = "Changed10@Y.ORG"
        s.commit()
    return written


def check_stored_and_found(engine: sa.Engine, model: Any, written: dict[int, str]) -> None:
    with engine.connect() as conn:
        got = {r.id: (r.email, r.shard) for r in conn.execute(sa.select(model.__table__))}
    assert sorted(got) == sorted(written)
    algorithm = "farm_fingerprint" if model is FarmPerson else "crc32"
    for pk, (email, shard) in got.items():
        assert email == written[pk].lower()
        assert shard == compute_shard([email], N, algorithm)
    index = model.__table__.indexes.pop()
    model.__table__.indexes.add(index)
    with Session(engine) as s:
        for pk, value in written.items():
            for asked in (value.lower(), value):  # the stored value, and the written one
                stmt = sharded_select(model, index=index.name).where(model.email == asked)
                assert [o.id for o in s.scalars(stmt)] == [pk], (pk, asked)
    if model is Person:
        assert verify(engine, model, progress_mode="off").ok


def test_a_type_decorator_source_is_hashed_as_stored(engine: sa.Engine) -> None:
    Base.metadata.create_all(engine, tables=[Person.__table__])
    check_stored_and_found(engine, Person, write_every_path(engine, Person))


def test_a_type_decorator_source_of_a_server_side_shard(engine: sa.Engine) -> None:
    Base.metadata.create_all(engine, tables=[FarmPerson.__table__])
    check_stored_and_found(engine, FarmPerson, write_every_path(engine, FarmPerson))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(min_size=0, max_size=30))
def test_decorated_stored_value_is_the_decorators_output(text: str) -> None:
    column = Person.__table__.c.email
    assert stored_value(column, text) == text.lower()
    assert Person.__table__.c.shard is not None


@pytest.mark.parametrize(
    "type_",
    [sa.Interval(), sa.PickleType()],
    ids=["Interval", "PickleType"],
)
def test_types_whose_stored_value_the_client_cannot_know_are_refused(type_: Any) -> None:
    class B(DeclarativeBase):
        pass

    with pytest.raises(ShardConfigError, match="cannot be a shard source"):

        class Bad(B):
            __tablename__ = "bad"
            id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
            v: Mapped[Any] = mapped_column(type_)
            shard: Mapped[int] = shard_column("v", count=4)


def test_a_sql_side_bind_expression_is_refused() -> None:
    class SqlLower(sa.types.TypeDecorator[str]):
        impl = sa.String(20)
        cache_ok = True

        def bind_expression(self, bindvalue: Any) -> Any:
            return sa.func.lower(bindvalue)

    class B(DeclarativeBase):
        pass

    with pytest.raises(ShardConfigError, match="bind_expression"):

        class Bad(B):
            __tablename__ = "bad"
            id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
            v: Mapped[str] = mapped_column(SqlLower)
            shard: Mapped[int] = shard_column("v", count=4)


# --------------------------------------------------------------------------- item 4


class Entry(Base):
    __tablename__ = "wv_entries"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    company_id: Mapped[str] = mapped_column(sa.String(20))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    note: Mapped[str | None] = mapped_column(sa.String(20))
    entry_shard_id: Mapped[int] = shard_column("company_id", "ts", count=10)


def test_changing_one_source_sends_only_it_and_the_shard(engine: sa.Engine) -> None:
    Base.metadata.create_all(engine, tables=[Entry.__table__])
    with Session(engine) as s:
        s.add(Entry(id=1, company_id="acme", ts=T0))
        s.commit()
    sent: list[str] = []
    with Session(engine, expire_on_commit=False) as s:
        obj = s.get(Entry, 1)
        assert obj is not None
        s.commit()  # the object keeps its values in memory; another writer changes one
        with engine.begin() as other:
            other.execute(Entry.__table__.update().where(Entry.id == 1).values(company_id="globex"))
        obj.ts = T0 + dt.timedelta(hours=1)

        @sa.event.listens_for(engine, "before_cursor_execute")
        def spy(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if statement.lstrip().upper().startswith("UPDATE"):
                sent.append(statement)

        try:
            s.commit()
        finally:
            sa.event.remove(engine, "before_cursor_execute", spy)
    assert len(sent) == 1
    set_clause = sent[0].upper().split(" SET ", 1)[1].split(" WHERE ")[0]
    assert "COMPANY_ID" not in set_clause and "TS" in set_clause
    assert "ENTRY_SHARD_ID" in set_clause
    with engine.connect() as conn:
        row = conn.execute(sa.select(Entry.__table__)).one()
    assert row.company_id == "globex"  # the other writer's change survives
    assert row.ts == T0 + dt.timedelta(hours=1)
    assert row.entry_shard_id == compute_shard(["globex", row.ts], 10)


# --------------------------------------------------------------------------- item 5


class KeyedEntry(Base):
    """The shard leads the key, so it is derived as soon as the sources are set."""

    __tablename__ = "wv_keyed"
    entry_shard_id: Mapped[int] = shard_column("company_id", "ts", count=10, primary_key=True)
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    company_id: Mapped[str] = mapped_column(sa.String(20))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    note: Mapped[str | None] = mapped_column(sa.String(20))


@pytest.mark.parametrize("model", [Entry, KeyedEntry], ids=["plain", "keyed"])
@pytest.mark.parametrize("discard", ["expire", "refresh", "rollback"])
def test_a_discarded_source_change_takes_its_shard_along(
    engine: sa.Engine, model: Any, discard: str
) -> None:
    Base.metadata.create_all(engine, tables=[model.__table__])
    with Session(engine) as s:
        s.add(model(id=1, company_id="acme", ts=T0))
        s.commit()
    with Session(engine) as s:
        obj = s.scalars(sa.select(model)).one()
        obj.ts = T0 + dt.timedelta(days=3)
        if discard == "expire":
            s.expire(obj, ["ts"])
        elif discard == "refresh":
            s.refresh(obj, ["ts"])
        else:
            s.rollback()
        obj.note = "x"
        s.commit()
    with engine.connect() as conn:
        row = conn.execute(sa.select(model.__table__)).one()
    assert (row.ts, row.note) == (T0, "x")
    assert row.entry_shard_id == compute_shard(["acme", T0], 10)


# --------------------------------------------------------------------------- item 6


class Money(Base):
    __tablename__ = "wv_money"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    amount: Mapped[Decimal] = mapped_column(sa.Numeric(38, 9))
    shard: Mapped[int] = shard_column("amount", count=N)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=-(10**29) + 1, max_value=10**29 - 1),
    st.integers(min_value=0, max_value=10**9 - 1),
    st.integers(min_value=0, max_value=9),
)
def test_every_numeric_38_9_value_is_hashed_exactly(whole: int, frac: int, extra: int) -> None:
    """Up to 29 integer and 9 fractional digits (trailing zeros beyond the scale too):
    accepted as is, and hashed as its exact fixed-point text."""
    from sharded_orm.hashing import canonical_text

    value = Decimal(f"{whole}.{frac:09d}{'0' * extra}")
    assert stored_value(Money.__table__.c.amount, value) == value
    digits = f"{frac:09d}".rstrip("0")
    assert canonical_text(value) == (f"{whole}.{digits}" if digits else str(whole))


def test_wide_numeric_values_are_stored_and_found(engine: sa.Engine) -> None:
    if engine.dialect.name == "sqlite":
        values = [Decimal(10**15), Decimal("-123456789.5")]  # SQLite's NUMERIC is a float
    else:
        values = [
            Decimal(10000000000000000000),
            Decimal("12345678901234567890123456789.123456789"),
            Decimal("-99999999999999999999999999999.999999999"),
        ]
    Base.metadata.create_all(engine, tables=[Money.__table__])
    with Session(engine) as s:
        s.add_all([Money(id=i, amount=v) for i, v in enumerate(values)])
        s.commit()
    with engine.connect() as conn:
        got = conn.execute(sa.select(Money.__table__).order_by(Money.id)).all()
    assert [r.amount for r in got] == values
    for r in got:
        assert r.shard == compute_shard([r.amount], N)


def test_the_canonical_text_of_a_wide_decimal_keeps_every_digit() -> None:
    from sharded_orm.hashing import canonical_text

    assert (
        canonical_text(Decimal("12345678901234567890123456789.123456789"))
        == "12345678901234567890123456789.123456789"
    )
    assert canonical_text(Decimal(10000000000000000000)) == "10000000000000000000"


def test_an_update_matching_no_row_returns_rowcount_zero(engine: sa.Engine) -> None:
    Base.metadata.create_all(engine, tables=[Entry.__table__])
    table = Entry.__table__
    with engine.begin() as conn:
        conn.execute(table.insert(), {"id": 1, "company_id": "acme", "ts": T0})
        missing = conn.execute(table.update().where(table.c.id == 99).values(ts=T0))
        assert missing.rowcount == 0
    # the ORM's bulk UPDATE by key: SQLAlchemy's own check where the driver counts
    # executemany rows (SQLite), nothing from sharded-orm
    with Session(engine) as s, contextlib.suppress(StaleDataError):
        s.execute(sa.update(Entry), [{"id": 99, "ts": T0}])
        s.commit()
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 1


# --------------------------------------------------------------------------- item 7


class Account(BitReversedPrimaryKeyMixin, Base):
    """The README's model: nothing but the bit-reversed identity key."""

    __tablename__ = "wv_accounts"


def test_a_model_with_only_its_identity_key_inserts(engine: sa.Engine) -> None:
    Base.metadata.create_all(engine, tables=[Account.__table__])
    with Session(engine) as s:
        accounts = [Account(), Account()]
        s.add_all(accounts)
        s.commit()
        ids = {a.id for a in accounts}
        s.execute(sa.insert(Account))
        s.commit()
    with engine.begin() as conn:
        conn.execute(Account.__table__.insert())
        stored = set(conn.execute(sa.select(Account.id)).scalars())
    assert len(stored) == 4 and ids <= stored and all(i > 0 for i in stored)


def test_the_stock_spanner_dialect_still_renders_an_empty_insert() -> None:
    """Trips when sqlalchemy-spanner fixes it upstream: our override can then go."""
    from google.cloud.sqlalchemy_spanner import SpannerDialect as Stock

    from sharded_orm.spanner.dialect import SpannerDialect

    table = Account.__table__
    assert str(table.insert().compile(dialect=Stock(), column_keys=[])).startswith(
        "INSERT INTO wv_accounts () VALUES ()"
    )
    ours = str(table.insert().compile(dialect=SpannerDialect(), column_keys=[]))
    assert ours.startswith("INSERT INTO wv_accounts (id) VALUES (DEFAULT)")


class TZDateTime(sa.types.TypeDecorator[dt.datetime]):
    """SQLAlchemy's documented pattern: aware in Python, naive UTC in the database."""

    impl = sa.DateTime
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> Any:
        if value is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> Any:
        return None if value is None else value.replace(tzinfo=UTC)


class Stamp(Base):
    __tablename__ = "wv_stamps"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    at: Mapped[dt.datetime] = mapped_column(TZDateTime)
    shard: Mapped[int] = shard_column("at", count=N)


@settings(max_examples=50, deadline=None)
@given(
    st.datetimes(min_value=dt.datetime(1000, 1, 2), max_value=dt.datetime(9999, 12, 30)),
    st.integers(min_value=-12, max_value=12),
)
def test_a_naive_utc_decorator_hashes_the_instant(at: dt.datetime, hours: int) -> None:
    given_at = at.replace(tzinfo=dt.timezone(dt.timedelta(hours=hours)))
    column = Stamp.__table__.c.at
    assert stored_value(column, given_at) == given_at.astimezone(UTC)


def test_a_naive_utc_decorator_source_round_trips(engine: sa.Engine) -> None:
    Base.metadata.create_all(engine, tables=[Stamp.__table__])
    at = dt.datetime(2024, 6, 1, 14, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    with Session(engine) as s:
        s.add(Stamp(id=1, at=at))
        s.commit()
    with engine.begin() as conn:
        conn.execute(Stamp.__table__.insert(), {"id": 2, "at": at})
    assert verify(engine, Stamp, progress_mode="off").ok
    with engine.connect() as conn:
        shards = set(conn.execute(sa.select(Stamp.__table__.c.shard)).scalars())
    assert shards == {compute_shard([at], N)}
