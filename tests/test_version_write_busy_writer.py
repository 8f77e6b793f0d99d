"""The revision's write beside a busy writer (issue 42, the adoption journey at 50,000 rows).

At 50,000 rows the emulator takes 0.3 to 0.9 s for the old code's one-row INSERT (0.02 s
at 3,000), and it runs one read-write transaction at a time: the write of the revision to
``alembic_version`` after the backfill was aborted whenever it began inside one of them.
It was retried with the schema change's backoff (0.5 s doubling to 10 s) and logged at
every wait, so ``alembic upgrade`` printed ``... aborted by a concurrent transaction;
retry 5 in 7.7 s`` five times in 13 s: a refusal loop to the user, and long waits that do
not raise the odds of the next attempt (the writer's next gap is a fraction of a second
away). Now the waits are the contention waits of ``sharded_orm.retry`` (tens of ms,
growing to 2 s), a line at the first abort, then at most one every 5 s, and one when it
got through.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import pytest

from alembic_ext.commit import WAIT_LINE_EVERY, write_revision

LOGGER = "alembic.sharded_orm"


def _versions(database: Any) -> list[str]:
    with database.snapshot() as snap:
        return [r[0] for r in snap.execute_sql("SELECT version_num FROM alembic_version")]


@pytest.mark.emulator
@pytest.mark.parametrize("aborts", [1, 6, 12])
def test_a_revision_write_aborted_again_and_again_gets_through_without_a_loop_of_lines(
    spanner_emulator: Any, spanner_faults: Any, caplog: pytest.LogCaptureFixture, aborts: int
) -> None:
    """``aborts`` commits of the revision's transaction aborted in a row (a writer holding
    the emulator's one transaction): the revision is written, in seconds, and the log says
    so in a few lines, none repeated as the journey's watcher counts a loop (more than 4
    lines of one shape, digits aside)."""
    db = spanner_emulator.create_database(
        [
            "CREATE TABLE alembic_version (version_num STRING(32) NOT NULL) "
            "PRIMARY KEY (version_num)"
        ]  # fmt: skip
    )
    direct = spanner_emulator.database(db)
    with direct.batch() as batch:
        batch.insert("alembic_version", ["version_num"], [["aaa"]])
    database = spanner_faults.emulator(spanner_emulator).database(db)
    spanner_faults.fail("Commit", "ABORTED", times=aborts)
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        found = write_revision(
            database, "alembic_version", "version_num", "alembic_version", "aaa", "bbb",
            seconds=60,
        )  # fmt: skip
    took = time.monotonic() - start
    assert found == 1
    assert spanner_faults.pending == 0  # every abort was met
    assert _versions(direct) == ["bbb"]
    # contention waits: 12 aborts cost about 11 s (the old backoff: over 60 s, i.e. a failure)
    assert took < 4 + aborts, took
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    waits = [ln for ln in lines if "aborted by a concurrent transaction" in ln]
    assert waits and "The write of revision bbb to alembic_version" in waits[0], lines
    assert len(waits) <= 1 + took / WAIT_LINE_EVERY, lines
    shapes = [re.sub(r"\d+(\.\d+)?", "#", ln) for ln in lines]
    assert max(shapes.count(s) for s in shapes) <= 4, lines
    assert re.search(rf"done, after {aborts} aborted attempt\(s\) in ", lines[-1]), lines
