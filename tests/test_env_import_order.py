"""env.py works in either import order, with or without the stock recipe (issue 42, item 1).

docs/migrations.md says env.py needs nothing imported for Spanner. An app that adopts the
library keeps its own engine module, made with no thought of sharded-orm, and its env.py
makes (or imports) that engine before anything imports the library. ``alembic upgrade``
then failed with a bare ``KeyError: 'spanner+spanner'`` (Alembic's ``get_by_dialect``):
nothing had registered the Spanner impl. Alembic loads our ``alembic.plugins`` entry point
on ``import alembic``, before env.py runs; the plugin now registers the library's dialect,
so the engine env.py makes gets it, and the dialect brings the impl.

Each case is a real ``alembic upgrade`` in a process of its own (import order matters only
once per process), on the emulator, with an env.py that never imports sharded_orm, and
with sqlalchemy-spanner's own recipe (``version_table_pk=False``, an AUTOCOMMIT engine, an
own ``SpannerImpl`` in env.py) present or removed. Where the engine exists before
``import alembic`` (a script that imports the app's engine module, then runs Alembic's
command API), the stock dialect is all there is: the migration still runs, or is refused
with one line naming the fix.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

#: docs/adopting.md's "before" models, as the app has them: nothing of the library's
MODELS = """
import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "users"
    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    handle: Mapped[str] = mapped_column(sa.String(30))
    __table_args__ = (sa.Index("users_by_handle", "handle", unique=True),)


class Event(Base):
    __tablename__ = "events"
    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    user_handle: Mapped[str] = mapped_column(sa.String(30), sa.ForeignKey("users.handle"))
    kind: Mapped[str] = mapped_column(sa.String(20))
    created_at: Mapped[dt.datetime] = mapped_column(sa.DateTime)
    __table_args__ = (sa.Index("events_by_time", "created_at"),)
"""

#: the app's engine module: made first, never imports sharded_orm
DB = """
import os

import sqlalchemy as sa

