"""``advise`` on the workloads people have (issue 43) and the samples they read (issue 42):
naive timestamps said to be read as UTC; an integer ``id`` beside a time index counted as a
growing key space only when its values grow with time; the newest rows read through the
time index on Spanner (``@{FORCE_INDEX=...}``); heavy skew settled by simulating the
counts the model is unsure of; a burst's window stated and sized for; every numeric flag's
range checked by the CLI."""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from examples import hotspots as h
from sharded_orm import bit_reverse, shard_column
from sharded_orm.schema.columns import shard_columns
from sharded_orm.tools.advise import advise
from sharded_orm.tools.advise.sample import from_rows, grows_with_time
from sharded_orm.tools.cli import main
from sharded_orm.tools.simulate import Instance, Workload, simulate

T0 = dt.datetime(2024, 1, 1, 9, 0)  # naive, as an app writing datetime.utcnow() has them
UTC = dt.timezone.utc
#: a split is warm above 175 writes/s (a tenth of the docs' node capacity, as the sweep)
SWEEP_INSTANCE = Instance(nodes=30, node_capacity=350.0, tick=5)
INSTANCE = ["--nodes", "6", "--node-capacity", "350", "--tick", "10"]
COUNTS = "1,2,4,8,16"

APP = """
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
import datetime as dt


class Base(DeclarativeBase):
    pass


class Event(Base):
    __tablename__ = "events"
    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    created_at: Mapped[dt.datetime] = mapped_column(sa.DateTime)
    __table_args__ = (sa.Index("Select", "created_at"),)  # a reserved word: quoted


class Order(Base):  # an integer id beside a time index
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    created_at: Mapped[dt.datetime] = mapped_column(sa.DateTime)
    __table_args__ = (sa.Index("orders_by_time", "created_at"),)
"""


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    name = f"advise_peaks_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SHARDED_ORM_PROGRESS", "off")
    module = __import__(name)
    yield module
    sys.modules.pop(name, None)


