"""Shard columns are right on every write path, on SQLite and on the Spanner emulator.

Every test writes through one path and then reads the rows back, checking each stored
shard against ``compute_shard`` of the stored sources.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import (
    ShardConfigError,
    ShardMismatchError,
    ShardTypeError,
    ShardValueError,
    UTCDateTime,
    compute_shard,
    get_shard_column,
    shard_column,
    shard_columns,
)

UTC = dt.timezone.utc
T0 = dt.datetime(2018, 5, 1, 15, 16, 3, 386257, tzinfo=UTC)


def _now() -> dt.datetime:
    return dt.datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class LogEntry(Base):
    __tablename__ = "LogEntries"

    company_id: Mapped[str] = mapped_column("CompanyId", sa.String(64), primary_key=True)
    entry_id: Mapped[int] = mapped_column("EntryId", primary_key=True, autoincrement=False)
    ts: Mapped[dt.datetime] = mapped_column("Timestamp", UTCDateTime, default=_now)
    message: Mapped[str | None] = mapped_column("LogEntry", sa.String(200))
    entry_shard_id: Mapped[int] = shard_column("company_id", "ts", count=10, name="EntryShardId")
    company_shard: Mapped[int] = shard_column(
        "company_id", count=16, algorithm="farm_fingerprint", server_side=True, name="CompanyShard"
    )


T = LogEntry.__table__


@pytest.fixture
def db(engine: sa.Engine) -> Iterator[sa.Engine]:
    Base.metadata.create_all(engine)
    yield engine


def stored(engine: sa.Engine) -> list[sa.RowMapping]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(T).order_by(T.c.CompanyId, T.c.EntryId)).mappings())


def assert_all_consistent(engine: sa.Engine, expected_rows: int) -> None:
    rows = stored(engine)
    assert len(rows) == expected_rows
    for r in rows:
        assert r["EntryShardId"] == compute_shard((r["CompanyId"], r["Timestamp"]), 10), dict(r)
        assert r["CompanyShard"] == compute_shard(r["CompanyId"], 16, "farm_fingerprint"), dict(r)


def rows(n: int, start: int = 0, ts: dt.datetime = T0) -> list[dict[str, object]]:
    return [
        {"company_id": f"c{i % 3}", "entry_id": i, "ts": ts + dt.timedelta(seconds=i)}
        for i in range(start, start + n)
    ]


# ----------------------------------------------------------------------------- inserts


def test_session_add_flush(db: sa.Engine) -> None:
    with Session(db) as s:
        objs = [LogEntry(**r) for r in rows(5)]
        s.add_all(objs)
        s.flush()
        # the object knows its shard without a reload
        assert objs[1].entry_shard_id == compute_shard(("c1", T0 + dt.timedelta(seconds=1)), 10)
        s.commit()
    assert_all_consistent(db, 5)


def test_python_default_of_a_source_is_hashed_and_stored(db: sa.Engine) -> None:
    before = _now()
    with Session(db) as s:
        s.add(LogEntry(company_id="acme", entry_id=1))
        s.commit()
    with db.begin() as conn:
        conn.execute(T.insert(), [{"CompanyId": "acme", "EntryId": 2}])
    assert_all_consistent(db, 2)
    assert all(r["Timestamp"] >= before for r in stored(db))


def test_orm_bulk_insert_statement(db: sa.Engine) -> None:
    with Session(db) as s:
        s.execute(sa.insert(LogEntry), rows(6))
        s.commit()
    assert_all_consistent(db, 6)


def test_bulk_insert_mappings_and_save_objects(db: sa.Engine) -> None:
    with Session(db) as s:
        s.bulk_insert_mappings(LogEntry, rows(3))  # type: ignore[arg-type]
        s.bulk_save_objects([LogEntry(**r) for r in rows(3, start=10)])
        s.commit()
    assert_all_consistent(db, 6)


def test_core_single_and_executemany(db: sa.Engine) -> None:
    with db.begin() as conn:
        conn.execute(T.insert().values(CompanyId="solo", EntryId=1, Timestamp=T0))
        conn.execute(T.insert(), {"CompanyId": "one", "EntryId": 2, "Timestamp": T0})
        conn.execute(
            T.insert(),
            [{"CompanyId": f"m{i}", "EntryId": 10 + i, "Timestamp": T0} for i in range(5)],
        )
    assert_all_consistent(db, 7)


def test_core_multi_values(db: sa.Engine) -> None:
    with db.begin() as conn:
        conn.execute(
            T.insert().values(
                [{"CompanyId": f"v{i}", "EntryId": i, "Timestamp": T0} for i in range(4)]
            )
        )
    assert_all_consistent(db, 4)


def test_orm_multi_values(db: sa.Engine) -> None:
    with Session(db) as s:
        s.execute(sa.insert(LogEntry).values(rows(4)))
        s.commit()
    assert_all_consistent(db, 4)


def test_caller_rows_are_not_mutated(db: sa.Engine) -> None:
    data = [{"CompanyId": "a", "EntryId": 1, "Timestamp": T0}]
    with db.begin() as conn:
        conn.execute(T.insert(), data)
    assert data == [{"CompanyId": "a", "EntryId": 1, "Timestamp": T0}]


# ----------------------------------------------------------------------------- updates


def test_orm_attribute_change_recomputes(db: sa.Engine) -> None:
    with Session(db) as s:
        s.add_all([LogEntry(**r) for r in rows(3)])
        s.commit()
    with Session(db) as s:
        e = s.get(LogEntry, ("c1", 1))
        assert e is not None
        e.ts = T0 + dt.timedelta(days=3)
        s.commit()
        assert e.entry_shard_id == compute_shard(("c1", T0 + dt.timedelta(days=3)), 10)
    assert_all_consistent(db, 3)


def test_core_update_setting_every_source(db: sa.Engine) -> None:
    with db.begin() as conn:
        conn.execute(
            T.insert(), [{"CompanyId": "a", "EntryId": i, "Timestamp": T0} for i in range(3)]
        )
        # the company is a key column: pinned by equality in WHERE, ts in SET
        conn.execute(
            sa.update(T)
            .where(T.c.CompanyId == "a", T.c.EntryId == 1)
            .values(Timestamp=T0 + dt.timedelta(hours=5))
        )
    assert_all_consistent(db, 3)
    assert {r["Timestamp"] for r in stored(db)} == {T0, T0 + dt.timedelta(hours=5)}


def test_orm_update_statement(db: sa.Engine) -> None:
    with Session(db) as s:
        s.execute(sa.insert(LogEntry), rows(4))
        s.execute(
            sa.update(LogEntry)
            .where(LogEntry.company_id == "c1")
            .values(ts=T0 + dt.timedelta(days=1))
        )
        s.commit()
    assert_all_consistent(db, 4)


def test_orm_bulk_update_by_primary_key(db: sa.Engine) -> None:
    with Session(db) as s:
        s.execute(sa.insert(LogEntry), rows(4))
        s.execute(
            sa.update(LogEntry),
            [
                {"company_id": "c0", "entry_id": 0, "ts": T0 + dt.timedelta(days=2)},
                {"company_id": "c1", "entry_id": 1, "ts": T0 + dt.timedelta(days=9)},
            ],
        )
        s.commit()
    assert_all_consistent(db, 4)


def test_update_of_other_columns_leaves_shards_alone(db: sa.Engine) -> None:
    with db.begin() as conn:
        conn.execute(T.insert(), rows_core(3))
        conn.execute(sa.update(T).values(LogEntry="hello"))
    assert_all_consistent(db, 3)


def rows_core(n: int) -> list[dict[str, object]]:
    return [{"CompanyId": "a", "EntryId": i, "Timestamp": T0} for i in range(n)]


def test_update_that_cannot_recompute_is_refused(db: sa.Engine) -> None:
    with db.begin() as conn:
        conn.execute(T.insert(), rows_core(2))
    with pytest.raises(ShardConfigError, match="not shard source 'CompanyId'"), db.begin() as conn:
        # a range UPDATE of the timestamp: the company of each row is unknown to the client
        conn.execute(sa.update(T).where(T.c.EntryId >= 0).values(Timestamp=T0 + dt.timedelta(1)))
    assert_all_consistent(db, 2)
    assert {r["Timestamp"] for r in stored(db)} == {T0}


def test_update_of_the_shard_alone_is_refused(db: sa.Engine) -> None:
    with db.begin() as conn:
        conn.execute(T.insert(), rows_core(1))
    with pytest.raises(ShardConfigError, match="sets 'EntryShardId'"), db.begin() as conn:
        conn.execute(sa.update(T).where(T.c.EntryId == 0).values(EntryShardId=3))
    assert_all_consistent(db, 1)


# ----------------------------------------------------------------------------- mismatches


def test_wrong_shard_given_to_the_orm_is_refused(db: sa.Engine) -> None:
    right = compute_shard(("a", T0), 10)
    with Session(db) as s:
        s.add(LogEntry(company_id="a", entry_id=1, ts=T0, entry_shard_id=(right + 1) % 10))
        with pytest.raises(ShardMismatchError, match="EntryShardId=.* disagrees"):
            s.flush()
    assert stored(db) == []


def test_wrong_shard_given_to_core_is_refused(db: sa.Engine) -> None:
    right = compute_shard(("a", T0), 10)
    bad = {"CompanyId": "a", "EntryId": 1, "Timestamp": T0, "EntryShardId": (right + 1) % 10}
    good = {"CompanyId": "a", "EntryId": 2, "Timestamp": T0, "EntryShardId": right}
    with pytest.raises(ShardMismatchError), db.begin() as conn:
        conn.execute(T.insert(), [good, bad])
    assert stored(db) == []
    with db.begin() as conn:  # a right explicit value is accepted
        conn.execute(T.insert(), [good])
    assert_all_consistent(db, 1)


def test_wrong_server_side_shard_is_refused(db: sa.Engine) -> None:
    right = compute_shard("a", 16, "farm_fingerprint")
    with pytest.raises(ShardMismatchError, match="CompanyShard"), db.begin() as conn:
        conn.execute(T.insert(), [{**rows_core(1)[0], "CompanyShard": (right + 1) % 16}])
    assert stored(db) == []


def test_wrong_shard_in_orm_update_is_refused(db: sa.Engine) -> None:
    with Session(db) as s:
        s.add(LogEntry(company_id="a", entry_id=1, ts=T0))
        s.commit()
        e = s.get(LogEntry, ("a", 1))
        assert e is not None
        e.entry_shard_id = (e.entry_shard_id + 1) % 10
        with pytest.raises(ShardMismatchError):
            s.commit()
    assert_all_consistent(db, 1)


# ----------------------------------------------------------------------------- bad values


def test_none_source_is_refused(db: sa.Engine) -> None:
    with pytest.raises(ShardValueError, match="cannot hash None"), db.begin() as conn:
        conn.execute(T.insert(), [{"CompanyId": None, "EntryId": 1, "Timestamp": T0}])
    assert stored(db) == []


def test_naive_datetime_is_refused(db: sa.Engine) -> None:
    with Session(db) as s:
        s.add(LogEntry(company_id="a", entry_id=1, ts=dt.datetime(2020, 1, 1)))
        with pytest.raises(ShardValueError, match="naive datetime"):
            s.flush()
    assert stored(db) == []


def test_sql_expression_source_is_refused(db: sa.Engine) -> None:
    with pytest.raises(ShardConfigError, match="SQL expression"), db.begin() as conn:
        conn.execute(
            T.insert().values(CompanyId="a", EntryId=1, Timestamp=sa.func.current_timestamp())
        )


# ----------------------------------------------------------------------------- declaration


def _declare(**shard_kwargs: object) -> type:
    class B(DeclarativeBase):
        pass

    try:

        class M(B):
            __tablename__ = "m"
            id: Mapped[int] = mapped_column(primary_key=True)
            a: Mapped[str]
            f: Mapped[float]
            s: Mapped[int] = shard_column(*shard_kwargs.pop("sources", ("a",)), **shard_kwargs)  # type: ignore[arg-type]

    except Exception:
        B.registry.dispose()  # a refused model leaves no mapper for a later configure
        raise
    return M


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"count": 0}, ShardConfigError, "between 1 and"),
        ({"count": -4}, ShardConfigError, "between 1 and"),
        ({"count": 2.0}, ShardConfigError, "must be an int"),
        ({"count": True}, ShardConfigError, "must be an int"),
        ({"count": 4, "algorithm": "sha1"}, ShardConfigError, "unknown shard algorithm"),
        ({"count": 4, "server_side": True}, ShardConfigError, "needs algorithm='farm_fingerprint'"),
        (
            {"count": 4, "sources": ("nope",)},
            ShardConfigError,
            "'nope' is not a column of table 'm'",
        ),
        ({"count": 4, "sources": ()}, ShardConfigError, "at least one source"),
        ({"count": 4, "sources": (3,)}, ShardTypeError, "column names"),
        ({"count": 4, "default": 1}, ShardConfigError, "remove default="),
    ],
)
def test_bad_declarations(kwargs: dict[str, object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        _declare(**kwargs)


def test_float_source_column_is_refused_at_declaration() -> None:
    # Was refused only at the first write ("type float"); a Float column can never be an
    # exact source, so the model itself is refused now (issue 11, item 4).
    with pytest.raises(ShardConfigError, match="cannot be a shard source"):
        _declare(count=4, sources=("a", "f"))


def test_introspection() -> None:
    sc = get_shard_column(LogEntry, "entry_shard_id")
    assert (sc.name, sc.key, sc.count, sc.algorithm, sc.server_side) == (
        "EntryShardId",
        "EntryShardId",
        10,
        "crc32",
        False,
    )
    assert [c.name for c in sc.sources] == ["CompanyId", "Timestamp"]
    assert sc.source_keys == ("CompanyId", "Timestamp")  # column keys, as Core uses them
    assert sc.spec.sources == ("company_id", "ts")  # as declared
    assert [c.key for c in shard_columns(T)] == ["EntryShardId", "CompanyShard"]
    assert get_shard_column(T, "CompanyShard").server_side is True
    with pytest.raises(ShardConfigError, match="not a shard column"):
        get_shard_column(LogEntry, "ts")
    with pytest.raises(ShardConfigError, match="2 shard columns; name the one"):
        get_shard_column(LogEntry)
