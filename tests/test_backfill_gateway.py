"""The client backfill through the gateway (sharded_orm.spanner.key_ranges): key values
cross it as the client takes them (BYTES base64-encoded) and come back as column values,
so a walk whose key has a BYTES part, DESC included, fills every row once (issue 45)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import sqlalchemy as sa

from alembic_ext import backfill_shard
from sharded_orm import compute_shard

pytestmark = pytest.mark.emulator


def test_walk_of_a_bytes_desc_key_fills_every_row_once(spanner_emulator: Any) -> None:
    db = spanner_emulator.create_database()
    database = spanner_emulator.database(db)
    database.update_ddl(
        [
            "CREATE TABLE Blobs (Tag BYTES(16) NOT NULL, Id INT64 NOT NULL, "
            "CompanyId STRING(36) NOT NULL, Shard16 INT64) PRIMARY KEY (Tag DESC, Id)"
        ]
    ).result(60)
    # bytes that are not UTF-8, and some that are: both must round-trip through the cursor
    tags = [bytes([i % 7, 0xFF, i % 3]) if i % 2 else f"t{i % 5}".encode() for i in range(250)]
    # the mutation encoder takes BYTES base64-encoded
    values = [[base64.b64encode(t), i, f"c{i % 11}"] for i, t in enumerate(tags)]
    with database.batch() as batch:
        batch.insert("Blobs", columns=["Tag", "Id", "CompanyId"], values=values)
    engine = spanner_emulator.engine(db)
    seen: list[int] = []
    res = backfill_shard(
        engine, "Blobs", "Shard16", sources=["CompanyId"], count=16, batch_size=40,
        progress=lambda p: seen.append(p.total),
    )  # fmt: skip
    assert (res.rows, res.verified, res.batches) == (250, 250, 7)
    assert seen == [min(40 * (i + 1), 250) for i in range(7)]  # the cursor: no row twice
    with engine.connect() as c:
        rows = c.execute(sa.text("SELECT CompanyId, Shard16 FROM Blobs")).all()
    assert len(rows) == 250
    assert all(s is not None and s == compute_shard((company,), 16) for company, s in rows)
    engine.dispose()
