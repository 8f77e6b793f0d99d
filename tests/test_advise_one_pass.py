"""``advise`` reads its sample's source once: the probe and the sample from one read.

The probe (the newest 1,000 rows of the key columns whose role their values decide) and
the sample (the newest rows by the layout's time column) were two reads: a CSV streamed
twice, a database read twice through the same time index. Now a CSV is streamed once (the
probe is the newest 1,000 of the records the pass keeps), so a named pipe, which can be
read only once, is a sample too (``--csv <(zcat events.csv.gz)``); a database is read
once where the declared layout stands (the probe is the newest rows of the sample). The
advice is the one the two reads gave (the same layout, roles and sample: ``probe`` then
``from_csv`` / ``from_engine``, the two reads as they were). Where the sample is ordered
otherwise than the probe, the second read remains, and a pipe is refused saying why.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import shard_column
from sharded_orm.errors import ShardConfigError
from sharded_orm.schema.columns import table_of
from sharded_orm.tools.advise import advise
from sharded_orm.tools.advise.layout import Layout, held_roles, layout_of
from sharded_orm.tools.advise.sample import (
    PROBE_ROWS,
    Sample,
    SampleReader,
    from_csv,
    from_engine,
    probe,
)
from sharded_orm.tools.simulate import Instance

SMALL = Instance(nodes=6, node_capacity=350, tick=5)
COUNTS = (1, 2, 4, 8)
T0 = dt.datetime(2024, 3, 1, 12, 0)  # naive: SQLite's DateTime; read as UTC


def new_id() -> str:
    """The app's own id helper: its name says nothing of what it makes."""
    return str(uuid.uuid4())


class Base(DeclarativeBase):
    pass


class Event(Base):  # declared: the time index grows; Id's role is left to its values
    __tablename__ = "op_events"
    Id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=new_id)
    CreatedAt: Mapped[dt.datetime] = mapped_column(sa.DateTime)
    __table_args__ = (sa.Index("op_events_by_time", "CreatedAt"),)


class Ticket(Base):  # declared: CreatedAt grows; Id's values may make it the growing part
    __tablename__ = "op_tickets"
    TenantId: Mapped[str] = mapped_column(sa.String(20), primary_key=True)
    Id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=new_id)
    CreatedAt: Mapped[dt.datetime] = mapped_column(sa.DateTime, primary_key=True)


class Ledger(Base):  # sharded by its key, which grows by Seq (no time); a time index beside
    __tablename__ = "op_ledger"
    LedgerShardId: Mapped[int] = shard_column("Seq", count=4, primary_key=True)
    Id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=new_id)
    Seq: Mapped[int] = mapped_column(
        sa.Integer, primary_key=True, info={"sharded_orm.sequential": True}
    )
    CreatedAt: Mapped[dt.datetime] = mapped_column(sa.DateTime)
    __table_args__ = (sa.Index("op_ledger_by_time", "CreatedAt"),)


def v7(when: dt.datetime, rng: random.Random) -> str:
    ms = int(when.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)
    bits = (ms << 80) | (7 << 76) | (rng.getrandbits(12) << 64) | (2 << 62) | rng.getrandbits(62)
    return str(uuid.UUID(int=bits))


