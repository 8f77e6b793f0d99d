"""Issue 42: ``sharded-orm advise`` sizes a table BEFORE it has a shard column.

The table of docs/adopting.md as it is before the library (events indexed by a growing
``created_at``, no shard column), with rows in it: advise finds the key space that grows
as doctor does, reads the newest rows (bounded), measures their rate at the busiest
window (bursts count), and answers with the count, the busiest split's share and the
read's cost, and the ``shard_column(..., count=N)`` the page's expand step then declares.
On SQLite and on the emulator, through the real entry point (``sharded_orm.tools.cli:main``).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shlex
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import set_naive_datetimes, shard_column
from sharded_orm.errors import ShardingError
from sharded_orm.schema.indexes import ShardedIndex
from sharded_orm.tools.advise import advise
from sharded_orm.tools.cli import main
from sharded_orm.tools.simulate import Instance

ROOT = Path(__file__).resolve().parent.parent
T0 = dt.datetime(2024, 1, 1, 9, 0)  # naive, as the page's app writes datetime.utcnow()

#: the page's "before" model (no shard column), and tables advise must refuse or quote
APP = """
import datetime as dt
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Event(Base):
    __tablename__ = "events"
    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    user_handle: Mapped[str] = mapped_column(sa.String(30))
    kind: Mapped[str] = mapped_column(sa.String(20))
    created_at: Mapped[dt.datetime] = mapped_column(sa.DateTime)
    __table_args__ = (sa.Index("events_by_time", "created_at"),)


class Tag(Base):  # no time-ordered column at all
    __tablename__ = "tags"
    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    label: Mapped[str] = mapped_column(sa.String(30))
    __table_args__ = (sa.Index("tags_by_label", "label"),)


HOSTILE = sa.Table(
    {hostile!r}, sa.MetaData(),
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("created at", sa.DateTime, key="created_at"),
    sa.Index("ByTime", "created_at"),
)
"""

#: SQLite accepts any name quoted; Spanner only identifiers (a reserved word, quoted)
HOSTILE_SQLITE = 'ev"en`ts; DROP TABLE events; --'
HOSTILE_SPANNER = "Select"

#: the instance the rates below are sized on: a split is warm above 30 writes/s
INSTANCE = ["--nodes", "10", "--node-capacity", "60", "--candidates", "1,2,4,8,10,16,32"]


def steady(n: int = 3000, rate: float = 50.0) -> list[dt.datetime]:
    """``n`` writes evenly at ``rate``/s (60 s for the defaults)."""
    return [T0 + dt.timedelta(seconds=i / rate) for i in range(n)]


def bursty() -> list[dt.datetime]:
    """The same 3,000 writes in the same 60 s (the same mean, 50/s): 2,500 of them in
    10 s (250/s), the rest over the other 50 s."""
    burst = [T0 + dt.timedelta(seconds=i / 250) for i in range(2500)]
    rest = [T0 + dt.timedelta(seconds=10 + i / 10) for i in range(500)]
    return burst + rest


def rows(times: list[dt.datetime]) -> list[dict[str, Any]]:
    return [
        {"id": str(uuid.UUID(int=i)), "user_handle": f"user{i % 7}", "kind": "k", "created_at": t}
        for i, t in enumerate(times)
    ]


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The page's models as module ``advise_app_<n>`` (the CLI imports it by name)."""
    name = f"advise_app_{uuid.uuid4().hex[:8]}"
    hostile = HOSTILE_SQLITE
    (tmp_path / f"{name}.py").write_text(APP.format(hostile=hostile))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SHARDED_ORM_PROGRESS", "off")
    module = __import__(name)
    yield module
    sys.modules.pop(name, None)


