"""alembic_ext without a server: bad inputs refused clearly, SQLite backfills, plugin loading.

Each bad input is one row: the call, the input, the error type and a fragment of its
message.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from alembic.util import CommandError
from alembic_project import Project, body

from alembic_ext import backfill_shard
from alembic_ext.backfill import BackfillIncomplete
from alembic_ext.errors import MigrationError
from alembic_ext.idempotent import idempotent_sql
from sharded_orm import ShardConfigError, ShardTypeError, UTCDateTime, compute_shard, shard_column

# the fixtures write as programs that do not use the library do: raw SQL, on purpose
pytestmark = pytest.mark.filterwarnings("ignore::sharded_orm.errors.ShardingWarning")

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)


def _logs(md: sa.MetaData | None = None, name: str = "Logs") -> sa.Table:
    return sa.Table(
        name,
        md or sa.MetaData(),
        sa.Column("Id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("CompanyId", sa.String(64), nullable=False),
        sa.Column("Ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("Body", sa.String(100)),
        sa.Column("Score", sa.Integer),
        sa.Column("Shard4", sa.Integer),
    )


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    eng = sa.create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    t = _logs()
    t.metadata.create_all(eng)
    rows = [
        (i, f"c{i % 3}", (T0 + dt.timedelta(minutes=i)).replace(tzinfo=None).isoformat(" "),
         1000 + i if i % 2 else None)
        for i in range(50)
    ]  # fmt: skip
    with eng.begin() as c:  # as another program writes it (the table is sharded in _model)
        c.exec_driver_sql("INSERT INTO Logs (Id, CompanyId, Ts, Score) VALUES (?, ?, ?, ?)", rows)
    yield eng
    eng.dispose()


OK: dict[str, Any] = {"sources": ["CompanyId", "Ts"], "count": 4}
BAD: list[tuple[str, str, dict[str, Any], type[Exception], str]] = [
    ("no sources", "Shard4", {"sources": []}, ShardConfigError, r"sources=\[\] would give"),
    ("sources as str", "Shard4", {"sources": "CompanyId"}, ShardTypeError, "list of column"),
    ("source twice", "Shard4", {"sources": ["Ts", "Ts"]}, ShardConfigError, "twice"),
    ("own source", "Shard4", {"sources": ["Shard4"]}, ShardConfigError, "its own shard"),
    ("unknown source", "Shard4", {"sources": ["Nope"]}, ShardConfigError, "not columns of"),
    ("quoted source", "Shard4", {"sources": ["a`b"]}, ShardConfigError, "not a plain identifier"),
    ("semicolon column", "x;DROP", {}, ShardConfigError, "not a plain identifier"),
    ("missing column", "Nope", {}, ShardConfigError, "does not exist: add the column"),
    ("text column", "Body", {}, ShardConfigError, "not an integer: it is a data column"),
    ("data int column", "Score", {}, ShardConfigError, "outside 0..3"),
    ("key column", "Id", {}, ShardConfigError, "is a key column"),
    ("zero count", "Shard4", {"count": 0}, ShardConfigError, "count"),
    ("bool count", "Shard4", {"count": True}, ShardConfigError, "count must be an int"),
    ("bad algorithm", "Shard4", {"algorithm": "md5"}, ShardConfigError, "unknown shard algorithm"),
    ("zero batch", "Shard4", {"batch_size": 0}, ShardConfigError, "batch_size"),
    ("bool batch", "Shard4", {"batch_size": True}, ShardTypeError, "batch_size"),
    ("pdml on sqlite", "Shard4", {"partitioned_dml": True}, ShardConfigError, "needs Spanner"),
]


@pytest.mark.parametrize(("case", "column", "change", "error", "fragment"), BAD)
def test_backfill_bad_input(
    engine: sa.Engine, case: str, column: str, change: dict[str, Any],
    error: type[Exception], fragment: str,
) -> None:  # fmt: skip
    kw = {**OK, **change}
    with pytest.raises(error, match=fragment):
        backfill_shard(engine, "Logs", column, progress=False, **kw)


def test_backfill_missing_table(engine: sa.Engine) -> None:
    with pytest.raises(ShardConfigError, match="table 'Nope' does not exist"):
        backfill_shard(engine, "Nope", "Shard4", progress=False, **OK)


def test_sqlite_timestamps_and_the_verify_pass(engine: sa.Engine) -> None:
    """Naive datetimes from SQLite are UTC; a row old code changed after the walk passed
    it is stale after that walk (its writer must be fenced) and fixed by the next run
    (the contract's, after the fence), which changes nothing else."""
    t = _logs()

    def old_code(p: Any) -> None:
        if p.phase == "fill" and p.batches == 1:
            with engine.begin() as c:
                c.exec_driver_sql("UPDATE Logs SET CompanyId = 'moved' WHERE Id = 0")

    res = backfill_shard(engine, "Logs", "Shard4", batch_size=20, progress=old_code, **OK)
    assert (res.rows, res.verified, res.fixed, res.method) == (50, 50, 0, "client_batches")
    fenced = backfill_shard(engine, "Logs", "Shard4", progress=False, require_complete=True, **OK)
    assert (fenced.rows, fenced.verified, fenced.fixed) == (0, 50, 1)
    with engine.connect() as c:
        rows = c.execute(sa.select(t.c.CompanyId, t.c.Ts, t.c.Shard4)).all()
    assert all(compute_shard((co, ts.replace(tzinfo=UTC)), 4) == s for co, ts, s in rows)
    again = backfill_shard(engine, "Logs", "Shard4", progress=False, **OK)
    assert (again.rows, again.fixed, again.method) == (0, 0, "nothing_to_do")


def test_sqlite_walk_is_linear_and_ends_at_its_start_bound(engine: sa.Engine) -> None:
    """The walk reads each row once (key cursor, no rescan: batches = rows / batch_size)
    and does not chase rows added after it began; require_complete then fails loudly."""
    _logs()
    late = iter(range(1000, 1010))

    def writer(p: Any) -> None:
        if p.batches == 1:  # a writer that does not fill the column, after the last key
            with engine.begin() as c:
                c.exec_driver_sql(
                    f"INSERT INTO Logs (Id, CompanyId, Ts) VALUES ({next(late)}, 'x', '2024-01-01')"
                )

    res = backfill_shard(engine, "Logs", "Shard4", batch_size=10, progress=writer, **OK)
    assert (res.rows, res.verified, res.batches) == (50, 50, 5)
    with pytest.raises(BackfillIncomplete, match="1 row"):
        backfill_shard(
            engine, "Logs", "Shard4", batch_size=10, progress=writer, require_complete=True, **OK
        )
    # nothing writes now: the run completes it
    done = backfill_shard(engine, "Logs", "Shard4", progress=False, require_complete=True, **OK)
    assert (done.rows, done.verified) == (1, 52)


def _operations(engine: sa.Engine, md: sa.MetaData | None) -> Callable[..., Any]:
    conn = engine.connect()
    ctx = MigrationContext.configure(conn, opts={"target_metadata": md})
    return lambda name, *a, **kw: getattr(Operations(ctx), name)(*a, **kw)


def _model(count: int = 4, name: str = "Shard4", table: str = "Logs") -> sa.MetaData:
    md = sa.MetaData()
    t = _logs(md, table)
    t._columns.remove(t.c.Shard4)  # declared below as a shard column
    t.append_column(shard_column("CompanyId", "Ts", count=count, name=name).column)
    return md


MIGRATION_BAD = [
    ("count differs from the model", 8, "Shard4", "the model declares count=8"),
    ("data column in the model", 4, "Score", "is a data column in the models"),
]


@pytest.mark.parametrize(("case", "count", "column", "fragment"), MIGRATION_BAD)
def test_op_backfill_checks_the_model(
    engine: sa.Engine, case: str, count: int, column: str, fragment: str
) -> None:
    op = _operations(engine, _model(count=count))
    with pytest.raises(MigrationError, match=fragment) as info:
        op("backfill_shard", "Logs", column, sources=["CompanyId", "Ts"], count=4)
    assert isinstance(info.value, CommandError)  # Alembic prints FAILED: <message>


def test_progress_goes_through_sharded_orm_progress(
    engine: sa.Engine, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24 item 8: log lines through sharded_orm.progress (rows walked, not 0/0),
    never a \\r bar on stderr."""
    caplog.set_level("INFO", logger="sharded_orm.progress")
    backfill_shard(engine, "Logs", "Shard4", batch_size=20, progress="log", **OK)
    lines = [r.getMessage() for r in caplog.records if r.name == "sharded_orm.progress"]
    assert lines[0] == "backfill Logs.Shard4: started"
    assert lines[-1].startswith("backfill Logs.Shard4: done, 50 rows in ")
    assert "\r" not in capsys.readouterr().err


def test_external_engine_only_checks_and_says_what_to_run(engine: sa.Engine) -> None:
    """op.backfill_shard(engine="external"): the fill ran out of band (Beam); the step
    writes nothing, refuses while a row is NULL (with the command), passes once filled."""
    md = _model(table="Jobs")
    _logs(sa.MetaData(), "Jobs").create(engine)
    with engine.begin() as c:
        c.exec_driver_sql("INSERT INTO Jobs (Id, CompanyId, Ts) VALUES (1, 'a', '2024-01-01')")
    op = _operations(engine, md)
    kw: dict[str, Any] = dict(sources=["CompanyId", "Ts"], count=4)
    with pytest.raises(BackfillIncomplete, match="1 row.*sharded-orm backfill <url> Jobs Shard4"):
        op("backfill_shard", "Jobs", "Shard4", engine="external", **kw)
    with engine.connect() as c:
        assert c.exec_driver_sql("SELECT Shard4 FROM Jobs").scalar() is None  # nothing written
    backfill_shard(engine, "Jobs", "Shard4", progress=False, engine="client", **kw)
    op("backfill_shard", "Jobs", "Shard4", engine="external", **kw)
    with pytest.raises(ShardConfigError, match="engine must be one of"):
        op("backfill_shard", "Jobs", "Shard4", engine="dataflow", **kw)


def test_spanner_only_op_on_sqlite_says_so(engine: sa.Engine) -> None:
    """op.backfill_shard runs anywhere (client batches); ALTER INDEX is Spanner's only."""
    md = _model(table="Jobs")  # a table of its own: "Logs" is declared differently above
    _logs(sa.MetaData(), "Jobs").create(engine)  # Shard4 added nullable, as an expand does
    raw = engine.raw_connection()  # written by a program that does not use the library
    raw.cursor().execute("INSERT INTO Jobs (Id, CompanyId, Ts) VALUES (1, 'a', '2024-01-01')")
    raw.commit()
    raw.close()
    op = _operations(engine, md)
    op("backfill_shard", "Jobs", "Shard4", sources=["CompanyId", "Ts"], count=4)
    with engine.connect() as c:
        assert c.exec_driver_sql("SELECT Shard4 FROM Jobs").scalar() == compute_shard(
            ("a", dt.datetime(2024, 1, 1, tzinfo=UTC)), 4
        )
    with pytest.raises(MigrationError, match="Spanner-only .* runs on 'sqlite'"):
        op("alter_index_storing", "JobsByX", "Jobs", add=["Body"])


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("CREATE TABLE `T` (...)", "CREATE TABLE IF NOT EXISTS `T` (...)"),
        (
            "CREATE NULL_FILTERED INDEX `I` ON T",
            "CREATE NULL_FILTERED INDEX IF NOT EXISTS `I` ON T",
        ),
        ("CREATE UNIQUE INDEX `I` ON T", "CREATE UNIQUE INDEX IF NOT EXISTS `I` ON T"),
        ("DROP INDEX `I`", "DROP INDEX IF EXISTS `I`"),
        ("DROP TABLE `T`", "DROP TABLE IF EXISTS `T`"),
        (
            "ALTER TABLE `T` ADD COLUMN `C` INT64",
            "ALTER TABLE `T` ADD COLUMN IF NOT EXISTS `C` INT64",
        ),
        ("ALTER TABLE `T` DROP COLUMN `C`", "ALTER TABLE `T` DROP COLUMN `C`"),
        ("CREATE TABLE IF NOT EXISTS `T`", "CREATE TABLE IF NOT EXISTS `T`"),
    ],
)
def test_ddl_is_made_rerunnable_where_spanner_can(sql: str, expected: str) -> None:
    assert idempotent_sql(sql) == expected


