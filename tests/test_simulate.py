"""The split simulator: real keys, the seeds' claims, side-by-side reports, bad input."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import (
    BitReversedPrimaryKeyMixin,
    ShardConfigError,
    ShardedIndex,
    ShardTypeError,
    UTCDateTime,
    bit_reverse,
    compute_shard,
    key_column,
    shard_column,
)
from sharded_orm.tools.cli import main
from sharded_orm.tools.simulate import (
    Instance,
    Workload,
    desc_transform,
    sample_rows,
    simulate,
    text_heatmap,
)
from sharded_orm.tools.simulate.instance import desc_inverse

EXAMPLES = Path(__file__).parent.parent / "examples"


class Base(DeclarativeBase):
    pass


class TsFirst(Base):
    __tablename__ = "ts_first"
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime, primary_key=True)
    user_id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)


class TsFirstDesc(Base):
    __tablename__ = "ts_first_desc"
    ts: Mapped[dt.datetime] = key_column(UTCDateTime, descending=True)
    user_id: Mapped[str] = key_column(sa.String(36))


class ShardFirst(Base):
    __tablename__ = "shard_first"
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    user_id: Mapped[str] = mapped_column(sa.String(36))
    shard: Mapped[int] = shard_column("ts", count=16)
    __table_args__ = (sa.PrimaryKeyConstraint("shard", "ts", "user_id"),)


class Logs(Base):
    __tablename__ = "logs"
    company_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    ts: Mapped[dt.datetime] = key_column(UTCDateTime, descending=True)
    entry_shard: Mapped[int] = shard_column("company_id", "ts", count=10)
    __table_args__ = (
        ShardedIndex("logs_by_company", "company_id", sa.desc("ts"), shard="entry_shard"),
        sa.Index("logs_by_user", "user_id"),
    )


class Counted(BitReversedPrimaryKeyMixin, Base):
    __tablename__ = "counted"


SMALL = Workload(rows_per_second=500, duration=60)


def test_timestamp_first_key_sends_every_write_to_one_split_and_sharding_spreads() -> None:
    result = simulate({"ts": TsFirst, "sharded": ShardFirst}, SMALL, Instance(nodes=4, tick=5))
    naive, sharded = result["ts"], result["sharded"]
    assert naive.hottest_split_share == pytest.approx(1.0)
    assert naive.imbalance == pytest.approx(4.0)  # one node of four does everything
    assert sharded.hottest_split_share < 0.25
    assert sharded.imbalance < 1.3
    assert [r.name for r in result.results] == ["ts", "sharded"]


def test_descending_timestamp_key_writes_at_the_start_of_the_key_space() -> None:
    asc = simulate(TsFirst, SMALL).results[0]
    desc = simulate(TsFirstDesc, SMALL).results[0]
    # heatmap rows are key ranges in key order, over existing and new rows: the hot range
    # climbs through the upper half (ascending) or falls through the lower half (descending)
    n = len(asc.heatmap[0])
    asc_hot = [max(range(n), key=row.__getitem__) for row in asc.heatmap]
    desc_hot = [max(range(n), key=row.__getitem__) for row in desc.heatmap]
    assert asc_hot == sorted(asc_hot) and min(asc_hot) >= n // 2 - 1
    assert desc_hot == sorted(desc_hot, reverse=True) and max(desc_hot) <= n // 2
    assert all(sum(1 for v in row if v) <= n // 8 for row in asc.heatmap + desc.heatmap)
    assert desc.hottest_split_share == pytest.approx(1.0)


def test_rows_carry_the_library_shard_and_ids() -> None:
    rows = sample_rows(Logs, Workload(rows_per_second=100, duration=10, tenants=3), n=50)
    for row in rows:
        assert row["entry_shard"] == compute_shard((row["company_id"], row["ts"]), 10)
        assert row["ts"].tzinfo is not None
    assert rows[1]["ts"] - rows[0]["ts"] == dt.timedelta(milliseconds=10)
    ids = sample_rows(Counted, Workload(rows_per_second=10, duration=10, history=0), n=3)
    assert [r["id"] for r in ids] == [bit_reverse(1), bit_reverse(2), bit_reverse(3)]


def test_tenant_weights_and_zipf_skew() -> None:
    w = Workload(rows_per_second=1000, duration=10, tenants=3, tenant_weights=(1, 3, 1))
    counts = Counter(r["company_id"] for r in sample_rows(Logs, w, n=5000))
    share = counts["tenant-00002"] / 5000
    assert 0.55 < share < 0.65
    z = Workload(rows_per_second=1000, duration=10, tenants=5, zipf=1.0)
    counts = Counter(r["company_id"] for r in sample_rows(Logs, z, n=5000))
    assert counts["tenant-00001"] > 1.7 * counts["tenant-00002"] > 0


def test_table_and_index_writes_are_both_counted() -> None:
    result = simulate(Logs, SMALL).results[0]
    assert result.table_writes == SMALL.rows
    assert result.index_writes == 2 * SMALL.rows
    assert result.writes == 3 * SMALL.rows
    assert sum(sum(row) for row in result.node_writes) == result.writes
    assert result.spaces == ["logs", "logs.logs_by_company", "logs.logs_by_user"]
    shares = result.node_share_over_time()
    assert all(sum(row) == pytest.approx(1.0) for row in shares)
    assert all(sum(d.values()) == pytest.approx(1.0) for d in result.split_share_over_time())


def test_bulk_load_in_key_order_is_worse_than_shuffled() -> None:
    class B(DeclarativeBase):
        pass

    class Users(B):
        __tablename__ = "users"
        user_id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)

    inst = Instance(nodes=4, tick=5, node_capacity=400, load_split_after=5)
    # 30,000 rows: enough for load-based splitting to cut the shuffled load (8 splits)
    by_key = simulate(Users, Workload(rows_per_second=1000, duration=30, insert_order="key"), inst)
    shuffled = simulate(
        Users, Workload(rows_per_second=1000, duration=30, insert_order="random"), inst
    )
    assert by_key.results[0].hottest_split_share > 0.9
    assert shuffled.results[0].hottest_split_share < 0.5
    assert shuffled.results[0].splits > 4  # load-based splitting cut the single split


def test_overload_time_and_summary() -> None:
    # 10 s overloaded end to end: every second counts, however many there are
    result = simulate(TsFirst, Workload(rows_per_second=5000, duration=10), Instance(nodes=2))
    r = result.results[0]
    assert r.overloaded_seconds == pytest.approx(10.0)
    assert r.peak_node_rate == pytest.approx(5000)
    text = result.summary()
    assert "TsFirst" in text and "100.0%" in text and "10s" in text
    assert len(text_heatmap(r)) > 0
    assert json.loads(json.dumps(result.as_dict()))["results"][0]["imbalance"] == 2.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rows_per_second": 0, "duration": 10}, "rows_per_second must be > 0"),
        ({"rows_per_second": -5, "duration": 10}, "rows_per_second must be > 0"),
        ({"rows_per_second": 10, "duration": 0}, "duration must be from 1e-06 to 1e\\+09 seconds"),
        ({"rows_per_second": 10, "duration": 10, "tenants": 0}, "tenants must be > 0"),
        ({"rows_per_second": 10, "duration": 10, "users_per_tenant": -1}, "users_per_tenant"),
        ({"rows_per_second": 10, "duration": 10, "zipf": -1}, "zipf must be from 0"),
        ({"rows_per_second": 0.01, "duration": 10}, "less than one row"),
        (
            {"rows_per_second": 10, "duration": 10, "tenants": 3, "tenant_weights": (1, 2)},
            "2 weights for 3 tenants",
        ),
        (
            {"rows_per_second": 10, "duration": 10, "tenants": 2, "tenant_weights": (1, 0)},
            "each tenant weight must be > 0",
        ),
        (
            {
                "rows_per_second": 10,
                "duration": 10,
                "tenants": 2,
                "tenant_weights": (1, 2),
                "zipf": 1.0,
            },
            "not both",
        ),
        ({"rows_per_second": 10, "duration": 10, "insert_order": "sorted"}, "insert_order"),
        ({"rows_per_second": 10, "duration": 10, "history": -1}, "history must be from 1e-06"),
        ({"rows_per_second": 10, "duration": 10, "roles": {"x": "magic"}}, "not one of"),
    ],
)
def test_bad_workloads(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ShardConfigError, match=message):
        Workload(**kwargs)


def test_bad_instance_schema_and_paths(tmp_path: Path) -> None:
    with pytest.raises(ShardConfigError, match="at least 1 node"):
        Instance(nodes=0)
    with pytest.raises(ShardTypeError, match="nodes must be an int"):
        Instance(nodes=2.5)  # type: ignore[arg-type]
    with pytest.raises(ShardConfigError, match="no such column"):
        simulate(TsFirst, Workload(rows_per_second=10, duration=10, roles={"nope": "user"}))
    with pytest.raises(ShardTypeError, match="mapped class or a Table"):
        simulate({"x": 42}, SMALL)
    with pytest.raises(ShardConfigError, match="at least one model"):
        simulate({}, SMALL)
    pytest.importorskip("matplotlib")
    with pytest.raises(ShardConfigError, match="cannot write"):
        simulate(TsFirst, SMALL, heatmap=tmp_path / "missing" / "dir" / "h.png")
    with pytest.raises(ShardConfigError, match="is a directory"):
        simulate(TsFirst, SMALL, heatmap=tmp_path)


# two schemas drawn into one PNG (matplotlib: seconds); quick loop: test_cli_simulate_heatmap
@pytest.mark.slow
def test_heatmap_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "heat.png"
    simulate({"ts": TsFirst, "sharded": ShardFirst}, SMALL, heatmap=out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


@given(st.text(), st.text())
def test_descending_strings_sort_in_reverse(a: str, b: str) -> None:
    f = desc_transform(sa.Column("s", sa.String))
    assert (a < b) == (f(a) > f(b))


@given(st.integers(-(2**62), 2**62), st.integers(-(2**62), 2**62))
def test_descending_integers_sort_in_reverse(a: int, b: int) -> None:
    f = desc_transform(sa.Column("n", sa.BigInteger))
    assert (a < b) == (f(a) > f(b))


# --- the command ------------------------------------------------------------------------


@pytest.fixture
def sim_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "sim_models.py").write_text(
        "import datetime as dt\n"
        "import sqlalchemy as sa\n"
        "from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column\n"
        "from sharded_orm import UTCDateTime, shard_column\n"
        "class Base(DeclarativeBase):\n    pass\n"
        "class Hot(Base):\n"
        "    __tablename__ = 'hot'\n"
        "    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime, primary_key=True)\n"
        "class Cool(Base):\n"
        "    __tablename__ = 'cool'\n"
        "    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)\n"
        "    shard: Mapped[int] = shard_column('ts', count=8)\n"
        "    __table_args__ = (sa.PrimaryKeyConstraint('shard', 'ts'),)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return tmp_path


def test_cli_simulate_text_and_json(sim_models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "sim_models:Hot", "fixed=sim_models:Cool", "--rows-per-second", "200"]
    assert main([*args, "--duration", "60", "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "Hot " in out and "fixed " in out and "100.0%" in out
    assert main([*args, "--duration", "60", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in data["results"]] == ["Hot", "fixed"]
    assert data["results"][0]["hottest_split_share"] == 1.0


def test_cli_simulate_bad_input(sim_models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["simulate", "sim_models:Hot", "--rows-per-second", "100", "--duration", "10"]
    assert main([*base, "--nodes", "0"]) == 2
    assert "argument --nodes: must be a whole number > 0, got '0'" in capsys.readouterr().err
    assert main(["simulate", "sim_models:Hot", "--rows-per-second=-1", "--duration", "9"]) == 2
    assert "argument --rows-per-second: must be a number > 0" in capsys.readouterr().err
    assert main([*base, "--tenant-weights", "1,x"]) == 2
    assert "--tenant-weights takes numbers" in capsys.readouterr().err
    assert main([*base, "--tenants", "2", "--tenant-weights", "1,2,3"]) == 2
    assert "3 weights for 2 tenants" in capsys.readouterr().err
    assert main([*base, "--role", "ts"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err
    assert main(["simulate", "nowhere:Hot", "--rows-per-second", "1", "--duration", "9"]) == 2
    assert "cannot import 'nowhere'" in capsys.readouterr().err
    pytest.importorskip("matplotlib")
    assert main([*base, "--heatmap", str(sim_models / "no" / "such" / "h.png")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_cli_simulate_heatmap(sim_models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = sim_models / "h.png"
    args = ["simulate", "sim_models:Hot", "--rows-per-second", "100", "--duration", "30"]
    assert main([*args, "--heatmap", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert f"heatmap: {out}" in capsys.readouterr().out


# --- what Spanner's split statistics would show -----------------------------------------------


# simulates 180 s at 4,000 rows/s; quick loop:
# test_timestamp_first_key_sends_every_write_to_one_split_and_sharding_spreads
@pytest.mark.slow
def test_hot_split_rows_in_the_statistics_shape() -> None:
    workload = Workload(rows_per_second=4000, duration=180)
    comparison = simulate({"ts": TsFirstDesc, "sharded": ShardFirst}, workload, Instance(nodes=4))
    rows = comparison.hot_split_rows()
    assert isinstance(rows, dict) and rows["sharded"] == []  # 250 writes/s a shard: cool
    hot = rows["ts"]
    ends = [r["INTERVAL_END"] for r in hot]
    start = workload.start
    assert ends == [start + dt.timedelta(minutes=m) for m in (1, 2, 3)]
    for r in hot:
        assert r["CPU_USAGE_SCORE"] == 100  # 4000 writes/s on one split, 3500 a node
        assert r["AFFECTED_TABLES"] == ["ts_first_desc"] and r["UNSPLITTABLE_REASONS"] == []
        # the descending key writes at the start of the table: from ts_first_desc() on
        assert r["SPLIT_START"] == "ts_first_desc()"
        assert r["SPLIT_LIMIT"].startswith("ts_first_desc(20")
    single = simulate(TsFirst, workload, Instance(nodes=4)).hot_split_rows()
    assert isinstance(single, list) and {r["SPLIT_LIMIT"] for r in single} == {"<end>"}


@given(st.text(max_size=30))
def test_desc_inverse_undoes_desc_transform_for_strings(s: str) -> None:
    col = sa.Column("s", sa.String)
    assert desc_inverse(col)(desc_transform(col)(s)) == s


@given(st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2200, 1, 1)))
def test_desc_inverse_undoes_desc_transform_for_timestamps(when: dt.datetime) -> None:
    col = sa.Column("t", UTCDateTime)
    value = when.replace(tzinfo=dt.timezone.utc)
    assert desc_inverse(col)(desc_transform(col)(value)) == value
