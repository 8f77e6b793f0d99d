"""Statements the write path builds stay under Spanner's limits, sized from what is sent.

* The dual write's copy into a successor (``write.mirror_io``): one multi-row
  ``INSERT OR UPDATE`` per chunk, sized from the statement with every column the engine
  hook adds (each new shard column): 300 events in one flush, or an UPDATE matching 300
  rows, sent 1,200 parameters (issue 41 A).
* The stored-source read of a partial-source UPDATE (``write.stored``): on Spanner the
  keys go as one array per key column, so neither its parameters nor its functions grow
  with the keys (a two-column key was one OR of ANDs: 340 keys crossed 1,000 functions,
  issue 41 E).

Each at the limit - 1, the limit, the limit + 1 and 10 x, for keys of 1 to 3 columns, on
SQLite and on the emulator (where the limits are real); the 10 x cases are slow.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
from collections.abc import Iterator
from typing import Any, cast

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Session, mapped_column
from successor_models import assert_mirrored

from sharded_orm import bulk_load, compute_shard, declare_successor, shard_column
from sharded_orm.limits import (
    SPANNER_FUNCTIONS,
    SPANNER_PARAMETERS,
    compiled_parameters,
    parameter_limit,
    rows_per_statement,
)
from sharded_orm.spanner.dialect import SpannerDialect
from sharded_orm.write.stored import StoredRows

#: key columns, in order: a key of n columns takes the first n
KEY_COLUMNS: list[tuple[str, Any]] = [
    ("K0", sa.String(20)),
    ("K1", sa.Integer()),
    ("K2", sa.Date()),
]
D0 = dt.date(2026, 1, 1)


def key_value(j: int, i: int) -> Any:
    return (f"t{i}", i % 5, D0 + dt.timedelta(days=i % 3))[j]


def key_of(n: int, i: int) -> dict[str, Any]:
    return {f"k{j}": key_value(j, i) for j in range(n)}


def _model_attrs(name: str, n: int) -> dict[str, Any]:
    attrs: dict[str, Any] = {"__tablename__": name}
    for j, (col, typ) in enumerate(KEY_COLUMNS[:n]):
        attrs[f"k{j}"] = mapped_column(col, typ, primary_key=True)
    attrs["a"] = mapped_column("A", sa.String(20))
    attrs["b"] = mapped_column("B", sa.String(20))
    attrs["kind"] = mapped_column("Kind", sa.String(20))
    return attrs


def models(n: int, successor: bool) -> tuple[Any, Any, sa.MetaData]:
    """``Wl<n>``: a key of ``n`` columns, a non-key shard ``Shard8`` of ``(A, B)``; with
    ``successor``, ``Wl<n>New`` keyed ``(Shard16, key...)``, declared its successor."""

    class Base(DeclarativeBase):
        pass

    old_attrs = _model_attrs(f"Wl{n}", n)
    old_attrs["shard8"] = shard_column("a", "b", count=8, name="Shard8")
    old = type(f"Wl{n}", (Base,), old_attrs)
    new = None
    if successor:
        new_attrs = _model_attrs(f"Wl{n}New", n)
        new_attrs["shard16"] = shard_column(
            "k0", count=16, name="Shard16", primary_key=True, sort_order=-10
        )
        new = type(f"Wl{n}New", (Base,), new_attrs)
        declare_successor(old, new)
    return old, new, Base.metadata


class Sent:
    """The statements an engine sends, with their parameter counts."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.seen: list[tuple[str, int]] = []
        sa.event.listen(engine, "before_cursor_execute", self._record)

    def _record(
        self, conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
    ) -> None:
        count = len(params[0]) if many and params else len(params or ())
        self.seen.append((statement, count))

    def close(self) -> None:
        sa.event.remove(self.engine, "before_cursor_execute", self._record)

    def matching(self, start: str, table: str) -> list[int]:
        quoted = (f"`{table}`", f'"{table}"')
        return [
            c
            for s, c in self.seen
            if s.lstrip().upper().startswith(start) and any(q in s for q in quoted)
        ]


@pytest.fixture
def sent(engine: sa.Engine) -> Iterator[Sent]:
    s = Sent(engine)
    yield s
    s.close()


#: where a batch's size sits against its limit: one under, at, one over, ten times
STEPS = [-1, 0, 1, pytest.param("10x", marks=pytest.mark.slow, id="10x")]


