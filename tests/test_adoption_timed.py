"""docs/adopting.md as a user lives it, timed (issue 42, "Build").

``tests/test_adopting_journey.py`` runs the page's Python blocks in one process. This test
runs the page the way an engineer does: an app written for the stock dialect (its engine
module made first, env.py in sqlalchemy-spanner's recipe: an own ``SpannerImpl``,
``version_table_pk=False``, an AUTOCOMMIT engine), a populated table, and the old code
writing a few rows a second in a process of its own, which never imports sharded-orm,
through the schema changes. Every command is the ``alembic`` CLI in a subprocess
(``python -m alembic``), every step of the page in its order: the engine module, env.py,
the adopt revision, the count (``sharded-orm advise``, as the page writes it), the expand
(its backfill), the deploy (the new code writes), the
contract, the reads, then the way back (the contract's downgrade, the old code deployed
again, the downgrade to the adopt revision) with the old code writing again.

Each step's wall time is printed as it ends and in a summary at the end (shown on pass:
the prints bypass pytest's capture). A watcher reads each command's output as it comes:
more than :data:`SILENCE` seconds without a line while a command runs fails the test (a
user sees a frozen terminal), and so does one refusal or retry message repeated more than
:data:`REFUSALS` times (a loop, whatever its backoff). At the end: every row a writer
committed is in the table, each shard is the hash of its sources, and the sharded reads
equal the plain ones.

The journey's own waits (a writer's first write, its stop, writes after a step) are no
more silent than a command: a line every :data:`REPORT_EVERY` s says what it waits for
and the writers' counts. On the emulator a writer's first write can take a minute while
another app writes (:data:`CONTENDED` says why on the first line of such a wait: the
emulator runs one read-write transaction at a time; Spanner does not).

The populated table has 3,000 rows (CI's size); ``SHARDED_ORM_JOURNEY_ROWS=50000 pytest
tests/test_adoption_timed.py -q`` rehearses the journey at another size (issue 42's own run
had 50,000; the timings print as they come, pytest's capture bypassed).
"""

from __future__ import annotations

import collections
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic_project import body, no_changes
from sqlalchemy.orm import Session
from test_adopting_journey import block, compose, load, page_blocks

from sharded_orm import compute_shard

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

PAGE = Path(__file__).resolve().parent.parent / "docs" / "adopting.md"

#: seconds a running command may go without an output line
SILENCE = 15.0
#: how often one refusal/retry line (digits aside) may repeat in a command's output
REFUSALS = 4
#: seconds between two lines while the journey waits on a writer (below SILENCE)
REPORT_EVERY = 10.0
#: seconds a writer may take for its first write while another writer runs (the emulator
#: took up to ~60 s at 50,000 rows, see CONTENDED), or to stop after its write under way
WRITER_WAIT = 120.0
#: why a writer's write can take most of a minute while another writer runs, on the
#: emulator only (said on a wait's first line while two writers run)
CONTENDED = (
    "the emulator runs one read-write transaction at a time: the two apps' inserts abort "
    "each other, each client re-runs its aborted insert at once, until one gets through; "
    "each insert holds the emulator longer as the table grows ({rows:,} rows here: ~0.35 s "
    "an insert at 50,000). Spanner locks rows, not the database: inserts of different "
    "rows do not wait for each other there"
)
#: the environment variable that sizes the populated table (to rehearse at your own size)
ROWS_ENV = "SHARDED_ORM_JOURNEY_ROWS"


def journey_rows() -> int:
    """The populated table's size: ``$SHARDED_ORM_JOURNEY_ROWS``, 3,000 without it (sized
    for the whole test to stay near two minutes on 2 cores)."""
    raw = os.environ.get(ROWS_ENV, "").strip().replace("_", "").replace(",", "")
    if not raw:
        return 3000
    if not raw.isdigit() or int(raw) < 1:
        raise pytest.UsageError(
            f"{ROWS_ENV}={os.environ[ROWS_ENV]!r}: give the populated table's row count as a "
            f"positive integer (e.g. {ROWS_ENV}=50000), or unset it for the default 3,000"
        )
    return int(raw)


#: the populated table
ROWS = journey_rows()
USERS = 12
#: seconds between two writes of a writer (a few rows a second)
PAUSE = 0.25

