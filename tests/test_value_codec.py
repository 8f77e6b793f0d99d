"""The one value codec (``sharded_orm.schema.value_codec``) of page cursors, copy cursors
and resume positions: exact, type-preserving round trips of every type a Spanner key
holds; old page cursors and old copy cursors still read; and on the emulator, a copy
with a cursor table and a backfill over keys of DATE, NUMERIC, UUID and TIMESTAMP."""

from __future__ import annotations

import base64
import datetime as dt
import enum
import json
import math
import uuid
import zoneinfo
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from google.api_core.datetime_helpers import DatetimeWithNanoseconds
from hypothesis import given, settings
from hypothesis import strategies as st

from sharded_orm import compute_shard, primary_key, shard_column
from sharded_orm.errors import ShardTypeError
from sharded_orm.read.cursors import CursorError, encode_cursor, read_cursor, seal
from sharded_orm.read.order import EnumName
from sharded_orm.schema.value_codec import (
    ValueCodecError,
    decode_value,
    dumps_key,
    encode_value,
    loads_key,
)


class Color(enum.Enum):
    RED = "r"
    GREEN = "g"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Tag(str, enum.Enum):
    A = "a"
    B = "b"


def _enum(name: str) -> Any:
    for cls in (Color, Level, Tag):
        if name in cls.__members__:
            return cls[name]
    raise AssertionError(name)


def _nanos_timestamp(draw: Any) -> DatetimeWithNanoseconds:
    base = draw(st.datetimes(timezones=st.just(dt.timezone.utc)))
    nanos = draw(st.integers(0, 10**9 - 1))
    return DatetimeWithNanoseconds(  # type: ignore[no-untyped-call]
        base.year, base.month, base.day, base.hour, base.minute, base.second,
        nanosecond=nanos, tzinfo=dt.timezone.utc,
    )  # fmt: skip


_ZONES = st.sampled_from(["Europe/Paris", "America/New_York", "UTC", "Asia/Kolkata"])
_OFFSETS = st.integers(-23 * 60, 23 * 60).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))

#: every type a Spanner key can hold, and what a page may sort on beside them
KEY_VALUES = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),  # INT64
    st.integers(),  # and Python's unbounded ints
    st.floats(allow_nan=True, allow_infinity=True),  # FLOAT64 incl. NaN, inf, -0.0
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324]),
    st.decimals(allow_nan=True, allow_infinity=True),  # NUMERIC (and Decimal's own)
    st.sampled_from([Decimal("-0"), Decimal("1E+2"), Decimal("1.50"), Decimal("sNaN")]),
    st.text(),  # STRING
    st.binary(),  # BYTES
    st.booleans(),  # BOOL
    st.dates(),  # DATE
    st.datetimes(),  # TIMESTAMP, naive
    st.datetimes(timezones=st.just(dt.timezone.utc)),  # tz-aware
    st.datetimes(timezones=_OFFSETS),
    st.datetimes(timezones=_ZONES.map(zoneinfo.ZoneInfo), allow_imaginary=False),
    st.composite(_nanos_timestamp)(),  # Spanner's DatetimeWithNanoseconds
    st.uuids(),  # UUID as uuid.UUID
    st.uuids().map(str),  # ... kept as STRING(36)
    st.uuids().map(lambda u: u.bytes),  # ... kept as BYTES(16)
    st.sampled_from([*Color, *Level, *Tag]),  # Enum
    st.times(),
    st.timedeltas(),
)


def _same(a: Any, b: Any) -> bool:
    """Equal, of the same type, with the same details equality overlooks (NaN, -0.0,
    Decimal exponents, tzinfo, fold, nanoseconds)."""
    if type(a) is not type(b) or repr(a) != repr(b):
        return False
    if isinstance(a, dt.datetime):
        return a.tzinfo == b.tzinfo and getattr(a, "nanosecond", None) == getattr(
            b, "nanosecond", None
        )
    return True


@settings(max_examples=400, deadline=None)
@given(st.lists(KEY_VALUES, max_size=4))
def test_every_key_type_round_trips_exactly(values: list[Any]) -> None:
    assert all(_same(decode_value(encode_value(v), enum_name=_enum), v) for v in values)
    back = loads_key(dumps_key(values), enum_name=_enum)
    assert len(back) == len(values) and all(_same(a, b) for a, b in zip(back, values, strict=True))