@pytest.fixture(params=["sqlite", pytest.param("spanner", marks=pytest.mark.emulator)])
def db(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """(URL, engine) of an empty database: a SQLite file, or a fresh emulator database."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'app.db'}"
        engine = sa.create_engine(url)
        yield url, engine
        engine.dispose()
        return
    emu = request.getfixturevalue("spanner_emulator")
    monkeypatch.setenv("SPANNER_EMULATOR_HOST", emu.host)
    database = emu.create_database()
    engine = emu.engine(database)
    engine.info = {"mutations": emu.database(database)}  # the rows go in as mutations (fast)
    yield emu.url(database), engine
    engine.dispose()


def fill(engine: Any, table: Any, data: list[dict[str, Any]]) -> None:
    table.create(engine)
    if not data:
        return
    database = getattr(engine, "info", {}).get("mutations")
    if database is None:
        with engine.begin() as conn:
            conn.execute(table.insert(), data)
        return
    names = {c.key: c.name for c in table.columns}
    utc = dt.timezone.utc
    for start in range(0, len(data), 2000):
        with database.batch() as batch:
            batch.insert(
                table.name,
                [names[k] for k in data[0]],
                [[v.replace(tzinfo=utc) if isinstance(v, dt.datetime) else v for v in r.values()]
                 for r in data[start : start + 2000]],
            )  # fmt: skip


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- the answer -------------------------------------------------------------------------------


# simulates every count; quick loop: test_the_columns_to_hash_and_the_index_can_be_named
@pytest.mark.slow
def test_a_populated_table_without_a_shard_column_gets_a_count(
    app: Any, db: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url, engine = db
    fill(engine, app.Event.__table__, rows(steady()))
    target = f"{app.__name__}:Event"
    code, out, err = cli(capsys, "advise", target, "--url", url, *INSTANCE)
    assert code == 0, err
    assert "events (no shard column yet): a shard column over created_at leading " in out
    assert "events_by_time: 3000 rows of events in the database, 50 rows/s" in out
    assert re.search(r"^recommended: 2 shards: the busiest split takes \d+\.\d% of the writes",
                     out, re.M), out  # fmt: skip
    assert 'in the model: shard_column("created_at", count=2)' in out
    code, out, err = cli(capsys, "advise", target, "--url", url, *INSTANCE, "--format", "json")
    summary = json.loads(out)["summary"]
    assert code == 0 and summary["recommended_count"] == 2, err
    assert summary["shard_column"] is None and summary["shard_sources"] == ["created_at"]
    assert summary["model"] == 'shard_column("created_at", count=2)'
    assert summary["key_space"] == "events_by_time"
    assert 0.5 < summary["busiest_split_share"] < 0.6  # two tails, each about half


# simulates twice; quick loop: test_the_columns_to_hash_and_the_index_can_be_named
@pytest.mark.slow
def test_bursts_get_more_shards_than_a_steady_rate_of_the_same_mean(
    app: Any, db: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url, engine = db
    fill(engine, app.Event.__table__, rows(bursty()))
    code, out, err = cli(
        capsys, "advise", f"{app.__name__}:Event", "--url", url, *INSTANCE, "--format", "json"
    )
    summary = json.loads(out)["summary"]
    assert code == 0, err
    assert summary["mean_rows_per_second"] == pytest.approx(50, rel=0.01)
    assert summary["rows_per_second"] > 200  # the burst's rate, not the mean
    assert summary["busiest_window_seconds"] == 10.0
    # the steady table's answer is 2; 250/s over 30/s a split: 10 at the least (16 here:
    # at 10 the busiest of the hashed tails is at the target)
    count = summary["recommended_count"]
    assert count in (10, 16), out
    assert summary["model"] == f'shard_column("created_at", count={count})'


#: the emulator case reads the same rows through Spanner, as the other tests here do on
#: both; quick loop: test_the_columns_to_hash_and_the_index_can_be_named on SQLite
SQLITE_QUICK = ["sqlite", pytest.param("spanner", marks=[pytest.mark.emulator, pytest.mark.slow])]


@pytest.mark.parametrize("db", SQLITE_QUICK, indirect=True)
def test_the_columns_to_hash_and_the_index_can_be_named(
    app: Any, db: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url, engine = db
    fill(engine, app.Event.__table__, rows(steady()))
    code, out, err = cli(
        capsys, "advise", f"{app.__name__}:Event", "--url", url, *INSTANCE,
        "--shard-on", "user_handle,created_at", "--index", "events_by_time", "--format", "json",
    )  # fmt: skip
    summary = json.loads(out)["summary"]
    assert code == 0, err
    assert summary["shard_sources"] == ["user_handle", "created_at"]
    assert summary["model"].startswith('shard_column("user_handle", "created_at", count=')


# --- refusals: what is wrong, what to do ------------------------------------------------------


def test_an_empty_table_is_refused_saying_what_to_do(
    app: Any, db: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url, engine = db
    fill(engine, app.Event.__table__, [])
    code, out, err = cli(capsys, "advise", f"{app.__name__}:Event", "--url", url)
    assert code == 2 and out == ""
    assert err.startswith("sharded-orm: error: events in the database: no rows to learn from")
    assert "table events is empty" in err and "run it once the table has rows" in err
    assert "--csv" in err and "--rows-per-second" in err


def test_a_table_without_a_time_ordered_column_is_refused(
    app: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = cli(
        capsys, "advise", f"{app.__name__}:Tag", "--rows-per-second", "100", "--duration", "10"
    )
    assert code == 2, out
    assert "tags has no time-ordered column (a timestamp, a counter): nothing to size" in err
    assert "index tags_by_label: label" in err and "--shard-on" in err


def test_a_growing_column_that_is_not_hashed_is_refused(app: Any) -> None:
    with pytest.raises(ShardingError, match=r"no key or index of events grows with created_at "
                       r"among the columns to hash \(user_handle\)"):  # fmt: skip
        advise(app.Event, rows(steady(100)), shard_on=["user_handle"])


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--shard-on", "created_at; DROP TABLE events", "has no column 'created_at; DROP TABLE"),
        ("--shard-on", "created_at,,kind", "--shard-on takes column names"),
        ("--index", 'events_by_time"; DROP TABLE events; --', "has no unsharded index"),
    ],
)
def test_hostile_names_on_the_command_line_are_refused(
    app: Any, db: Any, capsys: pytest.CaptureFixture[str], option: str, value: str, words: str
) -> None:
    url, engine = db
    fill(engine, app.Event.__table__, rows(steady(200)))
    code, out, err = cli(capsys, "advise", f"{app.__name__}:Event", "--url", url, option, value)
    assert code == 2 and words in err, err
    with engine.connect() as conn:  # nothing ran
        assert conn.execute(sa.select(sa.func.count()).select_from(app.Event)).scalar() == 200


def test_a_hostile_table_name_is_quoted(
    app: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'hostile.db'}"
    engine = sa.create_engine(url)
    fill(engine, app.Event.__table__, rows(steady(100)))
    fill(engine, app.HOSTILE, [{"id": str(i), "created_at": t} for i, t in enumerate(steady())])
    code, out, err = cli(capsys, "advise", f"{app.__name__}:HOSTILE", "--url", url, *INSTANCE)
    assert code == 0, err
    assert f"{HOSTILE_SQLITE} (no shard column yet)" in out
    assert 'in the model: shard_column("created_at", count=2)' in out
    with engine.connect() as conn:  # the other table is still there, with its rows
        assert conn.execute(sa.select(sa.func.count()).select_from(app.Event)).scalar() == 100
    engine.dispose()


@pytest.mark.emulator
def test_a_reserved_word_table_name_is_quoted_on_spanner(
    spanner_emulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = sa.Table(
        HOSTILE_SPANNER, sa.MetaData(),
        sa.Column("Id", sa.String(36), primary_key=True),
        sa.Column("Order", sa.DateTime),
        sa.Index("ByOrder", "Order"),
    )  # fmt: skip
    database = spanner_emulator.create_database()
    engine = spanner_emulator.engine(database)
    engine.info = {"mutations": spanner_emulator.database(database)}
    fill(engine, table, [{"Id": str(i), "Order": t} for i, t in enumerate(steady(600))])
    a = advise(table, engine, instance=Instance(nodes=10, node_capacity=60), candidates=(1, 2, 4))
    assert a.count == 2 and len(a.sample.rows) == 600
    assert a.model_line == 'shard_column("Order", count=2)'
    engine.dispose()


# --- the rate: bursts count, by property ------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rate=st.integers(5, 30), factor=st.integers(1, 6))
def test_a_burst_never_lowers_the_count(rate: int, factor: int) -> None:
    """``rate``/s for 60 s, steady; then its first 10 s ``factor`` times faster: the count
    never goes down, and the busiest split of each answer is under the target."""

    class B(DeclarativeBase):
        pass

    class Ev(B):
        __tablename__ = "ev"
        id: Mapped[str] = mapped_column(sa.String(20), primary_key=True)
        at: Mapped[dt.datetime] = mapped_column(sa.DateTime)
        __table_args__ = (sa.Index("ev_by_at", "at"),)

    n = 60 * rate
    flat = [T0 + dt.timedelta(seconds=i / rate) for i in range(n)]
    burst_n = 10 * rate * factor
    burst = [T0 + dt.timedelta(seconds=i / (rate * factor)) for i in range(burst_n)]
    spiky = burst + flat[10 * rate :]  # the first 10 s, ``factor`` times faster
    kw: dict[str, Any] = {
        "instance": Instance(nodes=20, node_capacity=60),
        "candidates": (1, 2, 4, 8, 16, 32, 64),
        "pages": 1,
        "k": 20,
    }
    one = advise(Ev, [{"id": str(i), "at": t} for i, t in enumerate(flat)], **kw)
    two = advise(Ev, [{"id": str(i), "at": t} for i, t in enumerate(spiky)], **kw)
    assert one.count is not None and two.count is not None
    assert two.count >= one.count, (one.table(), two.table())
    assert two.sample.rows_per_second >= one.sample.rows_per_second
    for a in (one, two):
        best = a.best
        assert best is not None and best.peak_split_writes <= a.target
        assert a.share(best) * a.sample.rows_per_second <= a.target + 1e-9


# --- siblings: a sharded model's naive datetimes, a column key that is not its name ------------


def test_a_sharded_model_with_naive_datetimes_as_utc_reads_its_rows() -> None:
    """The contract's model of docs/adopting.md: ``sa.DateTime`` (naive, as SQLite returns
    it) and ``set_naive_datetimes(Base, "utc")``: its variants keep the Base's policy."""

    class B(DeclarativeBase):
        pass

    set_naive_datetimes(B, "utc")

    class Ev(B):
        __tablename__ = "events"
        id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
        created_at: Mapped[dt.datetime] = mapped_column(sa.DateTime)
        shard: Mapped[int] = shard_column("created_at", count=16, name="EventShard")
        __table_args__ = (ShardedIndex("events_newest", sa.desc("created_at"), shard="EventShard"),)

    engine = sa.create_engine("sqlite://")
    B.metadata.create_all(engine)
    with sa.orm.Session(engine) as s:
        s.add_all(Ev(id=str(i), created_at=t) for i, t in enumerate(steady(600)))
        s.commit()
    a = advise(Ev, engine, instance=Instance(nodes=10, node_capacity=60), candidates=(1, 2, 4))
    assert a.count == 2 and a.layout.shard.name == "EventShard"
    assert "events.EventShard (now 16 shards)" in a.table()