REFUSAL = re.compile(r"refus|reject|retry|retrying|waiting|aborted|concurrent", re.I)

#: sqlalchemy-spanner's env.py recipe, the app's engine module imported first: the app as
#: it is before it adopts the library
STOCK_ENV = """\
from myapp.db import engine  # the app's engine module, made first

from logging.config import fileConfig

from alembic import context
from alembic.ddl.impl import DefaultImpl

from myapp.models import Base

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name)


class SpannerImpl(DefaultImpl):
    __dialect__ = "spanner+spanner"


target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(
        url=str(engine.url),
        target_metadata=target_metadata,
        literal_binds=True,
        version_table_pk=False,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = engine.execution_options(isolation_level="AUTOCOMMIT")
    with connectable.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            version_table_pk=False,
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
"""

STOCK_DB = """\
import os

import sqlalchemy as sa

DATABASE_URL = os.environ["DATABASE_URL"]
engine = sa.create_engine(DATABASE_URL)
"""

#: a writer, old code or new: one row per transaction every PAUSE s until ``out/stop``;
#: the ids it committed go to ``out/ids``, its counts to ``out/writer.json``
WRITER = """\
import datetime as dt, json, os, sys, time, uuid
from pathlib import Path

{models}
from sqlalchemy.orm import Session

out = Path(sys.argv[1])
ok = failed = 0
errors = {{}}
with open(out / "ids", "a") as ids:
    while not (out / "stop").exists():
        row = str(uuid.uuid4())
        try:
            with Session(engine) as s:
                s.add(Event(id=row, user_handle=f"user{{ok % {users}}}", kind="{kind}",
                            payload={{"n": ok}}, created_at=dt.datetime.utcnow()))
                s.commit()
        except Exception as e:
            failed += 1
            msg = (str(getattr(e, "orig", None) or e).splitlines() or ["?"])[0][:160]
            errors[msg] = errors.get(msg, 0) + 1
        else:
            ok += 1
            ids.write(row + "\\n")
            ids.flush()
        tmp = out / "writer.tmp"
        tmp.write_text(json.dumps({{"ok": ok, "failed": failed, "errors": errors}}))
        os.replace(tmp, out / "writer.json")
        time.sleep({pause})
leaked = sorted(m for m in sys.modules if m.split(".")[0] == "sharded_orm")
print("{kind} code done:", ok, "written,", failed, "failed; sharded_orm loaded:", bool(leaked))
"""

OLD_MODELS = """\
{before}

import sqlalchemy as sa
engine = sa.create_engine(os.environ["DATABASE_URL"])
"""

NEW_MODELS = """\
from myapp.db import engine
from myapp.models import Event
"""

POPULATE = """\
import datetime as dt, os, uuid
{before}
from google.cloud.spanner_v1.data_types import JsonObject
from sqlalchemy.orm import Session

engine = sa.create_engine(os.environ["DATABASE_URL"])
Base.metadata.create_all(engine)
with Session(engine) as s:
    s.add_all(User(id=str(uuid.UUID(int=u)), handle=f"user{{u}}") for u in range({users}))
    s.commit()
# the app's own bulk import, in mutations (the emulator's batch DML slows as the table grows)
database = engine.raw_connection().driver_connection.database
t0 = dt.datetime(2024, 1, 1, 9, 0, tzinfo=dt.timezone.utc)
columns = ["id", "user_handle", "kind", "payload", "created_at"]
for start in range(0, {rows}, 500):
    with database.batch() as batch:
        batch.insert("events", columns, [
            (str(uuid.UUID(int=10**6 + i)), f"user{{i % {users}}}", "old",
             JsonObject({{"i": i}}), t0 + dt.timedelta(seconds=i))
            for i in range(start, min(start + 500, {rows}))
        ])
print("populated", {rows}, "events with", engine.dialect.__class__.__module__)
"""


