"""A bound round that sees fewer than ``k`` keys has found no bound.

Each shard sends its first ``b`` keys (about twice its share of ``k``). When one shard
holds most of the rows (one tenant's table, a small table, a hot shard), those keys can
number fewer than ``k`` while that shard holds more of the answer: its rows past its
``b``-th are still wanted, however they sort against the other shards' last keys. The
merge then reads on with no bound. (Before, the last key of so few was taken as the
bound: on Spanner one statement returned 3 of the newest 100 rows of a 64-shard table
whose rows were all in one shard; elsewhere the rows statement's check failed on every
attempt and the read ended in a false ``ShardReadError``.)
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa
from plans import PLANS, forced, walk
from sqlalchemy.orm import Session
from test_merge_one_statement import T0, Wide  # 64 shards, newest first

from sharded_orm import MergeStats, get_shard_column, merged, sharded_select


def ids_in(shards: set[int], count: int) -> list[int]:
    shard = get_shard_column(Wide, "s")
    out: list[int] = []
    i = 0
    while len(out) < count:
        if shard.compute([i]) in shards:
            out.append(i)
        i += 1
    return out


def layout(name: str) -> list[dict[str, Any]]:
    """``one shard``: 200 rows, all in shard 5. ``hot and newer``: the same, and 10 rows
    spread over other shards, newer than all of them (they come first, and the hot shard's
    keys after its ``b``-th sort after the last key round 1 saw). ``two rows in a shard``:
    5 rows, two of them in one shard, the older of the two the oldest row."""
    if name == "one shard":
        return [
            {"id": i, "ts": T0 + dt.timedelta(seconds=n)} for n, i in enumerate(ids_in({5}, 200))
        ]
    if name == "hot and newer":
        newer = T0 + dt.timedelta(days=1)
        others = ids_in(set(range(64)) - {5}, 10)
        rows = [{"id": i, "ts": newer + dt.timedelta(seconds=n)} for n, i in enumerate(others)]
        return layout("one shard") + rows
    a, b = ids_in({9}, 2)
    rest = ids_in({1, 2, 3}, 3)
    return [
        {"id": a, "ts": T0 + dt.timedelta(seconds=50)},
        {"id": b, "ts": T0},  # shard 9's second row: older than every other shard's first
        *({"id": i, "ts": T0 + dt.timedelta(seconds=10 + n)} for n, i in enumerate(rest)),
    ]


LAYOUTS = ["one shard", "hot and newer", "two rows in a shard"]


# every plan x 3 layouts; quick loop: test_the_statement_reads_on_with_no_bound
@pytest.mark.slow
@pytest.mark.parametrize("name", LAYOUTS)
def test_fewer_keys_than_k_bound_nothing(engine: sa.Engine, name: str) -> None:
    """Every plan of the cost rule, through a Connection and a Session, and a page walk:
    the rows the unsharded statement gives, in at most two statements."""
    t = Wide.__table__
    t.create(engine)
    try:
        with engine.begin() as c:
            c.execute(t.insert(), layout(name))
        stmt = sharded_select(Wide, index="wide_by_ts").order_by(Wide.ts.desc())
        with engine.connect() as c:
            truth = c.execute(sa.select(t.c.id).order_by(t.c.ts.desc(), t.c.id)).scalars().all()
            for plan in PLANS:
                with forced(plan):
                    for k in (4, 20, 100, 300):
                        stats = MergeStats()
                        got = [r.id for r in merged(c, stmt, k, stats=stats)]
                        assert got == truth[:k], (plan, k)
                        assert stats.statements <= 2
                        entities = merged(Session(bind=c), stmt, k)
                        assert [e.id for e in entities] == truth[:k], (plan, k)
                    walked = [r.id for r in walk(c, stmt, 30, len(truth) + 2)]
                    assert walked == truth, plan
    finally:
        t.drop(engine)


@pytest.mark.emulator
def test_the_statement_reads_on_with_no_bound(spanner_engine: sa.Engine) -> None:
    """On Spanner the bound found inside the statement is NULL with fewer than ``k`` keys
    (``so_t IS NULL`` lets every branch read to its LIMIT), and still one statement."""
    t = Wide.__table__
    t.create(spanner_engine)
    with spanner_engine.begin() as c:
        c.execute(t.insert(), layout("one shard"))
    sent: list[str] = []

    @sa.event.listens_for(spanner_engine, "before_cursor_execute")
    def _keep(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    stmt = sharded_select(Wide, index="wide_by_ts").order_by(Wide.ts.desc())
    with spanner_engine.connect() as c:
        stats = MergeStats()
        got = merged(c, stmt, 100, stats=stats)
    assert len(got) == 100 and len(sent) == stats.statements == 1
    assert "so_t IS NULL OR" in sent[0]
