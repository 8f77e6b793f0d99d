"""doctor's inputs (issue 43), through the CLI as users run it:

- (A) the exports the docs and the help name, from the tool that makes them: gcloud's own
  ``gcloud spanner databases execute-sql ... --format=json`` (the ``ResultSet``: metadata
  and rows as lists, INT64 as strings, trailing NULLs left out), gcloud's default table,
  CSV and a JSON list of objects, all giving the same findings, in bounded memory;
- (B) every numeric column within its documented range (``CPU_USAGE_SCORE``: 0-100), a row
  outside it refused in one line naming the row, column, value and range;
- (C) keys classified by what the split keys hold (UUID versions, ULIDs, time-led text),
  not only by the column's name and default, and the finding carrying the growing part's
  role for ``--fix``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import UTCDateTime, doctor
from sharded_orm.tools.cli import main

T0 = dt.datetime(2026, 11, 23, 10, 0, tzinfo=dt.timezone.utc)
TARGET = "tests.test_doctor_inputs:MODELS"
COLUMNS = [
    "INTERVAL_END",
    "SPLIT_START",
    "SPLIT_LIMIT",
    "CPU_USAGE_SCORE",
    "AFFECTED_TABLES",
    "UNSPLITTABLE_REASONS",
]
TYPES = [
    {"code": "TIMESTAMP"},
    {"code": "STRING"},
    {"code": "STRING"},
    {"code": "INT64"},
    {"arrayElementType": {"code": "STRING"}, "code": "ARRAY"},
    {"arrayElementType": {"code": "STRING"}, "code": "ARRAY"},
]


# --- ids as applications make them, by helpers whose names say nothing ----------------------


def _time_ordered(version: int, when: dt.datetime, rng: random.Random) -> uuid.UUID:
    """A version-7 (Unix ms first) or version-6 (reordered Gregorian clock) UUID."""
    if version == 7:
        ms = int(when.timestamp() * 1000)
        value = ms << 80 | 7 << 76 | rng.getrandbits(12) << 64 | 2 << 62 | rng.getrandbits(62)
        return uuid.UUID(int=value)
    ticks = int((when - dt.datetime(1582, 10, 15, tzinfo=dt.timezone.utc)).total_seconds() * 1e7)
    value = (ticks >> 12) << 80 | 6 << 76 | (ticks & 0xFFF) << 64 | 2 << 62 | rng.getrandbits(62)
    return uuid.UUID(int=value)


def _ulid(when: dt.datetime, rng: random.Random) -> str:
    alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    n = int(when.timestamp() * 1000) << 80 | rng.getrandbits(80)
    return "".join(alphabet[(n >> (5 * i)) & 31] for i in range(25, -1, -1))


def new_event_id() -> str:
    """The app's id helper: a UUIDv7 made by hand (no function named uuid7 anywhere)."""
    return str(_time_ordered(7, dt.datetime.now(dt.timezone.utc), random.Random()))


def new_ref() -> str:
    return _ulid(dt.datetime.now(dt.timezone.utc), random.Random())


class Base(DeclarativeBase):
    pass


class Log(Base):
    __tablename__ = "Logs"
    ts: Mapped[dt.datetime] = mapped_column("Timestamp", UTCDateTime, primary_key=True)
    log_id: Mapped[str] = mapped_column("LogId", sa.String(36), primary_key=True)


class Event(Base):
    __tablename__ = "Events"
    id: Mapped[str] = mapped_column("Id", sa.String(36), primary_key=True, default=new_event_id)
    body: Mapped[str] = mapped_column("Body", sa.String(100))


class Ticket(Base):
    __tablename__ = "Tickets"
    ref: Mapped[str] = mapped_column("Ref", sa.String(40), primary_key=True, default=new_ref)


class Item(Base):
    __tablename__ = "Items"
    key: Mapped[uuid.UUID] = mapped_column("Key", sa.Uuid, primary_key=True, default=uuid.uuid4)


