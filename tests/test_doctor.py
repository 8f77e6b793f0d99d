"""sharded_orm.doctor: split keys decoded with the models, hotspots classified, fixes named.

Spanner's split statistics (SPANNER_SYS.SPLIT_STATS_TOP_*) exist only on real instances:
the mock server answers the doctor's query with rows in the documented shape, and the
simulator's ``hot_split_rows()`` is a second source.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from seed_models import LogEntry, User, UserSession
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import (
    Instance,
    ShardValueError,
    UTCDateTime,
    Workload,
    bit_reverse,
    doctor,
    simulate,
)
from sharded_orm.tools.cli import main
from sharded_orm.tools.doctor import (
    EmptyWindowError,
    StatisticsUnavailableError,
    parse_key,
    query_for,
)
from sharded_orm.tools.doctor.keys import Catalog
from sharded_orm.tools.simulate.instance import key_part_text

T0 = dt.datetime(2026, 11, 23, 10, 0, tzinfo=dt.timezone.utc)
_orders = itertools.count(1)


class Prod(DeclarativeBase):
    pass


class Log(Prod):
    """Timestamp-keyed: the seeds' anti-pattern #1."""

    __tablename__ = "Logs"
    ts: Mapped[dt.datetime] = mapped_column("Timestamp", UTCDateTime, primary_key=True)
    log_id: Mapped[str] = mapped_column("LogId", sa.String(36), primary_key=True)


class Order(Prod):
    """A key from a client-side counter."""

    __tablename__ = "Orders"
    id: Mapped[int] = mapped_column(
        "OrderId",
        sa.BigInteger,
        primary_key=True,
        default=lambda: next(_orders),
        info={"sharded_orm.sequential": True},  # a client-side counter
    )


class Counter(Prod):
    __tablename__ = "Counters"
    name: Mapped[str] = mapped_column("Name", sa.String(64), primary_key=True)
    value: Mapped[int] = mapped_column("Value", sa.BigInteger)


class Ticket(Prod):
    """A bit-reversed id (Spanner IDENTITY) and a UUID column."""

    __tablename__ = "Tickets"
    id: Mapped[int] = mapped_column("TicketId", sa.BigInteger, sa.Identity(), primary_key=True)
    ref: Mapped[str] = mapped_column("Ref", sa.String(36), default=lambda: str(uuid.uuid4()))
    __table_args__ = (sa.Index("TicketsByRef", "Ref"),)


MODELS = [Log, Order, Counter, Ticket, LogEntry, User, UserSession]


def row(minute: int, start: str, limit: str, score: int = 100, **kw: Any) -> dict[str, Any]:
    return {
        "INTERVAL_END": T0 + dt.timedelta(minutes=minute),
        "SPLIT_START": start,
        "SPLIT_LIMIT": limit,
        "CPU_USAGE_SCORE": score,
        "AFFECTED_TABLES": kw.get("tables", [start.split("(")[0]]),
        "UNSPLITTABLE_REASONS": kw.get("reasons", []),
    }


def ts(minute: int, second: int = 0) -> str:
    return (T0 + dt.timedelta(minutes=minute, seconds=second)).isoformat().replace("+00:00", "Z")


# --- the four seed scenarios, in the documented row shape ---------------------------------

SCENARIOS: dict[str, list[dict[str, Any]]] = {
    # every minute the last split of Logs, from a newer timestamp to the end, is hot
    "timestamp_key": [
        row(m, f'Logs({ts(m, -5)},"a1")', "<end>", reasons=["MOVING_HOT_SPOT"]) for m in range(15)
    ],
    # one company 100x the others; Timestamp is DESC in the index, so each shard's newest
    # company-b rows go first in company-b's range: the split ending there is hot
    "tenant_100x": [
        row(
            m,
            f'LogEntriesByCompany({s},"company-a",{ts(0)})',
            f'LogEntriesByCompany({s},"company-b",{ts(m)})',
        )
        for m in range(12)
        for s in range(10)
    ]
    + [
        row(
            3,
            f'LogEntriesByCompany(4,"company-a",{ts(3)})',
            f'LogEntriesByCompany(4,"company-a",{ts(1)})',
            60,
        )
    ],
    "sequence": [row(m, f"Orders({1000 * m + 17})", "<end>") for m in range(12)],
    "hot_row": [
        row(m, 'Counters("page-views")', 'Counters("page-views2")', reasons=["HOT_ROW"])
        for m in range(12)
    ],
}

