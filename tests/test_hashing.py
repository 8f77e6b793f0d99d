"""The shard hash: canonical encoding, ranges, bad input, and the documented vectors."""

from __future__ import annotations

import datetime as dt
import enum
import re
import uuid
import zlib
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from google.api_core.datetime_helpers import DatetimeWithNanoseconds
from hypothesis import given
from hypothesis import strategies as st

from sharded_orm import (
    ShardConfigError,
    ShardingError,
    ShardTypeError,
    ShardValueError,
    UTCDateTime,
    canonical_string,
    canonical_text,
    compute_shard,
    get_shard_column,
    shard_column,
)

UTC = dt.timezone.utc

aware_datetimes = st.datetimes(
    min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30), timezones=st.timezones()
)
decimals = st.decimals(
    allow_nan=False, allow_infinity=False, places=9, min_value=-(10**28), max_value=10**28
)
source_values = st.one_of(
    st.text(),
    st.binary(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.booleans(),
    st.uuids(),
    decimals,
    st.dates(),
    aware_datetimes,
)


@given(st.lists(source_values, min_size=1, max_size=4), st.integers(1, 1 << 16))
def test_shard_is_in_range(values: list[object], count: int) -> None:
    for algorithm in ("crc32", "farm_fingerprint"):
        shard = compute_shard(values, count, algorithm)
        assert 0 <= shard < count


@given(st.lists(st.text(), min_size=1, max_size=4), st.lists(st.text(), min_size=1, max_size=4))
def test_join_is_unambiguous(a: list[str], b: list[str]) -> None:
    if a != b:
        assert canonical_string(a) != canonical_string(b)


def test_split_point_changes_the_string() -> None:
    assert canonical_string(["ab", "c"]) == "2:ab1:c"
    assert canonical_string(["a", "bc"]) == "1:a2:bc"
    assert compute_shard(("ab", "c"), 1 << 16) != compute_shard(("a", "bc"), 1 << 16)


def test_length_prefix_counts_utf8_bytes() -> None:
    assert canonical_string(["é😀"]) == "6:é😀"


@given(aware_datetimes)
def test_same_instant_same_shard_whatever_the_zone(ts: dt.datetime) -> None:
    assert canonical_text(ts) == canonical_text(ts.astimezone(UTC))
    assert canonical_text(ts).endswith("Z")


def test_crc32_matches_zlib_on_the_canonical_bytes() -> None:
    ts = dt.datetime(2018, 5, 1, 15, 16, 3, 386257, tzinfo=UTC)
    expected = zlib.crc32(b"4:Acme27:2018-05-01T15:16:03.386257Z") % 10
    assert compute_shard(("Acme", ts), 10) == expected


def test_single_value_equals_one_element_sequence() -> None:
    assert compute_shard("abc", 97) == compute_shard(["abc"], 97) == compute_shard(("abc",), 97)


def test_nanoseconds_are_truncated_to_microseconds() -> None:
    ns = DatetimeWithNanoseconds(2020, 1, 1, 0, 0, 0, nanosecond=123456999, tzinfo=UTC)
    assert canonical_text(ns) == "2020-01-01T00:00:00.123456Z"
    plain = dt.datetime(2020, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)
    assert compute_shard(ns, 1000) == compute_shard(plain, 1000)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("Acme", "Acme"),
        (b"\xff\x00a", "/wBh"),
        (-5, "-5"),
        (True, "true"),
        (False, "false"),
        (uuid.UUID("15B7BD1F-8473-4F3C-9A31-6E3C1D1E0F01"), "15b7bd1f-8473-4f3c-9a31-6e3c1d1e0f01"),
        (Decimal("1.50"), "1.5"),
        (Decimal("1E+2"), "100"),
        (Decimal("-0.00"), "0"),
        (Decimal("0.000000001"), "0.000000001"),
        (dt.date(1, 2, 3), "0001-02-03"),
        (dt.datetime(1, 1, 1, tzinfo=UTC), "0001-01-01T00:00:00.000000Z"),
        (
            dt.datetime(2020, 6, 1, 2, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))),
            "2020-06-01T00:00:00.000000Z",
        ),
    ],
)
def test_canonical_text_per_type(value: object, text: str) -> None:
    assert canonical_text(value) == text


@pytest.mark.parametrize("count", [0, -1, 1.5, True, "3", None, (1 << 16) + 1])
def test_bad_counts(count: object) -> None:
    with pytest.raises(ShardConfigError, match="shard count"):
        compute_shard("x", count)  # type: ignore[arg-type]