engine = sa.create_engine(os.environ["DATABASE_URL"]{options})
"""

#: the app's own hand-written first revision (stock autogenerate fails on this stack)
REVISION = '''
"""the app's tables"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("handle", sa.String(30), nullable=False),
    )
    op.create_index("users_by_handle", "users", ["handle"], unique=True)
    op.create_table(
        "events",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("user_handle", sa.String(30), sa.ForeignKey("users.handle")),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("events_by_time", "events", ["created_at"])


def downgrade() -> None:
    op.drop_index("events_by_time", "events")
    op.drop_table("events")
    op.drop_index("users_by_handle", "users")
    op.drop_table("users")
'''

#: sqlalchemy-spanner's README recipe for env.py
STOCK_IMPL = (
    "from alembic.ddl.impl import DefaultImpl\n\n\n"
    "class SpannerImpl(DefaultImpl):\n"
    '    __dialect__ = "spanner+spanner"\n\n\n'
)

#: sqlalchemy-spanner's recipe, part by part: an AUTOCOMMIT engine, version_table_pk=False,
#: an own SpannerImpl in env.py
RECIPE = ("autocommit", "no_version_pk", "own_impl")

#: env.py variants: where the engine comes from ("config": env.py makes it from alembic.ini,
#: "app": imported from the app's engine module first of all), and the recipe's parts kept
ENVS: dict[str, tuple[str, tuple[str, ...]]] = {
    "docs_env": ("config", ()),
    "engine_module_first": ("app", ()),
    "engine_module_first_stock_recipe": ("app", RECIPE),
    "docs_env_stock_recipe": ("config", RECIPE),
    "autocommit_engine": ("app", ("autocommit",)),
    "recipe_without_own_impl": ("config", ("autocommit", "no_version_pk")),
}

#: a second revision: Alembic then updates the version row (a DELETE + INSERT with our impl)
REVISION_2 = '''
"""users: a note"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("users", sa.Column("note", sa.String(100), nullable=True))


def downgrade() -> None:
    op.drop_column("users", "note")
'''


def write_project(root: Path, env_kind: str) -> None:
    source, recipe = ENVS[env_kind]
    app = root / "myapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "models.py").write_text(MODELS)
    autocommit = ', isolation_level="AUTOCOMMIT"' if "autocommit" in recipe else ""
    (app / "db.py").write_text(DB.format(options=autocommit))
    command.init(Config(str(root / "alembic.ini"), stdout=io.StringIO()), str(root / "migrations"))
    env_py = root / "migrations" / "env.py"
    env = env_py.read_text()
    # docs/migrations.md's two changes: the models' metadata, the plugin
    env = env.replace(
        "target_metadata = None", "from myapp.models import Base\n\ntarget_metadata = Base.metadata"
    )
    configure = "target_metadata=target_metadata, "
    configure += "autogenerate_plugins=['alembic.autogenerate.*', 'sharded_orm.*'],"
    if "no_version_pk" in recipe:
        configure += " version_table_pk=False,"
    env = env.replace("target_metadata=target_metadata,", configure)
    if source == "app":
        # the engine comes from the app's engine module, imported first of all
        env = "from myapp.db import engine\n" + env
        start = env.index("    connectable = engine_from_config(")
        end = env.index(")\n", start) + 2
        env = env[:start] + "    connectable = engine\n" + env[end:]
    elif autocommit:
        env = env.replace("poolclass=pool.NullPool,", f"poolclass=pool.NullPool{autocommit},")
    if "own_impl" in recipe:
        env = env.replace("# add your model's MetaData object here", STOCK_IMPL + "# models")
    assert "sharded_orm" not in env.replace("'sharded_orm.*'", "")
    env_py.write_text(env)
    (root / "migrations" / "versions" / "0001_tables.py").write_text(REVISION)
    if "own_impl" not in recipe:
        # Alembic's own UPDATE of the version row, which an own DefaultImpl runs, is
        # refused from the second revision on ("Cannot modify a primary key column
        # with UPDATE"), on the stock dialect too: docs/migrations.md says to delete it
        (root / "migrations" / "versions" / "0002_note.py").write_text(REVISION_2)


def head(env_kind: str) -> list[str]:
    return ["0001"] if "own_impl" in ENVS[env_kind][1] else ["0002"]


def run(root: Path, url: str, host: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "SPANNER_EMULATOR_HOST": host,
        "PYTHONPATH": str(root),
        "PYTHONWARNINGS": "always",
    }
    env.pop("PYTHONSTARTUP", None)
    ini = root / "alembic.ini"
    text = ini.read_text().replace("driver://user:pass@localhost/dbname", url)
    ini.write_text(text)
    return subprocess.run(
        [sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )


def tables_and_version(url: str) -> tuple[set[str], list[str]]:
    import sharded_orm  # noqa: F401  (the test's own engine: the library's dialect)

    engine = sa.create_engine(url)
    try:
        names = set(sa.inspect(engine).get_table_names())
        with engine.connect() as conn:
            version = list(
                conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars()
            )
        return names, version
    finally:
        engine.dispose()


CLI = ["-m", "alembic", "upgrade", "head"]


# an alembic upgrade subprocess per env.py; quick loop:
# test_engine_made_before_alembic_is_imported
@pytest.mark.slow
@pytest.mark.parametrize("env_kind", list(ENVS))
def test_alembic_upgrade_with_an_env_py_that_never_imports_the_library(
    env_kind: str, tmp_path: Path, spanner_emulator: Any
) -> None:
    url = spanner_emulator.url(spanner_emulator.create_database())
    write_project(tmp_path, env_kind)
    out = run(tmp_path, url, spanner_emulator.host, CLI)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "KeyError" not in out.stderr
    names, version = tables_and_version(url)
    assert {"users", "events", "alembic_version"} <= names
    assert version == head(env_kind)
    recipe = ENVS[env_kind][1]
    # an AUTOCOMMIT engine printed "This method is non-operational as a transaction has
    # not been started" at every commit Alembic made; our impl turns that off. Left: the
    # one of the engine's first connect (the dialect's rollback, before any impl runs),
    # and those of an own impl in env.py, which is not ours (docs say to delete both)
    if "autocommit" not in recipe:
        assert "UserWarning" not in out.stderr, out.stderr[-3000:]
    elif "own_impl" not in recipe:
        assert out.stderr.count("non-operational") <= 1, out.stderr[-3000:]


#: a script that imports the app's engine module before Alembic, then runs `upgrade head`
ENGINE_BEFORE_ALEMBIC = [
    "-c",
    "import myapp.db\nfrom alembic.config import main\nmain(['upgrade', 'head'])\n",
]


#: the env.py kinds of the engine-first test; the stock recipe (the same import order with
#: the app's own impl, an alembic upgrade subprocess) is slow; quick loop:
#: test_engine_made_before_alembic_is_imported[engine_module_first], and for the app's impl
#: test_alembic_user_impl.py's autogenerate test, in both orders
ENGINE_FIRST_ENVS = [
    "engine_module_first",
    pytest.param("engine_module_first_stock_recipe", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("env_kind", ENGINE_FIRST_ENVS)
def test_engine_made_before_alembic_is_imported(
    env_kind: str, tmp_path: Path, spanner_emulator: Any
) -> None:
    """The engine predates ``import alembic``: it has sqlalchemy-spanner's own dialect. The
    plain migration runs all the same; the library's features are refused naming the fix."""
    url = spanner_emulator.url(spanner_emulator.create_database())
    write_project(tmp_path, env_kind)
    out = run(tmp_path, url, spanner_emulator.host, ENGINE_BEFORE_ALEMBIC)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "KeyError" not in out.stderr
    names, version = tables_and_version(url)
    assert {"users", "events", "alembic_version"} <= names
    assert version == head(env_kind)


def test_import_alembic_leaves_the_dialect_and_loads_nothing_of_the_library() -> None:
    """``import alembic`` alone (the CLI's first step) loads the plugin, which switches no
    dialect and imports nothing of the library: a Spanner URL keeps sqlalchemy-spanner's
    dialect (an installed library stays invisible, as the peer suites' stock runs check);
    our impl is defined only when such an engine connects inside an Alembic command."""
    code = textwrap.dedent(
        """
        import sys
        import alembic
        import sqlalchemy as sa
        engine = sa.create_engine("spanner+spanner:///projects/p/instances/i/databases/d")
        cls = type(engine.dialect)
        print(cls.__module__ + "." + cls.__qualname__)
        print(len([m for m in sys.modules if m.startswith("sharded_orm")]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [
        "google.cloud.sqlalchemy_spanner.sqlalchemy_spanner.SpannerDialect",
        "0",
    ]