EXPECTED = {
    "timestamp_key": ("Logs", "monotonic", None, None, "SO101", "shard_column('ts'"),
    "tenant_100x": ("LogEntriesByCompany", "tenant_skew", 0, "company-b", None, "reshard"),
    "sequence": ("Orders", "sequence", None, None, "SO101", "bit-reversed"),
    "hot_row": ("Counters", "hot_key", None, None, None, "contention"),
}


def _check(finding: Any, expected: tuple[Any, ...]) -> None:
    table, pattern, shard, tenant, rule, fix = expected
    assert (finding.table, finding.pattern, finding.shard, finding.tenant, finding.rule) == (
        table,
        pattern,
        shard,
        tenant,
        rule,
    )
    assert fix in finding.fix


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_seed_scenarios_from_rows(name: str) -> None:
    diagnosis = doctor(SCENARIOS[name], MODELS)
    _check(diagnosis.findings[0], EXPECTED[name])
    assert diagnosis.findings[0].hot_seconds >= 12 * 60


def _result_set(rows: list[dict[str, Any]], reasons: bool = True) -> Any:
    from google.cloud.spanner_v1.types import result_set as rs
    from google.cloud.spanner_v1.types import type as st
    from google.protobuf import struct_pb2

    string = st.Type(code=st.TypeCode.STRING)
    array = st.Type(code=st.TypeCode.ARRAY, array_element_type=string)
    fields = [
        ("INTERVAL_END", st.Type(code=st.TypeCode.TIMESTAMP)),
        ("SPLIT_START", string),
        ("SPLIT_LIMIT", string),
        ("CPU_USAGE_SCORE", st.Type(code=st.TypeCode.INT64)),
        ("AFFECTED_TABLES", array),
        ("UNSPLITTABLE_REASONS", array),
    ][: 6 if reasons else 5]
    meta = rs.ResultSetMetadata(
        row_type=st.StructType(fields=[st.StructType.Field(name=n, type_=t) for n, t in fields])
    )

    def value(v: Any) -> Any:
        if isinstance(v, list):
            return struct_pb2.Value(
                list_value=struct_pb2.ListValue(
                    values=[struct_pb2.Value(string_value=x) for x in v]
                )
            )
        if isinstance(v, dt.datetime):
            return struct_pb2.Value(string_value=v.isoformat().replace("+00:00", "Z"))
        return struct_pb2.Value(string_value=str(v))

    values = [[value(r[n]) for n, _ in fields] for r in rows]
    return rs.ResultSet(metadata=meta, rows=values)


