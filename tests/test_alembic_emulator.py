"""alembic_ext on the emulator, from a real ``alembic init`` project in a temp dir."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest
import seed_models
import sqlalchemy as sa
from alembic.util import CommandError
from alembic_project import Project, body, no_changes

from alembic_ext import BackfillProgress, backfill_shard
from alembic_ext.ops import PROGRESS_ATTRIBUTE
from alembic_ext.reflection import read_check_constraints, read_indexes, read_primary_key
from sharded_orm import ShardConfigError, ShardedIndex, compute_shard, shard_column

pytestmark = pytest.mark.emulator


def _logs(
    count: int, name: str, *, index: dict[str, Any] | None = None, **extra: Any
) -> sa.MetaData:
    """A Logs table with one shard column ``name`` (count) and a ShardedIndex led by it."""
    md = sa.MetaData()
    ix = dict(columns=("CompanyId", sa.desc("Ts")), name=f"LogsBy{name}")
    ix.update(index or {})
    cols = ix.pop("columns")
    iname = ix.pop("name")
    sa.Table(
        "Logs",
        md,
        sa.Column("Id", sa.String(36), primary_key=True),
        sa.Column("CompanyId", sa.String(64), nullable=False),
        sa.Column("Ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("Body", sa.String(100)),
        shard_column("CompanyId", "Ts", count=count, name=name).column,
        *[shard_column("CompanyId", "Ts", count=c, name=n).column for n, c in extra.items()],
        ShardedIndex(iname, *cols, shard=name, **ix),
    )
    return md


def _indexes(engine: sa.Engine) -> dict[str, Any]:
    with engine.connect() as c:
        return {k[1]: v for k, v in read_indexes(c).items()}


@pytest.fixture
def project(tmp_path: Path, spanner_emulator: Any) -> Any:
    db = spanner_emulator.create_database()
    url = spanner_emulator.url(db)
    proj = Project(tmp_path, url)
    engine = sa.create_engine(url)
    yield proj, engine
    engine.dispose()


def test_seed_models_roundtrip(project: Any) -> None:
    proj, engine = project
    script = proj.revision(seed_models.Sharded.metadata, "seed")
    up = body(script, "upgrade")
    assert "sa.desc(sa.column('Timestamp'))" in up
    assert "literal_column" not in up
    assert "sharded_orm.primary_key('UserId', sa.desc('LastAccessTimestamp'))" in up
    assert "spanner_null_filtered=True" in up and "spanner_storing=['LogEntry']" in up
    assert "spanner_interleave_in='EventBuckets'" in up
    sql = proj.offline_sql("base:head")  # offline mode: DDL only, no database
    assert "PRIMARY KEY (`UserId`, `LastAccessTimestamp` DESC)" in sql
    assert "`EntryShardId`, `CompanyId`, `Timestamp` DESC) STORING (`LogEntry`)" in sql
    assert "CREATE NULL_FILTERED INDEX IF NOT EXISTS `SessionsByDevice`" in sql
    proj.upgrade()
    with engine.connect() as c:
        assert read_primary_key(c, "Users") == [("UserId", False), ("LastAccessTimestamp", True)]
        checks = read_check_constraints(c, "LogEntries")
    assert any(n.startswith("ck_LogEntries_EntryShardId_shard10_") for n in checks)
    ix = _indexes(engine)
    assert ix["LogEntriesByCompany"].columns == (
        ("EntryShardId", False), ("CompanyId", False), ("Timestamp", True),
    )  # fmt: skip
    assert ix["LogEntriesByCompany"].storing == {"LogEntry"}
    assert ix["SessionsByDevice"].null_filtered
    assert ix["BucketedEventsByKind"].interleave_in == "EventBuckets"
    again = proj.revision(seed_models.Sharded.metadata, "again")
    assert no_changes(again), again
    proj.downgrade("base")
    with engine.connect() as c:
        assert read_indexes(c) == {}
        left = c.exec_driver_sql(
            "SELECT TABLE_NAME FROM INFORMATION_SCHEMA.TABLES WHERE TABLE_SCHEMA = ''"
        ).scalars()
        assert set(left) == {"alembic_version"}


CHANGES = [
    ("desc", {"columns": ("CompanyId", "Ts")}, lambda i: i.columns[-1] == ("Ts", False)),
    ("order", {"columns": (sa.desc("Ts"), "CompanyId")}, lambda i: i.columns[1] == ("Ts", True)),
    ("storing", {"storing": ["Body"]}, lambda i: i.storing == {"Body"}),
    ("null_filtered", {"null_filtered": True}, lambda i: i.null_filtered),
    ("unique", {"unique": True, "columns": ("Id",)}, lambda i: i.unique),
]


# 16 revisions and upgrades; quick loop: test_in_place_count_change_is_refused
@pytest.mark.slow
def test_each_index_property_change_is_detected_and_applied(project: Any) -> None:
    proj, engine = project
    proj.revision(_logs(8, "Shard8"), "init")
    proj.upgrade()
    for label, change, check in CHANGES:
        script = proj.revision(_logs(8, "Shard8", index=change), label)
        up = body(script, "upgrade")
        if label == "storing":  # in place: the index stays usable
            assert "op.alter_index_storing('LogsByShard8', 'Logs', add=['Body'])" in up, script
            assert "drop_index" not in up
        else:
            assert "op.drop_index('LogsByShard8'" in up, (label, script)
            assert "op.create_index('LogsByShard8'" in up, (label, script)
        proj.upgrade()
        assert check(_indexes(engine)["LogsByShard8"]), label
        nothing = proj.revision(_logs(8, "Shard8", index=change), label + "-again")
        assert no_changes(nothing), (label, nothing)
        proj.upgrade()
        proj.revision(_logs(8, "Shard8"), label + "-back")
        proj.upgrade()


def test_in_place_count_change_is_refused(project: Any) -> None:
    proj, _ = project
    proj.revision(_logs(8, "Shard8"), "init")
    proj.upgrade()
    with pytest.raises(ShardConfigError, match="cannot be recomputed in place"):
        proj.revision(_logs(16, "Shard8"), "in place")


def test_dropping_a_shard_column_still_indexed_is_refused(project: Any) -> None:
    proj, engine = project
    proj.revision(_logs(8, "Shard8"), "init")
    proj.upgrade()
    versions = Path(proj.cfg.get_main_option("script_location") or "") / "versions"
    (versions / "bad_drop.py").write_text(
        "from alembic import op\n"
        "revision = 'bad_drop'\n"
        f"down_revision = {_head(proj)!r}\n"
        "def upgrade():\n"
        "    op.drop_column('Logs', 'Shard8')\n"
        "def downgrade():\n"
        "    pass\n"
    )
    with pytest.raises(ShardConfigError, match="LogsByShard8 still use it"):
        proj.upgrade()


def test_dropping_an_index_the_models_still_declare_is_refused(project: Any) -> None:
    proj, engine = project
    proj.revision(_logs(8, "Shard8"), "init")
    proj.upgrade()
    versions = Path(proj.cfg.get_main_option("script_location") or "") / "versions"
    (versions / "bad_drop_index.py").write_text(
        "from alembic import op\n"
        "revision = 'bad_drop_index'\n"
        f"down_revision = {_head(proj)!r}\n"
        "def upgrade():\n"
        "    op.drop_index('LogsByShard8', table_name='Logs')\n"
        "def downgrade():\n"
        "    pass\n"
    )
    with pytest.raises(ShardConfigError, match="the models still declare it, unchanged"):
        proj.upgrade()
    assert "LogsByShard8" in _indexes(engine)


def test_backfill_refuses_a_spec_the_marker_contradicts(project: Any) -> None:
    proj, engine = project
    proj.revision(_logs(8, "Shard8"), "init")
    proj.upgrade()
    for change in ({"count": 16}, {"algorithm": "farm_fingerprint"}, {"sources": ["Ts"]}):
        kw: dict[str, Any] = {"sources": ["CompanyId", "Ts"], "count": 8, **change}
        with pytest.raises(ShardConfigError, match="recorded as a shard of count=8"):
            backfill_shard(engine, "Logs", "Shard8", progress=False, **kw)


def test_failed_batch_fix_and_run_again(project: Any) -> None:
    """A batch that fails (on Spanner, its statements before the failing one stay
    applied; the emulator applies none): with the cause fixed, `alembic upgrade head`
    runs the whole revision again and completes."""
    proj, engine = project
    proj.revision(_logs(8, "Shard8"), "init")
    proj.upgrade()
    versions = Path(proj.cfg.get_main_option("script_location") or "") / "versions"
    migration = versions / "half.py"
    text = (
        "import sqlalchemy as sa\n"
        "from alembic import op\n"
        "revision = 'half'\n"
        f"down_revision = {_head(proj)!r}\n"
        "def upgrade():\n"
        "    op.add_column('Logs', sa.Column('Extra', sa.String(10)))\n"
        "    op.create_index('LogsByExtra', 'Logs', ['Extra', 'Nope'])\n"
        "    op.create_check_constraint('ck_extra', 'Logs', 'LENGTH(Extra) > 0')\n"
        "def downgrade():\n"
        "    pass\n"
    )
    migration.write_text(text)
    with pytest.raises(CommandError, match="Spanner refused a schema change.*Nope"):
        proj.upgrade()
    migration.write_text(text.replace(", 'Nope'", ""))  # the fix
    proj.upgrade()
    proj.upgrade()  # and nothing to do the next time
    assert "LogsByExtra" in _indexes(engine)
    with engine.connect() as c:
        assert "ck_extra" in read_check_constraints(c, "Logs")


def _head(proj: Project) -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(proj.cfg).get_current_head()
    assert head is not None
    return head


def _head_down(proj: Project) -> str:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(proj.cfg).get_revision("head")
    assert script is not None and isinstance(script.down_revision, str)
    return script.down_revision


ROWS = 2_000


def _seed_rows(engine: sa.Engine, n: int) -> None:
    t0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    rows = []
    for i in range(n):
        company, ts = f"c{i % 10}", t0 + dt.timedelta(seconds=i)
        rows.append(
            {"Id": f"{i:06d}", "CompanyId": company, "Ts": ts,
             "Shard8": compute_shard((company, ts), 8)}
        )  # fmt: skip
    cols = ["Id", "CompanyId", "Ts", "Shard8"]
    with engine.connect() as c:  # mutations, 1,000 rows a commit (bigger is slower here)
        database: Any = c.connection.dbapi_connection.database  # type: ignore[union-attr]
    for k in range(0, n, 1000):
        with database.batch() as batch:
            chunk = [[r[col] for col in cols] for r in rows[k : k + 1000]]
            batch.insert(table="Logs", columns=cols, values=chunk)


def _found(engine: sa.Engine, column: str, count: int, index: str) -> int:
    """Rows found by the sharded query of each company (shard IN 0..N-1, via the index)."""
    shards = ", ".join(str(s) for s in range(count))
    sql = sa.text(
        f"SELECT COUNT(*) FROM Logs@{{FORCE_INDEX={index}}} "
        f"WHERE {column} IN ({shards}) AND CompanyId = :c"
    )
    with engine.connect().execution_options(read_only=True) as c:
        return sum(c.execute(sql, {"c": f"c{k}"}).scalar_one() for k in range(10))


def _two(shard8: bool = True, shard16: bool = True, nullable16: bool = False) -> sa.MetaData:
    """Logs during a reshard: the old layout, the new one, or both."""
    md = sa.MetaData()
    cols: list[Any] = []
    if shard8:
        cols += [shard_column("CompanyId", "Ts", count=8, name="Shard8").column]
    if shard16:
        cols += [
            shard_column("CompanyId", "Ts", count=16, name="Shard16", nullable=nullable16).column
        ]
    t = sa.Table(
        "Logs",
        md,
        sa.Column("Id", sa.String(36), primary_key=True),
        sa.Column("CompanyId", sa.String(64), nullable=False),
        sa.Column("Ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("Body", sa.String(100)),
        *cols,
    )
    for name in ("Shard8",) * shard8 + ("Shard16",) * shard16:
        t.append_constraint(ShardedIndex(f"LogsBy{name}", "CompanyId", sa.desc("Ts"), shard=name))
    return md


# resharding journey; quick loop: test_one_step_reshard_is_written_as_expand_and_contract
@pytest.mark.slow
def test_reshard_8_to_16_expand_then_contract(project: Any) -> None:
    proj, engine = project
    proj.revision(_two(shard16=False), "init")
    proj.upgrade()
    _seed_rows(engine, ROWS)

    script = proj.revision(_two(), "expand")
    up, down = body(script, "upgrade"), body(script, "downgrade")
    assert "op.backfill_shard('Logs', 'Shard16', sources=['CompanyId', 'Ts'], count=16" in up
    assert "drop_index" not in up and "drop_column" not in up
    assert "op.drop_column('Logs', 'Shard16')" in down
    offline = proj.offline_sql(f"{_head_down(proj)}:head")
    assert "-- sharded_orm: NEEDS A FILL BEFORE THE NEXT STATEMENT: Logs.Shard16" in offline
    check = "UPDATE `Logs` SET `Shard16` = ERROR("
    assert offline.index("ADD COLUMN IF NOT EXISTS `Shard16` INT64") < offline.index(check)
    assert offline.index(check) < offline.index("ALTER COLUMN `Shard16` INT64 NOT NULL")

    misses: list[tuple[int, int]] = []
    seen: list[BackfillProgress] = []

    def reader(p: BackfillProgress) -> None:
        seen.append(p)
        old = _found(engine, "Shard8", 8, "LogsByShard8")  # authoritative while filling
        if old != ROWS:
            misses.append((p.done, ROWS - old))

    t0 = time.monotonic()
    proj.upgrade(**{PROGRESS_ATTRIBUTE: reader})
    upgrade_s = time.monotonic() - t0
    assert misses == []
    assert len(seen) == -(-ROWS // 500) and seen[-1].total == ROWS  # one walk, no rescan
    assert _found(engine, "Shard16", 16, "LogsByShard16") == ROWS
    assert set(_indexes(engine)) == {"LogsByShard8", "LogsByShard16"}

    script = proj.revision(_two(shard8=False), "contract")
    up = body(script, "upgrade")
    assert up.index("drop_column('Logs', 'Shard8')") < up.index("backfill_shard('Logs', 'Shard16'")
    proj.upgrade(**{PROGRESS_ATTRIBUTE: None})
    with engine.connect() as c:
        rows = c.exec_driver_sql("SELECT CompanyId, Ts, Shard16 FROM Logs").all()
    assert all(compute_shard((co, ts), 16) == s for co, ts, s in rows)
    assert set(_indexes(engine)) == {"LogsByShard16"}

    # the old layout comes back, backfilled from the spec recorded in its marker
    proj.downgrade("-1", **{PROGRESS_ATTRIBUTE: None})
    assert _found(engine, "Shard8", 8, "LogsByShard8") == ROWS
    proj.downgrade("base")
    print(f"reshard expand of {ROWS} rows: {upgrade_s:.1f}s")


# expand, old writers, contract: 3 revisions upgraded (a journey); quick loop:
# test_one_step_reshard_is_written_as_expand_and_contract,
# test_verify_pass_fixes_rows_old_code_changed
@pytest.mark.slow
def test_nullable_expand_lets_old_writers_insert_until_the_contract(project: Any) -> None:
    """docs/migrations.md, 'Writers': a new shard column declared nullable=True stays
    nullable (for good: Spanner cannot change NOT NULL of an indexed column); rows old
    code inserts meanwhile are filled by the contract's verify."""
    proj, engine = project
    proj.revision(_two(shard16=False), "init")
    proj.upgrade()
    _seed_rows(engine, 300)
    script = proj.revision(_two(nullable16=True), "expand")
    assert "alter_column" not in body(script, "upgrade")
    proj.upgrade(**{PROGRESS_ATTRIBUTE: None})
    ts = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
    with engine.begin() as c:  # old code: knows Shard8 only
        c.exec_driver_sql(
            "INSERT INTO Logs (Id, CompanyId, Ts, Shard8) VALUES ('old', 'c1', "
            f"TIMESTAMP '{ts.isoformat()}', {compute_shard(('c1', ts), 8)})"
        )
    script = proj.revision(_two(shard8=False, nullable16=True), "contract")
    up = body(script, "upgrade")
    assert up.index("drop_column('Logs', 'Shard8')") < up.index("backfill_shard('Logs', 'Shard16'")
    proj.upgrade(**{PROGRESS_ATTRIBUTE: None})
    assert _found(engine, "Shard16", 16, "LogsByShard16") == 301


