"""Server-side reshard backfill (Partitioned DML) on the emulator, and its refusals."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from at_scale_models import CrcLogEntry, FarmBase, FarmLogEntry, load_old_rows, rows

from sharded_orm import ShardConfigError, UnsupportedOnDialectError, get_shard_column
from sharded_orm.load.backfill_server import backfill_server_side, backfill_sql
from sharded_orm.spanner.mutations import database_of

N = 3000


def test_sql_is_the_generated_column_expression_and_idempotent() -> None:
    sc = get_shard_column(FarmLogEntry, "EntryShardV2")
    sql = backfill_sql("LogEntries", "EntryShardV2", sc.sources, sc.count)
    assert sql.startswith("UPDATE `LogEntries` SET `EntryShardV2` = MOD(MOD(FARM_FINGERPRINT(")
    assert "FORMAT_TIMESTAMP('%E4Y-%m-%dT%H:%M:%E6SZ', `Timestamp`, 'UTC')" in sql
    assert sql.endswith("WHERE `EntryShardV2` IS NULL")


def test_crc32_column_is_refused_with_the_way_out() -> None:
    engine = sa.create_engine("spanner+spanner:///projects/p/instances/i/databases/d")
    with pytest.raises(ShardConfigError, match="no CRC32 function.*beam.Backfill"):
        backfill_server_side(engine, CrcLogEntry, "EntryShardV2")
    with pytest.raises(ShardConfigError, match="no CRC32 function"):
        backfill_server_side(
            engine, "LogEntries", "EntryShardV2", sources=["CompanyId"], count=4,
            algorithm="crc32",
        )  # fmt: skip


def test_non_spanner_engine_is_refused() -> None:
    with pytest.raises(UnsupportedOnDialectError, match="only Spanner"):
        backfill_server_side(sa.create_engine("sqlite://"), FarmLogEntry, "EntryShardV2")


def test_table_name_needs_sources_and_count() -> None:
    engine = sa.create_engine("spanner+spanner:///projects/p/instances/i/databases/d")
    with pytest.raises(ShardConfigError, match="needs sources"):
        backfill_server_side(engine, "LogEntries", "EntryShardV2")


def test_model_and_arguments_must_agree() -> None:
    engine = sa.create_engine("spanner+spanner:///projects/p/instances/i/databases/d")
    with pytest.raises(ShardConfigError, match="count=8 disagrees"):
        backfill_server_side(engine, FarmLogEntry, "EntryShardV2", count=8)


@pytest.mark.emulator
def test_backfill_fills_every_row_findable_and_is_resumable(spanner_engine: Any) -> None:
    FarmBase.metadata.create_all(spanner_engine)
    load_old_rows(spanner_engine, FarmLogEntry, N)

    result = backfill_server_side(
        spanner_engine, FarmLogEntry, "EntryShardV2", rows_per_statement=1000
    )
    assert result.rows_missing_before == N
    assert result.rows_updated == N
    assert result.mismatched == 0
    # count; per ranged statement the query of its end key and the statement; verify
    assert result.rpcs == 1 + 2 * 3 + 1

    # every row findable: its stored shard is what the library computes for it
    sc = get_shard_column(FarmLogEntry, "EntryShardV2")
    with spanner_engine.connect() as conn:
        stored = dict(
            ((c, u, t), s)
            for c, u, t, s in conn.execute(
                sa.select(
                    FarmLogEntry.company_id,
                    FarmLogEntry.user_id,
                    FarmLogEntry.ts,
                    FarmLogEntry.entry_shard_v2,
                )
            )
        )
    expected = {
        (r["company_id"], r["user_id"], r["ts"]): sc.compute([r["company_id"], r["ts"]])
        for r in rows(N)
    }
    assert stored == expected

    # a rerun touches nothing; rows written later with NULL (old code) are picked up
    again = backfill_server_side(spanner_engine, FarmLogEntry, "EntryShardV2")
    assert (again.rows_missing_before, again.rows_updated, again.mismatched) == (0, 0, 0)
    with database_of(spanner_engine).batch() as b:
        b.update("LogEntries", columns=("CompanyId", "UserId", "Timestamp", "EntryShardV2"),
                 values=[[c, u, t, None] for (c, u, t) in list(expected)[:7]])  # fmt: skip
    resumed = backfill_server_side(
        spanner_engine, "LogEntries", "EntryShardV2", sources=["CompanyId", "Timestamp"], count=16
    )
    assert (resumed.rows_missing_before, resumed.rows_updated, resumed.mismatched) == (7, 7, 0)


@pytest.mark.emulator
def test_mismatch_count_sees_a_wrong_shard(spanner_engine: Any) -> None:
    FarmBase.metadata.create_all(spanner_engine)
    load_old_rows(spanner_engine, FarmLogEntry, 50)
    r = next(rows(1))
    sc = get_shard_column(FarmLogEntry, "EntryShardV2")
    wrong = (sc.compute([r["company_id"], r["ts"]]) + 1) % 16
    with database_of(spanner_engine).batch() as b:
        b.update("LogEntries", columns=("CompanyId", "UserId", "Timestamp", "EntryShardV2"),
                 values=[[r["company_id"], r["user_id"], r["ts"], wrong]])  # fmt: skip
    # many small key ranges over the 3-part key (string, string, timestamp)
    result = backfill_server_side(
        spanner_engine, FarmLogEntry, "EntryShardV2", rows_per_statement=4
    )
    assert result.rpcs == 1 + 2 * 13 + 1
    assert result.rows_updated == 49
    assert result.mismatched == 1  # the backfill fills NULLs only; verify reports the rest
    fixed = backfill_server_side(spanner_engine, FarmLogEntry, "EntryShardV2", fix_stale=True)
    assert (fixed.rows_missing_before, fixed.rows_updated, fixed.mismatched) == (0, 1, 0)
    assert "OR `EntryShardV2` != MOD(" in fixed.sql
