"""bulk_load streams: memory is bounded by the batch and worker settings, not the input.

It held the whole input prepared in memory before the first commit, with a duplicate-key
dict: 133 MiB at 15,000 rows from a generator, 242 MiB at 150,000, about 8 GB for 10
million. Rows are now staged on disk (``sharded_orm.load.staging``): sorted in runs,
merged, checked for duplicate keys, cut into the same ranges and batches as before.
"""

from __future__ import annotations

import os
import pickle
import random
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharded_orm.load import staging
from sharded_orm.load.bulk import BulkValidationError, bulk_load
from sharded_orm.load.prepare import RowPreparer, written_columns

#: How far above the interpreter's own RSS (after imports and a warm-up load) a load
#: may peak, and how much more at 1M rows than at 100k (the batches grow until the
#: commit limits cap them).
BUDGET_MIB = 64
SAME_MIB = 12

PROBE = textwrap.dedent(
    """
    import sys
    import sqlalchemy as sa
    from sharded_orm import bulk_load

    url, n, options = sys.argv[1], int(sys.argv[2]), eval(sys.argv[3])
    md = sa.MetaData()
    t = sa.Table("Small", md,
                 sa.Column("Id", sa.BigInteger, primary_key=True, autoincrement=False),
                 sa.Column("V", sa.String(20)))
    engine = sa.create_engine(url)
    if url.startswith("sqlite"):
        md.create_all(engine)
    def status(field):  # MiB; this process's own (ru_maxrss would count its parent's)
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith(field + ":")) / 1024
    def reset_peak():  # Linux >= 4.0: VmHWM restarts from the current RSS
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    rows = lambda lo, hi: ({"Id": i, "V": f"v{i}"} for i in range(lo, hi))
    bulk_load(engine, t, rows(-2000, 0), progress=False, **options)  # imports, caches
    base = status("VmRSS")
    reset_peak()
    report = bulk_load(engine, t, rows(0, n), progress=False, **options)
    assert report.rows_written == n, report
    print(status("VmHWM") - base, base)
    """
)


def _load_peak(url: str, n: int, env: dict[str, str] | None = None, **options: Any) -> float:
    """MiB above its baseline a fresh interpreter peaks at, loading ``n`` rows from a
    generator (``options``: bulk_load's)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, url, str(n), repr(options)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(env or {})},
        timeout=1800,
    )
    return float(out.stdout.split()[0])


@pytest.mark.slow
def test_memory_is_flat_in_the_input_on_sqlite(tmp_path: Path) -> None:
    small = _load_peak(f"sqlite:///{tmp_path}/a.db", 100_000)
    large = _load_peak(f"sqlite:///{tmp_path}/b.db", 1_000_000)
    assert small <= BUDGET_MIB and large <= BUDGET_MIB, (small, large)
    assert large - small <= SAME_MIB, (small, large)  # 242 MiB at 150k rows before


@pytest.mark.slow
@pytest.mark.emulator
def test_memory_is_flat_in_the_input_on_the_emulator(spanner_emulator: Any) -> None:
    ddl = ["CREATE TABLE Small (Id INT64 NOT NULL, V STRING(20)) PRIMARY KEY (Id)"]
    env = {"SPANNER_EMULATOR_HOST": spanner_emulator.host}
    # batches of about 250 rows at both sizes (at defaults they grow with the input until
    # the commit limits cap them, past this test's sizes)
    peaks = [
        _load_peak(
            spanner_emulator.url(spanner_emulator.create_database(ddl)),
            n,
            env,
            workers=2,
            batch_bytes=8_000,
        )  # fmt: skip
        for n in (10_000, 60_000)
    ]
    assert max(peaks) <= BUDGET_MIB, peaks
    assert peaks[1] - peaks[0] <= SAME_MIB, peaks


# ------------------------------------------------------------------ staging, exactly


MD = sa.MetaData()
KV = sa.Table(
    "kv",
    MD,
    sa.Column("k", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("v", sa.String(100)),
)


def _preparer() -> RowPreparer:
    return RowPreparer(KV, written_columns(KV, False), None, None)


def _planned(
    rows: list[dict[str, Any]], workers: int, byte_limit: int, per_commit: int, seed: int
) -> tuple[list[list[int]], list[int], dict[int, list[int]]]:
    """The plan as bulk_load made it in memory (the oracle): sort by key, cut
    10 * workers ranges, cut batches, give range r to worker r % workers, shuffle."""
    prep = _preparer()
    sized = [prep.prepare(prep.filled(r, i), i) for i, r in enumerate(rows)]
    order = sorted(range(len(rows)), key=lambda i: sized[i][1])
    n_ranges = max(1, min(len(order), 10 * workers))
    per_range = -(-len(order) // n_ranges) if order else 1
    batches: list[list[int]] = []
    ranges: list[int] = []
    for r, start in enumerate(range(0, len(order), per_range)):
        current: list[int] = []
        size = 0
        for p in order[start : start + per_range]:
            if current and (size + sized[p][2] > byte_limit or len(current) >= per_commit):
                batches.append(current)
                ranges.append(r)
                current, size = [], 0
            current.append(p)
            size += sized[p][2]
        if current:
            batches.append(current)
            ranges.append(r)
    rng = random.Random(seed)
    by_worker: dict[int, list[int]] = {w: [] for w in range(workers)}
    for b, r in enumerate(ranges):
        by_worker[r % workers].append(b)
    for w in by_worker:
        rng.shuffle(by_worker[w])
    return [[int(rows[p]["k"]) for p in batch] for batch in batches], ranges, by_worker


@pytest.fixture
def tiny_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of a few rows and merges of two at a time: every path of the sort is taken."""
    monkeypatch.setattr(staging, "MIN_RUN_ROWS", 3)
    monkeypatch.setattr(staging, "MIN_RUN_BYTES", 1)
    monkeypatch.setattr(staging, "MAX_FAN_IN", 2)
    monkeypatch.setattr(staging, "BLOCK_RECORDS", 2)