def test_a_growing_column_whose_key_is_not_its_name() -> None:
    ts = sa.Column("Timestamp", sa.DateTime(timezone=True), key="ts")
    table = sa.Table(
        "Logs", sa.MetaData(),
        sa.Column("Id", sa.String(36), primary_key=True), ts,
        shard_column("ts", count=4, name="Shard", naive_datetimes="utc").column,
    )  # fmt: skip
    ShardedIndex("LogsByTime", sa.desc(ts), shard="Shard")
    engine = sa.create_engine("sqlite://")
    table.create(engine)
    utc = dt.timezone.utc
    with engine.begin() as conn:
        conn.execute(
            table.insert(),
            [{"Id": str(i), "ts": t.replace(tzinfo=utc)}
             for i, t in enumerate(steady(600))],
        )  # fmt: skip
    a = advise(table, engine, instance=Instance(nodes=10, node_capacity=60), candidates=(1, 2))
    assert a.count == 2 and len(a.sample.rows) == 600


# --- docs/adopting.md: the line the page types, and the count it then uses --------------------


def _page_line() -> str:
    text = (ROOT / "docs" / "adopting.md").read_text()
    (line,) = [
        ln.removeprefix("$ ").strip()
        for ln in text.splitlines()
        if ln.removeprefix("$ ").startswith("sharded-orm advise ")
    ]
    return line