def test_unknown_algorithm() -> None:
    with pytest.raises(ShardConfigError, match="unknown shard algorithm 'md5'"):
        compute_shard("x", 4, "md5")


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (None, ShardValueError, "cannot hash None"),
        (dt.datetime(2020, 1, 1), ShardValueError, "naive datetime"),
        (1.5, ShardTypeError, "type float"),
        (object(), ShardTypeError, "type object"),
        (Decimal("NaN"), ShardValueError, "non-finite"),
        ([["nested"]], ShardTypeError, "type list"),
    ],
)
def test_bad_values(value: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message) as info:
        compute_shard([value] if not isinstance(value, list) else value, 4)
    assert isinstance(info.value, ShardingError)


def _doc_vectors() -> list[tuple[str, int, str, int]]:
    doc = (Path(__file__).parent.parent / "docs" / "hashing.md").read_text()
    rows = re.findall(r"^\| `([^`]*)` \| (\d+) \| (\w+) \| (-?\d+) \|$", doc, re.M)
    assert len(rows) >= 10, "docs/hashing.md lost its test-vector table"
    return [(s, int(n), a, int(r)) for s, n, a, r in rows]


def test_documented_vectors_hold() -> None:
    """docs/hashing.md gives canonical strings and shards for other languages to check."""
    from sharded_orm.hashing import hash_string

    for string, count, algorithm, expected in _doc_vectors():
        assert hash_string(string, algorithm) % count == expected, (string, algorithm)


# --------------------------------------------------------------------------- stored values


def test_enum_members_hash_as_their_value() -> None:
    import enum

    class Color(str, enum.Enum):
        RED = "red"

    class Level(enum.IntEnum):
        HIGH = 1

    class Mixed(int, enum.Enum):
        LOW = 2

    assert canonical_string([Color.RED]) == canonical_string(["red"]) == "3:red"
    assert canonical_string([Level.HIGH, Mixed.LOW]) == "1:11:2"


def test_stored_value_vectors_of_the_doc() -> None:
    """The 'stored-value vectors' table of docs/hashing.md."""
    import enum

    import sqlalchemy as sa

    from sharded_orm import UTCDateTime
    from sharded_orm.schema.coerce import stored_value

    class Color(str, enum.Enum):
        RED = "red"

    def col(t: object) -> sa.Column[object]:
        return sa.Column("c", t)  # type: ignore[call-overload, no-any-return]

    plus2 = dt.timezone(dt.timedelta(hours=2))
    cases = [
        (sa.Boolean, 1, "4:true"),
        (
            sa.Uuid(as_uuid=False),
            "15B7BD1F-8473-4F3C-9A31-6E3C1D1E0F01",
            "36:15b7bd1f-8473-4f3c-9a31-6e3c1d1e0f01",
        ),
        (sa.String(10), Color.RED, "3:red"),
        (sa.Enum(Color), Color.RED, "3:RED"),
        (
            UTCDateTime,
            dt.datetime(2018, 5, 1, 17, 16, 3, 386257, tzinfo=plus2),
            "27:2018-05-01T15:16:03.386257Z",
        ),
        (sa.Numeric(10, 2), Decimal("1.50"), "3:1.5"),
    ]
    for type_, value, text in cases:
        assert canonical_string([stored_value(col(type_), value)]) == text
    for type_, value, error in [
        (sa.BigInteger, True, ShardTypeError),
        (sa.Numeric(10, 2), Decimal("1.005"), ShardValueError),
        (sa.Date, dt.datetime(2020, 1, 1, tzinfo=UTC), ShardTypeError),
        (sa.Float, 1.0, ShardTypeError),
    ]:
        with pytest.raises(error):
            stored_value(col(type_), value)


def _str_int_datetime_shard(count: int) -> Any:
    """A shard over (String, BigInteger, UTCDateTime): the three inline fast paths."""
    import sqlalchemy as sa

    from sharded_orm import UTCDateTime
    from sharded_orm.schema.columns import ShardSpec, make_shard_column

    table = sa.Table(
        "t",
        sa.MetaData(),
        sa.Column("s", sa.String),
        sa.Column("n", sa.BigInteger),
        sa.Column("ts", UTCDateTime),
    )
    return make_shard_column(
        sa.Column("sh", sa.Integer), ShardSpec(("s", "n", "ts"), count), tuple(table.c)
    )


