"""What a partial-source UPDATE costs, in statements and parameters (issue 33 item 6).

Changing one of two sources of loaded objects sends the plain UPDATE plus the stored
values of the other source, read for every row of the statement at once: one SELECT per
1,000 rows (900 parameters on Spanner); on SQLite the keys are bound as one JSON array
(SQLAlchemy's expanding IN costs more per key than the row it reads), 10,000 to a SELECT.
The shard each object gets is the one its stored row hashes to, whatever the loaded object
held.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.types import TypeDecorator

from sharded_orm import ShardValueError, UTCDateTime, compute_shard, shard_column
from sharded_orm.spanner import is_spanner

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)


class Base(DeclarativeBase):
    pass


class Event(Base):
    __tablename__ = "uc_events"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    tenant: Mapped[str] = mapped_column(sa.String(32))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    shard: Mapped[int] = shard_column("tenant", "ts", count=16)


class Lower(TypeDecorator[str]):
    """A key type that converts on bind: its keys cannot go as a JSON array."""

    impl = sa.String(32)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        return None if value is None else value.lower()


class ByName(Base):
    __tablename__ = "uc_by_name"
    name: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    tenant: Mapped[str] = mapped_column(sa.String(32))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    shard: Mapped[int] = shard_column("tenant", "ts", count=16)


class ByLower(Base):
    __tablename__ = "uc_by_lower"
    name: Mapped[str] = mapped_column(Lower, primary_key=True)
    tenant: Mapped[str] = mapped_column(sa.String(32))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    shard: Mapped[int] = shard_column("tenant", "ts", count=16)


class ByPair(Base):
    __tablename__ = "uc_by_pair"
    region: Mapped[str] = mapped_column(sa.String(8), primary_key=True)
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    tenant: Mapped[str] = mapped_column(sa.String(32))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    shard: Mapped[int] = shard_column("tenant", "ts", count=16)


class TwoShards(Base):
    __tablename__ = "uc_two_shards"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    tenant: Mapped[str] = mapped_column(sa.String(32))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    user: Mapped[str] = mapped_column(sa.String(32))
    by_time: Mapped[int] = shard_column("tenant", "ts", count=10)
    by_user: Mapped[int] = shard_column("user", "tenant", count=16)


class Spy:
    """The statements an engine sends, with their parameter counts."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.sent: list[tuple[str, int]] = []

    def __enter__(self) -> Spy:
        sa.event.listen(self.engine, "before_cursor_execute", self.record)
        return self

    def __exit__(self, *exc: Any) -> None:
        sa.event.remove(self.engine, "before_cursor_execute", self.record)

    def record(
        self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> None:
        first = parameters[0] if many and parameters else parameters
        self.sent.append((statement.lstrip().split()[0].upper(), len(first or ())))

    def of(self, verb: str) -> list[int]:
        return [n for v, n in self.sent if v == verb]


def _load(engine: sa.Engine, model: Any, rows: list[dict[str, Any]]) -> None:
    Base.metadata.create_all(engine, tables=[model.__table__])
    with Session(engine) as s:
        s.add_all([model(**r) for r in rows])
        s.commit()


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"id": i, "tenant": f"t{i % 7}", "ts": T0 + dt.timedelta(seconds=i)} for i in range(n)]


# 10,050 rows on SQLite; quick loop: test_every_flush_of_a_session_writes_its_shards_back,
# test_two_shards_of_one_table_follow_one_changed_source
@pytest.mark.slow
def test_changing_one_source_reads_the_others_once_per_batch(engine: sa.Engine) -> None:
    """Plain's UPDATE plus one SELECT per batch of rows, whatever the rows; each object and
    row gets the shard of what the row stores (here a tenant another writer changed after
    the objects were loaded)."""
    spanner = is_spanner(engine.dialect)
    n = 950 if spanner else 10_050
    _load(engine, Event, _rows(n))
    with Session(engine, expire_on_commit=False) as s:
        objs = s.scalars(sa.select(Event).order_by(Event.id)).all()
        s.commit()  # the objects keep what they loaded
        with engine.begin() as other:  # behind the session's back (the flush mends the shard)
            other.execute(
                sa.text("UPDATE uc_events SET tenant = 'moved' WHERE id < 5").execution_options(
                    sharded_orm_raw_sql_ok=True
                )
            )
        for o in objs:
            o.ts = o.ts + dt.timedelta(days=1)
        with Spy(engine) as spy:
            s.flush()
        batch = 1000 if spanner else 10_000  # Spanner: the keys as arrays, 1,000 a SELECT
        assert len(spy.of("SELECT")) == math.ceil(n / batch)
        assert len(spy.of("UPDATE")) == 1  # executemany: what plain SQLAlchemy sends
        for o in objs:
            stored = "moved" if o.id < 5 else f"t{o.id % 7}"
            assert o.shard == compute_shard([stored, o.ts], 16)
        s.commit()
    with engine.connect() as conn:
        for row in conn.execute(sa.select(Event.__table__)):
            assert row.shard == compute_shard([row.tenant, row.ts], 16)