#: (step, n key columns) of the dual-write tests: every step with one key column; with two
#: and three, the step over the limit (a second statement)
DUAL_WRITE_CASES = [
    *((step, 1) for step in (-1, 0, 1)),
    *(
        # under and at the limit again, with a wider row (a flush of hundreds of rows on the
        # emulator each); quick loop: test_a_flush_of_many_rows_reaches_the_successor,
        # test_an_update_matching_many_rows_reaches_the_successor (every step at n=1, the
        # step over the limit at n=2 and n=3)
        pytest.param(step, n, marks=pytest.mark.slow, id=f"{step}-{n}")
        for n in (2, 3)
        for step in (-1, 0)
    ),
    *((1, n) for n in (2, 3)),
    *(pytest.param("10x", n, marks=pytest.mark.slow, id=f"10x-{n}") for n in (1, 2, 3)),
]


def _size(limit: int, step: Any) -> int:
    return 10 * limit if step == "10x" else int(limit + step)


# ---------------------------------------------------------------------- the limits module


def test_rows_per_statement_counts_a_row_and_the_statement() -> None:
    assert rows_per_statement(5, 10, 950) == 190
    assert rows_per_statement(7, 12, 950) == 189  # 2 fixed, 5 a row
    assert rows_per_statement(951, 1902, 950) == 1  # a row over the limit: the driver says so


# ---------------------------------------------------------------------- A: the dual write


def _copy_rows(n: int) -> int:
    """Rows one successor INSERT may carry: each sends its n key columns, A, B, Kind and the
    new shard the engine hook adds (the old table's own shard is not a successor column)."""
    return SPANNER_PARAMETERS // (n + 4)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_copy_statement_is_sized_from_the_compiled_statement(n: int) -> None:
    """Offline: the rows per statement count the shard the hook adds (was 900 // copied)."""
    from sharded_orm.write.mirror_io import copy_rows_per_statement
    from sharded_orm.write.successor_plan import plan

    old, new, _ = models(n, successor=True)
    mp = plan(old.__table__, new.__table__)
    row = {**{f"K{j}": key_value(j, 1) for j in range(n)}, "A": "a", "B": "b", "Kind": "k"}
    conn = sa.create_mock_engine("spanner+spanner:///projects/p/instances/i/databases/d", None)
    per = copy_rows_per_statement(cast(sa.Connection, conn), mp, [mp.new_row(row)])
    assert per == _copy_rows(n)
    stmt = sa.insert(new.__table__).values(
        [{**mp.new_row(row), "Shard16": 1} for _ in range(per + 1)]
    )
    assert compiled_parameters(stmt.compile(dialect=SpannerDialect())) > SPANNER_PARAMETERS


