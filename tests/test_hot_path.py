"""The insert hot path hashes each row once, and never trusts a shard it cannot prove.

A shard outside the primary key is computed once, at flush: building objects hashes
nothing. A shard in the primary key is needed earlier (``session.merge()`` and the
identity map key the object by it), so the ORM's attribute ``set`` listener derives it as
soon as every source is known and remembers which source objects it hashed; the flush
takes that shard while the instance still holds those very objects, and hashes again
whenever anything could have changed behind the listener's back (``__dict__`` written
directly, a validator that converts, a mutable value changed in place, a shard set by
hand). Each test counts the hash calls with an instrumented CRC and reads the stored rows
back.
"""

from __future__ import annotations

import datetime as dt
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, validates

from sharded_orm import ShardMismatchError, UTCDateTime, compute_shard, shard_column
from sharded_orm.write import fastpath

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 3, 1, 12, 30, 5, 123456, tzinfo=UTC)


class Calls:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, data: bytes) -> int:
        self.n += 1
        return zlib.crc32(data)


@pytest.fixture
def crc(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Counts the hashes of generated hot-path functions built while the test runs."""
    calls = Calls()
    monkeypatch.setitem(fastpath._COMMON, "CRC", calls)
    return calls


def make_models(
    with_validator: bool = False, key_shard: bool = False
) -> tuple[type[Any], type[Any]]:
    class Base(DeclarativeBase):
        pass

    class Entry(Base):
        __tablename__ = "entries"
        id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
        company_id: Mapped[str] = mapped_column("CompanyId", sa.String(32))
        ts: Mapped[dt.datetime] = mapped_column("Timestamp", UTCDateTime)
        payload: Mapped[bytes] = mapped_column(sa.LargeBinary, default=b"")
        entry_shard_id: Mapped[int] = shard_column(
            "company_id", "ts", count=10, primary_key=key_shard
        )
        blob_shard: Mapped[int] = shard_column("payload", count=8)

        if with_validator:

            @validates("company_id")
            def _upper(self, key: str, value: str) -> str:
                return value.upper()

    return Base, Entry


@pytest.fixture
def db() -> Iterator[sa.Engine]:
    eng = sa.create_engine("sqlite://")
    yield eng
    eng.dispose()


def stored(eng: sa.Engine, model: type[Any]) -> list[sa.RowMapping]:
    with eng.connect() as conn:
        return list(conn.execute(sa.select(model.__table__).order_by("id")).mappings())


def assert_consistent(eng: sa.Engine, model: type[Any], n: int) -> None:
    got = stored(eng, model)
    assert len(got) == n
    for r in got:
        assert r["entry_shard_id"] == compute_shard([r["CompanyId"], r["Timestamp"]], 10)
        assert r["blob_shard"] == compute_shard([r["payload"]], 8)


def test_each_row_is_hashed_once_at_flush_and_not_while_built(db: sa.Engine, crc: Calls) -> None:
    base, entry = make_models()
    base.metadata.create_all(db)
    objs = [
        entry(id=i, company_id=f"c{i}", ts=T0 + dt.timedelta(seconds=i), payload=b"x")
        for i in range(20)
    ]
    assert crc.n == 0  # building objects hashes nothing
    assert all(o.entry_shard_id is None for o in objs)
    with Session(db) as s:
        s.add_all(objs)
        s.flush()
        assert crc.n == 20  # one hash per row (the blob shard takes the general path)
        assert [o.entry_shard_id for o in objs] == [
            compute_shard([o.company_id, o.ts], 10) for o in objs
        ]
        s.commit()
    assert_consistent(db, entry, 20)


def test_flush_takes_the_key_shards_the_listener_derived(db: sa.Engine, crc: Calls) -> None:
    base, entry = make_models(key_shard=True)
    base.metadata.create_all(db)
    objs = [
        entry(id=i, company_id=f"c{i}", ts=T0 + dt.timedelta(seconds=i), payload=b"x")
        for i in range(20)
    ]
    assert all(o.entry_shard_id is not None for o in objs)  # derived: merge needs it
    with Session(db) as s:
        s.add_all(objs)
        s.flush()
        assert crc.n == 0  # taken by the flush, not hashed again
        s.commit()
    assert_consistent(db, entry, 20)


def test_a_source_written_behind_the_listener_is_hashed_again_not_trusted(
    db: sa.Engine, crc: Calls
) -> None:
    """The derived shard belongs to the old value: the flush hashes the new one and stores
    its shard (a shard the library derived is never taken for one the caller gave)."""
    base, entry = make_models(key_shard=True)
    base.metadata.create_all(db)
    obj = entry(id=1, company_id="acme", ts=T0, payload=b"x")
    later = T0 + dt.timedelta(days=1)
    obj.__dict__["ts"] = later  # no set event
    with Session(db) as s:
        s.add(obj)
        s.commit()
        assert crc.n >= 1
        assert obj.entry_shard_id == compute_shard(["acme", later], 10)
    assert_consistent(db, entry, 1)


def test_an_equal_but_different_source_object_is_hashed_again(db: sa.Engine, crc: Calls) -> None:
    base, entry = make_models(key_shard=True)
    base.metadata.create_all(db)
    obj = entry(id=1, company_id="acme", ts=T0, payload=b"x")
    crc.n = 0
    obj.__dict__["ts"] = T0.replace()  # equal, not the same object: no proof either way
    with Session(db) as s:
        s.add(obj)
        s.commit()
    assert crc.n == 1
    assert_consistent(db, entry, 1)


def test_a_converting_validator_gets_the_shard_of_what_is_stored(db: sa.Engine) -> None:
    base, entry = make_models(with_validator=True)
    base.metadata.create_all(db)
    with Session(db) as s:
        s.add(entry(id=1, company_id="acme", ts=T0, payload=b"x"))
        s.commit()
    (row,) = stored(db, entry)
    assert row["CompanyId"] == "ACME"
    assert_consistent(db, entry, 1)


def test_a_mutable_source_changed_in_place_is_hashed_as_stored(db: sa.Engine) -> None:
    base, entry = make_models()
    base.metadata.create_all(db)
    payload = bytearray(b"before")
    obj = entry(id=1, company_id="acme", ts=T0, payload=payload)
    payload[:] = b"after!"
    with Session(db) as s:
        s.add(obj)
        s.commit()
    (row,) = stored(db, entry)
    assert bytes(row["payload"]) == b"after!"
    assert_consistent(db, entry, 1)


@pytest.mark.parametrize("key_shard", [False, True])
def test_a_shard_set_by_hand_after_the_sources_is_still_checked(
    db: sa.Engine, key_shard: bool
) -> None:
    base, entry = make_models(key_shard=key_shard)
    base.metadata.create_all(db)
    obj = entry(id=1, company_id="acme", ts=T0, payload=b"x")
    obj.entry_shard_id = (compute_shard(["acme", T0], 10) + 1) % 10
    with Session(db) as s:
        s.add(obj)
        with pytest.raises(ShardMismatchError, match="entry_shard_id"):
            s.flush()
    assert stored(db, entry) == []


@pytest.mark.parametrize("key_shard", [False, True])
def test_changing_a_source_after_construction_moves_the_shard(
    db: sa.Engine, crc: Calls, key_shard: bool
) -> None:
    base, entry = make_models(key_shard=key_shard)
    base.metadata.create_all(db)
    obj = entry(id=1, company_id="acme", ts=T0, payload=b"x")
    obj.ts = T0 + dt.timedelta(hours=5)
    obj.company_id = "globex"
    built = crc.n
    with Session(db) as s:
        s.add(obj)
        s.commit()
    # a key shard follows each set (hashed by the listener, not by the flush's generated
    # code, which takes it); any other is hashed at flush, once
    assert (built, crc.n) == (0, 0 if key_shard else 1)
    assert_consistent(db, entry, 1)
