"""Generated revisions say exactly what they do (issue 42, item 4).

Before: the expand of a nullable shard column said "then NOT NULL and the marker" above an
``add_column``, a backfill and a marker (no NOT NULL), and the contract's downgrade ended
with a backfill (the reverse of the fill before the NOT NULL) that walked the whole table
after making the column nullable again, which docs/adopting.md §6 does not mention. Now
the comment names the steps that follow, and the downgrade says in a comment that the fill
has nothing to undo. Autogenerate runs against SQLite and the emulator alike.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic_project import Project, body
from sqlalchemy.orm import DeclarativeBase, mapped_column

from sharded_orm import ShardedIndex, UTCDateTime, shard_column

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
ADOPTING = Path(__file__).resolve().parent.parent / "docs" / "adopting.md"


def models(step: str) -> sa.MetaData:
    class Base(DeclarativeBase):
        pass

    attrs: dict[str, Any] = {
        "__tablename__": "events",
        "__annotations__": {},
        "id": mapped_column(sa.String(36), primary_key=True),
        "created_at": mapped_column(UTCDateTime),
    }
    args: list[Any] = [sa.Index("events_by_time", "created_at")]
    if step != "plain":
        attrs["shard"] = shard_column(
            "created_at", count=16, name="EventShard", nullable=step == "expand"
        )
    if step == "contract":
        args.append(ShardedIndex("events_newest", sa.desc("created_at"), shard="EventShard"))
    attrs["__table_args__"] = tuple(args)
    type("Event", (Base,), attrs)
    return Base.metadata


def comments(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("#")]


def ops(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("op.")]


def journey(tmp_path: Path, url: str, *, contract: bool = True) -> tuple[str, str]:
    proj = Project(tmp_path, url)
    proj.revision(models("plain"), "plain")
    proj.upgrade()
    engine = sa.create_engine(url)
    table = sa.Table(
        "events",
        sa.MetaData(),
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("created_at", UTCDateTime),
    )
    with engine.begin() as conn:  # rows: the expand then backfills them
        conn.execute(table.insert(), [{"id": "a", "created_at": T0}, {"id": "b", "created_at": T0}])
    engine.dispose()
    expand = proj.revision(models("expand"), "expand")
    if not contract:  # SQLite: Alembic adds no CHECK constraint there outside batch mode
        return expand, ""
    proj.upgrade()
    later = proj.revision(models("contract"), "contract")
    proj.upgrade()
    proj.downgrade("-1")  # the downgrade as generated runs
    return expand, later


def check(expand: str, contract: str) -> None:
    up = body(expand, "upgrade")
    assert not [op for op in ops(up) if "nullable=False" in op], up
    said = " ".join(c for c in comments(up) if "sharded_orm" not in c)
    assert "NOT NULL" not in said, up  # the expand writes none
    assert "expand (nullable)" in said and "the marker recording its spec" in said
    if not contract:
        return
    down = body(contract, "downgrade")
    assert not [op for op in ops(down) if "backfill_shard" in op], down
    assert [re.sub(r"\s+", " ", op) for op in ops(down)][-1].startswith("op.alter_column"), down
    assert any("nothing to undo for the fill of events.EventShard" in c for c in comments(down))
    # docs/adopting.md §6 says the same of the contract's downgrade
    rollback = ADOPTING.read_text().split("## 6. Rolling back", 1)[1]
    assert "nothing to undo" in rollback


def test_generated_text_says_what_it_does_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    check(*journey(tmp_path, url, contract=False))


@pytest.mark.emulator
def test_generated_text_says_what_it_does_emulator(tmp_path: Path, spanner_emulator: Any) -> None:
    url = spanner_emulator.url(spanner_emulator.create_database())
    check(*journey(tmp_path, url))