class Writer:
    """A writer process (old code or new), its output dir and its counts."""

    def __init__(self, kind: str, script: Path, out: Path, env: dict[str, str]) -> None:
        self.kind, self.out = kind, out
        #: seconds its first write took (set by Journey.start_writer)
        self.first_write = 0.0
        out.mkdir()
        self.log = open(out / "output", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(out)], env=env, cwd=env["PYTHONPATH"],
            stdout=self.log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

    def stats(self) -> dict[str, Any]:
        path = self.out / "writer.json"
        return json.loads(path.read_text()) if path.exists() else {"ok": 0, "failed": 0}

    def ids(self) -> list[str]:
        path = self.out / "ids"
        return path.read_text().split() if path.exists() else []

    def stop(self) -> str:
        (self.out / "stop").touch()
        try:
            self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.log.close()
        text = (self.out / "output").read_text()
        assert self.proc.returncode == 0, text
        return text


class Journey:
    """The steps, their times, and a watcher over each command's output."""

    def __init__(self, root: Path, env: dict[str, str], capsys: Any) -> None:
        self.root, self.env, self.capsys = root, env, capsys
        self.times: list[tuple[str, float, str]] = []
        self.writers: list[Writer] = []
        #: every line said, in order
        self.said: list[str] = []
        #: seconds between two lines of a wait (:meth:`wait`)
        self.report_every = REPORT_EVERY

    def say(self, text: str) -> None:
        self.said.append(text)
        with self.capsys.disabled():
            print(text, flush=True)

    def counts(self) -> str:
        """What the running writers wrote so far."""
        said = []
        for w in self.writers:
            if w.proc.poll() is None:
                s = w.stats()
                said.append(f"{w.kind} code {s['ok']} rows, {s['failed']} failed")
        return "; ".join(said) or "no writer running"

    def wait(self, what: str, cond: Callable[[], bool], timeout: float) -> float:
        """Waits until ``cond()`` is true, saying what it waits for and the writers'
        counts every :attr:`report_every` s (and, on the first line while two writers run,
        why it may take long: :data:`CONTENDED`); fails after ``timeout`` s. Returns the
        seconds waited."""
        start = last = time.monotonic()
        lines = 0
        while not cond():
            now = time.monotonic()
            if now - start > timeout:
                pytest.fail(f"timed out after {timeout:g} s waiting for {what} ({self.counts()})")
            if now - last >= self.report_every:
                last = now
                live = [w for w in self.writers if w.proc.poll() is None]
                why = f" -- {CONTENDED.format(rows=ROWS)}" if len(live) > 1 and not lines else ""
                self.say(f"    waiting +{now - start:5.1f}s | {what}: {self.counts()}{why}")
                lines += 1
            time.sleep(0.05)
        return time.monotonic() - start

    @property
    def writing(self) -> Writer | None:
        live = [w for w in self.writers if w.proc.poll() is None]
        return live[-1] if live else None

    def step(self, name: str, seconds: float, extra: str = "") -> None:
        w = self.writing
        note = ""
        if w is not None:
            s = w.stats()
            note = f"{w.kind} code writing: {s['ok']} rows, {s['failed']} failed so far"
        note = ", ".join(n for n in (extra, note) if n)
        self.times.append((name, seconds, note))
        self.say(f"[adoption] {name}: {seconds:.1f} s {note}")

    def command(self, name: str, *argv: str) -> str:
        """A command as the user runs it, watched (see the module docstring)."""
        start = time.monotonic()
        proc = subprocess.Popen(
            argv, cwd=self.root, env=self.env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1,
        )  # fmt: skip
        assert proc.stdout is not None
        lines: queue.Queue[tuple[float, str] | None] = queue.Queue()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put((time.monotonic(), line.rstrip("\n")))
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        out: list[str] = []
        last = start
        seen: collections.Counter[str] = collections.Counter()
        try:
            while True:
                try:
                    item = lines.get(timeout=0.5)
                except queue.Empty:
                    if time.monotonic() - last > SILENCE:
                        pytest.fail(
                            f"{name}: no output for {SILENCE:g} s while it ran (a user sees a "
                            f"frozen terminal); its output so far:\n" + "\n".join(out)
                        )
                    continue
                if item is None:
                    break
                at, line = item
                last = at
                out.append(line)
                self.say(f"    {name} +{at - start:5.1f}s | {line}")
                if REFUSAL.search(line):
                    shape = re.sub(r"\d+(\.\d+)?", "#", line)
                    seen[shape] += 1
                    if seen[shape] > REFUSALS:
                        pytest.fail(
                            f"{name}: a refusal loop, {seen[shape]} times: {line}\n"
                            + "\n".join(out)
                        )
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        text = "\n".join(out)
        assert proc.returncode == 0, f"{' '.join(argv[1:])} failed:\n{text}"
        self.step(name, time.monotonic() - start)
        return text

    def alembic(self, name: str, *args: str) -> str:
        return self.command(name, sys.executable, "-m", "alembic", *args)

    def start_writer(self, kind: str, models: str) -> Writer:
        """A writer started, once it has written a row (said while it takes long)."""
        script = self.root / f"{kind}_writer_{len(self.writers)}.py"
        script.write_text(WRITER.format(models=models, users=USERS, kind=kind, pause=PAUSE))
        w = Writer(kind, script, self.root / f"{kind}_{len(self.writers)}", self.env)
        self.writers.append(w)
        w.first_write = self.wait(
            f"the {kind} code's first write", lambda: w.stats()["ok"] > 0, WRITER_WAIT
        )
        return w

    def stop_writer(self, w: Writer) -> str:
        """The writer stopped after its write under way (said while it takes long); its
        output."""
        (w.out / "stop").touch()
        self.wait(f"the {w.kind} code to stop (its write under way first)",
                  lambda: w.proc.poll() is not None, WRITER_WAIT)  # fmt: skip
        return w.stop()

    def summary(self) -> None:
        total = sum(t for _, t, _ in self.times)
        rows = [f"  {t:6.1f} s  {n}" + (f"  ({note})" if note else "") for n, t, note in self.times]
        self.say(
            "\n[adoption] the journey of docs/adopting.md, step by step:\n"
            + "\n".join(rows)
            + f"\n  {total:6.1f} s  in all (commands and checks; an engineer adds the edits "
            "and the deploys)"
        )
        for w in self.writers:
            s = w.stats()
            self.say(f"  {w.kind} code: {s['ok']} rows written, {s['failed']} failed: "
                     f"{s.get('errors')}")  # fmt: skip


