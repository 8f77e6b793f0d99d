"""``doctor --fix`` end to end on the emulator, for each seed scenario of docs/hotspots.md.

What is simulated: the emulator has no split statistics (SPANNER_SYS.SPLIT_STATS_TOP_*) and
no load-based splitting, so each scenario's hot-split table is the simulator's prediction
for the naive schema, exported as SPANNER_SYS rows with the reason a growing key gives
(MOVING_HOT_SPOT; tests/test_doctor_fix.py ``seed_export``). Everything after is real:
``doctor`` reads the export, ``fix`` writes the revision(s) into an Alembic project on the
emulator, and they are applied online while a separate process keeps inserting with the
OLD model (tests/fix_writer.py) until it is fenced. Then: 0 rows unfindable through the new
layout, ``alembic check`` clean against the models with the change applied, and the
scenario simulated again on the new schema shows no hot split.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic_project import Project
from fix_writer import MODELS, row
from old_writer import env as writer_env
from old_writer import stats as writer_stats
from old_writer import stop as stop_writer
from old_writer import wait_for
from test_doctor_fix import SEEDS, seed_export

from alembic_ext.ops import PROGRESS_ATTRIBUTE
from sharded_orm import doctor, sharded_select
from sharded_orm.tools.doctor import EmptyWindowError
from sharded_orm.tools.doctor.diagnose import metadata_of_models
from sharded_orm.tools.doctor.fix import fix
from sharded_orm.tools.simulate import simulate

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

HERE = Path(__file__).parent
SEED = 400
SCENARIO_OF = {"1": "1 company 3x", "2": "2 company 100x, 10 shards", "3": "3 timestamp key"}
SCENARIO_OF["4"] = "4 timestamp index"


def _upgrade(proj: Project, target: str, metadata: sa.MetaData) -> None:
    """``alembic upgrade``, again while the emulator refuses DDL beside the writer's
    transaction (it runs one at a time; Spanner does not refuse it): each step is safe to
    run again (docs/migrations.md, the re-run rule)."""
    proj.cfg.attributes["target_metadata"] = metadata
    for _ in range(30):
        try:
            proj.upgrade(target, **{PROGRESS_ATTRIBUTE: None})
            return
        except Exception as exc:  # MigrationError, BackfillIncomplete: said, and re-run
            if not any(why in str(exc) for why in RERUN):
                raise
            RERUNS.append(str(exc)[:80])
            time.sleep(0.3)
    raise AssertionError("the emulator refused the DDL 30 times")


#: refusals the re-run rule answers: the emulator's one-transaction-at-a-time, and a row
#: the old writer added between the contract's fill and its NOT NULL fence (the fill's
#: count, or the fence, fails loudly; run again: the fill takes it, the fence goes up)
RERUN = (
    "concurrent schema change operation or read-write transaction",
    "Cannot specify a null",
    "still NULL after the",
)
RERUNS: list[str] = []


@pytest.mark.parametrize("scenario", sorted(SCENARIO_OF))
def test_fix_applies_online_under_an_old_writer(
    tmp_path: Path, spanner_emulator: Any, scenario: str
) -> None:
    name = SCENARIO_OF[scenario]
    model = MODELS[scenario]
    old_md = metadata_of_models([model])
    url = spanner_emulator.url(spanner_emulator.create_database())
    proj = Project(tmp_path / "proj", url)
    engine = sa.create_engine(url)
    proj.revision(old_md, "init")
    proj.upgrade()
    old = model.__table__
    for lo in range(0, SEED, 50):  # small commits: the emulator is slow with big DML batches
        with engine.begin() as conn:
            conn.execute(old.insert(), [row(scenario, i, "seed-") for i in range(lo, lo + 50)])

    out = tmp_path / "writer"
    out.mkdir()
    writer = subprocess.Popen(
        [sys.executable, str(HERE / "fix_writer.py"), scenario, url, str(out)], env=writer_env()
    )
    try:
        wait_for("the old writer's first rows", lambda: writer_stats(out)["ok"] >= 5)
        diagnosis = doctor(seed_export(name, tmp_path / "splits.csv"), [model])
        report = fix(diagnosis, [model], alembic=proj.cfg)
        [change] = report.changes
        assert change.kind == SEEDS[name][3]
        revs = report.revisions[0]
        # the expand; old code keeps writing through it (a new shard column's NOT NULL
        # stops it there, loudly), then the contract
        _upgrade(proj, str(revs[0].revision), change.expand_metadata)
        if change.kind != "shard_index":
            during = writer_stats(out)["ok"]
            wait_for("old rows after the expand", lambda: writer_stats(out)["ok"] >= during + 3)
        _upgrade(proj, "head", change.metadata)
        before = writer_stats(out)["failed"]
        wait_for("the fenced writer's errors", lambda: writer_stats(out)["failed"] >= before + 3)
    finally:
        stop_writer(writer, out)
    stats = writer_stats(out)
    assert stats["ok"] >= 5

    # alembic check: the database is what the models say once the change is applied
    proj.check(change.metadata)
    command.check(proj.cfg)

    # 0 rows unfindable through the new layout
    new = change.after
    key = [c.name for c in old.primary_key.columns]
    index = None if change.new_index is None else str(change.new_index.name)
    via = sharded_select(new, index=index)
    with engine.connect() as c:
        stored = {tuple(r) for r in c.execute(sa.select(*[new.c[k] for k in key]))}
        found = {tuple(getattr(r, k) for k in key) for r in c.execute(via)}
    assert len(stored) >= SEED + stats["ok"] - 5  # nothing lost (a few commits may be unknown)
    assert found == stored

    # the scenario again, on the new schema: no hot split
    _, workload, instance, _ = SEEDS[name]
    rows = simulate(new, workload, instance, progress_mode="off").hot_split_rows()
    assert isinstance(rows, list)
    with pytest.raises(EmptyWindowError):  # doctor finds no hot split in the new schema's
        doctor([r for r in rows if r["CPU_USAGE_SCORE"] >= 100], [new])
    print(
        f"scenario {name}: after the fix, {len(rows)} warm split rows, peak score "
        f"{max((r['CPU_USAGE_SCORE'] for r in rows), default=0)}; writer {stats}"
    )
    engine.dispose()


def test_the_sequence_fix_applies_and_new_ids_skip_the_used_ones(
    tmp_path: Path, spanner_emulator: Any
) -> None:
    """``sequence``: no seed scenario has it (tests/test_doctor.py's Orders does): the
    revision creates a bit-reversed sequence skipping every id used; ids drawn from it never
    meet one, and the schema is unchanged (alembic check clean against the same models)."""
    from test_doctor import SCENARIOS, Order

    from sharded_orm.ids.sequences import SpannerSequence

    url = spanner_emulator.url(spanner_emulator.create_database())
    proj = Project(tmp_path / "proj", url)
    engine = sa.create_engine(url)
    md = metadata_of_models([Order])
    proj.revision(md, "init")
    proj.upgrade()
    used = [1, 2, 3, 1000, 2**40]
    with engine.begin() as conn:
        conn.execute(md.tables["Orders"].insert(), [{"OrderId": i} for i in used])
    report = fix(doctor(SCENARIOS["sequence"], [Order]), [Order], alembic=proj.cfg)
    [change] = report.changes
    assert change.kind == "bit_reversed"
    _upgrade(proj, "head", change.metadata)
    proj.check(change.metadata)
    seq = SpannerSequence(engine, str(change.sequence), block_size=50)
    drawn = [seq.next_id() for _ in range(200)]
    assert len(set(drawn)) == 200 and all(d > 2**40 for d in drawn)
    assert len({d >> 59 for d in drawn}) > 4  # bit-reversed: spread over the key space
    engine.dispose()