@pytest.fixture(params=["sqlite", pytest.param("spanner", marks=pytest.mark.emulator)])
def db(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """(URL, engine, the SQL statements it was sent) of an empty database."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'app.db'}"
        engine = sa.create_engine(url)
        mutations = None
    else:
        emu = request.getfixturevalue("spanner_emulator")
        monkeypatch.setenv("SPANNER_EMULATOR_HOST", emu.host)
        database = emu.create_database()
        url, engine, mutations = emu.url(database), emu.engine(database), emu.database(database)
    # every engine's statements (the CLI makes its own from the URL), through SQLAlchemy's
    # statement log: a listener on the Engine class would leave every later engine flagged
    # as having events (tests/test_invisible.py checks none is)
    handler = _Statements()
    logger = logging.getLogger("sqlalchemy.engine.Engine")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield url, engine, mutations, handler.sent
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        engine.dispose()


class _Statements(logging.Handler):
    """The messages of SQLAlchemy's statement log: each statement's text (and its
    parameters' lines, which no check here matches)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.sent: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.sent.append(record.getMessage())


def fill(db: Any, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    _, engine, mutations, _ = db
    table.create(engine)
    if mutations is None:
        with engine.begin() as conn:
            conn.execute(table.insert(), rows)
        return
    names = [table.c[k].name for k in rows[0]]
    for start in range(0, len(rows), 2000):
        with mutations.batch() as batch:
            batch.insert(table.name, names, [
                [v.replace(tzinfo=UTC) if isinstance(v, dt.datetime) else v for v in r.values()]
                for r in rows[start : start + 2000]
            ])  # fmt: skip


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def steady(n: int = 3000, per_second: float = 50.0) -> list[dt.datetime]:
    return [T0 + dt.timedelta(seconds=i / per_second) for i in range(n)]


def bursty() -> list[dt.datetime]:
    """10 minutes at 5 rows/s, and one 20 s burst at 600 rows/s 5 minutes in (issue 43)."""
    calm = [T0 + dt.timedelta(seconds=i / 5) for i in range(600 * 5)]
    burst = [T0 + dt.timedelta(seconds=300 + i / 600) for i in range(20 * 600)]
    return sorted(calm + burst)


def events(times: list[dt.datetime]) -> list[dict[str, Any]]:
    rng = random.Random(7)
    return [{"id": f"{rng.getrandbits(128):032x}", "created_at": t} for t in times]


# --- (A) naive timestamps: said to be read as UTC -----------------------------------------------


# simulates every count; quick loop: test_a_csvs_times_without_a_zone_are_said_to_be_utc
@pytest.mark.slow
def test_naive_timestamps_are_said_to_be_read_as_utc(
    app: Any, db: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """SQLite's DateTime returns the app's naive values: the output says they were read as
    UTC, and the line to declare hashes them so (without it every naive insert would be
    refused). Spanner returns its TIMESTAMPs with their zone: nothing to say there."""
    url, engine, mutations, _ = db
    fill(db, app.Event.__table__, events(steady()))
    code, out, _ = cli(capsys, "advise", f"{app.__name__}:Event", "--url", url,
                       "--candidates", COUNTS, *INSTANCE)  # fmt: skip
    assert code == 0, out
    code, js, _ = cli(capsys, "advise", f"{app.__name__}:Event", "--url", url,
                      "--candidates", COUNTS, *INSTANCE, "--format", "json")  # fmt: skip
    summary = json.loads(js)["summary"]
    if mutations is None:
        assert "created_at: datetimes without a timezone, read as UTC" in out
        assert 'set_naive_datetimes(Base, "utc")' in out and 'naive_datetimes="utc"' in out
        assert summary["naive_datetimes_read_as_utc"] == ["created_at"]
    else:
        assert "without a timezone" not in out and "naive_datetimes" not in out
        assert summary["naive_datetimes_read_as_utc"] == []


def test_the_advice_names_the_opt_in_the_apps_naive_writes_need(app: Any) -> None:
    """The line advise prints, with the opt-in its note names, takes the naive datetimes
    the app wrote (hashed as UTC); without it they are refused."""
    a = advise(app.Event, events(steady()), candidates=(1, 2, 4), instance=Instance(tick=10))
    assert a.naive_text is not None and 'naive_datetimes="utc"' in a.naive_text
    assert a.model_line is not None
    line = a.model_line[:-1] + ', naive_datetimes="utc")'

    class Base(DeclarativeBase):
        pass

    class E(Base):
        __tablename__ = "events"
        id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
        created_at: Mapped[dt.datetime] = mapped_column(sa.DateTime)
        shard: Mapped[int] = eval(line, {"shard_column": shard_column})  # noqa: S307 - ours

    engine = sa.create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        session.add(E(id="a", created_at=T0))  # naive, as the app writes it: not refused
    with engine.connect() as conn:
        [(stored,)] = conn.execute(sa.select(E.__table__.c.shard)).all()
    [sc] = shard_columns(E)
    assert stored == sc.compute([T0.replace(tzinfo=UTC)])  # the UTC instant's shard


@pytest.mark.parametrize(("text", "naive"), [("2024-01-01 09:00:00", True),
                                             ("2024-01-01T09:00:00Z", False),
                                             ("2024-01-01T10:00:00+01:00", False)])  # fmt: skip
def test_a_csvs_times_without_a_zone_are_said_to_be_utc(
    app: Any, tmp_path: Path, text: str, naive: bool
) -> None:
    path = tmp_path / "rows.csv"
    lines = ["id,created_at"] + [f"r{i},{_shift(text, i / 50)}" for i in range(500)]
    path.write_text("\n".join(lines) + "\n")
    a = advise(app.Event, str(path), candidates=(1, 2), instance=Instance(tick=1))
    assert a.sample.naive == (("created_at",) if naive else ())
    assert ("read as UTC" in a.table()) is naive


def _shift(text: str, seconds: float) -> str:
    """``text`` (an ISO time, with its zone or none) ``seconds`` later, written the same way."""
    zulu = text.endswith("Z")
    v = dt.datetime.fromisoformat(text.replace("Z", "+00:00")) + dt.timedelta(seconds=seconds)
    out = v.isoformat(sep=text[10])
    return out.replace("+00:00", "Z") if zulu else out


# --- (B) an integer id beside a time index ------------------------------------------------------


def orders(ids: list[int]) -> list[dict[str, Any]]:
    return [{"id": i, "created_at": t} for i, t in zip(ids, steady(len(ids)), strict=True)]


#: the emulator case (3,000 rows written, every count simulated) only repeats what SQLite
#: shows, the rows' order; quick loop:
#: test_an_id_that_does_not_grow_with_time_is_no_second_key_space on SQLite,
#: test_the_sample_is_read_through_the_time_index on both
SQLITE_QUICK = ["sqlite", pytest.param("spanner", marks=[pytest.mark.emulator, pytest.mark.slow])]


@pytest.mark.parametrize("db", SQLITE_QUICK, indirect=True)
def test_an_id_that_does_not_grow_with_time_is_no_second_key_space(
    app: Any, db: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bit-reversed ids (a Spanner sequence's) named ``id``: the rows show they do not grow,
    so the time index is sized, and the output says why the id was not taken."""
    url, *_ = db
    fill(db, app.Order.__table__, orders([bit_reverse(n) for n in range(1, 3001)]))
    code, out, err = cli(capsys, "advise", f"{app.__name__}:Order", "--url", url,
                         "--candidates", COUNTS, *INSTANCE)  # fmt: skip
    assert code == 0, (out, err)
    assert "leading orders_by_time" in out
    assert "id: an integer key named like a counter, but not one" in out
    assert "recommended:" in out


# simulates every count; quick loop:
# test_an_id_that_does_not_grow_with_time_is_no_second_key_space
@pytest.mark.slow
@pytest.mark.parametrize("direction", [1, -1])
def test_an_id_that_grows_with_time_still_asks_which_to_size(
    app: Any, db: Any, capsys: pytest.CaptureFixture[str], direction: int
) -> None:
    url, *_ = db
    fill(db, app.Order.__table__, orders([5000 + direction * n for n in range(3000)]))
    code, out, err = cli(capsys, "advise", f"{app.__name__}:Order", "--url", url,
                         "--candidates", COUNTS, *INSTANCE)  # fmt: skip
    assert code == 2 and out == ""
    line = err.strip()
    assert "2 key spaces that grow" in line and "--index" in line
    assert "id grows with time: 100% of its values" in line
    code, out, _ = cli(capsys, "advise", f"{app.__name__}:Order", "--url", url,
                       "--index", "orders_by_time", "--candidates", COUNTS, *INSTANCE)  # fmt: skip
    assert code == 0 and "leading orders_by_time" in out


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-(2**62), 2**62), min_size=20, max_size=300, unique=True),
       st.randoms(use_true_random=False))  # fmt: skip
def test_growth_is_told_from_the_values_order(values: list[int], rng: random.Random) -> None:
    from sharded_orm.tools.advise.layout import layout_of

    layout = layout_of(h.LogEntry)
    rows = [{"CompanyId": "a", "UserId": "u", "Timestamp": t} for t in steady(len(values))]
    ordered = sorted(values)
    shuffled = values[:]
    rng.shuffle(shuffled)
    for seq, grows in ((ordered, True), (ordered[::-1], True)):
        sample = from_rows(layout, [{**r, "x": v} for r, v in zip(rows, seq, strict=True)], "t")
        sample.rows = [{**r, "x": v} for r, v in zip(sample.rows, seq, strict=True)]
        assert grows_with_time(sample, layout, "x")[0] is grows
    sample.rows = [{**r, "x": v} for r, v in zip(sample.rows, shuffled, strict=True)]
    ups = sum(b > a for a, b in zip(shuffled, shuffled[1:], strict=False))
    share = max(ups, len(shuffled) - 1 - ups) / (len(shuffled) - 1)
    assert grows_with_time(sample, layout, "x")[0] is (share >= 0.9)


# --- (C) the newest rows read through the time index on Spanner ---------------------------------


def test_the_sample_is_read_through_the_time_index(
    app: Any, db: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """On Spanner the read of the newest rows names the index, quoted (its name here is a
    reserved word); SQLite gets no hint."""
    url, _, mutations, sent = db
    fill(db, app.Event.__table__, events(steady()))
    sent.clear()
    code, out, err = cli(capsys, "advise", f"{app.__name__}:Event", "--url", url,
                         "--candidates", COUNTS, *INSTANCE)  # fmt: skip
    assert code == 0, (out, err)
    # the sample's read of the newest rows, the probe of the id's values taken from it: one
    # read (the merges that price the reads run on their own tables, with a shard column)
    reads = [s for s in sent if "ORDER BY" in s and "ShardId" not in s]
    assert len(reads) == 1, reads
    for read in reads:
        if mutations is None:
            assert "FORCE_INDEX" not in read
        else:
            assert "@{FORCE_INDEX=`Select`}" in read, read
            assert read.index("@{FORCE_INDEX") < read.index("ORDER BY")


# --- (D) heavy skew: the counts the model is unsure of are simulated ----------------------------


def skewed(duration: float) -> Workload:
    return Workload(rows_per_second=3000, duration=duration, tenants=5000, zipf=1.5, seed=0)


def sweep_best(a: Any, workload: Workload, instance: Instance) -> Any:
    """The count a sweep of ``simulate`` over the curve's counts finds: the cheapest (same
    cost) within the target, so the counts are simulated cheapest first until one is."""
    layout = a.layout
    space = layout.table.name + (f".{layout.index}" if layout.index else "")
    for p in sorted(a.points, key=lambda p: (p.read_cost, p.count)):
        r = simulate(layout.variant(p.count), workload, instance, progress_mode="off").results[0]
        ids = {i for i, s in r.split_space.items() if s == space}
        peak = max(max((v for i, v in d.items() if i in ids), default=0) for d in r.split_writes)
        if peak / r.tick <= a.target:
            return p
    raise AssertionError(f"no count of {[p.count for p in a.points]} is within the target")


# simulates every close count; quick loop:
# test_advise.py::test_a_workload_gets_the_count_that_meets_the_target_with_the_least_read_cost
@pytest.mark.slow
def test_under_heavy_skew_the_close_counts_are_simulated_before_choosing() -> None:
    """5,000 tenants, Zipf 1.5, 3,000 rows/s: the model puts 10 shards above the target
    (184 w/s against 175) where simulate measures it below; advise simulates the counts it
    is unsure of and answers 10, the sweep's best, not 16 (cost 6,800 against 5,896)."""
    w = skewed(20)
    a = advise(h.LogEntry, w, instance=SWEEP_INSTANCE, candidates=(4, 8, 10, 16, 32))
    ten = next(p for p in a.points if p.count == 10)
    assert ten.model_split_writes is not None and ten.model_split_writes > a.target
    assert ten.peak_split_writes <= a.target  # simulate's worst tick
    assert a.count == 10 and a.best is not None and a.best.read_cost == pytest.approx(5896)
    far = next(p for p in a.points if p.count == 32)
    assert far.model_split_writes is None  # far from the target: the model's figure stands
    assert "10 shards 1" in a.table() and "(the model: 184)" in a.table()
    data = a.as_dict()
    assert [c["count"] for c in data["curve"] if c["simulated"]] == [
        p.count for p in a.points if p.model_split_writes is not None
    ]


@pytest.mark.slow
def test_under_heavy_skew_advise_is_within_10_percent_of_the_sweep() -> None:
    w = skewed(60)
    a = advise(h.LogEntry, w, instance=SWEEP_INSTANCE, full_curve=True,
               candidates=(1, 2, 4, 8, 10, 16, 20, 30, 32, 64))  # fmt: skip
    best = sweep_best(a, w, SWEEP_INSTANCE)
    assert a.best is not None and a.best.read_cost <= 1.10 * best.read_cost, a.table()


# --- (E) a burst: its window stated and sized for -----------------------------------------------


# simulates every count; quick loop: test_a_steady_sample_says_it_has_no_burst
@pytest.mark.slow
def test_a_burst_is_stated_and_sized_for(
    app: Any, db: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """10 minutes at 5 rows/s and a 20 s burst at 600 rows/s: the mean (25 rows/s) needs 1
    shard; the burst needs 4 (one split took 366 writes/s against 175 in issue 43). The
    output says when the busiest window was, and sizes for it."""
    url, *_ = db
    fill(db, app.Event.__table__, events(bursty()))
    inst = ["--nodes", "30", "--node-capacity", "350", "--tick", "10"]
    code, out, err = cli(capsys, "advise", f"{app.__name__}:Event", "--url", url,
                         "--candidates", "1,2,4,8,16", *inst)  # fmt: skip
    assert code == 0, (out, err)
    assert "busiest window: 10 s from 2024-01-01T09:05" in out, out
    assert "sized for it" in out and "not the mean 25.0" in out
    assert "recommended: 4 shards" in out
    code, js, _ = cli(capsys, "advise", f"{app.__name__}:Event", "--url", url,
                      "--candidates", "1,2,4,8,16", *inst, "--format", "json")  # fmt: skip
    summary = json.loads(js)["summary"]
    window = summary["busiest_window"]
    assert window["start"].startswith("2024-01-01T09:05") and window["rows"] >= 6000
    assert summary["recommended_count"] == 4


def test_a_steady_sample_says_it_has_no_burst(app: Any) -> None:
    a = advise(app.Event, events(steady()), candidates=(1, 2, 4), instance=Instance(tick=10))
    assert a.window_text is not None and "no burst above the mean" in a.window_text


# --- (F) every numeric flag's range -------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value", "rule"),
    [("--rows-per-second", "0", "> 0"), ("--duration", "0", "> 0"),
     ("--duration", "-5", "> 0"), ("--rows-per-second", "nan", "> 0"),
     ("--sample-rate", "0", "> 0"), ("--target-writes", "0", "> 0"),
     ("--node-capacity", "-1", "> 0"), ("--tick", "0", "> 0"), ("--nodes", "0", "> 0"),
     ("--k", "0", "> 0"), ("--page-size", "0", "> 0"), ("--pages", "1.5", "whole number"),
     ("--tenants", "0", "> 0"), ("--zipf", "-1", ">= 0 and <= 10")],
)  # fmt: skip
def test_a_numeric_flag_out_of_range_is_refused_naming_its_range(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, rule: str
) -> None:
    argv = {"--rows-per-second": "100", "--duration": "60"}
    argv[flag] = value
    flat = [x for kv in argv.items() for x in kv]
    code, out, err = cli(capsys, "advise", "examples.hotspots:LogEntry", *flat)
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert f"argument {flag}: must be a" in line and rule in line and repr(value) in line
    assert "give a sample" not in line


def test_half_a_workload_asks_for_the_other_half(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "advise", "examples.hotspots:LogEntry", "--rows-per-second", "9")
    assert code == 2 and "add --duration" in err