@given(
    st.text(max_size=20),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.one_of(aware_datetimes, st.datetimes(timezones=st.just(UTC))),
    st.integers(1, 1 << 16),
)
def test_generated_fast_path_equals_the_general_path(
    s: str, n: int, ts: dt.datetime, count: int
) -> None:
    """The hot path's generated code and the general coercion+encoding give one shard."""
    from sharded_orm.write.rows import RowShards, fast_insert_rows

    sc = _str_int_datetime_shard(count)
    row = {"s": s, "n": n, "ts": ts}
    try:
        expected: object = compute_shard([s, n, ts.astimezone(UTC)], count)
        if not -(2**63) <= n < 2**63:
            expected = ShardValueError
    except ShardingError as exc:
        expected = type(exc)
    try:
        got: object = fast_insert_rows(RowShards((sc,), on_spanner=False), [row])[0][sc.key]
    except ShardingError as exc:
        got = type(exc)
    assert got == expected


class _Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class _Tint(str, enum.Enum):
    RED = "red"
    BLUE = "blue"


@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "s": st.one_of(st.text(max_size=8), st.sampled_from(list(_Tint))),
                "n": st.one_of(st.integers(-(2**40), 2**40), st.sampled_from(list(_Level))),
                "ts": st.one_of(aware_datetimes, st.datetimes(timezones=st.just(UTC))),
                "flag": st.one_of(st.booleans(), st.sampled_from([0, 1])),
            }
        ),
        max_size=6,
    )
)
def test_generated_rows_filler_sends_what_the_general_path_sends(
    rows: list[dict[str, object]],
) -> None:
    """Core's generated executemany filler and the general row path give the same rows:
    the same shards, and each source in its stored form (same value, same type)."""
    import sqlalchemy as sa

    from sharded_orm import UTCDateTime
    from sharded_orm.schema.columns import ShardSpec, make_shard_column
    from sharded_orm.write.rows import RowShards, fast_insert_rows

    table = sa.Table(
        "t",
        sa.MetaData(),
        sa.Column("s", sa.String),
        sa.Column("n", sa.BigInteger),
        sa.Column("ts", UTCDateTime),
        sa.Column("flag", sa.Boolean),
    )
    shards = (
        make_shard_column(
            sa.Column("a", sa.Integer), ShardSpec(("s", "ts"), 10), (table.c.s, table.c.ts)
        ),
        make_shard_column(
            sa.Column("b", sa.Integer),
            ShardSpec(("n", "flag", "s"), 7),
            (table.c.n, table.c.flag, table.c.s),
        ),
    )
    row_shards = RowShards(shards, on_spanner=False)
    before = [dict(r) for r in rows]
    try:
        general: object = [row_shards.insert_row(dict(r), {}) for r in rows]
    except ShardingError as exc:
        general = type(exc)
    try:
        fast: object = fast_insert_rows(row_shards, rows)
    except ShardingError as exc:
        fast = type(exc)
    assert rows == before  # the caller's rows are not changed
    if isinstance(general, list) and isinstance(fast, list):
        assert [[(k, v, type(v)) for k, v in sorted(r.items())] for r in fast] == [
            [(k, v, type(v)) for k, v in sorted(r.items())] for r in general
        ]
        for r in fast:
            assert type(r["n"]) is int and type(r["s"]) is str and type(r["flag"]) is bool
            assert r["ts"].tzinfo is UTC
    else:
        assert fast == general


@given(
    st.text(max_size=12),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.datetimes(
        min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31), timezones=st.just(UTC)
    ),
    st.integers(1, 1 << 16),
)
def test_the_column_shard_function_equals_compute_shard(
    s: str, n: int, ts: dt.datetime, count: int
) -> None:
    """``ShardColumn.compute`` (inline pieces for str, int and UTC datetimes, used by the
    ORM's set listener and by lookups) agrees with the specified hash, years before 1000
    and lone surrogates included."""
    sc = _str_int_datetime_shard(count)
    try:
        expected: object = compute_shard([s, n, ts], count)
    except ShardingError as exc:
        expected = type(exc)
    try:
        got: object = sc.compute([s, n, ts])
    except ShardingError as exc:
        got = type(exc)
    assert got == expected


# --------------------------------------------------------------------------- odd values (R5)

fixed_offsets = st.builds(
    dt.timezone,
    st.timedeltas(
        min_value=-dt.timedelta(hours=23, minutes=59), max_value=dt.timedelta(hours=23, minutes=59)
    ),
)


def _power_of_ten(sign_and_exponent: tuple[int, int]) -> int:
    sign, exponent = sign_and_exponent
    return sign * 10**exponent


