"""A real Alembic project in a temp dir, with env.py edited as the README shows."""

from __future__ import annotations

import io
import re
import textwrap
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

PLUGINS = "autogenerate_plugins=['alembic.autogenerate.*', 'sharded_orm.*']"


class Project:
    def __init__(self, root: Path, url: str, *, split: bool = False) -> None:
        self.root = root
        self.out = io.StringIO()
        ini = root / "alembic.ini"
        command.init(Config(str(ini), stdout=io.StringIO()), str(root / "migrations"))
        env_py = root / "migrations" / "env.py"
        env = env_py.read_text()
        # The README's change: the models' metadata and the plugin; nothing to import
        # for Spanner (the dialect brings the impl, the entry point the plugin).
        env = env.replace(
            "target_metadata = None",
            "target_metadata = config.attributes['target_metadata']  # tests: models vary",
        )
        env = re.sub(
            r"target_metadata=target_metadata,?",
            f"target_metadata=target_metadata, {PLUGINS},",
            env,
        )
        if split:  # docs/migrations.md: a one-step reshard written as expand + contract
            env = "import alembic_ext\n" + env.replace(
                "target_metadata=target_metadata,",
                "target_metadata=target_metadata, "
                "process_revision_directives=alembic_ext.split_reshard,",
            )
        env_py.write_text(env)
        # No file name: env.py then skips logging.config.fileConfig, which would disable
        # every logger of the test process (the library's progress logs among them).
        self.cfg = Config(output_buffer=self.out, stdout=io.StringIO())
        self.cfg.set_main_option("script_location", str(root / "migrations"))
        self.cfg.set_main_option("sqlalchemy.url", url)

    def revision(self, metadata: sa.MetaData, message: str) -> str:
        self.cfg.attributes["target_metadata"] = metadata
        script: Any = command.revision(self.cfg, message, autogenerate=True)
        return Path(script.path).read_text()

    def hand_written(self, message: str, upgrade: str) -> str:
        """A hand-written revision (as users write data migrations) with ``upgrade`` as its
        upgrade body; returns its revision id."""
        script: Any = command.revision(self.cfg, message)
        path = Path(script.path)
        text = re.sub(r"def upgrade\(\) -> None:\n.*?\n\n\ndef downgrade", (
            "def upgrade() -> None:\n" + textwrap.indent(textwrap.dedent(upgrade), "    ")
            + "\n\ndef downgrade"
        ), path.read_text(), flags=re.S)  # fmt: skip
        path.write_text(text)
        return str(script.revision)

    def revisions(self, metadata: sa.MetaData, message: str) -> list[Any]:
        """Autogenerate that may write several files: their Alembic ``Script`` objects."""
        self.cfg.attributes["target_metadata"] = metadata
        scripts: Any = command.revision(self.cfg, message, autogenerate=True)
        return list(scripts) if isinstance(scripts, list) else [scripts]

    def upgrade(self, target: str = "head", **attributes: Any) -> None:
        self.cfg.attributes.update(attributes)
        command.upgrade(self.cfg, target)

    def downgrade(self, target: str, **attributes: Any) -> None:
        self.cfg.attributes.update(attributes)
        command.downgrade(self.cfg, target)

    def check(self, metadata: sa.MetaData) -> None:
        """``alembic check``: raises when autogenerate would find a change."""
        self.cfg.attributes["target_metadata"] = metadata
        command.check(self.cfg)

    def offline_sql(self, rng: str) -> str:
        self.out.seek(0)
        self.out.truncate()
        command.upgrade(self.cfg, rng, sql=True)
        return self.out.getvalue()


def body(script: str, fn: str) -> str:
    """The text of ``def upgrade`` or ``def downgrade`` in a migration file."""
    m = re.search(rf"def {fn}\(\).*?:\n(.*?)(?=\ndef |\Z)", script, re.S)
    assert m is not None
    return m.group(1)


def no_changes(script: str) -> bool:
    """True when autogenerate found nothing: the upgrade body is just ``pass``."""
    lines = [ln.strip() for ln in body(script, "upgrade").splitlines()]
    return [ln for ln in lines if ln and not ln.startswith(("#", '"""'))] == ["pass"]