@settings(max_examples=150, deadline=None)
@given(st.lists(KEY_VALUES, max_size=4))
def test_a_page_cursor_round_trips_every_key_type(values: list[Any]) -> None:
    """Through the sealed page cursor: the same values (an Enum member as its name, an
    ``EnumName`` the page binds as the column's member)."""
    token = encode_cursor(None, values, served=3, fingerprint="f" * 32, ahead=[])
    state = read_cursor(token)
    want = [EnumName(v.name) if isinstance(v, enum.Enum) else v for v in values]
    assert state.served == 3 and len(state.values) == len(want)
    assert all(_same(a, b) for a, b in zip(state.values, want, strict=True))


def test_a_page_cursor_of_the_old_wire_format_still_reads() -> None:
    """A body as cursors were written before the codec (three-part timestamps, no
    details) decodes to the same values; an edited cursor is still refused."""
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    body = {
        "q": "q" * 32, "n": 5, "h": [[[["i", "7"]], 2]],
        "v": [
            ["t", "2026-01-02T03:04:05.123456+00:00", 123456789],
            ["t", "2026-01-02T03:04:05.123456", 123456000],
            ["d", "2026-01-02"], ["m", "1.50"], ["u", str(u)], ["y", "AAE="],
            ["e", "RED"], ["b", True], ["f", "-0.0"], ["n", None], ["s", "x"],
        ],
    }  # fmt: skip
    token = seal(json.dumps(body).encode())
    state = read_cursor(token)
    ts = state.values[0]
    assert isinstance(ts, DatetimeWithNanoseconds) and ts.nanosecond == 123456789
    assert ts.tzinfo == dt.timezone.utc
    assert _same(state.values[1], dt.datetime(2026, 1, 2, 3, 4, 5, 123456))
    assert state.values[2:] == [
        dt.date(2026, 1, 2), Decimal("1.50"), u, b"\x00\x01", "RED", True, -0.0, None, "x",
    ]  # fmt: skip
    assert isinstance(state.values[6], EnumName)
    assert state.ahead == [([7], 2)] and state.served == 5
    edited = token[:-6] + ("A" if token[-6] != "A" else "B") + token[-5:]
    with pytest.raises(CursorError, match="altered"):
        read_cursor(edited)
    forged = seal(json.dumps({**body, "v": [["d", "not a date"]]}).encode())
    with pytest.raises(CursorError, match="bad body"):
        read_cursor(forged)


def test_a_copy_cursor_of_the_old_format_still_reads() -> None:
    raw = base64.b64encode(b"\x00k").decode()
    old = json.dumps(
        [["v", 7], ["ts", "2026-01-02T03:04:05.123456+00:00"], ["b", raw], ["v", None], ["v", 1.5]]
    )
    assert loads_key(old) == [
        7, dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.timezone.utc), b"\x00k", None, 1.5,
    ]  # fmt: skip


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"codec": 2, "key": []}', "codec version 2; this sharded-orm reads version 1"),
        ('{"codec": 1, "key": [["d", "2026-13-01"]]}', "not a value the cursor codec wrote"),
        ('{"codec": 1, "key": [["t", "2026-01-01T00:00:00", 5000]]}', "not a value"),
        ('{"codec": 1, "key": [["i", " 5"]]}', "not a value"),
        ('{"codec": 1, "key": [["q", "x"]]}', "not a value"),
        ('[["zz", 1]]', "not a key the cursor codec wrote"),
        ("{", "not a key the cursor codec wrote"),
    ],
)
def test_text_the_codec_did_not_write_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueCodecError, match=message):
        loads_key(text)


def test_a_type_no_key_holds_says_which_do() -> None:
    with pytest.raises(ShardTypeError, match=r"cannot encode a list .* it holds None, bool"):
        dumps_key([[1]])
    with pytest.raises(CursorError, match="cannot encode a complex"):
        encode_cursor(None, [1j], fingerprint="f" * 32)


# ------------------------------------------------------------------ on the emulator

