"""What a load's commit carries, and what verify reads, counted from what is finally sent
(issue 41, "one place knows Spanner's limits"):

* bulk_load's batches hold at most ``batch_bytes`` as the commit carries them: each row's
  values, its secondary index entries (the indexed columns, the table's key and the
  STORING columns) and, in a key reshard, its successor row with that row's index entries
  (the successor row and the index entries were left out of a batch's size);
* verify's server-side count, split into several statements to stay under Spanner's
  1,000 function calls, reads one snapshot: a write between two of its statements is not
  seen by the second (each statement read the latest data, so one report mixed two
  states of the table);
* the limits module's values are those of Google's quotas page, and a row's mutations on
  a table with generated columns are counted as the page's note 10 says.

Each batch bound at the limit - 1, the limit, the limit + 1 and 10 x, for keys of 1 to 3
columns, with and without a successor; on SQLite and on the emulator where it applies.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, mapped_column

from sharded_orm import bulk_load, declare_successor, shard_column
from sharded_orm.limits import (
    SPANNER_COMMIT_BYTES,
    SPANNER_FUNCTIONS,
    SPANNER_MUTATIONS,
    SPANNER_PARAMETERS,
    row_bytes,
    row_mutations,
    value_bytes,
)
from sharded_orm.load.prepare import RowPreparer, written_columns
from sharded_orm.load.staging import close_batches, stage
from sharded_orm.write.successor_plan import plan

#: key columns, in order: a key of n columns takes the first n
KEY_COLUMNS: list[tuple[str, Any]] = [
    ("K0", sa.String(20)),
    ("K1", sa.Integer()),
    ("K2", sa.Date()),
]
D0 = dt.date(2026, 1, 1)
#: rows a range holds (one worker: ten ranges), and the load's rows
RANGE = 20
ROWS = 10 * RANGE
STEPS = [-1, 0, 1, "10x"]


def models(n: int, successor: bool, tag: str = "") -> tuple[Any, Any, sa.MetaData]:
    """``Lb<tag><n>`` keyed by ``n`` columns, an index on ``A`` storing ``B``; with
    ``successor``, ``Lb<tag><n>New`` keyed ``(Shard16, key...)`` with an index on ``A``,
    declared its successor."""

    class Base(DeclarativeBase):
        pass

    def attrs(name: str) -> dict[str, Any]:
        out: dict[str, Any] = {"__tablename__": name}
        for j, (col, typ) in enumerate(KEY_COLUMNS[:n]):
            out[f"k{j}"] = mapped_column(col, typ, primary_key=True)
        out["a"] = mapped_column("A", sa.String(20))
        out["b"] = mapped_column("B", sa.Integer())
        return out

    old_attrs = attrs(f"Lb{tag}{n}")
    old_attrs["__table_args__"] = (sa.Index(f"Lb{tag}{n}ByA", "A", spanner_storing=["B"]),)
    old = type(f"Lb{tag}{n}", (Base,), old_attrs)
    new = None
    if successor:
        new_attrs = attrs(f"Lb{tag}{n}New")
        new_attrs["shard16"] = shard_column(
            "k0", count=16, name="Shard16", primary_key=True, sort_order=-10
        )
        new_attrs["__table_args__"] = (sa.Index(f"Lb{tag}{n}NewByA", "A"),)
        new = type(f"Lb{tag}{n}New", (Base,), new_attrs)
        declare_successor(old, new)
    return old, new, Base.metadata


def row(n: int, i: int) -> dict[str, Any]:
    """Row ``i``: every row the same size (fixed-width strings)."""
    key = {"K0": f"k{i:07d}", "K1": i, "K2": D0 + dt.timedelta(days=i % 3)}
    return {**{c: key[c] for c, _ in KEY_COLUMNS[:n]}, "A": f"a{i:07d}", "B": i}


def carried(n: int, successor: bool, indexes: bool = True) -> int:
    """Bytes one row's write carries in a commit, counted here by hand: the row's values,
    its index entry (A, the key, B stored), and the successor's row (Shard16, the key, A,
    B) with its index entry (A, Shard16, the key)."""
    r = row(n, 0)
    key = [r[c] for c, _ in KEY_COLUMNS[:n]]
    shard = 0  # an INT64, as any other
    size = sum(map(value_bytes, [*key, r["A"], r["B"]]))
    if indexes:
        size += sum(map(value_bytes, [r["A"], *key, r["B"]]))
    if successor:
        size += sum(map(value_bytes, [shard, *key, r["A"], r["B"]]))
        size += sum(map(value_bytes, [r["A"], shard, *key]))
    return size


def byte_limit(n: int, successor: bool, step: Any, indexes: bool = True) -> int:
    """The batch bound at which a range's rows carry the limit - 1, the limit, the limit + 1
    (one byte over: the range takes two commits) or 10 x the limit."""
    full = RANGE * carried(n, successor, indexes)
    return full // 10 if step == "10x" else full - int(step)


def expected_counts(step: Any) -> list[int]:
    """Rows per batch, batches in key order: one per range while the range fits."""
    if step == "10x":
        return [RANGE // 10] * 100
    if step == 1:
        return [RANGE - 1, 1] * 10
    return [RANGE] * 10


# ---------------------------------------------------------------------- the staged batches


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("successor", [False, True])
@pytest.mark.parametrize("step", STEPS)
def test_a_batch_holds_its_rows_index_entries_and_successor_rows(
    tmp_path: Path, n: int, successor: bool, step: Any
) -> None:
    old, new, _ = models(n, successor)
    cols = written_columns(old.__table__, True)
    preparer = RowPreparer(old.__table__, cols, None, None)
    also = None
    if successor:
        t2 = new.__table__
        also = (plan(old.__table__, t2), RowPreparer(t2, written_columns(t2, True), None, None))
    limit = byte_limit(n, successor, step)
    staged = stage(
        (row(n, i) for i in range(ROWS)), preparer, also, str(tmp_path),
        workers=1, byte_limit=limit, rows_per_commit=10**6, seed=0,
    )  # fmt: skip
    try:
        assert staged.counts == expected_counts(step)
        per_row = carried(n, successor)
        assert staged.bytes == ROWS * per_row
        seen = []
        for b, count in enumerate(staged.counts):
            values, successor_rows = staged.rows(b)
            assert len(values) == count and count * per_row <= limit
            assert len(successor_rows or []) == (count if successor else 0)
            seen += [v[cols.index(old.__table__.c.A)] for v in values]
        assert sorted(seen) == [f"a{i:07d}" for i in range(ROWS)]
    finally:
        close_batches(staged)


@pytest.mark.parametrize("n", [1, 3])
def test_defer_indexes_leaves_the_index_entries_out(tmp_path: Path, n: int) -> None:
    old, _, _ = models(n, False, tag="D")
    preparer = RowPreparer(old.__table__, written_columns(old.__table__, True), None, None)
    limit = byte_limit(n, False, 1, indexes=False)
    staged = stage(
        (row(n, i) for i in range(ROWS)), preparer, None, str(tmp_path),
        workers=1, byte_limit=limit, rows_per_commit=10**6, seed=0, indexes=False,
    )  # fmt: skip
    close_batches(staged)
    assert staged.counts == expected_counts(1)


def test_a_row_over_the_bound_with_its_successor_row_is_refused_by_position(
    tmp_path: Path,
) -> None:
    from sharded_orm.load.prepare import BulkValidationError

    old, new, _ = models(2, True, tag="R")
    t2 = new.__table__
    preparer = RowPreparer(old.__table__, written_columns(old.__table__, True), None, None)
    also = (plan(old.__table__, t2), RowPreparer(t2, written_columns(t2, True), None, None))
    alone = carried(2, False)  # fits without its successor row, not with it
    with pytest.raises(BulkValidationError, match=r"row 0: .*its successor row.*batch_bytes"):
        stage(
            [row(2, 0)], preparer, also, str(tmp_path),
            workers=1, byte_limit=alone, rows_per_commit=10, seed=0,
        )  # fmt: skip


# ---------------------------------------------------------------------- bulk_load, end to end


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("step", STEPS)
def test_bulk_load_commits_carry_at_most_batch_bytes(engine: sa.Engine, n: int, step: Any) -> None:
    """On Spanner the successor's rows go in the same commits (counted); elsewhere the
    engine hook mirrors each batch's insert. Every row lands once in both tables."""
    on_spanner = engine.dialect.name != "sqlite"
    old, new, md = models(n, True, tag="E")
    md.create_all(engine)
    limit = byte_limit(n, on_spanner, step)
    report = bulk_load(
        engine, old, [row(n, i) for i in range(ROWS)], workers=1, batch_bytes=limit,
        progress=False,
    )  # fmt: skip
    assert report.complete and report.rows_written == ROWS
    assert report.batches == report.commits == len(expected_counts(step))
    with engine.connect() as c:
        for t in (old.__table__, new.__table__):
            got = c.execute(sa.select(t.c.A, t.c.B)).all()
            assert sorted(got) == [(f"a{i:07d}", i) for i in range(ROWS)]


