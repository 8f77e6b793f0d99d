"""Issue 43: ``advise`` finds a growing key by its values, as ``doctor`` does.

A UUID or text key filled by an application's own helper (not named ``uuid7``) whose values
are time-ordered (UUID versions 1/6/7, ULIDs, text led by a time) is the growing part, by
doctor's own ``value_role`` on the sampled values (90 % of them); a key declared
time-ordered (a default named ``uuid7``) whose values are random version-4 UUIDs is not.
The advice says which and why. Rows given, and a database (SQLite; the emulator).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from test_advise_unsharded import fill

from sharded_orm.errors import ShardConfigError
from sharded_orm.schema.columns import table_of
from sharded_orm.tools.advise import advise
from sharded_orm.tools.advise.layout import held_roles
from sharded_orm.tools.cli import main
from sharded_orm.tools.simulate import Instance

SMALL = Instance(nodes=6, node_capacity=350, tick=5)
COUNTS = (1, 2, 4, 8, 16)
T0 = dt.datetime(2024, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def v7(when: dt.datetime, rng: random.Random) -> uuid.UUID:
    """A version-7 UUID: Unix milliseconds first, then random bits."""
    ms = int(when.timestamp() * 1000)
    bits = (ms << 80) | (7 << 76) | (rng.getrandbits(12) << 64) | (2 << 62) | rng.getrandbits(62)
    return uuid.UUID(int=bits)


def v4(rng: random.Random) -> uuid.UUID:
    return uuid.UUID(int=rng.getrandbits(128), version=4)


def ulid(when: dt.datetime, rng: random.Random) -> str:
    n = (int(when.timestamp() * 1000) << 80) | rng.getrandbits(80)
    return "".join(CROCKFORD[(n >> (5 * i)) & 31] for i in reversed(range(26)))


def new_id() -> str:
    """The application's own id helper: its name says nothing of what it makes."""
    return str(v7(dt.datetime.now(dt.timezone.utc), random.Random()))


def uuid7() -> str:
    """Named uuid7, but a random version-4 UUID (an app's fallback where none is built in)."""
    return str(uuid.uuid4())


class Base(DeclarativeBase):
    pass


class Event(Base):  # the key alone: no time column to grow by, as declared
    __tablename__ = "vr_events"
    Id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=new_id)
    Kind: Mapped[str] = mapped_column(sa.String(20))


class Ticket(Base):  # a tenant, an id, a time: declared, the time grows and the id "tenant"s
    __tablename__ = "vr_tickets"
    TenantId: Mapped[str] = mapped_column(sa.String(20), primary_key=True)
    Id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=new_id)
    CreatedAt: Mapped[dt.datetime] = mapped_column(sa.DateTime, primary_key=True)


class Doc(Base):  # declared: the key (uuid7) and the time index both grow
    __tablename__ = "vr_docs"
    Id: Mapped[str] = mapped_column(sa.String(36), primary_key=True, default=uuid7)
    CreatedAt: Mapped[dt.datetime] = mapped_column(sa.DateTime)
    __table_args__ = (sa.Index("vr_docs_by_time", "CreatedAt"),)


IdMaker = Callable[[dt.datetime, random.Random], str]
#: time-ordered ids an app's helper makes, and what advise says of them
TIME_ORDERED: dict[str, tuple[IdMaker, str]] = {
    "uuid7": (lambda w, r: str(v7(w, r)), "its values are time-ordered UUIDs (version 7)"),
    "uuid7 hex": (lambda w, r: v7(w, r).hex, "its values are time-ordered UUIDs (version 7)"),
    "ulid": (ulid, "its values are ULIDs (time-ordered)"),
    "date prefix": (
        lambda w, r: f"{w:%Y%m%dT%H%M%S}-{r.getrandbits(40):x}",
        "its values are text led by a time (a date, a date-time or Unix seconds)",
    ),
}


def times(n: int, rate: float) -> list[dt.datetime]:
    return [T0 + dt.timedelta(seconds=i / rate) for i in range(n)]


@pytest.mark.parametrize("kind", list(TIME_ORDERED))
def test_a_key_an_app_helper_fills_with_time_ordered_ids_is_the_growing_part(kind: str) -> None:
    make, phrase = TIME_ORDERED[kind]
    rng = random.Random(1)
    rows = [{"Id": make(t, rng), "Kind": "k"} for t in times(2000, 200)]
    a = advise(Event, rows, instance=SMALL, candidates=COUNTS, rows_per_second=600)
    assert a.layout.proposed and a.layout.growing == "Id"
    assert a.model_line is not None and a.model_line.startswith('shard_column("Id", count=')
    text = a.table()
    assert f"Id: {phrase}" in text and "100% of 1,000 sampled; the part that grows" in text
    held = a.as_dict()["held_by_values"]["Id"]
    assert held["growing"] is True and held["role"] != "uuid4"
    assert a.count is not None and a.count > 1  # 600 rows/s at one tail is over the target


def test_random_ids_in_an_undeclared_key_still_give_nothing_to_size() -> None:
    rng = random.Random(2)
    rows = [{"Id": str(v4(rng)), "Kind": "k"} for _ in range(500)]
    with pytest.raises(ShardConfigError, match="has no time-ordered column"):
        advise(Event, rows, instance=SMALL, candidates=COUNTS, rows_per_second=100)