T0 = DatetimeWithNanoseconds(2026, 3, 1, 12, tzinfo=dt.timezone.utc)  # type: ignore[no-untyped-call]


def _ts(i: int) -> DatetimeWithNanoseconds:
    """Timestamps four apart in nanoseconds: several rows share a microsecond."""
    return DatetimeWithNanoseconds(  # type: ignore[no-untyped-call]
        2026, 3, 1, 12, 0, 0, nanosecond=100 + 400 * i, tzinfo=dt.timezone.utc
    )


#: (name, column type, i -> the raw key value written through the mutation API,
#: whether the key part is DESC)
KEY_CASES = [
    ("date", sa.Date(), lambda i: dt.date(2026, 1, 1) + dt.timedelta(days=i // 3), False),
    ("numeric", sa.Numeric(), lambda i: Decimal(i // 3) + Decimal("0.5"), False),
    ("uuid_string", sa.String(36), lambda i: str(uuid.UUID(int=(i // 3) * 977)), False),
    ("uuid_bytes", sa.LargeBinary(16), lambda i: uuid.UUID(int=(i // 3) * 977).bytes, False),
    ("timestamp", sa.DateTime(timezone=True), _ts, False),
    ("timestamp_desc", sa.DateTime(timezone=True), _ts, True),
]
ROWS = 40


def _tables(type_: Any, desc: bool) -> tuple[sa.MetaData, sa.Table, sa.Table]:
    md = sa.MetaData()
    k = sa.desc("K") if desc else "K"
    src = sa.Table(
        "Src", md, sa.Column("K", type_, nullable=False),
        sa.Column("N", sa.Integer, nullable=False), sa.Column("Body", sa.String(20)),
        primary_key(k, "N"),
    )  # fmt: skip
    dst = sa.Table(
        "Dst", md, shard_column("K", count=8, name="Shard").column,
        sa.Column("K", type_, nullable=False), sa.Column("N", sa.Integer, nullable=False),
        sa.Column("Body", sa.String(20)), primary_key("Shard", k, "N"),
    )  # fmt: skip
    return md, src, dst


def _written(engine: sa.Engine, case: tuple[Any, ...]) -> tuple[sa.Table, sa.Table, list[Any]]:
    from sharded_orm.load.copy import cursor_table_ddl
    from sharded_orm.spanner.mutations import database_of

    _, type_, make, desc = case
    md, src, dst = _tables(type_, desc)
    md.create_all(engine)
    database = database_of(engine)
    database.update_ddl([cursor_table_ddl("CopyCursors")]).result()
    keys = [[make(i), i % 3] for i in range(ROWS)]
    raw = [[base64.b64encode(k).decode() if isinstance(k, bytes) else k, n] for k, n in keys]
    with database.batch() as batch:
        batch.insert("Src", columns=["K", "N", "Body"], values=[[*k, "b"] for k in raw])
    return src, dst, keys


def _stored_order(keys: list[Any], desc: bool) -> list[Any]:
    """The keys (K, N) in Spanner's order: K (DESC or not; a timestamp's nanoseconds
    count, which datetime comparisons overlook), then N."""
    out = sorted(keys, key=lambda k: k[1])
    out.sort(key=lambda k: (k[0], getattr(k[0], "nanosecond", 0)), reverse=desc)
    return out


class Stop(Exception):
    pass


@pytest.mark.emulator
@pytest.mark.parametrize("case", KEY_CASES, ids=[c[0] for c in KEY_CASES])
def test_a_copy_with_a_cursor_table_resumes_exactly(
    spanner_engine: sa.Engine, case: tuple[Any, ...]
) -> None:
    """Stopped after two batches of 7, the copy saved its cursor in each batch's commit;
    the next run resumes right after the last committed key (no row read twice, none
    skipped: a cursor that lost the nanoseconds of a DESC timestamp skipped rows), and
    the tables then hold the same rows with the right shards."""
    from sharded_orm.load.copy import CopyProgress, compare_tables, copy_table

    engine = spanner_engine
    src, dst, keys = _written(engine, case)
    seen: list[tuple[Any, ...]] = []

    def stop_after_two(p: CopyProgress) -> None:
        seen.append(p.after)
        if p.batches == 2:
            raise Stop

    with pytest.raises(Stop):
        copy_table(engine, src, dst, batch_size=7, progress_mode="off", on_batch=stop_after_two,
                   cursor_table="CopyCursors")  # fmt: skip
    with engine.connect() as c:
        saved = c.execute(sa.text("SELECT Cursor FROM CopyCursors")).scalar_one()
    want = _stored_order(keys, case[3])[13]  # the 14th key in stored order
    assert [_same(a, b) for a, b in zip(seen[-1], want, strict=True)] == [True, True]
    assert [_same(a, b) for a, b in zip(loads_key(saved), want, strict=True)] == [True, True]
    again = copy_table(engine, src, dst, batch_size=7, progress_mode="off",
                       cursor_table="CopyCursors")  # fmt: skip
    assert again.resumed and again.rows == ROWS - 14
    assert compare_tables(engine, src, dst) == {
        "missing_in_target": 0, "missing_in_source": 0, "different": 0,
    }  # fmt: skip
    with engine.connect() as c:
        shards = c.execute(sa.select(dst.c.Shard, dst.c.K)).all()
        left = c.execute(sa.text("SELECT COUNT(*) FROM CopyCursors")).scalar_one()
    assert len(shards) == ROWS and left == 0  # a complete walk clears its cursor
    assert all(shard == compute_shard((k,), 8) for shard, k in shards)


@pytest.mark.emulator
@pytest.mark.parametrize("case", KEY_CASES, ids=[c[0] for c in KEY_CASES])
def test_a_backfill_reports_its_resume_position_exactly(
    spanner_engine: sa.Engine, case: tuple[Any, ...], otel: Any
) -> None:
    """The backfill's walk over the same keys fills every row, and the resume position its
    span reports is where it stands as a count of rows in key order, never the key itself
    (a key can be an e-mail address; issue 44)."""
    from alembic_ext.backfill import backfill_shard

    engine = spanner_engine
    src, _, keys = _written(engine, case)
    from sharded_orm.spanner.mutations import database_of

    database_of(engine).update_ddl(["ALTER TABLE Src ADD COLUMN Shard8 INT64"]).result()
    result = backfill_shard(
        engine, "Src", "Shard8", sources=["K"], count=8, batch_size=7, progress=False
    )
    assert result.rows == ROWS
    span = otel.span("backfill Src")
    position = dict(span.attributes)["sharded_orm.resume_position"]
    assert position == ROWS  # the walk ends past every row
    with engine.connect() as c:
        read = sa.text("SELECT K, Shard8 FROM Src").columns(K=case[1], Shard8=sa.Integer)
        stored = c.execute(read).all()
    assert all(s == compute_shard((k,), 8) for k, s in stored)


def test_a_backfill_on_sqlite_reports_its_resume_position_exactly(otel: Any) -> None:
    """The client walk elsewhere than Spanner, a key of DATE, NUMERIC and a UUID's text:
    every row filled, and the span's position a count of rows, no key part in it."""
    from alembic_ext.backfill import backfill_shard

    engine = sa.create_engine("sqlite://")
    md = sa.MetaData()
    t = sa.Table(
        "Days", md, sa.Column("D", sa.Date, primary_key=True),
        sa.Column("M", sa.Numeric(10, 2), primary_key=True),
        sa.Column("U", sa.String(36), primary_key=True), sa.Column("Shard8", sa.Integer),
    )  # fmt: skip
    md.create_all(engine)
    keys = [
        (dt.date(2026, 1, 1 + i % 9), Decimal(i % 4) + Decimal("0.25"), str(uuid.UUID(int=i)))
        for i in range(30)
    ]
    with engine.begin() as c:
        c.execute(t.insert(), [{"D": d, "M": m, "U": u} for d, m, u in keys])
    result = backfill_shard(
        engine, "Days", "Shard8", sources=["D", "M"], count=8, batch_size=7, progress=False
    )
    assert result.rows == 30
    position = dict(otel.span("backfill Days").attributes)["sharded_orm.resume_position"]
    assert position == 30
    with engine.connect() as c:
        stored = c.execute(sa.select(t.c.D, t.c.M, t.c.Shard8)).all()
    assert all(s == compute_shard((d, m), 8) for d, m, s in stored)