def test_bulk_load_commits_on_spanner_hold_the_successor_rows(mock_spanner: Any) -> None:
    """What the commits carry, read from the requests: each commit writes the batch's rows
    to both tables, and rows x their bytes stay within batch_bytes."""
    old, _, _ = models(2, True, tag="M")
    limit = byte_limit(2, True, 1)
    bulk_load(
        mock_spanner.engine(), old, [row(2, i) for i in range(ROWS)], workers=1,
        batch_bytes=limit, progress=False,
    )  # fmt: skip
    commits = mock_spanner.commits()
    per_commit = []
    for commit in commits:
        writes = [m.insert if m.insert.table else m.insert_or_update for m in commit.mutations]
        tables = {w.table: len(w.values) for w in writes}
        assert set(tables) == {"LbM2", "LbM2New"} and len(set(tables.values())) == 1
        per_commit.append(tables["LbM2"])
    assert sorted(per_commit) == sorted(expected_counts(1))
    assert max(per_commit) * carried(2, True) <= limit


# ---------------------------------------------------------------------- the sizer


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 3),
    texts=st.lists(st.text(max_size=30), min_size=2, max_size=2),
    b=st.none() | st.integers(-(2**63), 2**63 - 1),
)
def test_row_bytes_counts_each_value_once_per_place_it_is_carried(
    n: int, texts: list[str], b: int | None
) -> None:
    old, new, _ = models(n, True, tag="H")
    t = old.__table__
    names = [c.key for c in written_columns(t, True)]
    r = {**row(n, 1), "A": texts[0], "B": b}
    by_key = {c.key: r[c.name] for c in t.columns}
    values = [by_key[k] for k in names]
    key = [by_key[c.key] for c in t.primary_key.columns]
    want = sum(map(value_bytes, values)) + sum(map(value_bytes, [r["A"], *key, r["B"]]))
    assert row_bytes(t, names)(values) == want
    assert row_bytes(t, names, indexes=False)(values) == sum(map(value_bytes, values))