def test_a_key_growing_by_its_values_is_found_before_a_later_time_part() -> None:
    """Declared, the key grows at CreatedAt with Id as its "tenant" (spread by a random
    id: no hot tail); its values make Id the growing part, TenantId the tenant before it,
    and the rate is still measured by CreatedAt."""
    rng = random.Random(3)
    rows = [
        {"TenantId": f"t{i % 3}", "Id": str(v7(t, rng)), "CreatedAt": t}
        for i, t in enumerate(times(3000, 100))
    ]
    a = advise(Ticket, rows, instance=SMALL, candidates=COUNTS)
    lay = a.layout
    assert (lay.growing, lay.tenant, lay.source_names) == ("Id", "TenantId", ("TenantId", "Id"))
    assert a.sample.rows_per_second == pytest.approx(100, rel=0.05)
    assert "Id: its values are time-ordered UUIDs (version 7)" in a.table()


def test_a_key_declared_uuid7_whose_values_are_random_does_not_grow() -> None:
    """Declared, both the key (a ``uuid7`` default) and the time index grow: advise asked
    which. The key's values are version-4 UUIDs: the time index is the one that grows."""
    rng = random.Random(4)
    rows = [{"Id": str(v4(rng)), "CreatedAt": t} for t in times(3000, 100)]
    a = advise(Doc, rows, instance=SMALL, candidates=COUNTS)
    assert (a.layout.index, a.layout.growing) == ("vr_docs_by_time", "CreatedAt")
    text = a.table()
    assert "Id: its values are random UUIDs (version 4): 100% of 1,000 sampled; not a part " \
        "that grows" in text  # fmt: skip
    assert a.as_dict()["held_by_values"]["Id"]["growing"] is False


def test_time_ordered_values_in_a_declared_uuid7_key_keep_both_key_spaces() -> None:
    rng = random.Random(5)
    rows = [{"Id": str(v7(t, rng)), "CreatedAt": t} for t in times(500, 100)]
    with pytest.raises(ShardConfigError, match="2 key spaces that grow"):
        advise(Doc, rows, instance=SMALL, candidates=COUNTS)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    n=st.integers(20, 300),
    share=st.floats(0.0, 1.0),
    other=st.sampled_from(["v4", "opaque"]),
    seed=st.integers(0, 2**32),
)
def test_a_key_grows_by_its_values_when_nine_in_ten_are_time_ordered(
    n: int, share: float, other: str, seed: int
) -> None:
    """Event.Id (declared random): time-ordered when >= 90 % of its sampled values are,
    a value ``value_role`` cannot tell counting for the declaration (doctor's rule)."""
    rng = random.Random(seed)
    k = round(n * share)
    values = [str(v7(T0, rng)) for _ in range(k)]
    values += [str(v4(rng)) if other == "v4" else f"id-{i}" for i in range(n - k)]
    rng.shuffle(values)
    held = held_roles(table_of(Event), [{"Id": v} for v in values])
    assert [h.role for h in held] == (["uuid7"] if k >= 0.9 * n else [])


@settings(max_examples=60, deadline=None, derandomize=True)
@given(n=st.integers(20, 300), share=st.floats(0.0, 1.0), seed=st.integers(0, 2**32))
def test_a_declared_time_ordered_key_is_random_when_nine_in_ten_values_are(
    n: int, share: float, seed: int
) -> None:
    rng = random.Random(seed)
    k = round(n * share)
    values = [v4(rng) for _ in range(k)] + [v7(T0, rng) for _ in range(n - k)]
    held = held_roles(table_of(Doc), [{"Id": str(v)} for v in values])
    assert [h.role for h in held] == (["uuid4"] if k >= 0.9 * n else [])


# --- from a database: SQLite, the emulator ---------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("spanner", marks=pytest.mark.emulator)])
def db(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """(URL, engine) of an empty database: a SQLite file, or a fresh emulator database."""
    monkeypatch.setenv("SHARDED_ORM_PROGRESS", "off")
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
    engine.info = {"mutations": emu.database(database)}
    yield emu.url(database), engine
    engine.dispose()


def test_a_database_key_growing_by_its_values_gets_its_shard_column(
    db: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url, engine = db
    rng = random.Random(6)
    data = [
        {"TenantId": f"t{i % 3}", "Id": str(v7(t, rng)), "CreatedAt": t.replace(tzinfo=None)}
        for i, t in enumerate(times(3000, 100))
    ]
    fill(engine, Ticket.__table__, data)
    code = main(["advise", f"{__name__}:Ticket", "--url", url, "--nodes", "6",
                 "--node-capacity", "350", "--tick", "5", "--candidates", "1,2,4,8",
                 "--format", "json"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out)["summary"]
    assert summary["shard_sources"] == ["TenantId", "Id"] and summary["key_space"] == "vr_tickets"
    assert summary["mean_rows_per_second"] == pytest.approx(100, rel=0.05)
    held = summary["held_by_values"]["Id"]
    assert held["role"] == "uuid7" and held["growing"] is True
    assert held["why"] == "its values are time-ordered UUIDs (version 7): 100% of 1,000 sampled"