def revision_of(root: Path, message: str) -> tuple[str, str]:
    """The id and text of the revision whose message is ``message``."""
    for path in (root / "migrations" / "versions").glob("*.py"):
        text = path.read_text()
        if text.startswith(f'"""{message}'):
            m = re.search(r"^revision: str = '(\w+)'", text, re.M)
            assert m is not None, text
            return m.group(1), text
    raise AssertionError(f"no revision {message!r}")


def in_page(command: str) -> None:
    """The test runs what the page tells the user to run."""
    assert command in PAGE.read_text(), f"docs/adopting.md no longer says `{command}`"


@pytest.fixture
def journey(tmp_path: Path, spanner_emulator: Any, capsys: Any) -> Iterator[Journey]:
    url = spanner_emulator.url(spanner_emulator.create_database())
    env = {
        **os.environ, "DATABASE_URL": url, "SPANNER_EMULATOR_HOST": spanner_emulator.host,
        "PYTHONPATH": str(tmp_path), "PYTHONUNBUFFERED": "1",
    }  # fmt: skip
    env.pop("SHARDED_ORM_PROGRESS", None)
    j = Journey(tmp_path, env, capsys)
    try:
        yield j
    finally:
        for w in j.writers:
            if w.proc.poll() is None:
                (w.out / "stop").touch()
                try:
                    w.proc.wait(60)
                except subprocess.TimeoutExpired:
                    w.proc.kill()
            w.log.close()
        j.summary()
        for name in [m for m in sys.modules if m.startswith("myapp_timed")]:
            del sys.modules[name]