def _register(mock: Any, engine: Any, rows: list[dict[str, Any]], window: str = "minute") -> None:
    sql = str(sa.text(query_for(window)).compile(engine))
    mock.add_result(sql, _result_set(rows))


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_seed_scenarios_on_the_mock_server(mock_spanner: Any, name: str) -> None:
    engine = mock_spanner.engine()
    _register(mock_spanner, engine, SCENARIOS[name])
    diagnosis = doctor(engine, MODELS, since=T0 - dt.timedelta(hours=1))
    _check(diagnosis.findings[0], EXPECTED[name])
    sent = [s for s in mock_spanner.executed_sql() if "SPLIT_STATS_TOP_MINUTE" in s]
    assert len(sent) == 1


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_cli_table_json_and_exit_code(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    export = tmp_path / "splits.json"
    export.write_text(json.dumps(SCENARIOS[name], default=str))
    module = tmp_path / "prod_models.py"
    module.write_text(
        "from test_doctor import Log, Order, Counter, Ticket\n"
        "from seed_models import LogEntry, User, UserSession\n"
        "MODELS = [Log, Order, Counter, Ticket, LogEntry, User, UserSession]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    table, pattern, shard, tenant, rule, fix = EXPECTED[name]
    assert main(["doctor", str(export), "prod_models:MODELS"]) == 1  # hot 12+ min > 10 min
    out = capsys.readouterr().out
    assert table in out and pattern in out and fix in out
    if tenant:
        assert tenant in out
    assert main(["doctor", str(export), "prod_models:MODELS", "--threshold", "1h"]) == 0
    capsys.readouterr()
    main(["doctor", str(export), "prod_models:MODELS", "--format", "json"])
    found = json.loads(capsys.readouterr().out)["findings"][0]
    assert (found["table"], found["pattern"], found["shard"], found["tenant"]) == (
        table,
        pattern,
        shard,
        tenant,
    )
    assert fix in found["fix"]


def test_csv_export(tmp_path: Path) -> None:
    export = tmp_path / "splits.csv"
    lines = ["interval_end,split_start,split_limit,cpu_usage_score,affected_tables"]
    for r in SCENARIOS["sequence"]:
        lines.append(f"{r['INTERVAL_END'].isoformat()},{r['SPLIT_START']},<end>,100,Orders")
    export.write_text("\n".join(lines))
    assert doctor(export, MODELS).findings[0].pattern == "sequence"


# --- the simulator's predicted rows as a source ---------------------------------------------


# simulates a scenario end to end; quick loop: test_seed_scenarios_from_rows
@pytest.mark.slow
def test_simulator_rows_are_diagnosed_like_production(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "examples"))
    import hotspots as h

    schemas, workload, instance = h.scenarios(0.2)["company_100x"]
    comparison = simulate({"10 shards": schemas["10 shards"]}, workload, instance)
    rows = comparison.hot_split_rows()
    assert isinstance(rows, list) and rows
    assert set(rows[0]) == {
        "INTERVAL_END",
        "SPLIT_START",
        "SPLIT_LIMIT",
        "CPU_USAGE_SCORE",
        "AFFECTED_TABLES",
        "UNSPLITTABLE_REASONS",
        "SOURCE",  # "simulated": not a Spanner column; doctor's pictures say where rows came from
    }
    assert {r["SOURCE"] for r in rows} == {"simulated"}
    finding = doctor(rows, [schemas["10 shards"]]).findings[0]
    assert (finding.table, finding.pattern, finding.tenant) == (
        "LogEntriesByCompany",
        "tenant_skew",
        "tenant-00001",
    )

    naive = simulate(
        {"naive": h.NaiveUser, "swapped": h.SwappedUser},
        Workload(rows_per_second=5000, duration=120, users_per_tenant=10_000),
        Instance(nodes=4),
    ).hot_split_rows()
    assert isinstance(naive, dict) and naive["swapped"] == []
    finding = doctor(naive["naive"], [h.NaiveUser]).findings[0]
    assert (finding.table, finding.pattern, finding.rule) == ("Users", "monotonic", "SO101")


def test_heatmap_shows_the_moving_tail(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from sharded_orm.tools.doctor.report import heatmap_panel

    rows = SCENARIOS["timestamp_key"]
    diagnosis = doctor(rows, MODELS)
    panel = heatmap_panel(diagnosis)
    # each minute's hot split sits higher in the key space than the minute before
    hot_bucket = [max(range(len(col)), key=col.__getitem__) for col in panel.grid]
    assert hot_bucket == sorted(hot_bucket) and hot_bucket[-1] > hot_bucket[0]
    out = diagnosis.heatmap(tmp_path / "doctor.png")
    assert out.stat().st_size > 1000


# --- key decoding -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    from sharded_orm.tools.doctor.diagnose import metadata_of_models

    return Catalog(metadata_of_models(MODELS))


def test_decodes_shard_string_and_desc_timestamp(catalog: Catalog) -> None:
    key = catalog.decode(f'LogEntriesByCompany(7,"company-b",{ts(1)},"u9")')
    assert (key.kind, key.table) == ("index", "LogEntries")
    shard, company, when, user = key.parts
    assert (shard.role, shard.value) == ("shard", 7)
    assert (company.role, company.value) == ("tenant", "company-b")
    assert (when.role, when.value, when.descending) == ("time", T0 + dt.timedelta(minutes=1), True)
    assert (user.column, user.value) == ("UserId", "u9")


def test_decodes_desc_key_part_of_a_table(catalog: Catalog) -> None:
    key = catalog.decode(f'Users(42,"{ts(0)}")')
    assert [p.value for p in key.parts] == [42, T0]
    assert [p.descending for p in key.parts] == [False, True]


def test_decodes_bit_reversed_ids_and_uuids(catalog: Catalog) -> None:
    key = catalog.decode(f"Tickets({bit_reverse(12345)})")
    assert (key.parts[0].role, key.parts[0].sequence) == ("bit_reversed", 12345)
    v7 = "018f3c1e-7b2a-7c3d-8e4f-0123456789ab"
    key = catalog.decode(f'TicketsByRef("{v7}")')
    assert key.parts[0].role == "uuid7"
    key = catalog.decode(f'TicketsByRef("{uuid.uuid4()}")')
    assert key.parts[0].role == "uuid4"


def test_decodes_interleaved_child_and_truncated_keys(catalog: Catalog) -> None:
    key = catalog.decode(f'UserSessions(42,{ts(0)},"s-1")')
    assert (key.table, key.interleaved_in) == ("UserSessions", "Users")
    assert [p.column for p in key.parts] == ["UserId", "LastAccessTimestamp", "SessionId"]
    assert catalog.decode("UserSessions(42)").parts[0].value == 42
    assert catalog.decode("Users()").parts == ()
    assert catalog.decode("<begin>").kind == "boundary"


@pytest.mark.parametrize(
    "text",
    [
        "Users(",
        "Users(1",
        "Users(1)x",
        'Users("a)',
        "not a key",
        "Users(1,2,3,4)",
        "Users(abc)",
        "",
    ],
)
def test_malformed_keys_are_named(catalog: Catalog, text: str) -> None:
    with pytest.raises(ShardValueError, match="malformed split key"):
        catalog.decode(text)


def test_parse_key_matches_the_documented_examples() -> None:
    assert parse_key('Threads(3, "aa")').parts[1] == "aa"
    assert parse_key('Messages(631, "abc", 1)').name == "Messages"
    assert parse_key("<end>").boundary


# --- bad input --------------------------------------------------------------------------------


def test_unknown_table_is_reported_not_dropped() -> None:
    rows = SCENARIOS["sequence"] + [row(1, "Invoices(17)", "<end>")]
    findings = doctor(rows, MODELS).findings
    unknown = [f for f in findings if f.table == "Invoices"]
    assert len(unknown) == 1 and unknown[0].pattern == "unknown"
    assert "unknown table 'Invoices'" in unknown[0].fix


def test_empty_window() -> None:
    with pytest.raises(EmptyWindowError, match="no split was warm or hot"):
        doctor([], MODELS)
    with pytest.raises(EmptyWindowError):
        doctor(SCENARIOS["sequence"], MODELS, since=T0 + dt.timedelta(days=1))


def test_malformed_key_in_rows_is_a_clear_error() -> None:
    with pytest.raises(ShardValueError, match="malformed split key 'Orders\\(12'"):
        doctor([row(1, "Orders(12", "<end>")], MODELS)
    with pytest.raises(ShardValueError, match="missing column"):
        doctor([{"SPLIT_START": "Orders(1)"}], MODELS)


def test_not_spanner() -> None:
    with pytest.raises(StatisticsUnavailableError, match="'sqlite'"):
        doctor(sa.create_engine("sqlite://"), MODELS)
    with pytest.raises(StatisticsUnavailableError, match="is a URL"):
        doctor("postgresql://db/x", MODELS)
    assert main(["doctor", "postgresql://localhost/db", "tests.test_doctor:MODELS"]) == 2


def test_emulator_says_it_has_no_statistics(spanner_engine: Any) -> None:
    with pytest.raises(StatisticsUnavailableError, match="emulator has no hot-split") as exc:
        doctor(spanner_engine, MODELS)
    assert "sharded-orm simulate" in str(exc.value)


def test_cli_reads_a_spanner_url(mock_spanner: Any, capsys: pytest.CaptureFixture[str]) -> None:
    _register(mock_spanner, mock_spanner.engine(), SCENARIOS["timestamp_key"])
    code = main(["doctor", mock_spanner.url, "tests.test_doctor:MODELS", "--since", "36500d"])
    out = capsys.readouterr().out
    assert code == 1
    assert "Logs" in out and "monotonic" in out and "SO101" in out


def test_cli_heatmap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    export = tmp_path / "splits.json"
    export.write_text(json.dumps(SCENARIOS["timestamp_key"], default=str))
    png = tmp_path / "hot.png"
    args = ["doctor", str(export), "tests.test_doctor:MODELS", "--heatmap", str(png)]
    assert main(args) == 1
    assert png.stat().st_size > 1000 and f"heatmap: {png}" in capsys.readouterr().out


# --- the key format round-trips (the simulator writes it, the doctor reads it) ----------------

_parts = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(max_size=20),
    st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(2200, 1, 1)).map(
        lambda d: d.replace(tzinfo=dt.timezone.utc)
    ),
)


