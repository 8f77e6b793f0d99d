"""The Alembic impl keeps Alembic's and SQLAlchemy's contracts on Spanner (issue 20).

Each test reproduces one cause found by running Alembic's own suite (peer/alembic/): a
table with no key columns, the caller's connection left in AUTOCOMMIT, DDL queued by
``Operations`` used directly and never sent, quoted string defaults seen as changed, a
constraint re-added before its drop.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata, produce_migrations
from alembic.operations import Operations, ops
from alembic.runtime.migration import MigrationContext

from alembic_ext.reflection import install_inspector

pytestmark = pytest.mark.emulator

PLUGINS = {"autogenerate_plugins": ["alembic.autogenerate.*", "sharded_orm.*"]}


@pytest.fixture
def engine(spanner_emulator: Any) -> Any:
    eng = spanner_emulator.engine(spanner_emulator.create_database())
    yield eng
    eng.dispose()


def _diffs(engine: sa.Engine, metadata: sa.MetaData) -> list[Any]:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True, **PLUGINS}
        )
        return list(compare_metadata(ctx, metadata))


def test_table_without_key_columns_reflects_as_sqlalchemy_says(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE NoKey (A INT64) PRIMARY KEY ()")
    install_inspector(engine.dialect)
    insp = sa.inspect(engine)
    assert insp.get_pk_constraint("NoKey") == {"constrained_columns": [], "name": None}
    for pk in insp.get_multi_pk_constraint().values():
        assert {"constrained_columns", "name"} <= set(pk)
    # autogenerate over a database holding such a table works (it used to KeyError)
    md = sa.MetaData()
    sa.Table("NoKey", md, sa.Column("A", sa.BigInteger))
    assert _diffs(engine, md) == []


def test_autocommit_block_gives_the_connection_back_as_it_was(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"transaction_per_migration": True})
        assert conn.get_isolation_level() != "AUTOCOMMIT"
        with ctx.begin_transaction(_per_migration=True):
            with ctx.autocommit_block():
                assert ctx.connection is not None
                assert ctx.connection.get_isolation_level() == "AUTOCOMMIT"
            assert conn.get_isolation_level() != "AUTOCOMMIT"
            assert conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT"


def test_a_migrations_data_statements_stay_atomic(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE kv (k INT64 NOT NULL) PRIMARY KEY (k)")
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"transaction_per_migration": True})
        with pytest.raises(RuntimeError), ctx.begin_transaction(_per_migration=True):
            conn.exec_driver_sql("INSERT INTO kv (k) VALUES (1)")
            raise RuntimeError("the migration fails after its first statement")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM kv").scalar() == 0


def _metadata(with_extra: bool) -> sa.MetaData:
    md = sa.MetaData()
    cols = [
        sa.Column("Id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("Name", sa.String(50), nullable=True),
    ]
    if with_extra:
        cols += [
            sa.Column("Extra", sa.String(20), nullable=True),
            sa.Column("Kind", sa.String(10), server_default="plain", nullable=True),
        ]
    t = sa.Table("Things", md, *cols)
    if with_extra:
        sa.Index("ThingsByExtra", t.c.Extra)
    return md


def test_operations_used_directly_apply_their_ddl(engine: sa.Engine) -> None:
    """autogenerate, apply its ops through Operations (no run_migrations), autogenerate
    again: nothing left to do."""
    _metadata(with_extra=False).create_all(engine)
    target = _metadata(with_extra=True)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True, **PLUGINS}
        )
        script = produce_migrations(ctx, target)
        assert not script.upgrade_ops.is_empty()
        op = Operations(ctx)
        for operation in script.upgrade_ops.ops:
            items = operation.ops if isinstance(operation, ops.ModifyTableOps) else [operation]
            for item in items:
                op.invoke(item)
        # applied by the time the calls returned: another connection sees them
        assert ctx.impl.pending_ddl == []  # type: ignore[attr-defined]
        with engine.connect() as other:
            insp = sa.inspect(other)
            assert {c["name"] for c in insp.get_columns("Things")} >= {"Extra", "Kind"}
    assert _diffs(engine, target) == []


def test_a_single_add_column_is_sent_at_once(engine: sa.Engine) -> None:
    _metadata(with_extra=False).create_all(engine)
    with engine.connect() as conn:
        Operations(MigrationContext.configure(conn)).add_column(
            "Things", sa.Column("Extra", sa.String(20))
        )
    assert "Extra" in {c["name"] for c in sa.inspect(engine).get_columns("Things")}


def test_unchanged_string_default_shows_no_change(engine: sa.Engine) -> None:
    md = sa.MetaData()
    sa.Table(
        "Defaults",
        md,
        sa.Column("Id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("Kind", sa.String(10), server_default="plain"),
        sa.Column("Quote", sa.String(10), server_default="it's"),
        sa.Column("Num", sa.BigInteger, server_default=sa.text("5")),
    )
    md.create_all(engine)
    assert _diffs(engine, md) == []
    changed = sa.MetaData()
    sa.Table(
        "Defaults",
        changed,
        sa.Column("Id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("Kind", sa.String(10), server_default="fancy"),
        sa.Column("Quote", sa.String(10), server_default="it's"),
        sa.Column("Num", sa.BigInteger, server_default=sa.text("6")),
    )
    found = {d[0][3] for d in _diffs(engine, changed) if isinstance(d, list)}
    assert found == {"Kind", "Num"}


def test_no_transaction_warning_from_a_migration(engine: sa.Engine) -> None:
    """The impl no longer runs the connection in AUTOCOMMIT, whose commits the DB-API
    answers with "This method is non-operational as a transaction has not been started"."""
    with engine.connect() as conn, warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        ctx = MigrationContext.configure(conn, opts={"transaction_per_migration": True})
        with ctx.begin_transaction(_per_migration=True):
            Operations(ctx).create_table(
                "W", sa.Column("Id", sa.BigInteger, primary_key=True, autoincrement=False)
            )
    assert "W" in sa.inspect(engine).get_table_names()


def test_inspector_sees_ddl_its_connection_ran_in_a_transaction(engine: sa.Engine) -> None:
    md = sa.MetaData()
    t = sa.Table("Fresh", md, sa.Column("Id", sa.BigInteger, primary_key=True))
    install_inspector(engine.dialect)
    with engine.connect() as conn, conn.begin():
        t.create(conn)  # the DB-API holds it until the transaction's next statement
        assert [c["name"] for c in sa.inspect(conn).get_columns("Fresh")] == ["Id"]


def test_upstream_inspector_misses_ddl_pending_in_the_db_api(engine: sa.Engine) -> None:
    """The stock gap apply_pending_ddl closes: when this fails, it can go."""
    from sqlalchemy.engine.reflection import Inspector

    md = sa.MetaData()
    t = sa.Table("Fresh", md, sa.Column("Id", sa.BigInteger, primary_key=True))
    with engine.connect() as conn, conn.begin():
        t.create(conn)
        stock = Inspector._construct(Inspector._init_connection, conn)
        assert stock.get_columns("Fresh") == []


_COMMANDS_SCRIPT = """
import sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import seed_models
from alembic_project import Project
md = seed_models.Sharded.metadata
p = Project(Path(tempfile.mkdtemp()), sys.argv[1])
p.revision(md, "first")
p.upgrade()
p.check(md)
p.downgrade("base")
print("commands ran")
"""


# alembic CLI journey in subprocesses; quick loop: test_no_transaction_warning_from_a_migration
@pytest.mark.slow
def test_alembic_commands_print_no_transaction_or_deprecation_warning(
    spanner_emulator: Any, tmp_path: Any
) -> None:
    """revision --autogenerate, upgrade, check, downgrade with every warning shown (as
    ``python -W always``): none of the DB-API's "non-operational" UserWarnings (the
    AUTOCOMMIT connection's commits), none of upstream's DeprecationWarnings."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    url = spanner_emulator.url(spanner_emulator.create_database())
    script = tmp_path / "commands.py"
    script.write_text(_COMMANDS_SCRIPT)
    env = {**os.environ, "SPANNER_EMULATOR_HOST": spanner_emulator.host}
    done = subprocess.run(
        [sys.executable, "-W", "always", str(script), url, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "commands ran" in done.stdout
    assert "non-operational" not in done.stderr
    assert "DeprecationWarning" not in done.stderr, done.stderr[-3000:]
