"""Server-side shard columns: Spanner computes exactly what ``compute_shard`` computes.

One table holds a source column of every supported type and a ``server_side=True``
shard column over each (plus one over several sources). 1,000 random rows are written
without shard values; Spanner fills the generated columns; every one must equal the
client's ``compute_shard(..., "farm_fingerprint")``.
"""

from __future__ import annotations

import datetime as dt
import random
import uuid
from decimal import Decimal

import pytest
import sqlalchemy as sa
from google.api_core.datetime_helpers import DatetimeWithNanoseconds
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import (
    ShardedIndex,
    UTCDateTime,
    compute_shard,
    shard_column,
    shard_columns,
    sharded_select,
)

UTC = dt.timezone.utc
N = 1 << 16  # the largest count: the most sensitive comparison
ROWS = 1000


class Base(DeclarativeBase):
    pass


def _farm(*sources: str) -> Mapped[int]:
    return shard_column(*sources, count=N, algorithm="farm_fingerprint", server_side=True)


class Mixed(Base):
    __tablename__ = "mixed_sources"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    s: Mapped[str] = mapped_column(sa.String(200))
    b: Mapped[bytes] = mapped_column(sa.LargeBinary(200))
    i: Mapped[int] = mapped_column(sa.BigInteger)
    flag: Mapped[bool]
    u: Mapped[str] = mapped_column(sa.String(36))
    d: Mapped[Decimal] = mapped_column(sa.Numeric(38, 9))
    day: Mapped[dt.date]
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    sh_s: Mapped[int] = _farm("s")
    sh_b: Mapped[int] = _farm("b")
    sh_i: Mapped[int] = _farm("i")
    sh_flag: Mapped[int] = _farm("flag")
    sh_u: Mapped[int] = _farm("u")
    sh_d: Mapped[int] = _farm("d")
    sh_day: Mapped[int] = _farm("day")
    sh_ts: Mapped[int] = _farm("ts")
    sh_multi: Mapped[int] = _farm("s", "i", "ts", "day")


def _text(rng: random.Random) -> str:
    alphabet = "aZ09 :-_|é€😀\u0000\n"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))


def _decimal(rng: random.Random) -> Decimal:
    whole = rng.randrange(-(10**15), 10**15)
    frac = rng.randrange(0, 10**9)
    return Decimal(f"{whole}.{frac:09d}") if rng.random() < 0.8 else Decimal(whole)


def _timestamp(rng: random.Random) -> dt.datetime:
    seconds = rng.randrange(-62135596800 + 86400, 253402300799 - 86400)  # 0001..9999
    ns = rng.randrange(0, 10**9)
    base = dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=seconds)
    # DatetimeWithNanoseconds keeps the sub-microsecond digits Spanner stores
    return DatetimeWithNanoseconds(
        base.year,
        base.month,
        base.day,
        base.hour,
        base.minute,
        base.second,
        nanosecond=ns,
        tzinfo=UTC,
    )


def random_rows(seed: int, n: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    edge_ints = [0, 1, -1, 2**63 - 1, -(2**63)]
    out = []
    for k in range(n):
        out.append(
            {
                "id": k,
                "s": _text(rng),
                "b": rng.randbytes(rng.randrange(0, 20)),
                "i": edge_ints[k] if k < len(edge_ints) else rng.randrange(-(2**63), 2**63),
                "flag": rng.random() < 0.5,
                "u": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                "d": _decimal(rng),
                "day": dt.date.fromordinal(rng.randrange(1, dt.date.max.toordinal())),
                "ts": _timestamp(rng),
            }
        )
    return out


# 1,000 rows x 9 generated columns; quick loop:
# test_uuid_sources_stored_shard_equals_client_compute[spanner],
# test_generated_column_ddl_and_information_schema
@pytest.mark.slow
@pytest.mark.emulator
def test_generated_columns_equal_compute_shard(spanner_engine: sa.Engine) -> None:
    Base.metadata.create_all(spanner_engine)
    table = Mixed.__table__
    data = random_rows(seed=20261123, n=ROWS)
    with spanner_engine.begin() as conn:
        for start in range(0, ROWS, 250):
            conn.execute(sa.insert(table), data[start : start + 250])
    shard_keys = [sc.key for sc in shard_columns(Mixed)]
    with spanner_engine.connect() as conn:
        stored = list(conn.execute(sa.select(table.c.id, *[table.c[k] for k in shard_keys])))
    assert len(stored) == ROWS
    sent = {r["id"]: r for r in data}
    checked = 0
    for row in stored:
        values = sent[row[0]]  # compare with what was sent: the server hashed exactly that
        for sc, server_value in zip(shard_columns(Mixed), row[1:], strict=True):
            expected = compute_shard([values[k] for k in sc.source_keys], N, "farm_fingerprint")
            assert server_value == expected, (sc.name, {k: values[k] for k in sc.source_keys})
            checked += 1
    assert checked == ROWS * 9


@pytest.mark.emulator
def test_generated_column_ddl_and_information_schema(spanner_engine: sa.Engine) -> None:
    Base.metadata.create_all(spanner_engine)
    with spanner_engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT COLUMN_NAME, IS_GENERATED, GENERATION_EXPRESSION, IS_STORED "
                "FROM INFORMATION_SCHEMA.COLUMNS WHERE TABLE_NAME = 'mixed_sources' "
                "AND COLUMN_NAME = 'sh_ts'"
            )
        ).one()
    assert rows[1] == "ALWAYS"
    assert "FARM_FINGERPRINT" in rows[2] and "%E4Y-%m-%dT%H:%M:%E6SZ" in rows[2]
    assert rows[3] == "YES"