@pytest.mark.filterwarnings("ignore::sharded_orm.errors.ShardingWarning")  # old code: raw SQL
def test_verify_pass_fixes_rows_old_code_changed(spanner_engine: sa.Engine) -> None:
    """A row whose source old code changes after the walk passed it is stale after that
    walk (old code is fenced only by the contract) and fixed by the contract's run."""
    engine = spanner_engine
    _logs(8, "Shard8").create_all(engine)
    _seed_rows(engine, 1200)
    with engine.begin() as c:
        c.exec_driver_sql("ALTER TABLE Logs ADD COLUMN Shard4 INT64")

    def old_code(p: BackfillProgress) -> None:
        if p.phase == "fill" and p.batches == 1:  # row 000001 was just filled
            with engine.begin() as c:
                c.exec_driver_sql("UPDATE Logs SET CompanyId = 'moved' WHERE Id = '000001'")

    kw: dict[str, Any] = dict(sources=["CompanyId", "Ts"], count=4)
    res = backfill_shard(engine, "Logs", "Shard4", progress=old_code, **kw)
    assert (res.rows, res.verified, res.fixed) == (1200, 1200, 0)
    fenced = backfill_shard(engine, "Logs", "Shard4", progress=False, require_complete=True, **kw)
    assert (fenced.rows, fenced.verified, fenced.fixed) == (0, 1200, 1)
    with engine.connect() as c:
        rows = c.exec_driver_sql("SELECT CompanyId, Ts, Shard4 FROM Logs").all()
    assert all(compute_shard((a, b), 4) == s for a, b, s in rows)


