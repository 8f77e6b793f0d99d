"""Alembic's own async env.py template runs migrations on ``spanner+spanner_async``
(issue 46): autogenerate through our plugin, and an upgrade that creates a sharded table
and backfills its shard, as with a sync engine."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import compute_shard, shard_column

pytestmark = pytest.mark.emulator

N = 4


class Base(DeclarativeBase):
    pass


class AsyncNote(Base):
    __tablename__ = "async_alembic_notes"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    author: Mapped[str] = mapped_column(sa.String(20))
    shard: Mapped[int] = shard_column("author", count=N)


def _project(root: Path, url: str) -> Config:
    """``alembic init -t async``, with env.py given the models' metadata and our plugin."""
    command.init(Config(str(root / "alembic.ini"), stdout=io.StringIO()), str(root / "m"), "async")
    env_py = root / "m" / "env.py"
    env = env_py.read_text()
    env = env.replace("target_metadata = None", "target_metadata = config.attributes['md']")
    env = re.sub(
        r"context\.configure\(connection=connection, target_metadata=target_metadata\)",
        "context.configure(connection=connection, target_metadata=target_metadata, "
        "autogenerate_plugins=['alembic.autogenerate.*', 'sharded_orm.*'])",
        env,
    )
    assert "autogenerate_plugins" in env, "the async template's configure call changed"
    env_py.write_text(env)
    cfg = Config(stdout=io.StringIO())
    cfg.set_main_option("script_location", str(root / "m"))
    cfg.set_main_option("sqlalchemy.url", url)
    cfg.attributes["md"] = Base.metadata
    return cfg


def test_the_async_template_autogenerates_and_upgrades(
    spanner_emulator: Any, tmp_path: Path
) -> None:
    database_id = spanner_emulator.create_database()
    sync_url = spanner_emulator.url(database_id)
    async_url = sync_url.replace("spanner+spanner:", "spanner+spanner_async:")
    cfg = _project(tmp_path, async_url)

    script: Any = command.revision(cfg, "notes", autogenerate=True)
    text = Path(script.path).read_text()
    assert "async_alembic_notes" in text and "shard" in text

    command.upgrade(cfg, "head")

    engine = sa.create_engine(sync_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.insert(AsyncNote),
                [{"id": i, "author": f"a{i}"} for i in range(6)],
            )
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT id, author, shard FROM async_alembic_notes"))
            stored = {r.id: (r.author, r.shard) for r in rows}
            version = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()
    assert version == script.revision
    assert stored == {i: (f"a{i}", compute_shard([f"a{i}"], N)) for i in range(6)}
    # nothing left to generate: the async engine reflects what the sync one wrote
    command.check(cfg)
