"""Key strategies: bit reversal, id mixins, hashed keys, pooled sequences."""

from __future__ import annotations

import random
import threading
import uuid
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import (
    BitReversedPrimaryKeyMixin,
    HashedPrimaryKeyMixin,
    SequenceExhausted,
    ShardConfigError,
    ShardTypeError,
    ShardValueError,
    SpannerSequence,
    TableSequence,
    UUIDPrimaryKeyMixin,
    bit_reverse,
    compute_shard,
    get_by_id,
    hashed_reference,
    id_filter,
)
from sharded_orm.ids import INT64_MAX

EDGES = [0, 1, 2, 2**62, 2**63 - 1]

# ----------------------------------------------------------------------------- bit_reverse


@given(st.integers(0, INT64_MAX))
def test_bit_reverse_is_an_involution_in_range(n: int) -> None:
    r = bit_reverse(n)
    assert 0 <= r <= INT64_MAX and bit_reverse(r) == n


def test_bit_reverse_edges() -> None:
    assert [bit_reverse(n) for n in EDGES] == [0, 2**62, 2**61, 1, 2**63 - 1]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (-1, ShardValueError),
        (2**63, ShardValueError),
        (1.0, ShardTypeError),
        (True, ShardTypeError),
        ("7", ShardTypeError),
    ],
)
def test_bit_reverse_bad_input(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        bit_reverse(value)


@pytest.mark.emulator
def test_bit_reverse_equals_spanner(spanner_engine: sa.Engine) -> None:
    rng = random.Random(5)
    values = EDGES + [rng.randrange(0, 2**63) for _ in range(1000)] + [1 << b for b in range(63)]
    with spanner_engine.connect() as conn:
        array = ", ".join(str(int(v)) for v in values)  # ints only: safe to inline
        got = conn.execute(
            sa.text(f"SELECT n, BIT_REVERSE(n, TRUE) FROM UNNEST([{array}]) AS n")
        ).all()
    assert len(got) == len(values)
    assert all(bit_reverse(n) == r for n, r in got)


# ----------------------------------------------------------------------------- mixins


class Base(DeclarativeBase):
    pass


class Doc(UUIDPrimaryKeyMixin, Base):
    __tablename__ = "docs"
    title: Mapped[str] = mapped_column(sa.String(50))


class Counter(BitReversedPrimaryKeyMixin, Base):
    __tablename__ = "counters"
    name: Mapped[str] = mapped_column(sa.String(50))


class Customer(HashedPrimaryKeyMixin, Base):
    __tablename__ = "customers"
    name: Mapped[str] = mapped_column(sa.String(50))


class Order(UUIDPrimaryKeyMixin, Base):
    __tablename__ = "orders"
    item: Mapped[str] = mapped_column(sa.String(50))


hashed_reference(Order, Customer, prefix="customer")


def test_uuid_ids_on_every_insert_path(engine: sa.Engine) -> None:
    Base.metadata.create_all(engine)
    t = Doc.__table__
    with Session(engine) as s:
        s.add(Doc(title="a"))
        s.flush()
        s.execute(sa.insert(Doc), [{"title": "b"}, {"title": "c"}])
        s.bulk_insert_mappings(Doc, [{"title": "d"}])  # type: ignore[arg-type]
        s.commit()
    with engine.begin() as conn:
        conn.execute(t.insert(), [{"title": "e"}, {"title": "f"}])
        conn.execute(t.insert().values([{"title": "g"}, {"title": "h"}]))
    with engine.connect() as conn:
        ids = conn.execute(sa.select(t.c.id)).scalars().all()
    assert len(ids) == len(set(ids)) == 8
    assert all(uuid.UUID(i).version == 4 for i in ids)


def test_bit_reversed_ids(engine: sa.Engine) -> None:
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        objs = [Counter(name=str(i)) for i in range(6)]
        s.add_all(objs)
        s.flush()
        s.execute(sa.insert(Counter), [{"name": "x"}, {"name": "y"}])
        s.commit()
        ids = s.scalars(sa.select(Counter.id)).all()
        assert all(o.id > 0 for o in objs)
    assert len(ids) == len(set(ids)) == 8 and all(i > 0 for i in ids)
    if engine.dialect.name != "sqlite":  # Spanner's identity: spread over the high bits
        assert len({i >> 59 for i in ids}) >= 3


def test_hashed_keys_lookups_and_children(engine: sa.Engine) -> None:
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        s.add_all([Customer(id=i, name=f"c{i}") for i in (1, 2, 3)])
        s.flush()
        c2 = get_by_id(s, Customer, 2)
        assert c2 is not None and c2.name == "c2"
        assert c2.hashed_id == compute_shard(2, 1 << 16)
        s.add(Order(item="book", customer=c2))
        s.add(Order(item="pen", customer_id=3))  # hashed_id filled from the id by the hook
        s.commit()
    with Session(engine) as s:
        found = s.scalars(sa.select(Customer).where(id_filter(Customer, 3))).one()
        assert found.name == "c3"
        rows = s.execute(
            sa.select(Order.item, Customer.name).join(Order.customer).order_by(Order.item)
        ).all()
        assert rows == [("book", "c2"), ("pen", "c3")]
        join_sql = str(sa.select(Order).join(Order.customer).compile(engine))
        assert "customers.hashed_id = orders.customer_hashed_id" in join_sql
        assert "customers.id = orders.customer_id" in join_sql


def test_hashed_bad_input() -> None:
    with pytest.raises(ShardTypeError, match="ids are ints"):
        id_filter(Customer, "2")  # type: ignore[arg-type]
    with pytest.raises(ShardConfigError, match="has no hashed key"):
        id_filter(Doc, 2)

    class Other(UUIDPrimaryKeyMixin, Base):
        __tablename__ = "others"

    with pytest.raises(ShardConfigError, match="has no hashed key"):
        hashed_reference(Other, Doc, prefix="doc")


# ----------------------------------------------------------------------------- sequences


@pytest.mark.parametrize("size", [0, -5, 2.5, True])
def test_bad_block_sizes(size: Any) -> None:
    with pytest.raises((ShardConfigError, ShardTypeError)):
        TableSequence(sa.create_engine("sqlite://"), "s", block_size=size)


def test_bad_skip_range() -> None:
    with pytest.raises(ShardConfigError, match="above its maximum"):
        SpannerSequence.create_ddl("s", skip_range=(100, 10))


def draw_concurrently(gens: list[Any], threads: int, per_thread: int) -> list[int]:
    out: list[list[int]] = [[] for _ in range(threads)]

    def work(i: int) -> None:
        gen = gens[i % len(gens)]
        out[i].extend(gen.next_id() for _ in range(per_thread))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return [v for chunk in out for v in chunk]


def test_table_sequence_on_sqlite_file(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'seq.db'}"
    e1, e2 = sa.create_engine(url), sa.create_engine(url)
    s1 = TableSequence(e1, "orders", block_size=50)
    s1.create_table()
    s2 = TableSequence(e2, "orders", block_size=50, bit_reversed=True)
    values = draw_concurrently([s1, s2], 8, 500)
    assert len(values) == len(set(values)) == 4000


def test_table_sequence_exhaustion() -> None:
    eng = sa.create_engine("sqlite://")
    seq = TableSequence(eng, "x", block_size=10)
    seq.create_table()
    with eng.begin() as conn:
        conn.execute(seq.table.insert(), {"Sequence_ID": "x", "Next_Value": INT64_MAX - 5})
    with pytest.raises(SequenceExhausted, match="exhausted"):
        seq.next_id()


@pytest.mark.emulator
def test_sequences_on_the_emulator_never_duplicate(spanner_emulator: Any) -> None:
    db = spanner_emulator.create_database(
        [SpannerSequence.create_ddl("ids", skip_range=(1, 1 << 40))]
    )
    e1, e2 = spanner_emulator.engine(db), spanner_emulator.engine(db)
    native = SpannerSequence(e1, "ids", block_size=100)
    values = draw_concurrently([native], 8, 5000)
    assert len(values) == len(set(values)) == 40_000
    assert native.reservations == 400
    assert all(v > 0 and not 1 <= v <= 1 << 40 for v in values)  # the skip range is skipped
    other = SpannerSequence(e2, "ids", block_size=100)
    both = draw_concurrently([native, other], 4, 500)
    assert len(set(both) | set(values)) == len(both) + len(values)
    table1 = TableSequence(e1, "orders", block_size=100)
    table1.create_table()
    table2 = TableSequence(e2, "orders", block_size=100)
    tvalues = draw_concurrently([table1, table2], 8, 5000)
    assert len(tvalues) == len(set(tvalues)) == 40_000
    e1.dispose()
    e2.dispose()


def test_aborted_reservation_is_retried(mock_spanner: Any) -> None:
    engine = mock_spanner.engine()
    seq = SpannerSequence(engine, "s", block_size=3)
    mock_spanner.add_result(
        "SELECT GET_NEXT_SEQUENCE_VALUE(SEQUENCE s) FROM UNNEST(GENERATE_ARRAY(1, @a0))",
        [("v", "INT64")],
        [[11], [22], [33]],
    )
    mock_spanner.add_error("Commit", grpc.StatusCode.ABORTED, "aborted by the test")
    assert [seq.next_id() for _ in range(3)] == [11, 22, 33]
    assert mock_spanner.count("CommitRequest") == 2  # the aborted commit, then the retry
    assert seq.reservations == 1
    engine.dispose()