def test_a_generated_column_is_counted_though_not_sent() -> None:
    """A server-side shard (a generated column) is not sent, yet the commit holds it, and
    the page's note 10 counts it and the key columns again as mutations."""
    md = sa.MetaData()
    t = sa.Table(
        "Gen",
        md,
        sa.Column("K", sa.String(10), primary_key=True),
        sa.Column("A", sa.String(10)),
        sa.Column("S", sa.Integer, sa.Computed("MOD(FARM_FINGERPRINT(A), 8)")),
    )
    sa.Index("GenByS", t.c.S)
    sized = row_bytes(t, ["K", "A"])
    # row: K, A and S (its most: an INT64); the entry: S, K
    assert sized(["k", "a"]) == 2 * value_bytes("k") + value_bytes("a") + 2 * 16
    # note 10: 2 written + 1 generated + 1 key column; the index entry: S, K
    assert row_mutations(t, 2) == 2 + 1 + 1 + 2
    assert row_mutations(t, 2, indexes=False) == 4


# ---------------------------------------------------------------------- the values themselves


def test_the_limits_are_those_of_the_quotas_page() -> None:
    """https://cloud.google.com/spanner/quotas, rechecked for issue 41 (the page's rows:
    "Parameters | 950", "Function calls | 1,000", "Mutations per commit (including
    indexes) | 80,000", "Commit size (including indexes and change streams) | 100 MiB",
    "Query statement length | 1 million characters", "Request size other than for
    commits | 10 MiB", "Columns per table | 1,024", ...)."""
    from sharded_orm import limits as lim

    assert SPANNER_PARAMETERS == 950
    assert SPANNER_FUNCTIONS == 1000
    assert SPANNER_MUTATIONS == 80_000
    assert SPANNER_COMMIT_BYTES == 100 * 2**20
    assert lim.SPANNER_STATEMENT_CHARS == 1_000_000
    assert lim.SPANNER_REQUEST_BYTES == 10 * 2**20
    assert lim.SPANNER_DDL_BYTES == 10 * 2**20
    assert lim.SPANNER_TABLE_COLUMNS == 1024
    assert lim.SPANNER_KEY_COLUMNS == 16
    assert lim.SPANNER_KEY_BYTES == 8 * 2**10
    assert lim.SPANNER_CELL_BYTES == 10 * 2**20
    assert lim.SPANNER_IN_VALUES == 10_000
    assert lim.SPANNER_STRUCT_FIELDS == 1000
    assert lim.SPANNER_NESTED_FUNCTIONS == 75
    assert lim.SPANNER_UNIONS == 200
    assert lim.SPANNER_NAME_LENGTH == 128
    assert lim.SPANNER_SPLIT_POINTS == 100
    assert lim.SPANNER_SPLIT_REQUEST_BYTES == 2**20


# ---------------------------------------------------------------------- verify reads one snapshot


