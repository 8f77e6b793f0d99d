"""verify's first read on Spanner (the strong COUNT(*) whose timestamp every later
statement reads at) ends within ``partition_timeout`` when the server is silent, with a
clear error, instead of the client's own timeout."""

from __future__ import annotations

import time
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import shard_column
from sharded_orm.load.verify import verify

PARTITION_TIMEOUT = 3.0
SLACK = 3.0


class Base(DeclarativeBase):
    pass


class VerifyBound(Base):
    __tablename__ = "VerifyBound"
    id: Mapped[str] = mapped_column("Id", sa.String(36), primary_key=True)
    kind: Mapped[str] = mapped_column("Kind", sa.String(20))
    shard: Mapped[int] = shard_column("kind", count=4, name="Shard")


@pytest.mark.emulator
def test_a_silent_server_at_verifys_count_ends_within_the_partition_timeout(
    spanner_emulator: Any, spanner_faults: Any
) -> None:
    db = spanner_emulator.create_database()
    direct = spanner_emulator.engine(db)
    table = VerifyBound.__table__
    table.metadata.create_all(direct)
    with direct.begin() as conn:
        conn.execute(table.insert(), [{"Id": f"k{i}", "Kind": f"x{i % 3}"} for i in range(20)])
    engine = spanner_faults.emulator(spanner_emulator).engine(db)
    try:
        assert verify(engine, table, progress_mode="off").rows_checked == 20  # answers
        spanner_faults.hang("ExecuteStreamingSql", 120.0, times=1000)
        start = time.monotonic()
        with pytest.raises(Exception) as caught:
            verify(engine, table, progress_mode="off", partition_timeout=PARTITION_TIMEOUT)
        took = time.monotonic() - start
    finally:
        spanner_faults.clear()
        engine.dispose()
        direct.dispose()
    assert took < PARTITION_TIMEOUT + SLACK, f"took {took:.1f} s"
    message = str(caught.value)
    assert "did not answer within 3 s (partition_timeout)" in message, message
