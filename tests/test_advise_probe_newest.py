"""Issue 43: ``advise`` decides a key column's role by the ids the app writes now.

``probe`` reads up to 1,000 rows of the key columns whose role their values decide. It
reads the newest, by the time column advise samples by (through the time index on
Spanner), so an app that switched its id scheme (UUIDv4 to UUIDv7, or back) is judged by
its new ids, not by its old rows. The old rows here come first in every order a read
without ORDER BY could take: inserted first, and first in key order (their ids sort
below the new ones). SQLite and the emulator; a CSV and rows given in any order.
"""

from __future__ import annotations

import csv
import datetime as dt
import random
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm.errors import ShardConfigError
from sharded_orm.schema.columns import table_of
from sharded_orm.tools.advise import advise
from sharded_orm.tools.advise.layout import held_roles
from sharded_orm.tools.advise.sample import PROBE_ROWS, probe
from sharded_orm.tools.doctor.keys import value_role
from sharded_orm.tools.simulate import Instance

SMALL = Instance(nodes=6, node_capacity=350, tick=5)
COUNTS = (1, 2, 4, 8)
T0 = dt.datetime(2024, 3, 1, 12, 0)  # naive: SQLite's DateTime; read as UTC
OLD, NEW = 1500, PROBE_ROWS + 100  # the old rows outnumber the new; the new fill a probe


def v7(when: dt.datetime, rng: random.Random) -> str:
    ms = int(when.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)
    bits = (ms << 80) | (7 << 76) | (rng.getrandbits(12) << 64) | (2 << 62) | rng.getrandbits(62)
    return str(uuid.UUID(int=bits))


def v4_low(rng: random.Random) -> str:
    """A random version-4 UUID whose text sorts below any UUIDv7 of this century ("00...")."""
    return str(uuid.UUID(int=rng.getrandbits(120), version=4))


def new_id() -> str:
    """The app's own id helper: its name says nothing of what it makes."""
    return v7(dt.datetime.now(), random.Random())


def uuid7() -> str:
    """Named uuid7: what the declaration guesses the key is (time-ordered)."""
    return new_id()


class Base(DeclarativeBase):
    pass


class Ticket(Base):  # declared: CreatedAt grows (the key's time part); Id is random
    __tablename__ = "pn_tickets"
    TenantId: Mapped[str] = mapped_column(sa.String(20), primary_key=True)
    Id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=new_id)
    CreatedAt: Mapped[dt.datetime] = mapped_column(sa.DateTime, primary_key=True)


class Doc(Base):  # declared: the key (uuid7) and the time index both grow
    __tablename__ = "pn_docs"
    Id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=uuid7)
    CreatedAt: Mapped[dt.datetime] = mapped_column(sa.DateTime)
    __table_args__ = (sa.Index("pn_docs_by_time", "CreatedAt"),)


def ticket_rows(seed: int) -> list[dict[str, Any]]:
    """Old rows with UUIDv4 ids, then the newest ``NEW`` with UUIDv7 ids, 100 rows/s."""
    rng = random.Random(seed)
    out = []
    for i in range(OLD + NEW):
        t = T0 + dt.timedelta(seconds=i / 100)
        out.append({"TenantId": f"t{i % 3}", "Id": v7(t, rng) if i >= OLD else v4_low(rng),
                    "CreatedAt": t})  # fmt: skip
    return out


def doc_rows(seed: int) -> list[dict[str, Any]]:
    """Old rows with UUIDv7 ids, then the newest ``NEW`` with random UUIDv4 ids that sort
    above them (text from "1..."; a UUIDv7 of this century starts "01...")."""
    rng = random.Random(seed)
    out = []
    for i in range(OLD + NEW):
        t = T0 + dt.timedelta(seconds=i / 100)
        high = str(uuid.UUID(int=rng.getrandbits(128) | 1 << 124, version=4))
        out.append({"Id": high if i >= OLD else v7(t, rng), "CreatedAt": t})
    return out


def assert_ticket_by_newest(a: Any) -> None:
    lay = a.layout
    assert (lay.growing, lay.tenant) == ("Id", "TenantId")
    held = a.as_dict()["held_by_values"]["Id"]
    assert held["role"] == "uuid7" and held["growing"] is True
    assert held["why"] == "its values are time-ordered UUIDs (version 7): 100% of 1,000 sampled"


def assert_doc_by_newest(a: Any) -> None:
    assert (a.layout.index, a.layout.growing) == ("pn_docs_by_time", "CreatedAt")
    held = a.as_dict()["held_by_values"]["Id"]
    assert held["role"] == "uuid4" and held["growing"] is False
    assert held["why"] == "its values are random UUIDs (version 4): 100% of 1,000 sampled"


# --- a database: SQLite, the emulator --------------------------------------------------------


