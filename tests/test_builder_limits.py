"""Every statement and commit the library builds stays under Spanner's limits, counted
from what is finally sent (issue 41): the dual write's read-back of old rows, copy_table's
commits, the backfill's batches, bulk_load's commits, presplit's requests, DDL batches
and verify's server-side count. Each at the limit - 1, the limit, the limit + 1 and 10 x,
for keys of 1 to 3 columns, on SQLite and on the emulator where it applies (the emulator
enforces parameters and functions a statement; commits are counted as Spanner counts
them, since the emulator does not enforce mutations per commit). The 10 x cases are slow.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, mapped_column
from test_write_limits import STEPS, Sent

from sharded_orm import bulk_load, shard_column
from sharded_orm.limits import (
    SPANNER_COMMIT_BYTES,
    SPANNER_DDL_BYTES,
    SPANNER_FUNCTIONS,
    SPANNER_KEY_BYTES,
    SPANNER_MUTATIONS,
    SPANNER_PARAMETERS,
    SPANNER_SPLIT_POINTS,
    commit_chunks,
    ddl_batches,
    index_cells,
    parameter_limit,
    row_mutations,
)

#: key columns, in order: a key of n columns takes the first n
KEY_COLUMNS: list[tuple[str, Any]] = [
    ("K0", sa.String(20)),
    ("K1", sa.Integer()),
    ("K2", sa.Date()),
]
D0 = dt.date(2026, 1, 1)


def _size(limit: int, step: Any) -> int:
    return 10 * limit if step == "10x" else int(limit + step)


def key_value(j: int, i: int) -> Any:
    # the key parts repeat across keys: an IN list per column would match their cross
    # product, which the read must not return
    return (f"t{i}", i % 7, D0 + dt.timedelta(days=i % 3))[j]


def key_of(n: int, i: int) -> dict[str, Any]:
    return {f"k{j}": key_value(j, i) for j in range(n)}


def _attrs(name: str, n: int, wide: int = 0) -> dict[str, Any]:
    attrs: dict[str, Any] = {"__tablename__": name}
    for j, (col, typ) in enumerate(KEY_COLUMNS[:n]):
        attrs[f"k{j}"] = mapped_column(col, typ, primary_key=True)
    attrs["a"] = mapped_column("A", sa.String(20))
    for w in range(wide):
        attrs[f"w{w}"] = mapped_column(f"W{w}", sa.Integer())
    return attrs


def pair(n: int, wide: int = 0, tag: str = "") -> tuple[Any, Any, sa.MetaData]:
    """``Bl<tag><n>`` keyed by ``n`` columns and its successor ``...New`` keyed
    ``(Shard16, key...)``; ``wide`` integer columns more in each."""

    class Base(DeclarativeBase):
        pass

    old = type(f"Bl{tag}{n}", (Base,), _attrs(f"Bl{tag}{n}", n, wide))
    new_attrs = _attrs(f"Bl{tag}{n}New", n, wide)
    new_attrs["shard16"] = shard_column(
        "k0", count=16, name="Shard16", primary_key=True, sort_order=-10
    )
    new = type(f"Bl{tag}{n}New", (Base,), new_attrs)
    return old, new, Base.metadata


@pytest.fixture
def sent(engine: sa.Engine) -> Iterator[Sent]:
    s = Sent(engine)
    yield s
    s.close()


def _seed(engine: sa.Engine, model: Any, n: int, rows: int, wide: int = 0) -> None:
    bulk_load(
        engine,
        model,
        [
            {
                **{c: key_value(j, i) for j, (c, _) in enumerate(KEY_COLUMNS[:n])},
                "A": f"a{i}",
                **{f"W{w}": i for w in range(wide)},
            }
            for i in range(rows)
        ],
        progress=False,
        workers=1,
    )


# ---------------------------------------------------------------------- the limits module


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 50), max_size=60),
    per_row=st.integers(1, 40),
    fixed=st.integers(0, 5),
    mutations=st.integers(40, 400),
    byte_limit=st.integers(50, 400),
)
def test_commit_chunks_cover_every_row_once_under_both_limits(
    sizes: list[int], per_row: int, fixed: int, mutations: int, byte_limit: int
) -> None:
    chunks = commit_chunks(sizes, per_row, fixed=fixed, mutations=mutations, byte_limit=byte_limit)
    assert [i for lo, hi in chunks for i in range(lo, hi)] == list(range(len(sizes)))
    for lo, hi in chunks:
        alone = hi - lo == 1
        assert alone or fixed + (hi - lo) * per_row <= mutations
        assert alone or sum(sizes[lo:hi]) <= byte_limit
        if hi < len(sizes):  # full: the next row would not have fit
            nxt = fixed + (hi - lo + 1) * per_row > mutations
            assert nxt or sum(sizes[lo : hi + 1]) > byte_limit


@pytest.mark.parametrize("step", [-1, 0, 1, "10x"])
def test_commit_chunks_at_the_mutation_limit(step: Any) -> None:
    per_row = 7
    limit = SPANNER_MUTATIONS // per_row
    rows = _size(limit, step)
    chunks = commit_chunks([10] * rows, per_row)
    assert [hi - lo for lo, hi in chunks][:-1] == [limit] * (len(chunks) - 1)
    assert len(chunks) == -(-rows // limit)


@pytest.mark.parametrize("step", [-1, 0, 1, "10x"])
def test_ddl_batches_at_the_request_limit(step: Any) -> None:
    stmt = "CREATE INDEX `Ix` ON `T` (`A`)"  # 31 bytes
    limit = SPANNER_DDL_BYTES // len(stmt)
    batches = ddl_batches([stmt] * _size(limit, step))
    assert all(sum(len(s) for s in b) <= SPANNER_DDL_BYTES for b in batches)
    assert sum(len(b) for b in batches) == _size(limit, step)
    assert len(batches) == -(-_size(limit, step) // limit)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_an_index_entry_counts_its_columns_the_key_and_storing(n: int) -> None:
    _, new, _ = pair(n)
    t = new.__table__
    ix = sa.Index("BlIx", t.c.A, spanner_storing=["K0"] if n > 1 else [])
    # A, then the key's columns (Shard16 and the n key columns), then STORING
    assert index_cells(t, ix) == 1 + (n + 1) + (1 if n > 1 else 0)
    written = len(t.c)
    assert row_mutations(t, written) == written + index_cells(t, ix)
    assert row_mutations(t, written, replaces=True) == written + index_cells(t, ix) + 1
    assert row_mutations(t, written, changed=["Shard16"]) == written  # not in the index
    assert row_mutations(t, written, indexes=False) == written


# ---------------------------------------------------------------------- the dual write's read-back


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("step", STEPS)
def test_read_keys_reads_exactly_the_keys_asked(
    engine: sa.Engine, sent: Sent, n: int, step: Any
) -> None:
    """The old rows at many keys (an IN list a key column filled Spanner's parameters at
    950 // n keys): exactly those rows, none of the cross product of the key parts, and
    on Spanner one array per key column (its parameters do not grow with the keys)."""
    from sharded_orm.write.mirror_io import read_keys
    from sharded_orm.write.successor_plan import plan

    limit = SPANNER_PARAMETERS // n
    keys = _size(limit, step)
    old, new, md = pair(n, tag="R")
    md.create_all(engine)
    stored = 2 * keys + 50  # every other row asked: the rest share key parts with them
    _seed(engine, old, n, stored)
    mp = plan(old.__table__, new.__table__)
    asked = [tuple(key_of(n, i).values()) for i in range(0, stored, 2)][:keys]
    assert len(asked) == keys
    missing = [tuple(key_of(n, i).values()) for i in range(stored, stored + 3)]
    sent.seen.clear()
    with engine.connect() as c:
        found = read_keys(c, mp, asked + missing)
    assert len(found) == len(asked)
    by_a = {row["A"] for row in found.values()}
    assert by_a == {f"a{i}" for i in range(0, stored, 2)[:keys]}
    reads = sent.matching("SELECT", old.__tablename__)
    with engine.connect() as c:
        most = parameter_limit(engine.dialect, c.connection.driver_connection)
    assert most is not None and reads and max(reads) <= most
    if engine.dialect.name != "sqlite":
        assert set(reads) == {n}  # the arrays, one a key column
        assert len(reads) == -(-(keys + 3) // 1000)


# ---------------------------------------------------------------------- copy_table's commits

WIDE = 200


def _copy_limit(n: int) -> int:
    """Rows one copy commit holds: each writes its n key columns, A, the wide columns and
    the new shard (the successor has no index)."""
    return SPANNER_MUTATIONS // (n + 1 + WIDE + 1)


@pytest.mark.parametrize(
    ("step", "n"),
    [
        # one row over a commit's mutations with one key column: the second commit
        (1, 1),
        # the other sizes and key widths: each seeds and copies a few hundred wide rows on
        # the emulator (seconds); quick loop:
        # test_copy_table_commits_stay_under_the_mutation_limit[1-1]
        *(
            pytest.param(step, n, marks=pytest.mark.slow, id=f"{step}-{n}")
            for n in (1, 2, 3)
            for step in (-1, 0, 1, "10x")
            if (step, n) != (1, 1)
        ),
    ],
)
def test_copy_table_commits_stay_under_the_mutation_limit(
    spanner_engine: sa.Engine, n: int, step: Any
) -> None:
    """A batch of more rows than one commit may hold (a wide table) is committed in
    several, each under 80,000 mutations, every row copied once."""
    from sharded_orm.load.copy import CopyProgress, copy_table

    limit = _copy_limit(n)
    rows = _size(limit, step)
    old, new, md = pair(n, wide=WIDE, tag="C")
    md.create_all(spanner_engine)
    _seed(spanner_engine, old, n, rows, wide=WIDE)
    seen: list[CopyProgress] = []
    result = copy_table(
        spanner_engine, old, new, batch_size=rows, progress_mode="off", on_batch=seen.append
    )
    per_commit = [
        b.rows - a.rows for a, b in zip([CopyProgress(0, 0, ()), *seen], seen, strict=False)
    ]
    assert max(per_commit) * (n + WIDE + 2) <= SPANNER_MUTATIONS
    assert result.rows == rows and result.batches == -(-rows // limit) == len(seen)
    with spanner_engine.connect() as c:
        t = new.__table__
        got = c.execute(sa.select(t.c.A, t.c.W0, t.c[f"W{WIDE - 1}"])).all()
    assert sorted(got) == sorted((f"a{i}", i, i) for i in range(rows))


# ---------------------------------------------------------------------- the backfill's batches


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("indexed", [False, True])
def test_backfill_batches_commit_under_the_mutation_limit(n: int, indexed: bool) -> None:
    """The largest batch size whose walk's commits (up to twice its rows, each an UPDATE
    of the key and the shard, and each index holding the shard re-written) stay under
    80,000 mutations; one more row would pass it."""
    from alembic_ext.backfill_io import WALK_READ_FACTOR, Plan, spanner_batch_size

    engine = sa.create_engine("sqlite://")
    md = sa.MetaData()
    t = sa.Table(
        "Bf",
        md,
        *[sa.Column(c, typ, primary_key=True) for c, typ in KEY_COLUMNS[:n]],
        sa.Column("A", sa.String(20)),
        sa.Column("Shard", sa.Integer()),
    )
    if indexed:
        sa.Index("BfByShard", t.c.Shard, t.c.A)
    md.create_all(engine)
    with engine.connect() as c:
        p = Plan(c, "Bf", "Shard", ["A"])
    per_row = n + 1 + ((2 + n + 1) if indexed else 0)  # key + shard; index: Shard, A, key; delete
    size = spanner_batch_size(p)

    def fits(rows: int) -> bool:  # a key's bytes at most, and the shard's
        commit = WALK_READ_FACTOR * rows
        return (
            commit * per_row <= SPANNER_MUTATIONS
            and commit * (SPANNER_KEY_BYTES + 16) <= SPANNER_COMMIT_BYTES
        )

    assert fits(size) and not fits(size + 1)
    engine.dispose()


# ---------------------------------------------------------------------- bulk_load's commits


# 9 loads at the limit; quick loop: test_backfill_batches_commit_under_the_mutation_limit,
# test_an_index_entry_counts_its_columns_the_key_and_storing
@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("step", [-1, 0, 1])
def test_bulk_load_commits_count_index_entries_as_spanner_does(
    mock_spanner: Any, n: int, step: Any
) -> None:
    """Each commit's rows x (columns + each index entry's cells, the key's included, and
    its replaced entry's delete) stay under 80,000 mutations."""
    md = sa.MetaData()
    cols = [sa.Column(f"c{i}", sa.Integer) for i in range(300)]
    keys = [sa.Column(c, typ, primary_key=True) for c, typ in KEY_COLUMNS[:n]]
    wide = sa.Table(f"BlWide{n}", md, *keys, *cols)
    sa.Index(f"BlWide{n}ByC0", wide.c.c0)
    per_row = (n + 300) + (1 + n) + 1
    limit = SPANNER_MUTATIONS // per_row
    rows = [
        {**{c: key_value(j, i) for j, (c, _) in enumerate(KEY_COLUMNS[:n])},
         **{f"c{k}": i for k in range(300)}}
        for i in range(_size(limit, step))
    ]  # fmt: skip
    report = bulk_load(mock_spanner.engine(), wide, rows, workers=1, batch_bytes=90_000_000)
    assert report.mutations_per_row == per_row
    sizes = [len(c.mutations[0].insert.values) for c in mock_spanner.commits()]
    assert sum(sizes) == len(rows)
    assert max(sizes) * per_row <= SPANNER_MUTATIONS