def _check_copies(engine: sa.Engine, sent: Sent, new: Any, rows: int, n: int) -> None:
    sizes = sent.matching("INSERT", new.__tablename__)
    assert max(sizes) <= SPANNER_PARAMETERS
    if engine.dialect.name != "sqlite":  # one multi-row statement per chunk, each full
        per = _copy_rows(n)
        assert len(sizes) == -(-rows // per), sizes
        assert max(sizes) == min(rows, per) * (n + 4)


@pytest.mark.parametrize(("step", "n"), DUAL_WRITE_CASES)
def test_a_flush_of_many_rows_reaches_the_successor(
    engine: sa.Engine, sent: Sent, n: int, step: Any
) -> None:
    limit = _copy_rows(n)
    rows = _size(limit, step)
    old, new, md = models(n, successor=True)
    md.create_all(engine)
    with Session(_patient(engine)) as s, s.begin():
        s.add_all([old(**key_of(n, i), a=f"a{i}", b="b", kind="a") for i in range(rows)])
    _check_copies(engine, sent, new, rows, n)
    assert assert_mirrored(engine, old, new) == rows


@pytest.mark.parametrize(("step", "n"), DUAL_WRITE_CASES)
def test_an_update_matching_many_rows_reaches_the_successor(
    engine: sa.Engine, sent: Sent, n: int, step: Any
) -> None:
    limit = _copy_rows(n)
    rows = _size(limit, step)
    old, new, md = models(n, successor=True)
    md.create_all(engine)
    t = old.__table__
    _seed(engine, old, n, rows, kind="a")
    sent.seen.clear()
    with _patient(engine).begin() as c:
        c.execute(sa.update(t).where(t.c.Kind == "a").values(Kind="z"))
    _check_copies(engine, sent, new, rows, n)
    assert assert_mirrored(engine, old, new) == rows
    with engine.connect() as c:
        assert set(c.scalars(sa.select(new.__table__.c.Kind))) == {"z"}


# ---------------------------------------------------------------------- E: stored sources


def _stored_limit(n: int) -> int:
    """Keys an OR of per-key ANDs could hold (n equalities and one AND a key, as the
    emulator counts them) under Spanner's functions per statement; for one column, an IN
    list's parameters."""
    return SPANNER_PARAMETERS if n == 1 else SPANNER_FUNCTIONS // (n + 1)


def _check_stored(engine: sa.Engine, old: Any, rows: int, b: str) -> None:
    t = old.__table__
    with engine.connect() as c:
        got = c.execute(sa.select(t.c.A, t.c.B, t.c.Shard8)).all()
    assert len(got) == rows
    for a, bb, shard in got:
        assert bb == b and shard == compute_shard((a, bb), 8)


def _seed(engine: sa.Engine, old: Any, n: int, rows: int, kind: str | None = None) -> None:
    """``rows`` rows (and their successor's) through ``bulk_load``: mutations on Spanner,
    where thousands of single-row DML statements outlast a statement's deadline."""
    bulk_load(
        engine,
        old,
        [{**key_of(n, i), "a": f"a{i}", "b": "b", "kind": kind} for i in range(rows)],
        progress=False,
        workers=1,
    )


def _patient(engine: sa.Engine) -> sa.Engine:
    """The engine, its statements given 30 minutes: the emulator runs the ORM's thousands
    of single-row statements one by one, past the default deadline of 60 s."""
    return engine.execution_options(timeout=1800) if engine.dialect.name != "sqlite" else engine


def _limit_of(engine: sa.Engine) -> int:
    with engine.connect() as c:
        found = parameter_limit(engine.dialect, c.connection.driver_connection)
    assert found is not None
    return found


@pytest.mark.parametrize("n", [1, 2, 3])
# 10 x: test_stored_rows_read_ten_times_the_limit (one flush of 2,500+ UPDATEs outlasts the
# emulator's batch DML stream)
# 18 flushes past the limits; quick loop: test_a_flush_of_many_rows_reaches_the_successor
@pytest.mark.slow
@pytest.mark.parametrize("step", STEPS[:3])
def test_a_flush_changing_one_source_of_many_rows(
    engine: sa.Engine, sent: Sent, n: int, step: Any
) -> None:
    limit = _stored_limit(n)
    rows = _size(limit, step)
    old, _, md = models(n, successor=False)
    md.create_all(engine)
    _seed(engine, old, n, rows)
    sent.seen.clear()
    with Session(_patient(engine)) as s, s.begin():
        for obj in s.scalars(sa.select(old)):
            obj.b = "changed"  # A, the other source, is read back for the new shard
    reads = sent.matching("SELECT", old.__tablename__)[1:]  # after the objects' load
    _check_stored(engine, old, rows, "changed")
    assert reads and max(reads) <= _limit_of(engine)
    if engine.dialect.name != "sqlite":  # one array per key column, a statement per batch
        assert set(reads) == {n} and len(reads) == -(-rows // StoredRowsBatch)


StoredRowsBatch = 1000


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2, 3])
def test_stored_rows_read_ten_times_the_limit(engine: sa.Engine, sent: Sent, n: int) -> None:
    """10 x the limit, read as the engine hook reads for one UPDATE of that many rows (on
    the emulator one flush of that many UPDATEs outlasts its batch DML stream): every
    row's stored sources, in one statement per 1,000 keys on Spanner."""
    rows = 10 * _stored_limit(n)
    old, _, md = models(n, successor=False)
    md.create_all(engine)
    _seed(engine, old, n, rows)
    t = old.__table__
    pk = list(t.primary_key.columns)
    pinned: dict[str, Any] = {c.key: sa.bindparam(f"pk_{c.key}") for c in pk}
    keyed = [{f"pk_{c.key}": key_value(j, i) for j, c in enumerate(pk)} for i in range(rows)]
    sent.seen.clear()
    with engine.connect() as c:
        fetch = StoredRows(c, t, pk, pinned, keyed)
        fetch.batch(["A"])
        reads = sent.matching("SELECT", old.__tablename__)
        for i, row in enumerate(keyed):
            assert fetch(row, ["A"]) == {"A": f"a{i}"}
    assert sent.matching("SELECT", old.__tablename__) == reads  # nothing read one by one
    assert max(reads) <= _limit_of(engine)
    if engine.dialect.name != "sqlite":
        assert set(reads) == {n} and len(reads) == -(-rows // StoredRowsBatch)


# quick loop: test_an_update_matching_many_rows_reaches_the_successor
@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2, 3])
def test_bulk_update_mappings_changing_one_source_past_the_limit(engine: sa.Engine, n: int) -> None:
    rows = _stored_limit(n) + 1
    old, _, md = models(n, successor=False)
    md.create_all(engine)
    _seed(engine, old, n, rows)
    with Session(_patient(engine)) as s, s.begin():
        s.bulk_update_mappings(old, [{**key_of(n, i), "b": "bulk"} for i in range(rows)])
    _check_stored(engine, old, rows, "bulk")