def v4(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def generated(model: Any, n: int, seed: int, ties: bool, burst: bool, v7_from: float) -> list[Any]:
    """``n`` rows of ``model``, oldest first, 20 rows/s: ``ties`` repeats a time about one
    row in three, ``burst`` writes the last 300 at 500 rows/s; ids from the ``v7_from``
    share of the rows on are UUIDv7, the ones before random UUIDv4."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    t = T0
    for i in range(n):
        if not (ties and rng.random() < 0.3):
            t += dt.timedelta(seconds=0.002 if burst and i >= n - 300 else 0.05)
        row: dict[str, Any] = {"Id": v7(t, rng) if i >= v7_from * n else v4(rng), "CreatedAt": t}
        if model is Ticket:
            row["TenantId"] = f"t{i % 3}"
        if model is Ledger:
            row["Seq"] = i + 1
        out.append(row)
    return out


def ordered(rows: list[Any], order: str, seed: int) -> list[Any]:
    if order == "newest first":
        return rows[::-1]
    if order == "shuffled":
        out = list(rows)
        random.Random(seed).shuffle(out)
        return out
    return rows


def csv_text(rows: list[dict[str, Any]]) -> str:
    lines = [",".join(rows[0])]
    for r in rows:
        lines.append(",".join(v.isoformat() if isinstance(v, dt.datetime) else str(v)
                              for v in r.values()))  # fmt: skip
    return "\n".join(lines) + "\n"


# --- counting the passes: a named pipe (read once), Python's audit hook (opens) ---------------


@contextmanager
def pipe(tmp_path: Path, text: str) -> Iterator[Path]:
    """A named pipe serving ``text`` once (to the first reader that opens it)."""
    path = tmp_path / "events.csv"
    os.mkfifo(path)

    def serve() -> None:
        with path.open("w") as f:  # blocks until a reader opens the pipe
            f.write(text)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        yield path
    finally:
        if server.is_alive():  # never opened: let the server's open return
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            server.join(10)
            os.close(fd)


#: the paths watched: [opens so far, whether a second open is refused (a pipe's would hang)]
_OPENS: dict[str, list[int]] = {}


def _count_opens(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and args and isinstance(args[0], (str, os.PathLike)):
        count = _OPENS.get(os.fspath(args[0]))
        if count is not None:
            count[0] += 1
            if count[1] and count[0] > 1:  # an audit hook may refuse the event
                raise RuntimeError(f"{args[0]} opened a second time")


sys.addaudithook(_count_opens)  # Python's own hook on every open(): counts only watched paths


@contextmanager
def opens(path: Path, once: bool = False) -> Iterator[list[int]]:
    """How many times ``path`` is opened in the block (``[0]``); ``once``: a second open
    is refused (RuntimeError), as a pipe read twice would wait forever."""
    count = _OPENS[str(path)] = [0, once]
    try:
        yield count
    finally:
        _OPENS.pop(str(path), None)


# --- the two reads as they were: the reference --------------------------------------------


def two_reads(model: Any, sample: Any, **kw: Any) -> tuple[Layout, Sample]:
    """The layout and sample of today's two reads: ``probe``, then the layout the values
    decide, read (``from_csv`` / ``from_engine``)."""
    table = table_of(model)
    kind = "csv" if isinstance(sample, Path) else "engine"
    declared = layout_of(model)
    held = held_roles(table, probe(table, kind, sample, declared))
    layout = layout_of(model, held=held)
    if kind == "csv":
        return layout, from_csv(layout, sample, window=float(SMALL.tick), **kw)
    return layout, from_engine(layout, sample, window=float(SMALL.tick), **kw)


def essentials(layout: Layout) -> tuple[Any, ...]:
    return (layout.index, layout.parts, layout.tenant, layout.growing, layout.held,
            layout.source_names)  # fmt: skip


def assert_as_two_reads(a: Any, model: Any, sample: Any, **kw: Any) -> None:
    """The advice ``a`` is priced from the layout and sample the two reads gave."""
    layout, data = two_reads(model, sample, **kw)
    assert essentials(a.layout) == essentials(layout)
    assert a.sample == data  # rows, rates, busiest window, source ("cut to its newest ...")


# --- a CSV ---------------------------------------------------------------------------------


@pytest.mark.parametrize("model,v7_from", [(Event, 1.1), (Ticket, 0.5)])
def test_a_csv_is_opened_once(tmp_path: Path, model: Any, v7_from: float) -> None:
    """Event: the probe's Id values are random (the layout stands); Ticket: the newest ids
    are UUIDv7 (Id becomes the growing part; the sample is still ordered by CreatedAt)."""
    path = tmp_path / "events.csv"
    path.write_text(csv_text(ordered(generated(model, 2500, 1, True, True, v7_from),
                                     "shuffled", 2)))  # fmt: skip
    with opens(path) as seen:
        a = advise(model, path, instance=SMALL, candidates=COUNTS)
    assert seen[0] == 1
    assert (a.layout.growing == "Id") is (model is Ticket)
    assert_as_two_reads(a, model, path)


@pytest.mark.parametrize("model,v7_from", [(Event, 1.1), (Ticket, 0.5)])
def test_a_named_pipe_is_a_sample_read_once(tmp_path: Path, model: Any, v7_from: float) -> None:
    rows = ordered(generated(model, 2500, 3, False, True, v7_from), "newest first", 4)
    file = tmp_path / "file.csv"
    file.write_text(csv_text(rows))
    with pipe(tmp_path, csv_text(rows)) as path, opens(path, once=True) as passes:
        a = advise(model, path, instance=SMALL, candidates=COUNTS)
    assert passes[0] == 1
    b = advise(model, file, instance=SMALL, candidates=COUNTS)
    assert a.table().replace(str(path), "FILE") == b.table().replace(str(file), "FILE")


def test_a_sample_ordered_otherwise_than_the_probe_is_read_again(tmp_path: Path) -> None:
    """Ledger's key grows by Seq (no time): its sample is the file's first records, its
    probe the newest by the time index. A file is read twice (as before); a pipe, which
    cannot be, is refused saying so and what to do."""
    rows = generated(Ledger, 1500, 5, False, False, 1.1)
    file = tmp_path / "ledger.csv"
    file.write_text(csv_text(rows))
    with opens(file) as seen:
        a = advise(Ledger, file, instance=SMALL, candidates=COUNTS, rows_per_second=100)
    assert seen[0] == 2
    layout, data = two_reads(Ledger, file, rows_per_second=100)
    assert essentials(a.layout) == essentials(layout) and a.sample == data
    with (
        pipe(tmp_path, csv_text(rows)) as path,
        opens(path, once=True) as passes,
        pytest.raises(ShardConfigError, match="is a pipe, which can be read once: advise read "
                      "it by CreatedAt .* the sample's order its first records: save it to a "
                      "file and give that"),
    ):  # fmt: skip
        advise(Ledger, path, instance=SMALL, candidates=COUNTS, rows_per_second=100)
    assert passes[0] == 1


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    model=st.sampled_from([Event, Ticket]),
    n=st.sampled_from([1, 2, PROBE_ROWS - 1, PROBE_ROWS, PROBE_ROWS + 1, 1300, 1700]),
    limit=st.sampled_from([PROBE_ROWS - 1, PROBE_ROWS, PROBE_ROWS + 1, 1299, 1300, 1301]),
    order=st.sampled_from(["oldest first", "newest first", "shuffled"]),
    ties=st.booleans(),
    burst=st.booleans(),
    v7_from=st.sampled_from([0.0, 0.5, 1.1]),
    seed=st.integers(0, 2**32),
)
def test_one_pass_gives_what_the_two_passes_gave(
    tmp_path_factory: pytest.TempPathFactory,
    model: Any,
    n: int,
    limit: int,
    order: str,
    ties: bool,
    burst: bool,
    v7_from: float,
    seed: int,
) -> None:
    """Around the probe's 1,000 and the sample's ``limit``, in any order, with ties and a
    burst at the end: the same roles, layout and sample (rows, busiest window, the "cut to
    its newest N of M records" source) as ``probe`` then ``from_csv``, from one open."""
    path = tmp_path_factory.mktemp("csv") / "events.csv"
    path.write_text(csv_text(ordered(generated(model, n, seed, ties, burst, v7_from),
                                     order, seed)))  # fmt: skip
    table = table_of(model)
    window = float(SMALL.tick)
    reader = SampleReader(table, "csv", path, layout_of(model), None, 20_000, window, limit)
    with opens(path) as seen:
        got_probe = reader.probe()
        held = held_roles(table, got_probe)
        try:
            layout = layout_of(model, held=held)
        except ShardConfigError:  # Event's ids all UUIDv7: two key spaces grow, as before
            layout = None
        try:
            got: Any = layout and reader.read(layout)
        except ShardConfigError as exc:  # the records span no time: no rate, as before
            got = str(exc)
    assert seen[0] == 1
    assert got_probe == probe(table, "csv", path, layout_of(model))
    if layout is None:
        return
    try:
        want: Any = from_csv(layout, path, window=window, limit=limit)
    except ShardConfigError as exc:
        want = str(exc)
    assert got == want


# --- a database: SQLite, the emulator -------------------------------------------------------


def insert(engine: sa.Engine, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    table.create(engine)
    with engine.begin() as conn:
        for start in range(0, len(rows), 1000):
            conn.execute(table.insert(), rows[start : start + 1000])


def selects_of(engine: sa.Engine, table: str) -> list[str]:
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        flat = " ".join(statement.replace("`", "").replace('"', "").split())
        if flat.upper().startswith("SELECT") and f"FROM {table}" in flat:
            seen.append(flat)

    sa.event.listen(engine, "before_cursor_execute", record)
    return seen


@pytest.fixture
def sqlite(tmp_path: Path) -> Any:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    yield engine
    engine.dispose()


@pytest.mark.parametrize("size", [500, PROBE_ROWS, 20_000])
def test_sqlite_the_declared_layout_standing_is_one_select(sqlite: Any, size: int) -> None:
    insert(sqlite, table_of(Event), generated(Event, 1500, 6, True, True, 1.1))
    seen = selects_of(sqlite, "op_events")
    a = advise(Event, sqlite, instance=SMALL, candidates=COUNTS, sample_size=size)
    assert len(seen) == 1, seen
    assert "ORDER BY op_events.CreatedAt DESC LIMIT" in seen[0]
    assert len(a.sample.rows) == min(size, 1500)
    assert_as_two_reads(a, Event, sqlite, size=size)


def test_sqlite_values_that_change_the_read_keep_the_second(sqlite: Any) -> None:
    """Ticket's newest ids are UUIDv7: Id becomes the growing part, the sample is read by
    it; the probe (by CreatedAt) could not be that read."""
    insert(sqlite, table_of(Ticket), generated(Ticket, 2500, 7, False, True, 0.5))
    seen = selects_of(sqlite, "op_tickets")
    a = advise(Ticket, sqlite, instance=SMALL, candidates=COUNTS)
    assert a.layout.growing == "Id"
    assert len(seen) == 2 and "ORDER BY op_tickets.Id DESC" in seen[1], seen
    assert_as_two_reads(a, Ticket, sqlite)


@pytest.mark.emulator
def test_emulator_the_declared_layout_standing_is_one_read_through_the_index(
    spanner_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDED_ORM_PROGRESS", "off")
    insert(spanner_engine, table_of(Event), generated(Event, 1500, 8, True, True, 1.1))
    seen = selects_of(spanner_engine, "op_events")
    a = advise(Event, spanner_engine, instance=SMALL, candidates=COUNTS)
    assert len(seen) == 1, seen
    assert "FROM op_events @{FORCE_INDEX=op_events_by_time} ORDER BY op_events.CreatedAt " \
        "DESC LIMIT" in seen[0], seen[0]  # fmt: skip
    assert len(a.sample.rows) == 1500
    assert_as_two_reads(a, Event, spanner_engine)
