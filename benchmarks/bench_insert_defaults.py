"""Cost of a Core INSERT whose rows omit the shard's sources (their Python defaults fill them).

``conn.execute(Event.__table__.insert(), rows)`` into a ``TimestampShardedMixin`` table,
each row giving only its payload: the hook evaluates the ``Timestamp`` and ``EventId``
defaults ahead of SQLAlchemy (to hash and send what the row stores), row by row. What it
evaluates for a row depends only on the table and the keys the row gives, so that plan
is made once (``sharded_orm.write.sql.PREFETCH_PLANS``), not once per row.

Against **plain**: SQLAlchemy alone, a table with the same columns and the same Python
defaults (SQLAlchemy evaluates them) and the shard given as a constant. In-memory
SQLite, CPU time of this process (``time.process_time``), rounds interleaved, each ratio
min / median / max over the per-round ratios.

Figures (20,000 rows, 11 rounds, a shared 2-core machine, SQLAlchemy 2.1.9; plain
0.22 s median in both runs):

* before (a ``StatementDefaults`` and a ``prefetch_columns`` per row): sharded 0.64 s
  median; sharded / plain 2.83 / 2.95 / 3.11
* after (planned once per shape of row): sharded 0.57 s median; sharded / plain
  2.47 / 2.55 / 3.21

**ORM flush** (``--orm``): ``session.add_all(objects); session.flush()`` of new
``Event`` objects giving only their payload (``before_insert`` evaluates and stores the
defaults of each object's sources, to key it by its shard), against the same flush of a
plain mapped class of ``plain_events`` (SQLAlchemy evaluates the defaults, the shard
given). The defaults' state is built once per flush and shape of object
(``orm_events.FlushDefaults``), not once per object, and what the defaults see is
worked out once per mapper. Figures (5,000 objects, 11 rounds, same machine, two runs
each; plain 0.19 s median in all):

* before (a ``StatementDefaults``, a plan lookup and the table's column map per
  object): sharded 0.46 / 0.43 s median; sharded / plain 1.88 / 2.37 / 2.57 and
  2.16 / 2.39 / 2.76
* after: sharded 0.41 / 0.39 s median; sharded / plain 2.06 / 2.14 / 2.27 and
  1.67 / 2.14 / 2.20

    python benchmarks/bench_insert_defaults.py [--rows 20000] [--rounds 11]
    python benchmarks/bench_insert_defaults.py --orm [--rows 5000] [--rounds 11]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import statistics
import time
import uuid
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import TimestampShardedMixin, compute_shard


class Base(DeclarativeBase):
    pass


class Event(TimestampShardedMixin, Base):
    __tablename__ = "events"
    payload: Mapped[str] = mapped_column(sa.String(40))


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _new_id() -> str:
    return str(uuid.uuid4())


events = Base.metadata.tables["events"]
plain = sa.Table(
    "plain_events",
    Base.metadata,
    sa.Column("ShardId", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("Timestamp", sa.DateTime(timezone=True), primary_key=True, default=_now),
    sa.Column("EventId", sa.String(36), primary_key=True, default=_new_id),
    sa.Column("payload", sa.String(40)),
)


class PlainEvent(Base):
    __table__ = plain


Rows = list[dict[str, object]]
Work = Callable[[], float]


def timed(table: sa.Table, rows: Rows) -> Work:
    def run() -> float:
        eng = sa.create_engine("sqlite://")
        Base.metadata.create_all(eng)
        with eng.connect() as conn:
            mine = [dict(r) for r in rows]
            gc.collect()
            t = time.process_time()
            conn.execute(sa.insert(table), mine).close()
            spent = time.process_time() - t
        eng.dispose()
        return spent

    return run


def flushed(model: type[Base], n: int, **given: object) -> Work:
    """An ORM flush of ``n`` new objects of ``model`` (``given``: the same for each)."""

    def run() -> float:
        eng = sa.create_engine("sqlite://")
        Base.metadata.create_all(eng)
        with Session(eng) as s:
            s.connection()  # the transaction begun, the tables' mappers configured
            objects = [model(payload=f"p{i}", **given) for i in range(n)]
            gc.collect()
            t = time.process_time()
            s.add_all(objects)
            s.flush()
            spent = time.process_time() - t
            s.rollback()
        eng.dispose()
        return spent

    return run


def built(model: type[Base], n: int, **given: object) -> Work:
    """New objects of ``model`` built *and* flushed, each given its own ``Timestamp``
    (``given``: the same for each): a key shard's ``set`` listener hashes the timestamp
    as it is set, so the objects' construction is timed with the flush."""
    start = _now()
    stamps = [start + dt.timedelta(microseconds=i) for i in range(n)]
    attr = "timestamp" if model is Event else "Timestamp"

    def run() -> float:
        eng = sa.create_engine("sqlite://")
        Base.metadata.create_all(eng)
        with Session(eng) as s:
            s.connection()  # the transaction begun, the tables' mappers configured
            gc.collect()
            t = time.process_time()
            s.add_all(
                [model(payload=f"p{i}", **{attr: ts}, **given) for i, ts in enumerate(stamps)]
            )
            s.flush()
            spent = time.process_time() - t
            s.rollback()
        eng.dispose()
        return spent

    return run


def check_once() -> None:
    """The sharded rows store their defaults, each shard the hash of its stored source."""
    eng = sa.create_engine("sqlite://")
    Base.metadata.create_all(eng)
    with eng.begin() as conn:
        conn.execute(sa.insert(events), [{"payload": str(i)} for i in range(100)])
        got = conn.execute(sa.select(Event.shard_id, Event.timestamp, Event.event_id)).all()
    assert len({r[2] for r in got}) == 100
    for shard, ts, _ in got:
        ts = ts if ts.tzinfo else ts.replace(tzinfo=dt.timezone.utc)
        assert shard == compute_shard([ts], Event.__shard_count__)


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--orm", action="store_true", help="an ORM flush of new objects")
    args = ap.parse_args()
    check_once()
    if args.orm:
        args.rows = args.rows or 5_000
        what = "new objects flushed giving only their payload (given: built with a timestamp)"
        variants = {
            "plain": flushed(PlainEvent, args.rows, ShardId=0),
            "sharded": flushed(Event, args.rows),
            "plain_given": built(PlainEvent, args.rows, ShardId=0),
            "sharded_given": built(Event, args.rows),
        }
    else:
        args.rows = args.rows or 20_000
        what = "rows omitting the shard's sources"
        variants = {
            "plain": timed(plain, [{"payload": f"p{i}", "ShardId": 0} for i in range(args.rows)]),
            "sharded": timed(events, [{"payload": f"p{i}"} for i in range(args.rows)]),
        }
    names = list(variants)
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            times[name].append(variants[name]())
    print(
        f"{args.rows} {what}, SQLAlchemy {sa.__version__}, "
        f"{args.rounds} interleaved rounds, CPU seconds (min / median / max)"
    )
    for name in names:
        print(f"  {name:<13} {spread(times[name])}")
    for suffix in ("", "_given"):
        if "sharded" + suffix not in times:
            continue
        per_round = [
            x / y for x, y in zip(times["sharded" + suffix], times["plain" + suffix], strict=True)
        ]
        print(
            f"sharded{suffix} / plain{suffix} per round (min / median / max): {spread(per_round)}"
        )


if __name__ == "__main__":
    main()