@pytest.mark.parametrize(
    ("model", "keys", "one_parameter"),
    [
        (Event, [{"id": i} for i in (0, 1, -7, 2**62)], True),
        (ByName, [{"name": k} for k in ("a", "É", "a b", "'); --")], True),
        (ByLower, [{"name": k} for k in ("a", "b", "c")], False),
        (ByPair, [{"region": r, "id": i} for r in ("eu", "us") for i in (1, 2)], False),
    ],
    ids=["int", "str", "converted-str", "composite"],
)
def test_the_stored_rows_are_read_with_one_json_parameter_on_sqlite(
    model: Any, keys: list[dict[str, Any]], one_parameter: bool
) -> None:
    """Keys that JSON carries exactly (int64, str) of a one-column key with no conversion
    on bind go as one parameter; any other key as one parameter each, with the same
    result."""
    engine = sa.create_engine("sqlite://")
    rows = [
        {**k, "tenant": f"t{i}", "ts": T0 + dt.timedelta(seconds=i)} for i, k in enumerate(keys)
    ]
    _load(engine, model, rows)
    with Session(engine) as s:
        objs = s.scalars(sa.select(model)).all()
        assert len(objs) == len(keys)
        for o in objs:
            o.ts = o.ts + dt.timedelta(hours=1)
        with Spy(engine) as spy:
            s.flush()
        assert spy.of("SELECT") == ([1] if one_parameter else [len(keys) * len(keys[0])])
        for o in objs:
            assert o.shard == compute_shard([o.tenant, o.ts], 16)
        s.commit()
    with engine.connect() as conn:
        for row in conn.execute(sa.select(model.__table__)):
            assert row.shard == compute_shard([row.tenant, row.ts], 16)


def test_two_shards_of_one_table_follow_one_changed_source(engine: sa.Engine) -> None:
    """A source two shards share: both shards written back to every object, their other
    sources read in the one SELECT."""
    rows = [{**r, "user": f"u{r['id']}"} for r in _rows(30)]
    _load(engine, TwoShards, rows)
    with Session(engine) as s:
        objs = s.scalars(sa.select(TwoShards)).all()
        for o in objs:
            o.tenant = o.tenant + "x"
        with Spy(engine) as spy:
            s.flush()
        assert len(spy.of("SELECT")) == 1
        for o in objs:
            assert o.by_time == compute_shard([o.tenant, o.ts], 10)
            assert o.by_user == compute_shard([o.user, o.tenant], 16)
        s.commit()
    with engine.connect() as conn:
        for row in conn.execute(sa.select(TwoShards.__table__)):
            assert row.by_time == compute_shard([row.tenant, row.ts], 10)
            assert row.by_user == compute_shard([row.user, row.tenant], 16)


class MaybeTenant(Base):
    __tablename__ = "uc_maybe_tenant"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    tenant: Mapped[str | None] = mapped_column(sa.String(32))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    shard: Mapped[int] = shard_column("tenant", "ts", count=16)


def test_a_stored_null_in_the_source_read_is_refused_and_nothing_written() -> None:
    """The stored value read for the source the flush does not send is NULL (a raw write
    put it there): the flush is refused with the source named, and no row changes."""
    engine = sa.create_engine("sqlite://")
    _load(engine, MaybeTenant, _rows(20))
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE uc_maybe_tenant SET tenant = NULL WHERE id = 7").execution_options(
                sharded_orm_raw_sql_ok=True
            )
        )
    with Session(engine) as s:
        objs = s.scalars(sa.select(MaybeTenant)).all()
        for o in objs:
            o.ts = o.ts + dt.timedelta(days=1)
        with Spy(engine) as spy, pytest.raises(ShardValueError, match="uc_maybe_tenant.tenant"):
            s.flush()
        assert spy.of("UPDATE") == []
    with engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.max(MaybeTenant.ts))) == T0 + dt.timedelta(seconds=19)


def test_every_flush_of_a_session_writes_its_shards_back(engine: sa.Engine) -> None:
    """Flushes on one connection, with commits and a rollback between them: each object
    holds the shard its row stores after every flush (what one flush recorded for the
    next never carries over)."""
    _load(engine, Event, _rows(40))
    with Session(engine) as s:
        objs = s.scalars(sa.select(Event).order_by(Event.id)).all()
        for step in range(4):
            for o in objs[step::2]:
                o.ts = o.ts + dt.timedelta(hours=step + 1)
            s.flush()
            assert all(o.shard == compute_shard([o.tenant, o.ts], 16) for o in objs)
            if step == 1:
                s.rollback()
                objs = s.scalars(sa.select(Event).order_by(Event.id)).all()
            else:
                s.commit()
        kept = {o.id: o.shard for o in objs}
    with engine.connect() as conn:
        for row in conn.execute(sa.select(Event.__table__)):
            assert row.shard == compute_shard([row.tenant, row.ts], 16) == kept[row.id]