def test_server_side_column_is_plain_on_sqlite() -> None:
    eng = sa.create_engine("sqlite://")
    ddl = str(sa.schema.CreateTable(Mixed.__table__).compile(eng))
    assert "FARM_FINGERPRINT" not in ddl and "GENERATED" not in ddl.upper()
    Base.metadata.create_all(eng)
    data = random_rows(seed=7, n=50)
    for r in data:  # SQLite stores no nanoseconds: give it plain datetimes
        r["ts"] = dt.datetime.fromtimestamp(r["ts"].timestamp(), UTC)  # type: ignore[attr-defined]
        # SQLite's NUMERIC is a float: only values it stores exactly keep their shard
        r["d"] = Decimal(int(r["d"]) % 10**6) / 4
    with eng.begin() as conn:
        conn.execute(sa.insert(Mixed.__table__), data)
        stored = list(conn.execute(sa.select(Mixed.__table__)).mappings())
    for row in stored:
        for sc in shard_columns(Mixed):
            assert row[sc.key] == compute_shard(
                [row[k] for k in sc.source_keys], N, "farm_fingerprint"
            )


# --------------------------------------------------------------------------- UUID sources


class UuidRow(Base):
    __tablename__ = "uuid_sources"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    text_u: Mapped[str] = mapped_column(sa.Uuid(as_uuid=False))
    obj_u: Mapped[uuid.UUID] = mapped_column(sa.Uuid())
    sh_text: Mapped[int] = shard_column(
        "text_u", count=64, algorithm="farm_fingerprint", server_side=True
    )
    sh_obj: Mapped[int] = shard_column(
        "obj_u", count=64, algorithm="farm_fingerprint", server_side=True
    )
    __table_args__ = (
        ShardedIndex("ix_uuid_text", "text_u", shard="sh_text"),
        ShardedIndex("ix_uuid_obj", "obj_u", shard="sh_obj"),
    )


UUIDS = [
    "15b7bd1f-84aa-4c2e-9f00-0123456789ab",
    "0b7f6c4e-1f7c-4c8e-9a31-6e3c1d1e0f02",
    "ffffffff-0000-4000-8000-00000000000a",
]


#: the text each row's ``text_u`` was written with (a string keeps its case when stored)
WRITTEN_AS = {0: UUIDS[0].upper(), 1: UUIDS[1], 2: UUIDS[2].upper()}


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("spanner", marks=pytest.mark.emulator)])
def test_uuid_sources_stored_shard_equals_client_compute(
    request: pytest.FixtureRequest, kind: str
) -> None:
    """A UUID source's shard is the hash of ``str(uuid)`` however the text was written:
    the server expression rebuilds the canonical text from the stored one (SQLAlchemy
    sends 32 hex digits; raw SQL may store dashes and upper case), and point lookups by
    the canonical or the upper-case form find exactly what the unsharded query finds."""
    engine = (
        sa.create_engine("sqlite://")
        if kind == "sqlite"
        else request.getfixturevalue("spanner_engine")
    )
    Base.metadata.create_all(engine, tables=[UuidRow.__table__])
    with Session(engine) as s:  # given upper-case, canonical text, a UUID object's text
        s.add(UuidRow(id=0, text_u=UUIDS[0].upper(), obj_u=UUIDS[0].upper()))
        s.add(UuidRow(id=1, text_u=UUIDS[1], obj_u=uuid.UUID(UUIDS[1])))
        s.commit()
    with engine.begin() as conn:
        conn.execute(
            UuidRow.__table__.insert(), [{"id": 2, "text_u": UUIDS[2].upper(), "obj_u": UUIDS[2]}]
        )
    if kind == "spanner":  # another writer's text: dashes and upper case kept as sent
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO uuid_sources (id, text_u, obj_u) VALUES (3, :t, :o)"
                ).execution_options(sharded_orm_raw_sql_ok=True),
                {"t": UUIDS[0].upper(), "o": UUIDS[0].replace("-", "").upper()},
            )
    text_sc, obj_sc = shard_columns(UuidRow)
    with engine.connect() as conn:
        raw = {
            r.id: r
            for r in conn.execute(
                sa.text("SELECT id, text_u, obj_u, sh_text, sh_obj FROM uuid_sources")
            )
        }
        rows = conn.execute(sa.select(UuidRow.__table__)).all()
    # a string is stored as the caller wrote it (32 hex digits, case kept), so their own
    # "text_u == value" finds it; the shard is still the hash of the canonical text
    assert raw[0].text_u == UUIDS[0].replace("-", "").upper()
    for r in rows:
        want = compute_shard(uuid.UUID(r.text_u), 64, "farm_fingerprint")
        assert (
            r.sh_text == want == text_sc.compute([r.text_u]) == text_sc.compute([r.text_u.upper()])
        )
        assert (
            r.sh_obj == compute_shard(r.obj_u, 64, "farm_fingerprint") == obj_sc.compute([r.obj_u])
        )
    for u in UUIDS:
        for look in (u, u.upper()):
            for col, index in ((UuidRow.text_u, "ix_uuid_text"), (UuidRow.obj_u, "ix_uuid_obj")):
                value = look if col is UuidRow.text_u else uuid.UUID(look)
                point = sharded_select(UuidRow, index=index).where(col == value)
                assert "BETWEEN" not in str(point)  # pruned to one shard
                plain = sa.select(UuidRow).where(col == value)
                with engine.connect() as conn:
                    got = sorted(x.id for x in conn.execute(point).all())
                    assert got == sorted(x.id for x in conn.execute(plain).all())
                    if col is UuidRow.obj_u or look == WRITTEN_AS[UUIDS.index(u)]:
                        assert got and set(got) <= {UUIDS.index(u), 3}
    engine.dispose()
