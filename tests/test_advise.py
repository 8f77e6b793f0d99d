"""``advise`` (issue 34): the shard count from a sample, with its read cost by the merge's own
rule; every kind of sample; hostile files; the CLI contract. The sweep against ``simulate``
over N is tests/test_advise_sweep.py (slow)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from test_cli_contract import assert_one_line_error, run_cli

from examples import hotspots as h
from sharded_orm import UTCDateTime, shard_column
from sharded_orm.errors import ShardingError
from sharded_orm.read.branches import probe_limit, single_statement
from sharded_orm.tools.advise import advise
from sharded_orm.tools.advise import sample as sample_mod
from sharded_orm.tools.cli import main
from sharded_orm.tools.simulate import Instance, Workload, sample_rows

ROOT = Path(__file__).resolve().parent.parent
SMALL = Instance(nodes=6, node_capacity=350, tick=5)
W3X = Workload(rows_per_second=600, duration=60, tenants=3, tenant_weights=(1, 3, 1))
COUNTS = (1, 2, 4, 8, 16, 64)


@pytest.fixture(scope="module")
def w3x_advice() -> Any:
    """The advice for W3X (k=100, the default), computed once: the tests below only read
    it (each count is simulated: seconds)."""
    return advise(h.LogEntry, W3X, instance=SMALL, candidates=COUNTS, k=100, sample_size=5000)


def test_a_workload_gets_the_count_that_meets_the_target_with_the_least_read_cost(
    w3x_advice: Any,
) -> None:
    a = w3x_advice
    peaks = [p.peak_split_writes for p in a.points]
    assert peaks[0] > a.target > peaks[-1]
    assert peaks[:4] == sorted(peaks[:4], reverse=True)  # more shards, a cooler busiest split
    assert a.target == SMALL.load_split_threshold * SMALL.node_capacity
    best = a.best
    assert best is not None and a.count == best.count == 4
    assert all(p.read_cost >= best.read_cost for p in a.feasible)
    text = a.table()
    assert "recommended: 4 shards" in text and "<- recommended" in text
    data = a.as_dict()
    assert data["recommended_count"] == 4 and len(data["curve"]) == len(COUNTS)
    assert data["read"]["tenant"] == "tenant-00002"  # the busiest tenant's reads


def test_the_read_cost_is_the_merges(w3x_advice: Any) -> None:
    a = w3x_advice
    for p in a.points:
        probe = probe_limit(p.count, 100)
        if probe is not None:  # the rule: the probe, every branch LIMIT L, settles it here
            assert (p.newest_statements, p.newest_rows_read) == (1, p.count * probe)
        elif single_statement(p.count, 100):  # one statement, every branch LIMIT K
            assert (p.newest_statements, p.newest_rows_read) == (1, p.count * 100)
        else:
            assert p.newest_statements == 2  # two rounds (one statement on Spanner)
    # more shards, more branches: the 64-shard read costs more than the 4-shard one
    assert a.points[-1].read_cost > a.points[2].read_cost


def test_no_count_meets_an_impossible_target() -> None:
    a = advise(h.LogEntry, W3X, instance=SMALL, candidates=(1, 2), target=1.0, sample_size=2000)
    assert a.count is None and "no candidate up to 2 meets the target" in a.table()


def _rows(n: int = 3000) -> list[dict[str, Any]]:
    return sample_rows(h.LogEntry, W3X, n)


#: the counts up to the recommended one and past it: where only the input differs, 16 and
#: 64 shards (two thirds of the simulation's time) add nothing
FEW_COUNTS = (1, 2, 4, 8)


def test_rows_an_engine_and_a_csv_give_the_same_advice(tmp_path: Path) -> None:
    rows = _rows()
    from_rows = advise(h.LogEntry, rows, instance=SMALL, candidates=FEW_COUNTS)
    assert from_rows.sample.rows_per_second == pytest.approx(600, rel=0.02)  # its time span
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    h.LogEntry.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(h.LogEntry.__table__.insert(), rows)
    from_db = advise(h.LogEntry, engine, instance=SMALL, candidates=FEW_COUNTS)
    path = tmp_path / "rows.csv"
    cols = ["CompanyId", "UserId", "Timestamp"]
    path.write_text(
        ",".join(cols) + "\n" + "".join(",".join(str(r[c]) for c in cols) + "\n" for r in rows)
    )
    from_csv = advise(h.LogEntry, path, instance=SMALL, candidates=FEW_COUNTS)
    assert from_rows.count == from_db.count == from_csv.count == 4
    assert [p.read_cost for p in from_db.points] == [p.read_cost for p in from_csv.points]


def test_a_model_without_or_with_two_shard_columns() -> None:
    # issue 42: a table without one is sized as it would be (tests/test_advise_unsharded.py)
    with pytest.raises(ShardingError, match="2 key spaces that grow"):  # name the one
        advise(h.NaiveLogEntry, W3X)
    naive = advise(
        h.NaiveLogEntry, W3X, index="LogEntriesByCompany", instance=SMALL, candidates=FEW_COUNTS,
        sample_size=2000,
    )  # fmt: skip
    assert naive.layout.proposed and naive.count is not None

    class B(DeclarativeBase):
        pass

    class Two(B):
        __tablename__ = "Two"
        id: Mapped[str] = mapped_column("Id", sa.String(36), primary_key=True)
        ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime)
        a: Mapped[int] = shard_column("ts", count=4, name="A")
        b: Mapped[int] = shard_column("id", count=4, name="B")
        __table_args__ = (sa.Index("ByA", "A", "Ts"),)

    with pytest.raises(ShardingError, match="2 shard columns"):
        advise(Two, [{"Id": "x", "Ts": dt.datetime.now(dt.timezone.utc)}])
    with pytest.raises(ShardingError, match="leads no ShardedIndex"):
        advise(Two, [{"Id": "x", "Ts": dt.datetime.now(dt.timezone.utc)}], column="B")


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"candidates": ()}, "at least one"),
        ({"candidates": (0,)}, "candidate count"),
        ({"candidates": (10_000,)}, "4096"),
        ({"target": float("nan")}, "target"),
        ({"k": 0}, "k"),
    ],
)
def test_bad_arguments_are_refused(kw: dict[str, Any], words: str) -> None:
    with pytest.raises(ShardingError, match=words):
        advise(h.LogEntry, W3X, instance=SMALL, **kw)


# --- hostile sample files ---------------------------------------------------------------------

HEAD = "CompanyId,UserId,Timestamp\n"
LINE = "tenant-00001,u1,2024-01-01T00:00:00Z\n"
HOSTILE: dict[str, tuple[bytes, str]] = {
    "truncated.csv": ((HEAD + LINE + "tenant-00001,u2").encode(), "number of fields"),
    "latin1.csv": ((HEAD + LINE.replace("tenant", "tenänt")).encode("latin-1"), "not UTF-8"),
    "utf16.csv": ((HEAD + LINE).encode("utf-16"), "not UTF-8"),
    "bad_time.csv": ((HEAD + "a,b,yesterday\n").encode(), "not a DateTime"),
    "header_only.csv": (HEAD.encode(), "no rows"),
    "wrong_columns.csv": (b"A,B\n1,2\n", "missing column"),
    "nul.csv": ((HEAD + LINE).encode().replace(b"u1", b"u\x001"), "span no time"),
    "empty.csv": (b"", "no rows"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_csv_files_are_clear_errors(tmp_path: Path, name: str) -> None:
    data, words = HOSTILE[name]
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ShardingError, match=words):
        advise(h.LogEntry, path, instance=SMALL, candidates=(1, 2))


def test_a_huge_csv_is_refused_before_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sample_mod, "MAX_FILE_BYTES", 1000)
    path = tmp_path / "huge.csv"
    path.write_text(HEAD + LINE * 100)
    with pytest.raises(ShardingError, match="more than advise reads"):
        advise(h.LogEntry, path, instance=SMALL, candidates=(1, 2))


def test_csv_injection_is_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a spreadsheet formula as a tenant: read as text, printed as text, never evaluated
    formula = '=HYPERLINK("http://x";"y")'
    rows = _rows(600)
    path = tmp_path / "rows.csv"
    lines = [HEAD]
    for r in rows:
        company = formula if r["CompanyId"] == "tenant-00002" else r["CompanyId"]
        lines.append(f'"{company.replace(chr(34), chr(34) * 2)}",{r["UserId"]},{r["Timestamp"]}\n')
    path.write_text("".join(lines))
    a = advise(h.LogEntry, path, instance=SMALL, candidates=(1, 4))
    assert a.tenant == formula
    assert json.loads(json.dumps(a.as_dict()))["read"]["tenant"] == formula


# --- the command line -------------------------------------------------------------------------


# CLI journey with a plot; quick loop: test_rows_an_engine_and_a_csv_give_the_same_advice
@pytest.mark.slow
def test_cli_text_json_plot_and_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    base = ["advise", "examples.hotspots:LogEntry", "--rows-per-second", "600", "--duration",
            "60", "--tenant-weights", "1,3,1", "--nodes", "6", "--node-capacity", "350",
            "--tick", "5", "--candidates", "1,2,4,8"]  # fmt: skip
    png = tmp_path / "curve.png"
    assert main([*base, "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "recommended: 4 shards" in out and f"curve: {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([*base, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["command"] == "advise" and data["summary"]["recommended_count"] == 4
    assert [r["count"] for r in data["results"]] == [1, 2, 4, 8]
    assert main([*base, "--target-writes", "1"]) == 1  # no candidate meets it
    capsys.readouterr()


HOT_HASHING_NO_COLUMN = (
    *("advise", "models:Hot", "--rows-per-second", "10", "--duration", "60"),
    *("--shard-on", "Nope"),
)


@pytest.mark.slow  # subprocesses
@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("advise", "models:Sharded"), ("give a sample",)),
        # a table with no shard column is sized now (tests/test_advise_unsharded.py); a
        # column to hash it does not have is refused
        (HOT_HASHING_NO_COLUMN, ("no column 'Nope'",)),
        (("advise", "adv:Log", "--csv", "missing.csv"), ("missing.csv",)),
        (("advise", "adv:Log", "--csv", "garbage.db"), ("garbage.db",)),
        (("advise", "adv:Log", "--csv", "a_directory"), ("a_directory",)),
        (("advise", "adv:Log", "--csv", "x.csv", "--url", "sqlite://"), ("one sample",)),
        (("advise", "adv:Log", "--candidates", "a,b", "--csv", "x.csv"), ("candidates",)),
        (("advise", "adv:Log", "--url", "sqlite:///no_such.db"), ("no_such.db",)),
    ],
)
def test_cli_contract_for_advise(
    workdir: Path, argv: tuple[str, ...], words: tuple[str, ...]
) -> None:
    assert_one_line_error(run_cli(workdir, *argv), *words)


ADV_MODELS = """
import datetime as dt
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sharded_orm import ShardedIndex, UTCDateTime, shard_column


class Base(DeclarativeBase):
    pass


class Log(Base):
    __tablename__ = "Logs"
    id: Mapped[str] = mapped_column("Id", sa.String(36), primary_key=True)
    company: Mapped[str] = mapped_column("CompanyId", sa.String(64))
    ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime)
    shard: Mapped[int] = shard_column("company", "ts", count=4, name="ShardId")
    __table_args__ = (ShardedIndex("LogsByCompany", "CompanyId", sa.desc("Ts"), shard="ShardId"),)
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_cli_contract import FILES, MODULES

    d = tmp_path_factory.mktemp("advise_cli")
    (d / "models.py").write_text(MODULES["models.py"])
    (d / "adv.py").write_text(ADV_MODELS)
    (d / "garbage.db").write_bytes(FILES["garbage.db"])
    (d / "a_directory").mkdir()
    return d
