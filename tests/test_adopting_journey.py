"""docs/adopting.md, run as written, on the emulator (issue 31 item 5).

The page's Python blocks run in page order (``tests/test_doc_snippets.py`` leaves its
sections to this test): a process that never imports sharded-orm makes the database with
the page's "before" models through the stock dialect and writes rows (naive
``datetime``\\ s, as the app does); then, in this process, the page's engine module and
models, an empty autogenerate, the expand (its ``# generated`` lines are in the revision
autogenerate writes), rows from old code (that process again) and new code, the contract,
the reads: ``merged()`` and a ``page()`` walk equal the plain queries row for row. Then the
hot index dropped, and the rollback: downgrade to the adopt revision, after which the
schema is the models' of before and old code writes again.
"""

from __future__ import annotations

import ast
import datetime as dt
import os
import re
import subprocess
import sys
import textwrap
import types
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic_project import Project, body, no_changes
from sqlalchemy.orm import Session

from sharded_orm import compute_shard

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

PAGE = Path(__file__).resolve().parent.parent / "docs" / "adopting.md"
USERS = 12
T0 = dt.datetime(2024, 1, 1, 9, 0)  # naive: the app writes datetime.utcnow()

#: the old app's writer, run in a process that never imports sharded-orm
OLD_CODE = """
import sys, uuid
{models}
from sqlalchemy.orm import Session

engine = sa.create_engine(sys.argv[1])
start, n, create = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "create"
if create:
    Base.metadata.create_all(engine)
with Session(engine) as s:
    if create:
        s.add_all(User(id=str(uuid.UUID(int=u)), handle=f"user{{u}}") for u in range({users}))
        s.commit()
    s.add_all(
        Event(id=str(uuid.UUID(int=10**6 + i)), user_handle=f"user{{i % {users}}}",
              kind="old", payload={{"i": i}},
              created_at=dt.datetime(2024, 1, 1, 9, 0) + dt.timedelta(seconds=i // 2))
        for i in range(start, start + n)
    )
    s.commit()
# the stock dialect imports Alembic, which loads its plugins' entry points: ours,
# alembic_ext.plugin, imports nothing (of sharded-orm, or more of alembic_ext than the
# stand-ins of its operations)
leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("sharded_orm", "alembic_ext"))
assert set(leaked) <= {{"alembic_ext", "alembic_ext.plugin", "alembic_ext.stand_ins"}}, leaked
print("old code wrote", n, "rows with", engine.dialect.__class__.__module__)
"""


def page_blocks() -> list[str]:
    """The page's Python blocks, in order."""
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)


def block(first_line: str) -> str:
    found = [b for b in page_blocks() if b.splitlines()[0].strip() == first_line]
    assert len(found) == 1, (first_line, [b.splitlines()[0] for b in page_blocks()])
    return found[0]


def compose(before: str, change: str) -> str:
    """The models file after ``change``: the page shows only what changes, with ``...``
    for Event's other attributes (those it does not give again); its other statements
    go right after ``Base``."""
    old, new = ast.parse(before), ast.parse(textwrap.dedent(change))

    def event(tree: ast.Module) -> ast.ClassDef:
        (cls,) = [s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == "Event"]
        return cls

    def name(s: ast.stmt) -> str | None:
        target = s.target if isinstance(s, ast.AnnAssign) else getattr(s, "targets", [None])[0]
        return target.id if isinstance(target, ast.Name) else None

    changed = event(new)
    given = {name(s) for s in changed.body} - {None}
    kept = [s for s in event(old).body if name(s) not in given]
    changed.body = [
        x
        for s in changed.body
        for x in (
            kept if isinstance(s, ast.Expr) and getattr(s.value, "value", None) is ... else [s]
        )
    ]
    others = [s for s in new.body if s is not changed]
    out: list[ast.stmt] = []
    for s in old.body:
        out.append(changed if s is event(old) else s)
        if isinstance(s, ast.ClassDef) and s.name == "Base":
            out.extend(others)
    return ast.unparse(ast.Module(body=out, type_ignores=[]))


def load(source: str, name: str, **names: Any) -> dict[str, Any]:
    """``source`` run as module ``name`` (SQLAlchemy resolves annotations there)."""
    module = types.ModuleType(name)
    module.__dict__.update(names)
    sys.modules[name] = module
    exec(compile(source, f"{name}.py", "exec"), module.__dict__)
    return module.__dict__


def in_script(lines: str, script: str) -> None:
    """Each line of a ``# generated`` block is a line of ``script``."""
    have = {ln.strip() for ln in script.splitlines()}
    missing = [ln.strip() for ln in lines.splitlines()[1:] if ln.strip() not in have]
    assert not missing, (missing, script)


@pytest.fixture
def app(tmp_path: Path, spanner_emulator: Any) -> Any:
    url = spanner_emulator.url(spanner_emulator.create_database())
    env = {**os.environ, "SPANNER_EMULATOR_HOST": spanner_emulator.host}
    before = block("# myapp/models.py, before")
    script = tmp_path / "old_code.py"
    script.write_text(OLD_CODE.format(models=before, users=USERS))

    def old_code(start: int, n: int, create: bool = False) -> subprocess.CompletedProcess[str]:
        args = [sys.executable, str(script), url, str(start), str(n)]
        args.append("create" if create else "append")
        return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)

    yield url, old_code
    for name in [m for m in sys.modules if m.startswith("myapp_")]:
        del sys.modules[name]


