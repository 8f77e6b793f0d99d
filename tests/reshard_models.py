"""Models and helper processes of the end-to-end reshard tests (tests/test_reshard_e2e.py,
tests/test_key_reshard_e2e.py).

Importable by the subprocesses those tests start: ``python reshard_models.py writer URL
DIR`` writes rows with the OLD model (``Shard8`` only) until ``DIR/stop`` exists;
``python reshard_models.py upgrade URL SCRIPTS REV`` runs ``alembic upgrade`` with the
model at REV, printing one line per backfill batch (the test kills it with SIGKILL).
The key reshard's twins: ``events(stage)``, ``event-writer`` (inserts through the OLD
``TimestampShardedMixin`` model, count 8, with the ORM) and ``key-upgrade`` (the expand
with the model of both tables, one line per copy batch).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import ShardedIndex, shard_column

T0 = 1_700_000_000


def logs(
    shard8: bool = True, shard16: bool = True, nullable16: bool = True, algorithm16: str = "crc32"
) -> sa.MetaData:
    """Logs during an 8 -> 16 reshard: the old layout, the new one, or both."""
    md = sa.MetaData()
    cols: list[Any] = []
    if shard8:
        cols.append(shard_column("CompanyId", "Ts", count=8, name="Shard8").column)
    if shard16:
        cols.append(
            shard_column(
                "CompanyId",
                "Ts",
                count=16,
                name="Shard16",
                nullable=nullable16,
                algorithm=algorithm16,
            ).column
        )
    t = sa.Table(
        "Logs",
        md,
        sa.Column("Id", sa.String(36), primary_key=True),
        sa.Column("CompanyId", sa.String(64), nullable=False),
        sa.Column("Ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("Body", sa.String(100)),
        *cols,
    )
    for name in ("Shard8",) * shard8 + ("Shard16",) * shard16:
        t.append_constraint(ShardedIndex(f"LogsBy{name}", "CompanyId", sa.desc("Ts"), shard=name))
    return md


def row(i: int, tag: str = "") -> dict[str, Any]:
    import datetime as dt

    ts = dt.datetime.fromtimestamp(T0 + i, dt.timezone.utc)
    return {"Id": f"{tag}{uuid.uuid4()}"[:36], "CompanyId": f"c{i % 10}", "Ts": ts, "Body": tag}


def _publish(out: Path, stats: dict[str, Any]) -> None:
    """Replace writer.json whole, so the test never reads a half-written file."""
    tmp = out / "writer.json.tmp"
    tmp.write_text(json.dumps(stats))
    os.replace(tmp, out / "writer.json")


def writer(url: str, out: Path) -> None:
    """The OLD application: inserts through the library with the count-8 model only."""
    import warnings

    warnings.simplefilter("ignore")
    table = logs(shard16=False).tables["Logs"]
    engine = sa.create_engine(url)
    ok = failed = 0
    errors: list[str] = []
    i = 0
    while not (out / "stop").exists():
        i += 1
        try:
            with engine.begin() as conn:
                conn.execute(table.insert(), [row(i, "old-")])
            ok += 1
        except Exception as exc:  # aborts, and "column not found" once fenced
            failed += 1
            orig = getattr(exc, "orig", exc)  # Spanner's message is the DB-API error's cause
            errors.append(str(orig.__cause__ or orig)[:200])
        _publish(out, {"ok": ok, "failed": failed})
        # a few writes a second: the emulator runs one read-write transaction at a time and
        # aborts the others, so a writer in a tight loop starves the migration's commits
        # (the DB-API retries them without end); Spanner itself runs them side by side
        time.sleep(0.25)
    _publish(out, {"ok": ok, "failed": failed, "errors": errors})
    engine.dispose()


def upgrade(
    url: str,
    scripts: str,
    rev: str,
    metadata: sa.MetaData,
    line: Any = lambda p: f"batch {p.batches} filled {p.done}",
) -> None:
    """``alembic upgrade REV``, one stdout ``line(progress)`` per backfill or copy batch,
    slowed so a test can kill it mid-step."""
    import io

    from alembic import command
    from alembic.config import Config

    from alembic_ext.ops import PROGRESS_ATTRIBUTE

    cfg = Config(output_buffer=io.StringIO(), stdout=io.StringIO())
    cfg.set_main_option("script_location", scripts)
    cfg.set_main_option("sqlalchemy.url", url)
    cfg.attributes["target_metadata"] = metadata

    def batch(p: Any) -> None:
        print(line(p), flush=True)
        time.sleep(0.5)

    cfg.attributes[PROGRESS_ATTRIBUTE] = batch
    for _ in range(20):  # the emulator refuses DDL beside a transaction: run it again
        try:
            command.upgrade(cfg, rev)
            break
        except Exception as exc:
            if "concurrent schema change operation" not in str(exc):
                raise
            time.sleep(0.2)
    print("done", flush=True)


def events(stage: str) -> sa.MetaData:
    """Events keyed ``(ShardId, Timestamp DESC, EventId)`` during an 8 -> 16 key reshard:
    ``"old"`` (Events, 8 shards), ``"expand"`` (Events and its successor Events16, 16
    shards, every write to both), ``"both"`` (the two tables, no successor declared) or
    ``"contract"`` (Events16 only). Fresh classes on every call: a test module's
    ``declare_successor`` or mapper events reach no other module's models."""
    from sharded_orm import TimestampShardedMixin, declare_successor

    class Base(DeclarativeBase):
        pass

    models = {}
    if stage in ("old", "expand", "both"):

        class Event(TimestampShardedMixin, Base):
            __tablename__ = "Events"
            __shard_count__ = 8
            kind: Mapped[str] = mapped_column("Kind", sa.String(40))

        models["Event"] = Event
    if stage in ("expand", "both", "contract"):

        class Event16(TimestampShardedMixin, Base):
            __tablename__ = "Events16"
            __shard_count__ = 16
            kind: Mapped[str] = mapped_column("Kind", sa.String(40))

        models["Event16"] = Event16
    if stage == "expand":
        declare_successor(models["Event"], models["Event16"])
    Base.metadata.info["models"] = models
    return Base.metadata