class Blob(Base):
    __tablename__ = "Blobs"
    id: Mapped[bytes] = mapped_column("Id", sa.LargeBinary(16), primary_key=True)


MODELS = Base


# --- rows and files ------------------------------------------------------------------------


def ts(when: dt.datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def _rows(n: int = 12, **over: Any) -> list[dict[str, Any]]:
    """A timestamp-keyed table's moving tail, one hot split a minute (the seeds' #1)."""
    out = []
    for m in range(n):
        end = T0 + dt.timedelta(minutes=m + 1)
        out.append(
            {
                "INTERVAL_END": ts(end),
                "SPLIT_START": f'Logs({ts(end - dt.timedelta(seconds=5))},"a{m}")',
                "SPLIT_LIMIT": "<end>",
                "CPU_USAGE_SCORE": 100,
                "AFFECTED_TABLES": ["Logs"],
                "UNSPLITTABLE_REASONS": ["MOVING_HOT_SPOT"] if m % 2 else None,
                **over,
            }
        )
    return out


def gcloud_json(rows: list[dict[str, Any]], *, rows_first: bool = False, indent: int = 2) -> str:
    """``rows`` as gcloud prints a ResultSet with --format=json: keys sorted, each row a
    list in the fields' order, INT64 as a string, a row's trailing NULLs left out."""
    lists = []
    for r in rows:
        values = [r.get(c) for c in COLUMNS]
        values[3] = None if values[3] is None else str(values[3])
        while values and values[-1] is None:
            values.pop()
        lists.append(values)
    meta = {
        "rowType": {"fields": [{"name": c, "type": t} for c, t in zip(COLUMNS, TYPES, strict=True)]}
    }
    if not rows_first:
        return json.dumps({"metadata": meta, "rows": lists}, indent=indent, sort_keys=True)
    body = json.dumps(lists, indent=indent)
    return f'{{"rows": {body}, "metadata": {json.dumps(meta)}}}'


def gcloud_table(rows: list[dict[str, Any]]) -> str:
    """``rows`` as gcloud prints them without --format (a padded table, NULL as None,
    arrays as Python lists)."""
    cells = [COLUMNS] + [["None" if r.get(c) is None else str(r[c]) for c in COLUMNS] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in cells
    )


def csv_text(rows: list[dict[str, Any]]) -> str:
    def cell(v: Any) -> str:
        text = "" if v is None else json.dumps(v) if isinstance(v, list) else str(v)
        return '"' + text.replace('"', '""') + '"'

    return "\n".join(
        [",".join(COLUMNS)] + [",".join(cell(r.get(c)) for c in COLUMNS) for r in rows]
    )


SHAPES: dict[str, tuple[str, Callable[[list[dict[str, Any]]], str]]] = {
    "gcloud json": ("json", gcloud_json),
    "gcloud json, rows before metadata": ("json", lambda r: gcloud_json(r, rows_first=True)),
    "gcloud json, one line": ("json", lambda r: gcloud_json(r, indent=0).replace("\n", "")),
    "gcloud table": ("txt", gcloud_table),
    "csv": ("csv", csv_text),
    "json list": ("json", lambda r: json.dumps(r)),
}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any] | None, str]:
    code = main(["doctor", *argv, "--format", "json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def write(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text)
    return str(path)


# --- (A) every export shape the docs and the help name --------------------------------------


@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_export_shape_gives_the_same_finding(
    shape: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ext, render = SHAPES[shape]
    path = write(tmp_path, f"splits.{ext}", render(_rows()))
    code, out, err = run(capsys, path, TARGET)
    assert code == 1, err  # hot 12 minutes > the 10-minute threshold
    assert out is not None
    assert out["summary"]["rows"] == 12
    [finding] = out["findings"]
    assert (finding["table"], finding["pattern"], finding["column"]) == (
        "Logs",
        "monotonic",
        "Timestamp",
    )
    assert finding["hot_seconds"] == 720.0
    assert finding["unsplittable_reasons"] == ["MOVING_HOT_SPOT"]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 30),
    shape=st.sampled_from(list(SHAPES)),
    scores=st.lists(st.integers(50, 100), min_size=30, max_size=30),
    nanos=st.booleans(),
)
def test_every_shape_reads_the_same_rows(
    tmp_path_factory: pytest.TempPathFactory,
    n: int,
    shape: str,
    scores: list[int],
    nanos: bool,
) -> None:
    rows = _rows(n)
    for r, score in zip(rows, scores, strict=False):
        r["CPU_USAGE_SCORE"] = score
        if nanos:  # Spanner prints up to nanoseconds
            r["INTERVAL_END"] = r["INTERVAL_END"].replace("Z", ".000000001Z")
    ext, render = SHAPES[shape]
    path = tmp_path_factory.mktemp("s") / f"splits.{ext}"
    path.write_text(render(rows))
    expected = doctor(rows, MODELS)
    got = doctor(path, MODELS)
    assert got.row_count == n
    assert [f.as_dict() for f in got.findings] == [f.as_dict() for f in expected.findings]


def test_an_empty_gcloud_result_is_no_hot_splits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gcloud prints no ``rows`` for an empty result: no split was warm or hot."""
    metadata = json.loads(gcloud_json([]))["metadata"]
    path = write(tmp_path, "empty.json", json.dumps({"metadata": metadata}, indent=2))
    code, out, err = run(capsys, path, TARGET)
    assert code == 0, err
    assert out is not None and "no hot splits" in out["summary"]["message"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"rows": [["2026-11-23T10:00:00Z", "Logs()", "<end>", "100"]]}', ("metadata",)),
        (
            '{"metadata": {"rowType": {"fields": [{"name": "INTERVAL_END"}]}},'
            ' "rows": [["2026-11-23T10:00:00Z", "Logs()"]]}',
            ("row 1", "2 values", "1 columns"),
        ),
        ('{"metadata": {"rowType": {}}, "rows": []}', ("rowType.fields",)),
        ('{"metadata": {"rowType": {"fields": []}}, "rows": [["2026-11', ("not valid JSON",)),
        ('"a string"', ("JSON list of rows",)),
    ],
)
def test_a_malformed_gcloud_export_is_one_line(
    text: str, words: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "bad.json", text)
    assert main(["doctor", path, TARGET]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.json" in err, err
    for word in words:
        assert word in err, (word, err)


RSS = """
import resource, sys
from sharded_orm.tools.cli import main
code = main(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def _big_gcloud_export(path: Path, megabytes: float) -> int:
    """A gcloud --format=json export of at least ``megabytes``, written row by row."""
    head = gcloud_json(_rows(1))
    prefix, _, _ = head.partition('"rows": [')
    size, i = 0, 0
    with path.open("w") as f:
        f.write(prefix + '"rows": [\n')
        while size < megabytes * 1_000_000:
            end = T0 + dt.timedelta(minutes=1 + i // 50)
            start = f'Logs({ts(T0 + dt.timedelta(seconds=i))},"{i:032x}")'
            values = [ts(end), start, "<end>", str(50 + i % 51), ["Logs"]]
            line = (",\n" if i else "") + json.dumps(values, indent=2)
            f.write(line)
            size += len(line)
            i += 1
        f.write("\n  ]\n}\n")
    return i


@pytest.mark.slow
def test_a_big_gcloud_export_streams(tmp_path: Path) -> None:
    """The peak RSS on a 40 MB gcloud export stays within a few MiB of a 4 MB one's (read
    whole, the 40 MB one alone took over 300 MB)."""
    (tmp_path / "models.py").write_text(
        textwrap.dedent(
            """
            import datetime as dt
            import sqlalchemy as sa
            from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
            from sharded_orm import UTCDateTime

            class Base(DeclarativeBase):
                pass

            class Log(Base):
                __tablename__ = "Logs"
                ts: Mapped[dt.datetime] = mapped_column("Timestamp", UTCDateTime, primary_key=True)
                log_id: Mapped[str] = mapped_column("LogId", sa.String(36), primary_key=True)
            """
        )
    )
    peaks = []
    for mb in (4, 40):
        path = tmp_path / f"splits{mb}.json"
        n = _big_gcloud_export(path, mb)
        env = {**os.environ, "PYTHONPATH": str(tmp_path), "SHARDED_ORM_PROGRESS": "off"}
        proc = subprocess.run(
            [sys.executable, "-c", RSS, "doctor", str(path), "models:Base", "--format", "json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        assert proc.returncode == 1, proc.stderr[-2000:]
        assert json.loads(proc.stdout)["summary"]["rows"] == n
        peaks.append(int(proc.stderr.strip().splitlines()[-1]) / 1024)  # MiB
    assert peaks[1] - peaks[0] < 24, peaks


# --- gcloud itself, against the emulator's REST gateway ------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def gcloud_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """gcloud pointed at a gateway_main (REST in front of emulator_main) we start and stop:
    its own config folder, no credentials."""
    gcloud = shutil.which("gcloud")
    assert gcloud, "gcloud is on every developer machine and in CI (docs/testing.md)"
    binaries = Path(os.path.realpath(gcloud)).parent / "cloud_spanner_emulator"
    grpc_port, http_port = _free_port(), _free_port()
    proc = subprocess.Popen(
        [
            str(binaries / "gateway_main"),
            "--hostname",
            "127.0.0.1",
            "--grpc_port",
            str(grpc_port),
            "--http_port",
            str(http_port),
            "--grpc_binary",
            str(binaries / "emulator_main"),
        ],  # fmt: skip
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its emulator_main child is stopped with it
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", http_port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "no gateway"
                time.sleep(0.2)
        (tmp_path / "gcloud").mkdir()
        env = {
            **os.environ,
            "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
            "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
            "CLOUDSDK_CORE_PROJECT": "doctor-inputs",
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_SPANNER": f"http://127.0.0.1:{http_port}/",
        }
        for args in (
            ["instances", "create", "i1", "--config=emulator-config", "--description=d",
             "--nodes=1"],
            ["databases", "create", "d1", "--instance=i1"],
        ):  # fmt: skip
            subprocess.run(["gcloud", "spanner", *args], env=env, check=True, capture_output=True)
        yield env
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


#: rows shaped like SPANNER_SYS.SPLIT_STATS_TOP_MINUTE (the emulator has no such view)
SPLIT_STATS_SQL = """
SELECT TIMESTAMP_ADD(TIMESTAMP '2026-11-23T10:01:00.123456789Z', INTERVAL m MINUTE)
         AS INTERVAL_END,
       FORMAT('Logs(%s,"a%d")', FORMAT_TIMESTAMP('%Y-%m-%dT%H:%M:%SZ',
         TIMESTAMP_ADD(TIMESTAMP '2026-11-23T10:00:55Z', INTERVAL m MINUTE), 'UTC'), m)
         AS SPLIT_START,
       '<end>' AS SPLIT_LIMIT,
       CAST(100 AS INT64) AS CPU_USAGE_SCORE,
       ['Logs'] AS AFFECTED_TABLES,
       IF(MOD(m, 2) = 1, ['MOVING_HOT_SPOT'], CAST(NULL AS ARRAY<STRING>))
         AS UNSPLITTABLE_REASONS
FROM UNNEST(GENERATE_ARRAY(0, 11)) AS m
ORDER BY INTERVAL_END
"""


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["json", None])
def test_gcloud_execute_sql_output_is_read(
    gcloud_env: dict[str, str],
    fmt: str | None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What `gcloud spanner databases execute-sql` itself prints, with --format=json (the
    docs' command) and without (its table), read as the statistics it holds."""
    argv = ["gcloud", "spanner", "databases", "execute-sql", "d1", "--instance=i1"]
    argv += ["--sql", SPLIT_STATS_SQL] + ([f"--format={fmt}"] if fmt else [])
    proc = subprocess.run(argv, env=gcloud_env, capture_output=True, text=True, check=True)
    path = write(tmp_path, "splits.json" if fmt else "splits.txt", proc.stdout)
    code, out, err = run(capsys, path, TARGET)
    assert code == 1, (err, proc.stdout[:2000])
    assert out is not None and out["summary"]["rows"] == 12
    [finding] = out["findings"]
    assert (finding["table"], finding["pattern"], finding["hot_seconds"]) == (
        "Logs",
        "monotonic",
        720.0,
    )
    assert finding["unsplittable_reasons"] == ["MOVING_HOT_SPOT"]
    assert out["summary"]["first_interval_end"] == "2026-11-23T10:01:00.123456+00:00"


# --- (B) numeric columns within their documented range --------------------------------------


BAD_SCORES = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=101),
    st.floats(0, 100).filter(lambda x: not x.is_integer()),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    score=BAD_SCORES,
    at=st.integers(0, 5),
    shape=st.sampled_from(list(SHAPES)),
)
def test_a_score_outside_0_to_100_is_refused_in_one_line(
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    score: float,
    at: int,
    shape: str,
) -> None:
    rows = _rows(6)
    rows[at]["CPU_USAGE_SCORE"] = score
    ext, render = SHAPES[shape]
    path = tmp_path_factory.mktemp("b") / f"splits.{ext}"
    path.write_text(render(rows))
    capsys.readouterr()
    assert main(["doctor", str(path), TARGET]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"row {at + 1}:" in err and "CPU_USAGE_SCORE" in err, err
    assert repr(score) in err or str(score) in err, err
    assert "0-100" in err or "from 0 to 100" in err, err


@pytest.mark.parametrize("score", [-1, -50, 101, 100_000, True, None, "nan", "1e999"])
def test_bad_scores_from_rows_and_their_exit_code(score: Any) -> None:
    """From Python (an iterable of rows) too: refused, never taken as warm or hot."""
    rows = _rows(3)
    rows[1]["CPU_USAGE_SCORE"] = score
    from sharded_orm import ShardValueError

    with pytest.raises(ShardValueError, match=r"row 2: CPU_USAGE_SCORE .*(0-100|0 to 100)"):
        doctor(rows, MODELS)


@given(score=st.integers(0, 100), as_text=st.booleans())
def test_every_score_in_range_is_read(score: int, as_text: bool) -> None:
    rows = _rows(2, CPU_USAGE_SCORE=str(score) if as_text else float(score))
    assert doctor(rows, MODELS).findings[0].peak_score == score


# --- (C) keys classified by what they hold --------------------------------------------------

IdMaker = Callable[[dt.datetime, random.Random], str]
TIME_ORDERED_IDS: dict[str, tuple[str, IdMaker, str]] = {
    "uuid7": ("Events", lambda w, r: str(_time_ordered(7, w, r)), "uuid7"),
    "uuid7 hex": ("Events", lambda w, r: _time_ordered(7, w, r).hex, "uuid7"),
    "uuid6": ("Events", lambda w, r: str(_time_ordered(6, w, r)), "uuid7"),
    "ulid": ("Tickets", _ulid, "ulid"),
    "ulid lower": ("Tickets", lambda w, r: _ulid(w, r).lower(), "ulid"),
    "date prefix": ("Tickets", lambda w, r: f"{w:%Y%m%dT%H%M%S}-{r.random()}", "time_prefix"),
    "iso prefix": ("Tickets", lambda w, r: ts(w) + f"#{r.getrandbits(32)}", "time_prefix"),
    "epoch ms": ("Tickets", lambda w, r: f"{w.timestamp() * 1000:.0f}-{r.random()}", "time_prefix"),
    "uuid7 as Uuid": ("Items", lambda w, r: str(_time_ordered(7, w, r)), "uuid7"),
}  # fmt: skip


def _tail_rows(table: str, make: IdMaker, minutes: int, seed: int) -> list[dict[str, Any]]:
    """One hot split a minute at the end of ``table``'s key space, each starting at an id
    made that minute (what Spanner lists for a key that grows)."""
    rng = random.Random(seed)
    rows = []
    for m in range(minutes):
        end = T0 + dt.timedelta(minutes=m + 1)
        start = make(end - dt.timedelta(seconds=5), rng)
        rows.append(
            {
                "INTERVAL_END": ts(end),
                "SPLIT_START": f"{table}({json.dumps(start)})",
                "SPLIT_LIMIT": "<end>",
                "CPU_USAGE_SCORE": 100,
                "AFFECTED_TABLES": [table],
            }
        )
    return rows


@pytest.mark.parametrize("kind", list(TIME_ORDERED_IDS))
def test_a_time_ordered_key_filled_by_an_app_helper_is_monotonic(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table, make, role = TIME_ORDERED_IDS[kind]
    path = write(tmp_path, "splits.json", gcloud_json(_tail_rows(table, make, 12, 1)))
    code, out, err = run(capsys, path, TARGET)
    assert code == 1, err
    assert out is not None
    [finding] = out["findings"]
    assert (finding["table"], finding["pattern"], finding["rule"]) == (table, "monotonic", "SO101")
    assert finding["growing_role"] == role
    assert finding["column"] == MODELS.metadata.tables[table].primary_key.columns[0].name
    assert "its split keys hold" in finding["fix"]


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(list(TIME_ORDERED_IDS)),
    minutes=st.integers(2, 20),
    seed=st.integers(0, 2**32),
)
def test_time_ordered_keys_carry_their_growing_part_for_fix(
    kind: str, minutes: int, seed: int
) -> None:
    """What --fix needs: the finding names the growing column and, for each key column,
    the role doctor saw (``finding.role_of(column)``), not the declaration's guess."""
    table, make, role = TIME_ORDERED_IDS[kind]
    [finding] = doctor(_tail_rows(table, make, minutes, seed), MODELS).findings
    col = MODELS.metadata.tables[table].primary_key.columns[0]
    assert finding.pattern == "monotonic" and finding.column == col.name
    assert finding.role_of(col) == role == finding.growing_role
    assert finding.roles == {col.name: role}


@settings(max_examples=30, deadline=None)
@given(minutes=st.integers(2, 20), seed=st.integers(0, 2**32))
def test_random_uuids_are_not_taken_as_growing(minutes: int, seed: int) -> None:
    rows = _tail_rows("Events", lambda w, r: str(uuid.UUID(int=r.getrandbits(128), version=4)),
                      minutes, seed)  # fmt: skip
    for f in doctor(rows, MODELS).findings:
        assert f.pattern != "monotonic" and f.growing_role is None, f


def test_time_ordered_uuid_bytes_are_seen(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A BYTES(16) key holding UUIDv7s (printed as a quoted byte string)."""
    rng = random.Random(3)
    rows = []
    for m in range(12):
        end = T0 + dt.timedelta(minutes=m + 1)
        raw = _time_ordered(7, end, rng).bytes
        text = json.dumps(raw.decode("latin-1"))
        rows.append({**_rows(1)[0], "INTERVAL_END": ts(end), "SPLIT_START": f"Blobs(b{text})",
                     "AFFECTED_TABLES": ["Blobs"]})  # fmt: skip
    path = write(tmp_path, "splits.csv", csv_text(rows))
    code, out, err = run(capsys, path, TARGET)
    assert code == 1, err
    assert out is not None
    [finding] = out["findings"]
    assert (finding["pattern"], finding["growing_role"]) == ("monotonic", "uuid7")


def test_a_declared_random_uuid_key_holding_v7_values_follows_the_values() -> None:
    """Items.Key's default is uuid.uuid4, yet the keys hold version-7 UUIDs (another writer
    fills them): the keys win."""
    table, make, _ = TIME_ORDERED_IDS["uuid7 as Uuid"]
    [finding] = doctor(_tail_rows(table, make, 6, 9), MODELS).findings
    assert (finding.pattern, finding.growing_role) == ("monotonic", "uuid7")