def _stage(rows: Any, **kw: Any) -> staging.StagedLoad:
    directory = tempfile.mkdtemp()
    return staging.stage(rows, _preparer(), None, directory, **kw)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    keys=st.lists(st.integers(-1000, 1000), unique=True, max_size=120),
    workers=st.integers(1, 5),
    byte_limit=st.integers(40, 400),
    per_commit=st.integers(1, 9),
    seed=st.integers(0, 3),
)
def test_the_plan_is_the_one_made_in_memory(
    tiny_runs: None, keys: list[int], workers: int, byte_limit: int, per_commit: int, seed: int
) -> None:
    rows = [{"k": k, "v": "x" * (abs(k) % 7)} for k in keys]
    staged = _stage(iter(rows), workers=workers, byte_limit=byte_limit,
                    rows_per_commit=per_commit, seed=seed)  # fmt: skip
    try:
        batches, ranges, by_worker = _planned(rows, workers, byte_limit, per_commit, seed)
        got = [[values[0] for values in staged.rows(b)[0]] for b in range(len(staged.counts))]
        assert got == batches
        assert staged.batch_range == ranges and staged.by_worker == by_worker
        assert staged.total == len(rows) == sum(staged.counts)
    finally:
        staging.close_batches(staged)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.integers(0, 30), min_size=2, max_size=60))
def test_the_first_duplicate_in_input_order_is_reported(tiny_runs: None, keys: list[int]) -> None:
    seen: dict[int, int] = {}
    want = None
    for pos, k in enumerate(keys):
        if k in seen:
            want = (pos, seen[k])
            break
        seen[k] = pos
    rows = ({"k": k, "v": "v"} for k in keys)
    if want is None:
        staging.close_batches(_stage(rows, workers=2, byte_limit=10**6, rows_per_commit=5, seed=0))
        return
    with pytest.raises(BulkValidationError) as caught:
        _stage(rows, workers=2, byte_limit=10**6, rows_per_commit=5, seed=0)
    assert caught.value.position == want[0]
    assert f"is also the key of row {want[1]}" in str(caught.value)


def test_a_duplicate_before_a_bad_row_is_the_error_and_after_it_is_not(tiny_runs: None) -> None:
    rows = [{"k": i, "v": "v"} for i in range(20)]
    dup_first = [*rows[:10], {"k": 3, "v": "again"}, *rows[10:15], {"k": "bad"}]
    with pytest.raises(BulkValidationError, match="row 10: its primary key"):
        _stage(iter(dup_first), workers=2, byte_limit=10**6, rows_per_commit=5, seed=0)
    bad_first = [*rows[:10], {"k": "bad"}, {"k": 3, "v": "again"}]
    with pytest.raises(BulkValidationError, match="row 10: column 'k' takes int"):
        _stage(iter(bad_first), workers=2, byte_limit=10**6, rows_per_commit=5, seed=0)


def test_mixed_key_types_are_refused(tiny_runs: None) -> None:
    table = sa.Table("mixed", sa.MetaData(), sa.Column("k", sa.JSON, primary_key=True))
    prep = RowPreparer(table, written_columns(table, False), None, None)
    rows = iter([{"k": 1}, {"k": "a"}, {"k": 2}, {"k": "b"}, {"k": 3}])
    with pytest.raises(Exception, match="mixed types cannot be ordered"):
        staging.stage(rows, prep, None, tempfile.mkdtemp(), workers=1, byte_limit=10**6,
                      rows_per_commit=5, seed=0)  # fmt: skip


def test_a_value_that_cannot_be_staged_names_its_row(tmp_path: Path) -> None:
    table = sa.Table(
        "docs",
        sa.MetaData(),
        sa.Column("k", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("doc", sa.JSON),
    )
    engine = sa.create_engine(f"sqlite:///{tmp_path}/d.db")
    table.create(engine)
    rows = [{"k": i, "doc": {"n": i}} for i in range(5)] + [{"k": 5, "doc": {"f": lambda: 1}}]
    with pytest.raises(BulkValidationError, match="row 5: a value cannot be staged"):
        bulk_load(engine, table, iter(rows), progress=False)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 0


def test_the_staging_files_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    engine = sa.create_engine(f"sqlite:///{tmp_path}/kv.db")
    MD.create_all(engine)
    report = bulk_load(engine, KV, ({"k": i, "v": "v"} for i in range(3000)), progress=False)
    assert report.rows_written == 3000
    with pytest.raises(BulkValidationError):
        bulk_load(engine, KV, iter([{"k": 9000}, {"k": 9000}]), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kv.db"]


def test_staged_batches_hold_what_is_sent(tiny_runs: None) -> None:
    rows = [{"k": k, "v": f"v{k}"} for k in random.Random(3).sample(range(500), 200)]
    staged = _stage(iter(rows), workers=3, byte_limit=200, rows_per_commit=7, seed=1)
    try:
        sent = [v for b in range(len(staged.counts)) for v in staged.rows(b)[0]]
        assert sorted(sent) == sorted((r["k"], r["v"]) for r in rows)
        assert all(staged.rows(b)[1] is None for b in range(len(staged.counts)))
        assert pickle.loads(pickle.dumps(sent)) == sent
    finally:
        staging.close_batches(staged)