#: everything a caller can hand a shard function: the accepted types over their whole
#: range (lone surrogates, ints of thousands of digits, the first and last instants at
#: any offset, Decimals of any exponent) and types that are refused
odd_values = st.one_of(
    st.text(st.characters(codec=None, exclude_categories=()), max_size=8),
    st.sampled_from(["\ud800", "a\udfff", "\udc80b", "é\ud83d"]),
    st.integers(),
    # built by map: hypothesis may repr a strategy, and a 5,000-digit int has no repr
    st.sampled_from([(1, 5000), (-1, 5000), (1, 4300)]).map(_power_of_ten),
    st.sampled_from([2**63, -(2**63) - 1]),
    st.datetimes(timezones=st.one_of(st.none(), fixed_offsets, st.timezones())),
    st.sampled_from(
        [
            dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5))),
            dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
            dt.datetime.min.replace(tzinfo=dt.timezone(dt.timedelta(hours=23, minutes=59))),
            dt.datetime.max.replace(tzinfo=dt.timezone(-dt.timedelta(hours=23, minutes=59))),
        ]
    ),
    st.dates(),
    st.decimals(),
    st.sampled_from([Decimal("1E+999999999"), Decimal("-1E-999999999"), Decimal("NaN")]),
    st.binary(max_size=8),
    st.uuids(),
    st.booleans(),
    st.none(),
    st.floats(),
)


@pytest.mark.parametrize("algorithm", ["crc32", "farm_fingerprint", "crc32_concat"])
@given(values=st.lists(odd_values, min_size=1, max_size=3), count=st.integers(1, 1 << 16))
def test_any_value_is_a_shard_or_a_sharding_error_naming_it(
    algorithm: str, values: list[object], count: int
) -> None:
    """No raw UnicodeEncodeError, ValueError or OverflowError: a value outside what the
    algorithm accepts is a ShardingError whose message says what is wrong with it."""
    try:
        shard = compute_shard(values, count, algorithm)
    except ShardingError as exc:
        assert "cannot hash" in str(exc) or "takes" in str(exc), exc
        assert len(str(exc)) < 1000  # a 5,000-digit int is described, not printed
    else:
        assert 0 <= shard < count


@pytest.mark.parametrize(
    ("value", "why"),
    [
        pytest.param("a\ud800", "lone surrogate", id="surrogate"),
        pytest.param(10**5000, "INT64", id="huge-int"),
        pytest.param(-(10**5000), "INT64", id="huge-negative-int"),
        pytest.param(
            dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5))), "out of range", id="y1"
        ),
        pytest.param(
            dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
            "out of range",
            id="y9999",
        ),
    ],
)
@pytest.mark.parametrize("algorithm", ["crc32", "farm_fingerprint", "crc32_concat"])
def test_the_reported_odd_values_name_their_problem(algorithm: str, value: Any, why: str) -> None:
    with pytest.raises(ShardValueError, match=why):
        compute_shard([value], 16, algorithm)


def test_a_decimal_too_long_to_write_out_is_refused_at_once() -> None:
    with pytest.raises(ShardValueError, match="digits"):
        compute_shard(Decimal("1E+999999999"), 16)
    assert 0 <= compute_shard(Decimal("1E+4000"), 16) < 16  # long, but written out


_COLUMN_TYPES = {
    "String": sa.String(40),
    "Integer": sa.BigInteger(),
    "Boolean": sa.Boolean(),
    "Numeric": sa.Numeric(38, 9),
    "Date": sa.Date(),
    "DateTime": sa.DateTime(timezone=True),
    "UTCDateTime": UTCDateTime(),
    "LargeBinary": sa.LargeBinary(),
    "Uuid": sa.Uuid(),
}


@pytest.mark.parametrize("algorithm", ["crc32", "farm_fingerprint", "crc32_concat"])
@pytest.mark.parametrize("type_name", list(_COLUMN_TYPES))
@given(value=odd_values)
def test_any_value_through_a_column_is_a_shard_or_a_sharding_error(
    type_name: str, algorithm: str, value: object
) -> None:
    """The same through a shard column's own function (the write and lookup paths):
    stored-value coercion first, then the algorithm."""
    sc = _odd_shard_column(type_name, algorithm)
    try:
        shard = sc.compute([value])
    except ShardingError as exc:
        assert len(str(exc)) < 1000
    else:
        assert 0 <= shard < 16


_odd_columns: dict[tuple[str, str], Any] = {}


def _odd_shard_column(type_name: str, algorithm: str) -> Any:
    key = (type_name, algorithm)
    if key not in _odd_columns:
        table = sa.Table(
            f"odd_{type_name}_{algorithm}",
            sa.MetaData(),
            sa.Column("src", _COLUMN_TYPES[type_name]),
            shard_column("src", count=16, algorithm=algorithm, name="shard").column,
        )
        _odd_columns[key] = get_shard_column(table)
    return _odd_columns[key]