def test_backfill_twice_and_resumed(spanner_engine: sa.Engine) -> None:
    engine = spanner_engine
    md = _logs(8, "Shard8")
    md.create_all(engine)
    _seed_rows(engine, 1200)
    with engine.begin() as c:
        c.exec_driver_sql("ALTER TABLE Logs ADD COLUMN Shard4 INT64")
    calls = []

    def stop_after_two(p: BackfillProgress) -> None:
        calls.append(p.done)
        if len(calls) == 2:
            raise KeyboardInterrupt  # an interruption between two batches

    kw: dict[str, Any] = dict(sources=["CompanyId", "Ts"], count=4, batch_size=500)
    with pytest.raises(KeyboardInterrupt):
        backfill_shard(engine, "Logs", "Shard4", progress=stop_after_two, **kw)
    with engine.connect() as c:
        filled = c.exec_driver_sql("SELECT COUNT(*) FROM Logs WHERE Shard4 IS NOT NULL").scalar()
    assert filled == 1000
    resumed = backfill_shard(engine, "Logs", "Shard4", progress=False, **kw)
    assert (resumed.rows, resumed.method, resumed.verified, resumed.fixed) == (
        200, "mutations", 1200, 0,
    )  # fmt: skip
    again = backfill_shard(engine, "Logs", "Shard4", progress=False, **kw)
    assert (again.rows, again.method) == (0, "nothing_to_do")
    with engine.connect() as c:
        rows = c.exec_driver_sql("SELECT CompanyId, Ts, Shard4 FROM Logs").all()
    assert len(rows) == 1200 and all(compute_shard((a, b), 4) == s for a, b, s in rows)