@given(st.lists(_parts, max_size=5))
def test_key_text_round_trips(values: list[Any]) -> None:
    text = f"Some_Table({','.join(key_part_text(v) for v in values)})"
    raw = parse_key(text)
    assert raw.name == "Some_Table" and len(raw.parts) == len(values)
    for value, part in zip(values, raw.parts, strict=True):
        if isinstance(value, str):
            assert part == value
        elif isinstance(value, int):
            assert int(part.text) == value
        else:
            assert dt.datetime.fromisoformat(part.text.replace("Z", "+00:00")) == value


def test_an_instance_without_unsplittable_reasons(mock_spanner: Any) -> None:
    """Older instances have no UNSPLITTABLE_REASONS column: doctor reads without it."""
    engine = mock_spanner.engine()
    sql = str(sa.text(query_for("minute", reasons=False)).compile(engine))
    mock_spanner.add_result(sql, _result_set(SCENARIOS["sequence"], reasons=False))
    diagnosis = doctor(engine, MODELS, since=T0 - dt.timedelta(hours=1))
    assert diagnosis.findings[0].pattern == "sequence"


def test_decodes_nanosecond_timestamps_and_nulls(catalog: Catalog) -> None:
    key = catalog.decode("Logs(2026-11-23T10:00:00.123456789Z,NULL)")
    assert key.parts[0].value == T0 + dt.timedelta(microseconds=123456)
    assert key.parts[1].value is None


