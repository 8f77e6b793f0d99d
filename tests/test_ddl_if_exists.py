"""Migration DDL is safe to run again, through the constructs' own IF [NOT] EXISTS (issue 45).

The impl used to rewrite compiled SQL by regex; now ``CreateTable``/``CreateIndex``/
Alembic's ``AddColumn`` get ``if_not_exists`` and ``DropTable``/``DropIndex`` get
``if_exists`` (``alembic_ext.idempotent.rerunnable``), which our dialect renders. Text DDL
(``op.execute("CREATE ...")``) has no flag: the clause is still added to its head.
Spanner has no ``DROP COLUMN IF EXISTS`` (a syntax error on the emulator): the impl drops
Alembic's ``if_exists`` there and checks INFORMATION_SCHEMA itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.schema import CreateIndex, CreateTable, DropIndex, DropTable

from alembic_ext.idempotent import idempotent_sql, rerunnable
from sharded_orm.spanner.dialect import SpannerDialect

Migration = Callable[[Operations], None]


def upgrade(op: Operations) -> None:
    op.create_table(
        "Accounts",
        sa.Column("Id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("Email", sa.String(100)),
        sa.Column("Region", sa.String(10), index=True),  # an index made with the table
    )
    op.create_index(
        "AccountsByEmail", "Accounts", ["Email"], unique=True, spanner_null_filtered=True
    )
    op.add_column("Accounts", sa.Column("Plan", sa.String(20)))


def downgrade(op: Operations) -> None:
    op.drop_column("Accounts", "Plan", if_exists=True)
    op.drop_index("AccountsByEmail", table_name="Accounts")
    op.drop_index("ix_Accounts_Region", table_name="Accounts")
    op.drop_table("Accounts")


def run(engine: sa.Engine, migration: Migration) -> list[str]:
    """Run ``migration`` as ``alembic upgrade`` does (DDL batched); the statements sent
    (but the version table's, made by the impl before the first migration)."""
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn)
        ctx.impl.start_migrations()
        with conn.begin():
            migration(Operations(ctx))
        batches = ctx.impl.ddl_batches  # type: ignore[attr-defined]
    return [s for batch in batches for s in batch if "alembic_version" not in s]


def schema(engine: sa.Engine) -> dict[str, Any]:
    insp = sa.inspect(engine)
    if not insp.has_table("Accounts"):
        return {}
    return {
        "columns": [c["name"] for c in insp.get_columns("Accounts")],
        "indexes": sorted(i["name"] for i in insp.get_indexes("Accounts")),
    }


@pytest.mark.emulator
def test_a_migrations_create_and_drop_run_twice_are_no_ops_the_second_time(
    spanner_engine: sa.Engine,
) -> None:
    sent = run(spanner_engine, upgrade)
    assert len(sent) == 4
    assert all("IF NOT EXISTS" in s for s in sent), sent
    made = schema(spanner_engine)
    assert made == {
        "columns": ["Id", "Email", "Region", "Plan"],
        "indexes": ["AccountsByEmail", "ix_Accounts_Region"],
    }
    with spanner_engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO Accounts (Id, Email, Plan) VALUES (1, 'a@x', 'pro')"))

    assert run(spanner_engine, upgrade) == sent  # again, as after a partial failure
    assert schema(spanner_engine) == made
    with spanner_engine.connect() as conn:  # the table was not made again: its row is there
        assert conn.execute(sa.text("SELECT Id, Plan FROM Accounts")).all() == [(1, "pro")]

    sent = run(spanner_engine, downgrade)
    assert [s.split(" IF EXISTS")[0] for s in sent[1:]] == ["DROP INDEX"] * 2 + ["DROP TABLE"]
    assert sent[0] == "ALTER TABLE `Accounts` DROP COLUMN `Plan`"  # no IF EXISTS on Spanner
    assert schema(spanner_engine) == {}
    # again: the column's drop is skipped (INFORMATION_SCHEMA), the rest are no-ops
    assert run(spanner_engine, downgrade) == sent[1:]
    assert schema(spanner_engine) == {}


@pytest.mark.emulator
def test_drop_column_if_exists_works_on_spanner(spanner_engine: sa.Engine) -> None:
    """Alembic's ``op.drop_column(..., if_exists=True)`` rendered ``DROP COLUMN IF
    EXISTS``, which Spanner refuses as a syntax error."""
    with spanner_engine.connect() as conn:
        ctx = MigrationContext.configure(conn)
        op = Operations(ctx)
        op.create_table(
            "Notes",
            sa.Column("Id", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("Body", sa.String(10)),
        )
        op.drop_column("Notes", "Body", if_exists=True)
        op.drop_column("Notes", "Body", if_exists=True)  # already gone: nothing sent
    assert [c["name"] for c in sa.inspect(spanner_engine).get_columns("Notes")] == ["Id"]


def test_text_ddl_still_gets_the_clause() -> None:
    """DDL given as text has no flag to set: the clause goes to its head as before."""
    assert idempotent_sql("CREATE INDEX ix ON T (a)") == "CREATE INDEX IF NOT EXISTS ix ON T (a)"
    assert idempotent_sql("DROP TABLE T") == "DROP TABLE IF EXISTS T"
    assert idempotent_sql("ALTER TABLE T DROP COLUMN C") == "ALTER TABLE T DROP COLUMN C"


def test_offline_sql_output_is_rerunnable() -> None:
    import io

    buf = io.StringIO()
    ctx = MigrationContext.configure(
        dialect_name="spanner+spanner", opts={"as_sql": True, "output_buffer": buf}
    )
    upgrade(Operations(ctx))
    downgrade(Operations(ctx))
    heads = [
        s.strip().split("(")[0].split(" ON ")[0] for s in buf.getvalue().split(";") if s.strip()
    ]
    assert heads == [
        "CREATE TABLE IF NOT EXISTS `Accounts` ",
        "CREATE INDEX IF NOT EXISTS `ix_Accounts_Region`",
        "CREATE UNIQUE NULL_FILTERED INDEX IF NOT EXISTS `AccountsByEmail`",
        "ALTER TABLE `Accounts` ADD COLUMN IF NOT EXISTS `Plan` STRING",
        "ALTER TABLE `Accounts` DROP COLUMN `Plan`",
        "DROP INDEX IF EXISTS `AccountsByEmail`",
        "DROP INDEX IF EXISTS `ix_Accounts_Region`",
        "DROP TABLE IF EXISTS `Accounts`",
    ]


NAME = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,20}", fullmatch=True)


@settings(max_examples=50, deadline=None)
@given(table=NAME, column=NAME, index=NAME)
def test_each_construct_renders_its_clause_once_whatever_the_names(
    table: str, column: str, index: str
) -> None:
    md = sa.MetaData()
    t = sa.Table(table, md, sa.Column(column, sa.BigInteger, primary_key=True))
    ix = sa.Index(index, t.c[column])
    dialect = SpannerDialect()
    cases: list[tuple[Any, str]] = [
        (CreateTable(t), "IF NOT EXISTS"),
        (CreateIndex(ix), "IF NOT EXISTS"),
        (DropIndex(ix), "IF EXISTS"),
        (DropTable(t), "IF EXISTS"),
    ]
    for construct, clause in cases:
        sql = str(rerunnable(construct).compile(dialect=dialect))
        assert sql.count(clause) == 1, sql
        assert clause not in str(construct.compile(dialect=dialect))  # the caller's: as given