def test_partitioned_dml_backfill_matches_client(spanner_engine: sa.Engine) -> None:
    engine = spanner_engine
    _logs(8, "Shard8").create_all(engine)
    _seed_rows(engine, 300)
    with engine.begin() as c:
        c.exec_driver_sql("ALTER TABLE Logs ADD COLUMN ShardFp INT64")
    res = backfill_shard(
        engine, "Logs", "ShardFp", sources=["CompanyId", "Ts"], count=16,
        algorithm="farm_fingerprint", progress=False,
    )  # fmt: skip
    assert (res.method, res.rows, res.fixed) == ("partitioned_dml", 300, 0)
    with engine.connect() as c:
        rows = c.exec_driver_sql("SELECT CompanyId, Ts, ShardFp FROM Logs").all()
    assert all(compute_shard((a, b), 16, "farm_fingerprint") == s for a, b, s in rows)


def test_one_step_reshard_without_the_hook_is_refused(project: Any) -> None:
    proj, _ = project
    proj.revision(_two(shard16=False), "init")
    proj.upgrade()
    with pytest.raises(ShardConfigError, match="split_reshard"):
        proj.revision(_two(shard8=False), "one step")


def test_one_step_reshard_is_written_as_expand_and_contract(
    tmp_path: Path, spanner_emulator: Any
) -> None:
    """docs/migrations.md, 'One model change': with split_reshard in env.py, replacing
    Shard8 by Shard16 in one model change gives two revisions; readers of the old index
    find every row until the contract runs."""
    url = spanner_emulator.url(spanner_emulator.create_database())
    proj, engine = Project(tmp_path, url, split=True), sa.create_engine(url)
    proj.revision(_two(shard16=False), "init")
    proj.upgrade()
    _seed_rows(engine, 300)

    expand, contract = proj.revisions(_two(shard8=False), "reshard")
    assert contract.down_revision == expand.revision
    ex, co = Path(expand.path).read_text(), Path(contract.path).read_text()
    up = body(ex, "upgrade")
    assert "op.backfill_shard('Logs', 'Shard16', sources=['CompanyId', 'Ts'], count=16" in up
    assert "LogsByShard16" in up and "drop_index" not in up and "drop_column" not in up
    assert "op.drop_column('Logs', 'Shard16')" in body(ex, "downgrade")
    assert "apply only after every reader runs the new code" in co.splitlines()[0]
    up = body(co, "upgrade")
    assert up.index("drop_column('Logs', 'Shard8')") < up.index("backfill_shard('Logs', 'Shard16'")
    assert "drop_column('Logs', 'Shard8')" in up and "create_index" not in up

    proj.upgrade(expand.revision, **{PROGRESS_ATTRIBUTE: None})
    assert set(_indexes(engine)) == {"LogsByShard8", "LogsByShard16"}
    assert _found(engine, "Shard8", 8, "LogsByShard8") == 300
    assert _found(engine, "Shard16", 16, "LogsByShard16") == 300

    proj.upgrade("head")
    assert set(_indexes(engine)) == {"LogsByShard16"}
    assert _found(engine, "Shard16", 16, "LogsByShard16") == 300
    proj.check(_two(shard8=False))

    proj.downgrade(expand.revision)  # the old column comes back, backfilled
    assert set(_indexes(engine)) == {"LogsByShard8", "LogsByShard16"}
    assert _found(engine, "Shard8", 8, "LogsByShard8") == 300
    proj.downgrade("base")
    engine.dispose()