def test_bad_interval_end_and_score_are_named() -> None:
    with pytest.raises(ShardValueError, match="row 1: INTERVAL_END 'yesterday'"):
        doctor([{**row(1, "Orders(1)", "<end>"), "INTERVAL_END": "yesterday"}], MODELS)
    with pytest.raises(ShardValueError, match="row 1: CPU_USAGE_SCORE 'hot'"):
        doctor([{**row(1, "Orders(1)", "<end>"), "CPU_USAGE_SCORE": "hot"}], MODELS)
    late = {**row(1, "Orders(1)", "<end>"), "INTERVAL_END": "2026-11-23T10:01:00.000000001Z"}
    assert doctor([late], MODELS).findings[0].table == "Orders"


def test_hour_view_on_the_mock_and_bad_window(mock_spanner: Any) -> None:
    from sharded_orm import ShardConfigError

    engine = mock_spanner.engine()
    hourly = [row(60 * h, f"Orders({1000 * h + 17})", "<end>") for h in range(3)]
    _register(mock_spanner, engine, hourly, window="hour")
    diagnosis = doctor(engine, MODELS, window="hour", since=T0 - dt.timedelta(days=1))
    assert [s for s in mock_spanner.executed_sql() if "SPLIT_STATS_TOP_HOUR" in s]
    assert diagnosis.findings[0].pattern == "sequence"
    assert diagnosis.findings[0].hot_seconds == 3 * 3600
    with pytest.raises(ShardConfigError, match="window must be one of minute, 10minute, hour"):
        doctor(hourly, MODELS, window="day")