def event_writer(url: str, out: Path) -> None:
    """The OLD application: adds events through the ORM with the count-8 model only."""
    import datetime as dt
    import warnings

    from sqlalchemy.orm import Session

    warnings.simplefilter("ignore")
    Event = events("old").info["models"]["Event"]
    engine = sa.create_engine(url)
    ok = failed = 0
    errors: list[str] = []
    i = 0
    while not (out / "stop").exists():
        i += 1
        try:
            with Session(engine) as session, session.begin():
                ts = dt.datetime.fromtimestamp(T0 + i, dt.timezone.utc)
                session.add(Event(timestamp=ts, event_id=f"old-{uuid.uuid4()}"[:36], kind="old"))
            ok += 1
        except Exception as exc:  # aborts, and "Table not found" once fenced
            failed += 1
            orig = getattr(exc, "orig", exc)
            errors.append(str(orig.__cause__ or orig)[:200])
        _publish(out, {"ok": ok, "failed": failed})
        time.sleep(0.25)  # a few writes a second (see writer)
    _publish(out, {"ok": ok, "failed": failed, "errors": errors})
    engine.dispose()


def key_upgrade(url: str, scripts: str, rev: str) -> None:
    """``upgrade`` with the expand's models, a line per copy batch."""
    upgrade(url, scripts, rev, events("expand"), lambda p: f"batch {p.batches} copied {p.rows}")


if __name__ == "__main__":
    if sys.argv[1] == "writer":
        writer(sys.argv[2], Path(sys.argv[3]))
    elif sys.argv[1] == "event-writer":
        event_writer(sys.argv[2], Path(sys.argv[3]))
    elif sys.argv[1] == "key-upgrade":
        key_upgrade(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        upgrade(sys.argv[2], sys.argv[3], sys.argv[4], logs())