@pytest.mark.emulator
@pytest.mark.slow
def test_the_adopting_page_advise_line_gives_the_count_the_page_uses(
    spanner_emulator: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The page's "before" models on the emulator, with users and the events of its
    busiest second (20,000/s); the page's advise line as typed (the URL the emulator's):
    its answer is the excerpt the page prints, and the count the expand step declares."""
    page = (ROOT / "docs" / "adopting.md").read_text()
    before = re.search(r"```python\n(# myapp/models.py, before\n.*?)```", page, re.S)
    expand = re.search(r"```python\n# myapp/models.py, the expand\n(.*?)```", page, re.S)
    shown = re.search(r"```text\n(recommended: .*?)```", page, re.S)
    assert before and expand and shown
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "models.py").write_text(before.group(1))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SHARDED_ORM_PROGRESS", "off")
    monkeypatch.setenv("SPANNER_EMULATOR_HOST", spanner_emulator.host)
    for name in [m for m in sys.modules if m.split(".")[0] == "myapp"]:
        monkeypatch.delitem(sys.modules, name)
    try:
        from myapp import models  # type: ignore[import-not-found]

        database = spanner_emulator.create_database()
        engine = spanner_emulator.engine(database)
        models.Base.metadata.create_all(engine)
        utc = dt.timezone.utc
        with spanner_emulator.database(database).batch() as batch:
            batch.insert("users", ["id", "handle"],
                         [[str(uuid.UUID(int=u)), f"user{u}"] for u in range(7)])  # fmt: skip
        with spanner_emulator.database(database).batch() as batch:
            batch.insert(
                "events", ["id", "user_handle", "kind", "created_at"],
                [[r["id"], r["user_handle"], "k", r["created_at"].replace(tzinfo=utc)]
                 for r in rows(steady(4000, 20_000.0))],
            )  # fmt: skip
        engine.dispose()
        argv = shlex.split(_page_line())[1:]
        argv = [spanner_emulator.url(database) if "://" in a else a for a in argv]
        code, out, err = cli(capsys, *argv)
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "myapp"]:
            del sys.modules[name]
    assert code == 0, err
    for line in shown.group(1).splitlines():
        assert line in out.splitlines(), (line, out)
    counts = set(re.findall(r"count=(\d+)", expand.group(1)))
    advised = re.search(r'in the model: shard_column\("created_at", count=(\d+)\)', out)
    assert advised and counts == {advised.group(1)}, (counts, out)