def test_unsized_strings_and_bytes_compare_equal_to_max() -> None:
    from alembic_ext.impl import SpannerImpl
    from sharded_orm.spanner.dialect import SpannerDialect

    impl = SpannerImpl(SpannerDialect(), None, True, None, None, {})

    def differs(real: Any, meta: Any) -> bool:
        return bool(impl.compare_type(sa.Column("c", real), sa.Column("c", meta)))

    assert not differs(sa.String(2621440), sa.String())
    assert not differs(sa.String(2621440), sa.Text())
    assert not differs(sa.LargeBinary(10485760), sa.LargeBinary())
    assert differs(sa.String(10), sa.String(20))


def test_env_py_without_import_renders_utc_datetime_with_its_import(tmp_path: Path) -> None:
    """The README's env.py (no import for sharded-orm): the plugin is found, and a
    UTCDateTime column is written as sharded_orm.UTCDateTime() with the import."""
    proj = Project(tmp_path, f"sqlite:///{tmp_path / 'p.sqlite'}")
    assert "alembic_ext" not in (tmp_path / "migrations" / "env.py").read_text()
    md = sa.MetaData()
    sa.Table(
        "Events",
        md,
        sa.Column("Id", sa.String(36), primary_key=True),
        sa.Column("Ts", UTCDateTime, nullable=False),
        sa.Index("EventsByTs", "Ts"),
    )
    script = proj.revision(md, "events")
    assert "import sharded_orm" in script
    assert "sa.Column('Ts', sharded_orm.UTCDateTime(), nullable=False)" in script
    up = body(script, "upgrade")
    (warning,) = [ln for ln in up.splitlines() if "# WARNING (sharded_orm):" in ln]
    assert "SO10" in warning  # the linter's hotspot finding, for a UTCDateTime-led index
    proj.upgrade()  # the file runs: no NameError


