"""Issue 43: a version-1 UUID key is not a key that grows at its end.

A v1 UUID's text starts with ``time_low``, the low 32 bits of its 100-ns clock, which
wraps about every 7.16 minutes: the rows written together land together, at a point that
walks across the key space and wraps. doctor's ``value_role`` gives it a role of its own
(``uuid1``), not ``uuid7``: a hot range of v1 keys is not ``monotonic`` (no key reshard
planned for it), the finding says what a v1 key does and that new v4 ids fix it, and
``--fix`` refuses it with the same. advise does not take a v1 key for a growing part.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from typing import Any

import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import doctor
from sharded_orm.schema.columns import table_of
from sharded_orm.tools.advise.layout import held_roles
from sharded_orm.tools.doctor.changes import Planner, Refusal
from sharded_orm.tools.doctor.diagnose import attribute_names
from sharded_orm.tools.doctor.keys import UUID1_WRAP_MINUTES, Catalog, value_role

GREGORIAN = dt.datetime(1582, 10, 15, tzinfo=dt.timezone.utc)
T0 = dt.datetime(2026, 11, 23, 10, 0, tzinfo=dt.timezone.utc)


def v1(when: dt.datetime, clock_seq: int, node: int) -> uuid.UUID:
    """The version-1 UUID ``uuid.uuid1`` makes at ``when`` (100-ns ticks since 1582)."""
    ticks = (when - GREGORIAN) // dt.timedelta(microseconds=1) * 10
    return uuid.UUID(
        fields=(
            ticks & 0xFFFFFFFF,
            (ticks >> 32) & 0xFFFF,
            (ticks >> 48) & 0x0FFF | 0x1000,
            0x80 | (clock_seq >> 8) & 0x3F,
            clock_seq & 0xFF,
            node,
        )
    )


#: the app's generator, behind a name that says nothing
_MAKE_ID = uuid.uuid1


def new_id() -> str:
    """The app's id helper (neither its name nor the names its code calls say what it
    makes): version-1 UUIDs."""
    return str(_MAKE_ID())


class Base(DeclarativeBase):
    pass


class Event(Base):  # declared: a random key (the helper's name says nothing)
    __tablename__ = "Events"
    id: Mapped[str] = mapped_column("Id", sa.String(36), primary_key=True, default=new_id)
    body: Mapped[str] = mapped_column("Body", sa.String(100))


class Order(Base):  # declared by a uuid1 default: role uuid1 (it was taken for uuid7)
    __tablename__ = "Orders"
    id: Mapped[str] = mapped_column("Id", sa.String(36), primary_key=True, default=uuid.uuid1)


whens = st.datetimes(
    min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2099, 12, 31),
    timezones=st.just(dt.timezone.utc),
)  # fmt: skip
clock_seqs = st.integers(0, 2**14 - 1)
nodes = st.integers(0, 2**48 - 1)


@settings(max_examples=200, deadline=None)
@given(when=whens, clock_seq=clock_seqs, node=nodes)
def test_a_version_1_uuid_in_any_form_is_uuid1(
    when: dt.datetime, clock_seq: int, node: int
) -> None:
    u = v1(when, clock_seq, node)
    assert u.version == 1 and u.variant == uuid.RFC_4122
    forms = [u, str(u), u.hex, str(u).upper(), "{" + str(u) + "}", u.urn, u.bytes]
    assert [value_role(f) for f in forms] == ["uuid1"] * len(forms)


def test_the_python_generator_s_ids_are_uuid1_and_v6_v7_still_grow() -> None:
    assert value_role(uuid.uuid1()) == "uuid1"
    assert value_role(str(uuid.uuid1())) == "uuid1"
    v7 = uuid.UUID(int=(int(T0.timestamp() * 1000) << 80) | 7 << 76 | 2 << 62)
    v6 = uuid.UUID(int=(1 << 100) | 6 << 76 | 2 << 62)
    assert (value_role(v7), value_role(v6), value_role(uuid.uuid4())) == ("uuid7", "uuid7", "uuid4")


@settings(max_examples=50, deadline=None)
@given(when=whens, clock_seq=clock_seqs, node=nodes)
def test_v1_ids_of_one_wrap_sweep_the_whole_key_space(
    when: dt.datetime, clock_seq: int, node: int
) -> None:
    """What the finding says: the ids of any ~7.16 minutes, one a second, lead with every
    hex digit, and the text order is not the time order (a wrap falls among them)."""
    ids = [str(v1(when + dt.timedelta(seconds=s), clock_seq, node))
           for s in range(math.ceil(UUID1_WRAP_MINUTES * 60))]  # fmt: skip
    assert {i[0] for i in ids} == set("0123456789abcdef")
    assert ids != sorted(ids)
    assert UUID1_WRAP_MINUTES == 2**32 * 100e-9 / 60


def sweep(minutes: int, clock_seq: int, node: int, rate: int = 1) -> list[dict[str, Any]]:
    """The split statistics of a key of v1 ids written ``rate`` times a minute: each
    minute one hot split, from the id made at its start to the id made at its end (the
    writes of a minute sit between them), or to <end> where time_low wrapped."""
    rows = []
    for m in range(minutes):
        start = T0 + dt.timedelta(minutes=m)
        a, b = (str(v1(start + dt.timedelta(seconds=s), clock_seq, node)) for s in (0, 60))
        rows.append(
            {
                "INTERVAL_END": (start + dt.timedelta(minutes=1)).isoformat(),
                "SPLIT_START": f"Events({json.dumps(a)})",
                "SPLIT_LIMIT": f"Events({json.dumps(b)})" if b > a else "<end>",
                "CPU_USAGE_SCORE": 100,
                "AFFECTED_TABLES": ["Events"],
                "UNSPLITTABLE_REASONS": ["MOVING_HOT_SPOT"] if m % 3 == 0 else None,
            }
        )
    return rows


@settings(max_examples=30, deadline=None)
@given(minutes=st.integers(2, 30), clock_seq=clock_seqs, node=nodes)
def test_a_v1_key_is_neither_monotonic_nor_a_hot_key_and_says_why(
    minutes: int, clock_seq: int, node: int
) -> None:
    [finding] = doctor(sweep(minutes, clock_seq, node), Base).findings
    assert finding.pattern == "unknown", finding  # not "monotonic", not "hot_key"
    assert finding.roles == {"Id": "uuid1"} and finding.column == "Id"
    fix = finding.fix
    assert "Id holds version-1 UUIDs" in fix, fix
    assert "time_low" in fix and f"about every {UUID1_WRAP_MINUTES:.2f} minutes" in fix, fix
    assert "the hotspot moves rather than sitting at the end" in fix, fix
    assert "Make the new ids version 4 (uuid.uuid4()" in fix, fix


@settings(max_examples=20, deadline=None)
@given(minutes=st.integers(2, 20), clock_seq=clock_seqs, node=nodes)
def test_fix_plans_no_key_reshard_for_a_v1_key(minutes: int, clock_seq: int, node: int) -> None:
    [finding] = doctor(sweep(minutes, clock_seq, node), Base).findings
    planner = Planner(Catalog(Base.metadata, attribute_names(Base)), Base.metadata)
    refusal = planner.plan(finding)
    assert isinstance(refusal, Refusal), refusal
    assert "version-1 UUIDs" in refusal.reason and "uuid.uuid4()" in refusal.reason


def test_a_uuid1_default_is_judged_by_its_values() -> None:
    """A ``uuid1`` default (once taken for time-ordered, like ``uuid7``) and its values
    agree: a version-1 key, not monotonic."""
    rows = [{**r, "SPLIT_START": r["SPLIT_START"].replace("Events", "Orders"),
             "SPLIT_LIMIT": r["SPLIT_LIMIT"].replace("Events", "Orders"),
             "AFFECTED_TABLES": ["Orders"]} for r in sweep(12, 7, 99)]  # fmt: skip
    [finding] = doctor(rows, Base).findings
    assert finding.pattern != "monotonic" and finding.roles == {"Id": "uuid1"}


@settings(max_examples=30, deadline=None)
@given(
    start=whens, clock_seq=clock_seqs, node=nodes, n=st.integers(20, 400),
    step_us=st.integers(1, 10_000_000),
)  # fmt: skip
def test_advise_does_not_take_a_v1_key_for_a_growing_part(
    start: dt.datetime, clock_seq: int, node: int, n: int, step_us: int
) -> None:
    rows = [{"Id": str(v1(start + dt.timedelta(microseconds=i * step_us), clock_seq, node))}
            for i in range(n)]  # fmt: skip
    [held] = held_roles(table_of(Event), rows)
    assert (held.column, held.role, held.growing) == ("Id", "uuid1", False)
    assert held.why.startswith("its values are version-1 UUIDs, whose inserts sweep")
    assert "not a part that grows" in held.text


def _v7(when: dt.datetime, tail: int) -> str:
    """A version-7 UUID made at ``when``: its 48-bit millisecond clock first."""
    ms = int(when.timestamp() * 1000)
    value = (ms << 80) | (0x7 << 76) | (0b10 << 62) | (tail & ((1 << 62) - 1))
    return str(uuid.UUID(int=value))


def test_values_correct_a_uuid1_default_as_they_correct_the_other_uuid_defaults() -> None:
    """A ``uuid1`` default is a declaration's guess like ``uuid4``'s and ``uuid7``'s (the
    rows may come from an import or another writer): most hot splits holding version-7
    UUIDs make the column ``uuid7``, a growing key."""
    rows = []
    for m in range(12):
        start = T0 + dt.timedelta(minutes=m)
        a, b = (_v7(start + dt.timedelta(seconds=s), m) for s in (0, 60))
        rows.append(
            {
                "INTERVAL_END": (start + dt.timedelta(minutes=1)).isoformat(),
                "SPLIT_START": f"Orders({json.dumps(a)})",
                "SPLIT_LIMIT": f"Orders({json.dumps(b)})",
                "CPU_USAGE_SCORE": 100,
                "AFFECTED_TABLES": ["Orders"],
                "UNSPLITTABLE_REASONS": None,
            }
        )
    [finding] = doctor(rows, Base).findings
    assert finding.roles == {"Id": "uuid7"}, finding
