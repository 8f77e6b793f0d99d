"""``op.backfill_shard`` with ``Operations`` used directly (no ``run_migrations``).

The idiom of test fixtures and programmatic migrations:
``op = Operations(MigrationContext.configure(conn))`` on a connection the caller already
read through, so SQLAlchemy has begun the caller's transaction. Alembic's
``autocommit_block`` asserts there (it commits only a transaction Alembic began): the
backfill used to fail with a bare ``AssertionError``.
"""

from __future__ import annotations

import datetime as dt
import io
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from reshard_models import events
from sqlalchemy.orm import Session

from alembic_ext.errors import MigrationError
from alembic_ext.ops import PROGRESS_ATTRIBUTE
from sharded_orm import compute_shard

pytestmark = pytest.mark.emulator

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


def _logs(md: sa.MetaData, *extra: sa.Column[Any]) -> sa.Table:
    return sa.Table(
        "Logs",
        md,
        sa.Column("Id", sa.String(36), primary_key=True),
        sa.Column("CompanyId", sa.String(64), nullable=False),
        sa.Column("Ts", sa.DateTime(timezone=True), nullable=False),
        *extra,
    )


def _seeded(engine: sa.Engine, n: int) -> sa.Table:
    table = _logs(sa.MetaData())
    table.create(engine)
    rows = [{"Id": f"{i:04d}", "CompanyId": f"c{i % 7}", "Ts": T0 + dt.timedelta(seconds=i)}
            for i in range(n)]  # fmt: skip
    with engine.begin() as conn:
        conn.execute(table.insert(), rows)
    return table


def _shards(engine: sa.Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text("SELECT CompanyId, Ts, Shard4 FROM Logs"))]


def _filled_as_the_model_says(engine: sa.Engine, n: int) -> None:
    rows = _shards(engine)
    assert len(rows) == n
    assert all(s is not None and compute_shard((c, ts), 4) == s for c, ts, s in rows)


def _expand(op: Operations) -> None:
    op.add_column("Logs", sa.Column("Shard4", sa.BigInteger, nullable=True))
    op.backfill_shard("Logs", "Shard4", sources=["CompanyId", "Ts"], count=4, batch_size=40)
    op.alter_column("Logs", "Shard4", existing_type=sa.BigInteger, nullable=False)


def test_after_a_read_on_the_callers_connection(spanner_engine: sa.Engine) -> None:
    """A read, add_column, backfill_shard, alter_column NOT NULL: every row filled, the
    column NOT NULL, and the caller's connection still usable in its transaction."""
    engine = spanner_engine
    _seeded(engine, 150)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM Logs")).scalar_one() == 150
        assert conn.in_transaction()  # SQLAlchemy began the caller's transaction
        level = conn.get_isolation_level()
        _expand(Operations(MigrationContext.configure(conn)))
        # the caller's transaction is still the caller's: open, same isolation level
        assert conn.in_transaction() and conn.get_isolation_level() == level
        assert conn.execute(sa.text("SELECT COUNT(*) FROM Logs")).scalar_one() == 150
        conn.commit()
    _filled_as_the_model_says(engine, 150)
    cols = {c["name"]: c for c in sa.inspect(engine).get_columns("Logs")}
    assert cols["Shard4"]["nullable"] is False


def test_the_callers_work_before_the_backfill_is_committed_first(
    spanner_engine: sa.Engine,
) -> None:
    """As a schema change does on Spanner (docs/migrations.md): the backfill commits the
    caller's open transaction before it, so the row written in it is filled too; a
    rollback afterwards undoes only what came after."""
    engine = spanner_engine
    table = _seeded(engine, 30)
    with engine.connect() as conn:
        op = Operations(MigrationContext.configure(conn))
        op.add_column("Logs", sa.Column("Shard4", sa.BigInteger, nullable=True))
        conn.execute(table.insert(), [{"Id": "mine", "CompanyId": "c9", "Ts": T0}])
        op.backfill_shard("Logs", "Shard4", sources=["CompanyId", "Ts"], count=4)
        conn.execute(table.insert(), [{"Id": "after", "CompanyId": "c9", "Ts": T0}])
        conn.rollback()
    _filled_as_the_model_says(engine, 31)
    with engine.connect() as conn:
        ids = set(conn.execute(sa.text("SELECT Id FROM Logs")).scalars())
    assert "mine" in ids and "after" not in ids