def test_import_alembic_loads_only_the_light_plugin() -> None:
    """The entry point loads while ``import alembic`` is half done: no circular import,
    nothing heavy imported; the dialect brings the impl."""
    code = (
        "import sys, alembic\n"
        "from alembic.runtime.plugins import _all_plugins\n"
        "assert 'sharded_orm.autogenerate' in _all_plugins\n"
        "assert 'alembic_ext.impl' not in sys.modules\n"
        "assert 'grpc' not in sys.modules and 'google.cloud.spanner_v1' not in sys.modules\n"
        "import sqlalchemy as sa, sharded_orm\n"
        "from alembic.ddl.impl import DefaultImpl\n"
        "d = sa.create_engine('spanner+spanner:///projects/p/instances/i/databases/d').dialect\n"
        "print(DefaultImpl.get_by_dialect(d).__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "SpannerImpl"


# 3 subprocesses; quick loop: test_import_alembic_loads_only_the_light_plugin
@pytest.mark.slow
@pytest.mark.parametrize(
    "first", ["import alembic_ext", "import alembic_ext.plugin", "import sharded_orm, alembic_ext"]
)
def test_importing_alembic_ext_before_alembic_works(first: str) -> None:
    """``import alembic_ext`` imports Alembic, which loads the entry point module again
    while it is still being imported: no circular import in any order."""
    code = (
        f"{first}\n"
        "import sys\n"
        "from alembic.runtime.plugins import _all_plugins\n"
        "assert 'sharded_orm.autogenerate' in _all_plugins\n"
        "assert 'grpc' not in sys.modules and 'google.cloud.spanner_v1' not in sys.modules\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr


def test_names_pasted_into_alembic_text_are_checked() -> None:
    """The marker CHECK and ALTER INDEX ... STORED COLUMN are built as text: no name escapes."""
    import io

    from alembic.runtime.migration import MigrationContext

    from alembic_ext.markers import marker_clause
    from sharded_orm.errors import ShardConfigError
    from sharded_orm.spanner.dialect import SpannerDialect

    assert marker_clause("EntryShardId", 16) == '"EntryShardId" >= 0 AND "EntryShardId" < 16'
    with pytest.raises(ShardConfigError, match="CHECK constraint"):
        marker_clause('Shard" >= 0); DROP TABLE Users; --', 16)
    buf = io.StringIO()
    ctx = MigrationContext.configure(
        dialect=SpannerDialect(), opts={"as_sql": True, "output_buffer": buf}
    )
    with pytest.raises(ShardConfigError, match="not a valid Spanner name"):
        ctx.impl.alter_index_storing("Ix`; DROP TABLE Users; --", ["Payload"], [])  # type: ignore[attr-defined]
    assert "DROP TABLE" not in buf.getvalue()
    ctx.impl.alter_index_storing("LogEntriesByCompany", ["Payload"], [])  # type: ignore[attr-defined]
    assert "ALTER INDEX `LogEntriesByCompany` ADD STORED COLUMN `Payload`" in buf.getvalue()