# ---------------------------------------------------------------------- presplit's requests


@pytest.mark.parametrize("step", [-1, 0, 1, "10x"])
def test_presplit_requests_hold_at_most_the_split_points_a_request(step: Any) -> None:
    import datetime as dt
    from types import SimpleNamespace

    from sharded_orm.limits import SPANNER_SPLIT_REQUEST_BYTES
    from sharded_orm.load import presplit as ps
    from sharded_orm.spanner import admin

    points = _size(SPANNER_SPLIT_POINTS, step)
    wanted = [ps.SplitPoint("T", None, (k,)) for k in range(1, points + 1)]
    database = SimpleNamespace(name="projects/p/instances/i/databases/d")
    bodies = admin.split_point_requests(
        database, wanted, expire_at=dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc),
        initiator="sharded-orm", per_request=ps.MAX_POINTS_PER_REQUEST,
        byte_limit=SPANNER_SPLIT_REQUEST_BYTES,
    )  # fmt: skip
    counts = [sum(len(sp.keys) for sp in body.split_points) for body in bodies]
    assert max(counts) <= SPANNER_SPLIT_POINTS and sum(counts) == points
    assert len(bodies) == -(-points // SPANNER_SPLIT_POINTS)


# ---------------------------------------------------------------------- verify's server count


def _farm_model(shards: int) -> Any:
    class Base(DeclarativeBase):
        pass

    attrs: dict[str, Any] = {
        "__tablename__": f"BlFarm{shards}",
        "k": mapped_column("K", sa.String(20), primary_key=True),
        "a": mapped_column("A", sa.String(20)),
        "b": mapped_column("B", sa.String(20)),
        "c": mapped_column("C", sa.Integer()),
    }
    for i in range(shards):
        attrs[f"s{i}"] = shard_column(
            "a", "b", "c", count=i + 2, algorithm="farm_fingerprint", name=f"S{i}"
        )
    return type(f"BlFarm{shards}", (Base,), attrs)


def test_verify_counts_more_shard_columns_than_one_statement_holds(
    spanner_engine: sa.Engine,
) -> None:
    """Farm-fingerprint shard columns are compared server-side; their tests together
    pass Spanner's 1,000 functions a statement, so they go in several statements."""
    from sharded_orm import verify
    from sharded_orm.load.verify import function_calls, mismatch_sql
    from sharded_orm.schema.columns import shard_columns

    model = _farm_model(30)
    t = model.__table__
    tests = [mismatch_sql(sc.name, sc.sources, sc.count) for sc in shard_columns(t)]
    assert sum(function_calls(x) for x in tests) > SPANNER_FUNCTIONS
    model.metadata.create_all(spanner_engine)
    _rows = [{"k": f"k{i}", "a": f"a{i}", "b": "b", "c": i} for i in range(5)]
    bulk_load(spanner_engine, model, _rows, progress=False, workers=1)
    report = verify(spanner_engine, model, progress_mode="off")
    assert report.ok and report.rows_checked == 5
    assert set(report.mismatched) == {f"S{i}" for i in range(30)}
