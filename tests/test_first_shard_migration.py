"""The first real migration (issue 31 item 4): a shard column and a ShardedIndex added to an
existing time-ordered table that holds rows, online, on the emulator.

The expand (the model declares the shard column ``nullable=True``): autogenerate writes the
nullable column, its backfill and its marker. Code that does not fill it (the app before
its deploy) keeps writing rows with none. The contract (the column NOT NULL, its
ShardedIndex): autogenerate writes a backfill of those rows *before* the NOT NULL (the
NOT NULL fences such code: its INSERTs fail from then on), then the index (Spanner cannot
change NOT NULL of a column an index holds). Every row is then found by sharded reads.

Before: the contract was ``alter_column(nullable=False)`` alone, which Spanner refused
over the rows written since the expand; a NOT NULL change of an indexed column failed at
upgrade, half way through a revision.
"""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.util import CommandError
from alembic_project import Project, body, no_changes
from sqlalchemy.orm import DeclarativeBase, mapped_column

from sharded_orm import ShardedIndex, UTCDateTime, merged, shard_column, sharded_select

pytestmark = pytest.mark.emulator

T0 = dt.datetime(2024, 3, 1, tzinfo=dt.timezone.utc)


def models(step: str) -> tuple[sa.MetaData, Any]:
    """``step``: "plain" (the app as it is), "expand", "contract", "done" (hot index gone);
    "expand_indexed": the expand with its index (the shape that cannot become NOT NULL)."""

    class Base(DeclarativeBase):
        pass

    attrs: dict[str, Any] = {
        "__tablename__": "events",
        "__annotations__": {},
        "id": mapped_column(sa.String(36), primary_key=True),
        "user_id": mapped_column(sa.String(36)),
        "created_at": mapped_column(UTCDateTime),
        "kind": mapped_column(sa.String(20)),
    }
    args: list[Any] = []
    if step != "done":
        args.append(sa.Index("events_by_time", "created_at"))  # the hot index
    if step != "plain":
        attrs["shard"] = shard_column(
            "created_at", count=8, name="EventShard", nullable=step.startswith("expand")
        )
    if step in ("contract", "done", "expand_indexed"):
        args.append(ShardedIndex("events_newest", sa.desc("created_at"), shard="EventShard"))
    attrs["__table_args__"] = tuple(args)
    event = type("Event", (Base,), attrs)
    return Base.metadata, event


def old_code_writes(engine: sa.Engine, start: int, n: int) -> None:
    """Rows as the app wrote them before it declared the shard column: mutations that do
    not name it (sharded-orm never sees them)."""
    rows = [
        [str(uuid.UUID(int=i)), f"u{i % 7}", T0 + dt.timedelta(seconds=i), "click"]
        for i in range(start, start + n)
    ]
    with engine.connect() as c:
        database: Any = c.connection.dbapi_connection.database  # type: ignore[union-attr]
    with database.batch() as batch:
        batch.insert("events", columns=["id", "user_id", "created_at", "kind"], values=rows)


@pytest.fixture
def project(tmp_path: Path, spanner_emulator: Any) -> Any:
    url = spanner_emulator.url(spanner_emulator.create_database())
    proj = Project(tmp_path, url)
    proj.cfg.attributes["sharded_orm.backfill_progress"] = None
    engine = sa.create_engine(url)
    yield proj, engine
    engine.dispose()


# adoption journey; quick loop: test_not_null_of_an_indexed_column_is_refused_at_autogenerate
@pytest.mark.slow
def test_first_shard_column_expand_then_contract_online(project: Any) -> None:
    proj, engine = project
    md, _ = models("plain")
    proj.revision(md, "the app")
    proj.upgrade()
    old_code_writes(engine, 0, 300)

    md, _ = models("expand")
    script = proj.revision(md, "expand")
    up = body(script, "upgrade")
    assert "op.add_column('events', sa.Column('EventShard', sa.Integer(), nullable=True))" in up
    assert "op.backfill_shard('events', 'EventShard', sources=['created_at'], count=8" in up
    assert "nullable=False" not in up and "create_index" not in up
    proj.upgrade()
    proj.check(md)
    old_code_writes(engine, 300, 40)  # the app, not deployed yet: no shard

    md, event = models("contract")
    script = proj.revision(md, "contract")
    up = body(script, "upgrade")
    fill = up.index("op.backfill_shard('events', 'EventShard'")
    assert (
        fill
        < up.index("op.alter_column('events', 'EventShard'")
        < up.index("op.create_index('events_newest'")
    ), script
    assert "drop_index" not in up
    proj.upgrade()
    proj.check(md)

    with engine.connect() as c:
        nulls = c.execute(sa.text("SELECT COUNT(*) FROM events WHERE EventShard IS NULL"))
        assert nulls.scalar_one() == 0
        stmt = sharded_select(event, index="events_newest").order_by(event.created_at.desc())
        everything = c.execute(sa.select(event.id).order_by(event.created_at.desc())).scalars()
        found = [r.id for r in merged(c, stmt, 1000)]
        assert found == list(everything) and len(found) == 340
        newest = [r.id for r in merged(c, stmt, 25)]
        assert newest == found[:25]
    with pytest.raises(Exception, match="EventShard"):  # old code is fenced, loudly
        old_code_writes(engine, 400, 1)

    md, _ = models("done")  # readers use the sharded index: the hot one goes
    script = proj.revision(md, "drop the hot index")
    assert "op.drop_index('events_by_time', table_name='events')" in body(script, "upgrade")
    proj.upgrade()
    proj.check(md)
    assert no_changes(proj.revision(md, "nothing"))


def test_not_null_of_an_indexed_column_is_refused_at_autogenerate(project: Any) -> None:
    """The shard column added nullable with its index in one revision: Spanner cannot make
    it NOT NULL later; autogenerate says so (and what to do) before anything runs."""
    proj, engine = project
    md, _ = models("expand_indexed")
    proj.revision(md, "nullable, indexed")
    proj.upgrade()
    md, _ = models("contract")
    with pytest.raises(CommandError, match="cannot change NOT NULL of a column that index"):
        proj.revision(md, "not null")