def plain_ids(session: Session, event: Any) -> list[str]:
    stmt = sa.select(event.id).order_by(event.created_at.desc(), event.id)
    return list(session.scalars(stmt))


def test_adopting_page_runs_as_written(app: Any, tmp_path: Path) -> None:
    url, old_code = app
    made = old_code(0, 400, create=True)
    assert made.returncode == 0, made.stderr
    assert "google.cloud.sqlalchemy_spanner" in made.stdout  # the stock dialect wrote them

    # 2. the engine module, 3. the models as they are: autogenerate finds nothing
    db = load(block("# myapp/db.py"), "myapp_db", DATABASE_URL=url)
    engine = db["engine"]
    assert type(engine.dialect).__module__ == "sharded_orm.spanner.dialect"
    before = block("# myapp/models.py, before")
    md = load(before, "myapp_models_0")["Base"].metadata
    proj = Project(tmp_path / "project", url)
    proj.cfg.attributes["sharded_orm.backfill_progress"] = None
    proj.check(md)
    script = proj.revision(md, "adopt sharded-orm")
    assert no_changes(script), script
    adopt = re.search(r"^revision: str = '(\w+)'", script, re.M)
    assert adopt is not None
    proj.upgrade()

    # 4. the expand, then rows from old code (not deployed yet) and from new code
    generated = [b for b in page_blocks() if b.startswith("# generated")]
    assert len(generated) == 2
    expand = load(compose(before, block("# myapp/models.py, the expand")), "myapp_models_1")
    assert "set_naive_datetimes(Base, 'utc')" in compose(
        before, block("# myapp/models.py, the expand")
    )
    script = proj.revision(expand["Base"].metadata, "events: shard column (expand)")
    in_script(generated[0], body(script, "upgrade"))
    proj.upgrade()
    proj.check(expand["Base"].metadata)
    wrote = old_code(400, 60)
    assert wrote.returncode == 0, wrote.stderr
    event = expand["Event"]
    with Session(engine) as s:  # the deployed code: the library fills the shard
        s.add_all(
            event(id=str(uuid.uuid4()), user_handle="user1", kind="new", payload=None,
                  created_at=T0 + dt.timedelta(seconds=230, microseconds=i))
            for i in range(40)
        )  # fmt: skip
        s.commit()

    # the contract: the fill before NOT NULL, then the sharded index
    expand_src = compose(before, block("# myapp/models.py, the expand"))
    contract_src = compose(expand_src, block("# myapp/models.py, the contract"))
    contract = load(contract_src, "myapp_models_2")
    script = proj.revision(contract["Base"].metadata, "events: sharded index (contract)")
    in_script(generated[1], body(script, "upgrade"))
    proj.upgrade()
    proj.check(contract["Base"].metadata)
    event = contract["Event"]
    with engine.connect() as c:
        nulls = c.execute(sa.select(sa.func.count()).where(event.shard.is_(None)))
        assert nulls.scalar_one() == 0
    fenced = old_code(900, 1)  # code that does not fill the shard: refused, loudly
    assert fenced.returncode != 0 and "EventShard" in fenced.stderr, fenced.stderr

    # 5. the reads, as the page writes them, equal the plain queries
    reads = load(
        block("from sqlalchemy.orm import Session"), "myapp_reads", Event=event, engine=engine
    )
    with Session(engine) as s:
        everything = plain_ids(s, event)
        assert len(everything) == 500
        assert [e.id for e in reads["latest"]] == everything[:50]
        assert [e.id for e in reads["first"].rows] == everything[:20]
        assert [e.id for e in reads["second"].rows] == everything[20:40]
        walked: list[str] = []
        cursor = None
        while True:
            p = reads["page"](s, reads["newest"], 37, cursor)
            walked.extend(e.id for e in p.rows)
            if p.next_cursor is None:
                break
            cursor = p.next_cursor
        assert walked == everything
        for e in reads["latest"]:  # read back aware: the shard each was written with
            assert e.shard == compute_shard((e.created_at,), 16), e.created_at

    # the hot index, once no reader uses it
    done_src = compose(
        contract_src,
        "class Event(Base):\n    ...\n    __table_args__ = (\n"
        "        ShardedIndex('events_newest', sa.desc('created_at'),"
        " shard='EventShard'),\n    )\n",
    )
    done = load(done_src, "myapp_models_3")
    assert "events_by_time" not in {i.name for i in done["Event"].__table__.indexes}
    script = proj.revision(done["Base"].metadata, "events: drop the hot index")
    assert "op.drop_index('events_by_time', table_name='events')" in body(script, "upgrade")
    proj.upgrade()
    proj.check(done["Base"].metadata)

    # 6. rolling back: down to the adopt revision, the database is as it was
    proj.downgrade(adopt.group(1))
    with engine.connect() as c:  # the models of before match the database again
        opts = {"autogenerate_plugins": ["alembic.autogenerate.*", "sharded_orm.*"]}
        assert compare_metadata(MigrationContext.configure(c, opts=opts), md) == []
        assert "EventShard" not in {col["name"] for col in sa.inspect(c).get_columns("events")}
    again = old_code(1000, 5)
    assert again.returncode == 0, again.stderr
