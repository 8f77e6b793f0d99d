"""The simulator makes version-1 UUID keys as a host does: ``time_low`` first, so the rows
written together sit together and their point sweeps the key space, wrapping about every
7.16 minutes (not the end of the key space, like a version-7 key)."""

from __future__ import annotations

import datetime as dt
import uuid

import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm.tools.simulate import Workload, guess_role, sample_rows, simulate
from sharded_orm.tools.simulate.workload import uuid1

#: time_low counts 100-ns intervals: 2**32 of them
WRAP_SECONDS = 2**32 / 10_000_000


def uuid7() -> uuid.UUID:
    """An app's own version-7 helper (Python before 3.14 has none)."""
    import os
    import time

    ms = time.time_ns() // 1_000_000
    return uuid.UUID(
        int=(ms << 80) | (0x7 << 76) | (2 << 62) | int.from_bytes(os.urandom(7), "big")
    )


class Base(DeclarativeBase):
    pass


class V1Keyed(Base):
    __tablename__ = "v1_keyed"
    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid, primary_key=True, default=uuid.uuid1)
    body: Mapped[str] = mapped_column(sa.String(20), default="")


class V7Keyed(Base):
    __tablename__ = "v7_keyed"
    id: Mapped[uuid.UUID] = mapped_column(sa.Uuid, primary_key=True, default=uuid7)
    body: Mapped[str] = mapped_column(sa.String(20), default="")


def test_a_uuid1_default_is_simulated_as_version_1_uuids() -> None:
    v1, v7 = V1Keyed.__table__, V7Keyed.__table__
    assert isinstance(v1, sa.Table) and isinstance(v7, sa.Table)
    assert guess_role(v1.c.id) == "uuid1"
    assert guess_role(v7.c.id) == "uuid7"
    rows = sample_rows(V1Keyed, Workload(rows_per_second=100, duration=10), 50)
    assert all(isinstance(r["id"], uuid.UUID) and r["id"].version == 1 for r in rows)


@given(
    st.integers(min_value=0, max_value=32_503_680_000_000_000),
    st.integers(min_value=0, max_value=2**62 - 1),
)
def test_uuid1_holds_the_time_it_was_made_at(t_us: int, node: int) -> None:
    made = uuid1(t_us, node)
    assert made.version == 1 and made.variant == uuid.RFC_4122
    since_1582 = dt.timedelta(microseconds=made.time // 10)
    assert dt.datetime(1582, 10, 15) + since_1582 == dt.datetime(1970, 1, 1) + dt.timedelta(
        microseconds=t_us
    )


def test_the_hot_point_of_a_v1_key_sweeps_and_wraps_where_a_v7_key_stays_at_the_end() -> None:
    run = Workload(rows_per_second=40, duration=2 * WRAP_SECONDS)
    v1 = simulate(V1Keyed, run).results[0]
    v7 = simulate(V7Keyed, run).results[0]

    def hot(result: object) -> list[int]:
        heat = result.heatmap  # type: ignore[attr-defined]
        return [max(range(len(row)), key=row.__getitem__) for row in heat if any(row)]

    v1_hot, v7_hot = hot(v1), hot(v7)
    n = len(v1.heatmap[0])
    # a v7 key's inserts stay at the end of the key space (its newest ranges)
    assert v7_hot == sorted(v7_hot) and min(v7_hot) >= n // 2 - 1
    # a v1 key's hot range visits most of the key space, and goes back to its start
    assert len(set(v1_hot)) >= n // 2
    assert any(b < a for a, b in zip(v1_hot, v1_hot[1:], strict=False))