class Colour(enum.Enum):
    red = 1
    blue = 2


#: one-column keys of each type a Spanner key holds, and three values of each
KEY_TYPES: list[tuple[str, Any, list[Any]]] = [
    ("int", sa.BigInteger(), [1, -(2**63), 2**63 - 1]),
    ("str", sa.String(30), ["a", "", "é'\\`x"]),
    ("bytes", sa.LargeBinary(16), [b"\x00", b"abc", b"\xff" * 16]),
    ("date", sa.Date(), [dt.date(1, 1, 1), dt.date(2026, 2, 28), dt.date(9999, 12, 31)]),
    (
        "aware",
        sa.DateTime(timezone=True),
        [
            dt.datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=dt.timezone.utc),
            dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc),
        ],
    ),
    ("numeric", sa.Numeric(38, 9), [decimal.Decimal("1.5"), decimal.Decimal("-0.000000001")]),
    ("float", sa.Float(), [0.5, -1e300, 3.0]),
    ("enum", sa.Enum(Colour), [Colour.red, Colour.blue]),
]


@pytest.mark.parametrize("kind", [k for k, _, _ in KEY_TYPES])
def test_stored_sources_are_read_for_keys_of_each_type(engine: sa.Engine, kind: str) -> None:
    _, typ, values = next(k for k in KEY_TYPES if k[0] == kind)

    class Base(DeclarativeBase):
        pass

    attrs = {
        "__tablename__": f"WlType{kind}",
        "k": mapped_column("K", typ, primary_key=True),
        "a": mapped_column("A", sa.String(20)),
        "b": mapped_column("B", sa.String(20)),
        "shard8": shard_column("a", "b", count=8, name="Shard8"),
    }
    model: Any = type(f"WlType{kind}", (Base,), attrs)
    Base.metadata.create_all(engine)
    with Session(engine) as s, s.begin():
        s.add_all([model(k=v, a=f"a{i}", b="b") for i, v in enumerate(values)])
    with Session(engine) as s, s.begin():
        s.bulk_update_mappings(model, [{"k": v, "b": "new"} for v in values])
    with engine.connect() as c:
        got = c.execute(
            sa.select(model.__table__.c.A, model.__table__.c.B, model.__table__.c.Shard8)
        )
        rows = got.all()
    assert len(rows) == len(values)
    assert all(shard == compute_shard((a, b), 8) and b == "new" for a, b, shard in rows)


def test_the_spanner_read_sends_one_array_per_key_column() -> None:
    """Offline: the statement's parameters are the key columns, whatever the keys."""
    old, _, _ = models(3, successor=False)
    t = old.__table__
    mock = sa.create_mock_engine("spanner+spanner:///projects/p/instances/i/databases/d", None)
    from sharded_orm.write import stored

    made = stored._spanner_by_arrays(t, list(t.primary_key.columns), ["A"], mock.dialect)
    assert made is not None
    compiled = made[0].compile(dialect=mock.dialect)
    assert compiled_parameters(compiled) == 3
    text = str(compiled)
    assert " OR " not in text and "UNNEST" in text


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 3),
    picks=st.lists(st.integers(0, 60), min_size=1, max_size=40, unique=True),
    missing=st.lists(st.integers(61, 80), max_size=5),
)
def test_stored_rows_read_exactly_the_rows_asked_sqlite(
    n: int, picks: list[int], missing: list[int]
) -> None:
    """Whatever keys a statement names (some not stored), each row's stored sources are
    its own, and a key with no row reads as none."""
    old, _, md = models(n, successor=False)
    engine = sa.create_engine("sqlite://")
    md.create_all(engine)
    _seed(engine, old, n, 61)
    t = old.__table__
    pk = list(t.primary_key.columns)
    pinned: dict[str, Any] = {c.key: sa.bindparam(f"pk_{c.key}") for c in pk}
    rows = [{f"pk_{c.key}": key_value(j, i) for j, c in enumerate(pk)} for i in picks + missing]
    with engine.connect() as c:
        fetch = StoredRows(c, t, pk, pinned, rows)
        for i, row in zip(picks + missing, rows, strict=True):
            got = fetch(row, ["A"])
            assert got == ({"A": f"a{i}"} if i <= 60 else None)
    engine.dispose()