def insert(engine: sa.Engine, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    table.create(engine)
    with engine.begin() as conn:
        for start in range(0, len(rows), 1000):
            conn.execute(table.insert(), rows[start : start + 1000])


def statements(engine: sa.Engine) -> list[str]:
    seen: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    return seen


@pytest.fixture
def sqlite(tmp_path: Path) -> Any:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    yield engine
    engine.dispose()


def test_sqlite_a_key_switched_from_v4_to_v7_grows_by_its_newest_ids(sqlite: Any) -> None:
    insert(sqlite, table_of(Ticket), ticket_rows(1))
    seen = statements(sqlite)
    a = advise(Ticket, sqlite, instance=SMALL, candidates=COUNTS)
    assert_ticket_by_newest(a)
    assert 'ORDER BY pn_tickets."CreatedAt" DESC' in seen[0] and "LIMIT" in seen[0], seen[0]


def test_sqlite_a_key_switched_from_v7_to_v4_is_random_by_its_newest_ids(sqlite: Any) -> None:
    insert(sqlite, table_of(Doc), doc_rows(2))
    a = advise(Doc, sqlite, instance=SMALL, candidates=COUNTS)
    assert_doc_by_newest(a)


def test_emulator_a_key_switched_from_v4_to_v7_grows_by_its_newest_ids(
    spanner_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDED_ORM_PROGRESS", "off")
    insert(spanner_engine, table_of(Ticket), ticket_rows(3))
    assert_ticket_by_newest(advise(Ticket, spanner_engine, instance=SMALL, candidates=COUNTS))


def test_emulator_the_probe_reads_the_newest_through_the_time_index(
    spanner_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDED_ORM_PROGRESS", "off")
    insert(spanner_engine, table_of(Doc), doc_rows(4))
    seen = statements(spanner_engine)
    a = advise(Doc, spanner_engine, instance=SMALL, candidates=COUNTS)
    assert_doc_by_newest(a)
    first = " ".join(seen[0].replace("`", "").split())
    assert "FROM pn_docs @{FORCE_INDEX=pn_docs_by_time} ORDER BY pn_docs.CreatedAt DESC LIMIT" \
        in first, first  # fmt: skip


def test_without_the_newest_rows_the_old_ids_would_decide() -> None:
    """What the test above guards: the first 1,000 rows (what a read without ORDER BY
    gives) are the old ids, whose role is the other one."""
    rows = doc_rows(2)
    assert {value_role(r["Id"]) for r in rows[:PROBE_ROWS]} == {"uuid7"}
    with pytest.raises(ShardConfigError, match="2 key spaces that grow"):
        advise(Doc, rows[:OLD], instance=SMALL, candidates=COUNTS)


def test_a_table_without_a_time_column_keeps_the_plain_read(sqlite: Any) -> None:
    t = sa.Table("pn_plain", sa.MetaData(), sa.Column("Id", sa.String(36), primary_key=True))
    rng = random.Random(5)
    insert(sqlite, t, [{"Id": v4_low(rng)} for _ in range(50)])
    seen = statements(sqlite)
    got = probe(t, "engine", sqlite)
    assert len(got) == 50 and "ORDER BY" not in seen[0]


# --- a CSV and rows given: the greatest times, in whatever order they come -------------------


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({**r, "CreatedAt": r["CreatedAt"].isoformat() + "Z"})
    return path


@pytest.mark.parametrize("order", ["oldest first", "newest first", "shuffled"])
def test_a_csv_is_judged_by_its_newest_records(tmp_path: Path, order: str) -> None:
    rows = ticket_rows(6)
    if order == "newest first":
        rows.reverse()
    elif order == "shuffled":
        random.Random(7).shuffle(rows)
    path = write_csv(tmp_path / "tickets.csv", rows)
    assert_ticket_by_newest(advise(Ticket, path, instance=SMALL, candidates=COUNTS))
    docs = doc_rows(8)
    if order == "newest first":
        docs.reverse()
    elif order == "shuffled":
        random.Random(9).shuffle(docs)
    path = write_csv(tmp_path / "docs.csv", docs)
    assert_doc_by_newest(advise(Doc, path, instance=SMALL, candidates=COUNTS))


def test_a_csv_time_that_is_not_a_time_is_refused_saying_where(tmp_path: Path) -> None:
    rows = ticket_rows(10)[:5]
    path = write_csv(tmp_path / "bad.csv", rows)
    text = path.read_text().splitlines()
    text[3] = text[3].replace(text[3].split(",")[2], "yesterday")
    path.write_text("\n".join(text) + "\n")
    with pytest.raises(Exception, match="line 4: 'yesterday' is not a DateTime"):
        probe(table_of(Ticket), "csv", path)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**32),
    old=st.integers(0, 3 * PROBE_ROWS),
    switch_to=st.sampled_from(["v7", "v4"]),
)
def test_rows_given_in_any_order_are_judged_by_the_newest(
    seed: int, old: int, switch_to: str
) -> None:
    """However many old rows, in whatever order: the ``PROBE_ROWS`` newest decide."""
    rng = random.Random(seed)
    rows = []
    for i in range(old + PROBE_ROWS):
        t = T0 + dt.timedelta(milliseconds=10 * i)
        is_new = i >= old
        as_v7 = is_new == (switch_to == "v7")
        rows.append({"TenantId": "t", "Id": v7(t, rng) if as_v7 else v4_low(rng), "CreatedAt": t})
    rng.shuffle(rows)
    table = table_of(Ticket)
    got = probe(table, "rows", rows)
    assert len(got) == PROBE_ROWS
    assert {value_role(r["Id"]) for r in got} == {"uuid7" if switch_to == "v7" else "uuid4"}
    assert [h.role for h in held_roles(table, got)] == (["uuid7"] if switch_to == "v7" else [])