def test_adoption_journey_timed(journey: Journey) -> None:
    j, root = journey, journey.root
    before = block("# myapp/models.py, before")
    assert "import os" not in before
    old_models = OLD_MODELS.format(before="import os\n" + before)

    # the app before: its models, its engine module, env.py in the stock recipe, rows
    app = root / "myapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "models.py").write_text(before)
    (app / "db.py").write_text(STOCK_DB)
    t = time.monotonic()
    populate = root / "populate.py"
    populate.write_text(POPULATE.format(before=before, users=USERS, rows=ROWS))
    made = subprocess.run(
        [sys.executable, str(populate)], env=j.env, capture_output=True, text=True, timeout=300
    )
    assert made.returncode == 0, made.stderr
    assert "google.cloud.sqlalchemy_spanner" in made.stdout  # the stock dialect wrote them
    j.step(f"(setup) the old app's database, {ROWS:,} events", time.monotonic() - t)
    j.alembic("(setup) alembic init", "init", "migrations")
    env_py = root / "migrations" / "env.py"
    env_py.write_text(STOCK_ENV)
    old = j.start_writer("old", old_models)

    # 2. the engine module: import sharded_orm first
    db = block("# myapp/db.py")
    assert db.splitlines()[1].startswith("import sharded_orm")
    (app / "db.py").write_text(
        db.replace("engine = ", 'import os\n\nDATABASE_URL = os.environ["DATABASE_URL"]\n'
                   "engine = ", 1)
    )  # fmt: skip
    # 3. env.py: `import sharded_orm` first, the plugin; the own SpannerImpl and
    # AUTOCOMMIT deleted (version_table_pk=False stays: the page says it may)
    text = PAGE.read_text()
    flat = " ".join(text.split())
    assert "`import sharded_orm` as its first line" in flat, "the page's env.py step changed"
    assert 'delete your own `SpannerImpl` class and `isolation_level="AUTOCOMMIT"`' in flat
    env = "import sharded_orm  # noqa: F401\n" + STOCK_ENV
    env = re.sub(r"class SpannerImpl\(DefaultImpl\):\n.*?\n\n\n", "", env, flags=re.S)
    env = env.replace('engine.execution_options(isolation_level="AUTOCOMMIT")', "engine")
    env = env.replace(
        "target_metadata=target_metadata,",
        "target_metadata=target_metadata,\n"
        "            autogenerate_plugins=['alembic.autogenerate.*', 'sharded_orm.*'],",
    )
    assert "SpannerImpl" not in env and "AUTOCOMMIT" not in env
    env_py.write_text(env)
    in_page('alembic revision --autogenerate -m "adopt sharded-orm"')
    j.alembic("3. alembic revision --autogenerate (adopt)", "revision", "--autogenerate",
              "-m", "adopt sharded-orm")  # fmt: skip
    adopt, script = revision_of(root, "adopt sharded-orm")
    assert no_changes(script), script
    j.alembic("3. alembic upgrade head (adopt)", "upgrade", "head")

    # the count: if the page has the user ask `sharded-orm advise`, ask it
    advise = re.search(r"^\$ sharded-orm (advise .*)$", text, re.M)
    if advise is not None:
        words = advise.group(1).split()
        if "--url" in words:
            words[words.index("--url") + 1] = j.env["DATABASE_URL"]
        cli = str(Path(sys.executable).parent / "sharded-orm")
        said = j.command("4. sharded-orm advise (the count)", cli, *words)
        assert "recommended:" in said and "shard_column(" in said, said

    # 4. the expand, with the old code writing
    expand_src = compose(before, block("# myapp/models.py, the expand"))
    (app / "models.py").write_text(expand_src)
    message = "events: shard column (expand)"
    in_page(f'alembic revision --autogenerate -m "{message}"')
    j.alembic("4. alembic revision --autogenerate (expand)", "revision", "--autogenerate",
              "-m", message)  # fmt: skip
    _, script = revision_of(root, message)
    generated = [b for b in page_blocks() if b.startswith("# generated")]
    assert len(generated) == 2
    have = {ln.strip() for ln in body(script, "upgrade").splitlines()}
    assert {ln.strip() for ln in generated[0].splitlines()[1:]} <= have, script
    out = j.alembic("4. alembic upgrade head (expand, its backfill)", "upgrade", "head")
    # the backfill said what it did: its size, then what it filled
    assert re.search(r"backfill events.EventShard: done, [\d,]+ rows in .*: [\d,]+ filled", out)
    assert re.search(r"backfill events.EventShard: [\d,]+ rows in all", out)  # its size
    untotalled = re.findall(r"backfill events.EventShard: [1-9][\d,]* rows, .*", out)
    assert not untotalled, untotalled  # each line: how much of how many, and the time left
    for line in re.findall(r"backfill events.EventShard: [\d,]+ / .*", out):
        assert ", ETA " in line, line

    # deploy: the new code writes (it fills the shard); the old code stops
    t = time.monotonic()
    new = j.start_writer("new", NEW_MODELS)
    stopping = time.monotonic()
    old_text = j.stop_writer(old)
    assert "sharded_orm loaded: False" in old_text, old_text
    j.step("4. deploy the new code", time.monotonic() - t,
           f"first write of the new code in {new.first_write:.1f} s, the old code stopped "
           f"in {time.monotonic() - stopping:.1f} s")  # fmt: skip

    # the contract, with the new code writing
    contract_src = compose(expand_src, block("# myapp/models.py, the contract"))
    (app / "models.py").write_text(contract_src)
    message = "events: sharded index (contract)"
    j.alembic("4. alembic revision --autogenerate (contract)", "revision", "--autogenerate",
              "-m", message)  # fmt: skip
    _, script = revision_of(root, message)
    have = {ln.strip() for ln in body(script, "upgrade").splitlines()}
    assert {ln.strip() for ln in generated[1].splitlines()[1:]} <= have, script
    j.alembic("4. alembic upgrade head (contract)", "upgrade", "head")
    n = new.stats()["ok"]
    j.wait("writes of the new code after the contract", lambda: new.stats()["ok"] > n + 2, 60)
    j.stop_writer(new)

    # 5. the reads, as the page writes them, equal the plain reads
    t = time.monotonic()
    import sharded_orm  # noqa: F401  (this process reads with the library's dialect)

    engine = sa.create_engine(j.env["DATABASE_URL"])
    contract = load(contract_src, "myapp_timed_models")
    event = contract["Event"]
    reads = load(block("from sqlalchemy.orm import Session"), "myapp_timed_reads",
                 Event=event, engine=engine)  # fmt: skip
    j.step("5. the page's reads: merged() 50, two page()s of 20", time.monotonic() - t)
    t = time.monotonic()
    written = set(old.ids()) | set(new.ids())
    with Session(engine) as s:
        plain = list(s.scalars(sa.select(event.id).order_by(event.created_at.desc(), event.id)))
        assert len(plain) == ROWS + len(written)
        assert written <= set(plain)  # every row a writer committed is there
        assert [e.id for e in reads["latest"]] == plain[:50]
        assert [e.id for e in reads["first"].rows] == plain[:20]
        assert [e.id for e in reads["second"].rows] == plain[20:40]
        walked: list[str] = []
        cursor = None
        while True:
            p = reads["page"](s, reads["newest"], 500, cursor)
            walked.extend(e.id for e in p.rows)
            if p.next_cursor is None:
                break
            cursor = p.next_cursor
        assert walked == plain  # every row is findable through the sharded index
        stored = s.execute(sa.select(event.created_at, event.shard)).all()
        wrong = [(c, sh) for c, sh in stored if sh != compute_shard((c,), 16)]
        assert not wrong, wrong[:5]
    engine.dispose()
    j.step(f"5. checks: a page() walk of 500s == the plain read ({len(plain):,} rows)",
           time.monotonic() - t)  # fmt: skip

    # 6. back: the contract's downgrade, the old code deployed again, then down to adopt
    in_page("alembic downgrade -1")
    j.alembic("6. alembic downgrade -1 (the contract)", "downgrade", "-1")
    t = time.monotonic()
    (app / "models.py").write_text(before)
    again = j.start_writer("old", old_models)
    j.step("6. deploy the old code again", time.monotonic() - t)
    j.alembic("6. alembic downgrade <the adopt revision>", "downgrade", adopt)
    n = again.stats()["ok"]
    j.wait("writes of the old code after the rollback", lambda: again.stats()["ok"] > n + 2, 60)
    assert "sharded_orm loaded: False" in j.stop_writer(again)

    engine = sa.create_engine(j.env["DATABASE_URL"])
    md = load(before, "myapp_timed_before")["Base"].metadata
    with engine.connect() as c:  # the database is the app's of before again
        opts = {"autogenerate_plugins": ["alembic.autogenerate.*", "sharded_orm.*"]}
        assert compare_metadata(MigrationContext.configure(c, opts=opts), md) == []
        ids = set(c.scalars(sa.text("SELECT id FROM events")))
    engine.dispose()
    everything = set(old.ids()) | set(new.ids()) | set(again.ids())
    assert everything <= ids, len(everything - ids)
    assert len(ids) == ROWS + len(everything)
    assert all(w.stats()["ok"] > 0 for w in j.writers)