def test_inside_the_callers_explicit_transaction(spanner_engine: sa.Engine) -> None:
    """``with conn.begin():`` around the operations (an env.py sharing a connection in a
    transaction does the same): the block ends normally and commits what follows."""
    engine = spanner_engine
    table = _seeded(engine, 60)
    with engine.connect() as conn:
        with conn.begin():
            conn.execute(sa.text("SELECT 1")).all()
            _expand(Operations(MigrationContext.configure(conn)))
            conn.execute(table.update().where(table.c.Id == "0001").values(CompanyId="moved"))
        assert not conn.in_transaction()
    rows = _shards(engine)
    assert len(rows) == 60 and all(s is not None for _, _, s in rows)
    moved = [r for r in rows if r[0] == "moved"]  # its shard went stale: old-code write
    assert len(moved) == 1
    assert all(compute_shard((c, ts), 4) == s for c, ts, s in rows if c != "moved")


metadata = events("both")  # the old table and the expand's new one
Event8, Event16 = metadata.info["models"]["Event"], metadata.info["models"]["Event16"]


def test_key_reshard_ops_after_a_read(spanner_engine: sa.Engine) -> None:
    """The key reshard's ops run their copy and comparison the same way."""
    engine = spanner_engine
    metadata.create_all(engine)  # the old table and the expand's create_table
    with Session(engine) as s, s.begin():
        s.add_all(Event8(timestamp=T0 + dt.timedelta(seconds=i), event_id=f"e{i}", kind="k")
                  for i in range(40))  # fmt: skip
    with engine.connect() as conn:
        op = Operations(MigrationContext.configure(conn, opts={"target_metadata": metadata}))
        assert conn.execute(sa.text("SELECT COUNT(*) FROM Events")).scalar_one() == 40
        op.copy_table_rows("Events", "Events16")
        conn.execute(sa.text("SELECT 1")).all()
        op.copy_table_rows("Events", "Events16", engine="external")
        conn.execute(sa.text("SELECT 1")).all()
        op.verify_tables("Events", "Events16")
        conn.execute(sa.text("SELECT 1")).all()
        op.retire_table("Events", successor="Events16")
        conn.commit()
    assert sa.inspect(engine).get_table_names() == ["Events16"]
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT COUNT(*) FROM Events16")).scalar_one() == 40


ENV_PY = """
from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None)
with context.begin_transaction():
    context.run_migrations()
"""

REVISION = """
import sqlalchemy as sa
from alembic import op

revision = "a1"
down_revision = None


def upgrade():
    op.add_column("Logs", sa.Column("Shard4", sa.BigInteger, nullable=True))
    op.backfill_shard("Logs", "Shard4", sources=["CompanyId", "Ts"], count=4, batch_size=40)
    op.alter_column("Logs", "Shard4", existing_type=sa.BigInteger, nullable=False)
"""


def test_env_py_sharing_the_callers_connection_in_a_transaction(
    spanner_engine: sa.Engine, tmp_path: Path
) -> None:
    """Alembic's cookbook recipe 'sharing a connection': ``command.upgrade`` on a
    connection the caller holds in ``engine.begin()``; Alembic leaves that transaction
    to the caller, and the backfill runs inside the migration all the same."""
    engine = spanner_engine
    _seeded(engine, 90)
    command.init(Config(str(tmp_path / "alembic.ini"), stdout=io.StringIO()), str(tmp_path / "m"))
    (tmp_path / "m" / "env.py").write_text(ENV_PY)
    (tmp_path / "m" / "versions" / "a1_expand.py").write_text(REVISION)
    cfg = Config(stdout=io.StringIO())
    cfg.set_main_option("script_location", str(tmp_path / "m"))
    cfg.attributes[PROGRESS_ATTRIBUTE] = False
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    _filled_as_the_model_says(engine, 90)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).all() == [("a1",)]


def test_another_database_says_to_end_the_callers_transaction(tmp_path: Path) -> None:
    """Elsewhere the op keeps Alembic's autocommit_block; where that cannot run (the
    caller's transaction) the error says what to do instead of a bare AssertionError."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    table = _seeded(engine, 20)
    with engine.connect() as conn:
        op = Operations(MigrationContext.configure(conn))
        op.add_column("Logs", sa.Column("Shard4", sa.BigInteger, nullable=True))
        conn.execute(sa.text("SELECT 1")).all()
        level = conn.get_isolation_level()
        kw: dict[str, Any] = dict(sources=["CompanyId", "Ts"], count=4)
        with pytest.raises(MigrationError, match=r"Commit or roll it back \(connection"):
            op.backfill_shard("Logs", "Shard4", **kw)
        assert conn.in_transaction() and conn.get_isolation_level() == level
        conn.commit()
        op.backfill_shard("Logs", "Shard4", **kw)
        assert conn.get_isolation_level() == level
        shard = sa.column("Shard4", sa.BigInteger)
        rows = conn.execute(sa.select(table.c.CompanyId, table.c.Ts, shard)).all()
    engine.dispose()
    utc = dt.timezone.utc  # SQLite gives naive datetimes back: they are UTC
    assert len(rows) == 20
    assert all(compute_shard((c, ts.replace(tzinfo=utc)), 4) == s for c, ts, s in rows)