def _verify_model(shards: int, algorithm: str, tag: str) -> Any:
    class Base(DeclarativeBase):
        pass

    attrs: dict[str, Any] = {
        "__tablename__": f"Vs{tag}",
        "k": mapped_column("K", sa.String(20), primary_key=True),
        "a": mapped_column("A", sa.String(20)),
        "b": mapped_column("B", sa.String(20)),
        "c": mapped_column("C", sa.Integer()),
    }
    for i in range(shards):
        attrs[f"s{i}"] = shard_column("a", "b", "c", count=i + 2, algorithm=algorithm, name=f"S{i}")
    return type(f"Vs{tag}", (Base,), attrs)


class WriteBetween:
    """Runs ``write`` once, just before the ``nth`` statement of ``engine`` that contains
    ``marker``: a concurrent writer's commit between two of verify's statements."""

    def __init__(self, engine: sa.Engine, marker: str, nth: int, write: Any) -> None:
        self.engine, self.marker, self.nth, self.write = engine, marker, nth, write
        self.seen = 0
        sa.event.listen(engine, "before_cursor_execute", self._before)

    def _before(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if self.marker in statement:
            self.seen += 1
            if self.seen == self.nth:
                self.write()

    def close(self) -> None:
        sa.event.remove(self.engine, "before_cursor_execute", self._before)


@pytest.mark.emulator
@pytest.mark.parametrize("isolation", [None, "AUTOCOMMIT"])
def test_verify_server_counts_read_one_snapshot(
    spanner_engine: sa.Engine, isolation: str | None
) -> None:
    """30 farm_fingerprint columns: their tests pass 1,000 function calls, so the count is
    several statements. A row with wrong shards committed between the first and the second
    is seen by none of them (all read the table as of the first), and by the next verify
    in every column; whatever the engine's transaction mode (in AUTOCOMMIT each statement
    read the latest data; in a read-write transaction the writer's commit ended it on the
    emulator)."""
    from sharded_orm import verify
    from sharded_orm.spanner.mutations import database_of

    if isolation is not None:
        spanner_engine = spanner_engine.execution_options(isolation_level=isolation)
    model = _verify_model(30, "farm_fingerprint", "Farm")
    model.metadata.create_all(spanner_engine)
    rows = [{"k": f"k{i}", "a": f"a{i}", "b": "b", "c": i} for i in range(5)]
    bulk_load(spanner_engine, model, rows, progress=False, workers=1)
    database = database_of(spanner_engine)

    def write() -> None:  # a row whose shards no hash gives: a mismatch in every column
        columns = ["K", "A", "B", "C", *(f"S{i}" for i in range(30))]
        database.run_in_transaction(
            lambda tx: tx.insert("VsFarm", columns, [["late", "a", "b", 1, *[999] * 30]])
        )

    between = WriteBetween(spanner_engine, "COUNTIF", 2, write)
    try:
        report = verify(spanner_engine, model, progress_mode="off")
    finally:
        between.close()
    assert between.seen > 1  # several statements, the write between the first two
    assert report.rows_checked == 5
    assert report.mismatched == {f"S{i}": 0 for i in range(30)}
    again = verify(spanner_engine, model, progress_mode="off")
    assert again.rows_checked == 6
    assert again.mismatched == {f"S{i}": 1 for i in range(30)}


def test_verify_on_sqlite_counts_and_scans_in_one_transaction(tmp_path: Path) -> None:
    """The row count and the scan read one snapshot (WAL: a writer commits meanwhile): a
    row with a wrong shard committed between them is not in the report."""
    from sharded_orm import verify

    path = tmp_path / "v.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.connect() as c:
        c.exec_driver_sql("PRAGMA journal_mode=WAL")
    model = _verify_model(2, "crc32", "Crc")
    model.metadata.create_all(engine)
    rows = [{"k": f"k{i}", "a": f"a{i}", "b": "b", "c": i} for i in range(20)]
    bulk_load(engine, model, rows, progress=False, workers=1)

    def write() -> None:
        other = sqlite3.connect(path, timeout=1)
        with other:
            other.execute(
                'INSERT INTO "VsCrc" ("K", "A", "B", "C", "S0", "S1") VALUES (?, ?, ?, ?, ?, ?)',
                ("late", "a", "b", 1, 99, 99),  # shards no hash gives
            )
        other.close()

    between = WriteBetween(engine, '"VsCrc"', 2, write)  # the count, then the scan
    try:
        report = verify(engine, model, progress_mode="off")
    finally:
        between.close()
    assert between.seen == 2
    assert report.rows_checked == 20 and report.ok
    again = verify(engine, model, progress_mode="off")
    assert again.rows_checked == 21 and again.mismatched == {"S0": 1, "S1": 1}
    engine.dispose()
