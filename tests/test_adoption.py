"""Adopting a table sharded by hand as the seed article does (issue 22 item 9).

Rows are written by the seed's own snippet, ``zlib.crc32(company_id +
timestamp.isoformat()) % 10`` with ``datetime.utcnow()``, through raw SQL the library does
not touch; then the model declares ``shard_column(..., algorithm="crc32_concat")`` over
them: ``verify`` finds every row right (and a row hashed otherwise wrong), point lookups
find them, and new rows written through the library get the snippet's shard.
"""

from __future__ import annotations

import datetime as dt
import zlib
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import (
    ShardConfigError,
    ShardedIndex,
    UTCDateTime,
    compute_shard,
    shard_column,
    sharded_select,
    verify,
)

UTC = dt.timezone.utc
N = 10


def seed_shard(company_id: str, timestamp: dt.datetime) -> int:
    """The seed article's snippet, in Python 3 (its ``crc32`` takes bytes)."""
    return (zlib.crc32((company_id + timestamp.isoformat()).encode()) & 0xFFFFFFFF) % N


class Base(DeclarativeBase):
    pass


class LogEntry(Base):
    __tablename__ = "adopt_log_entries"
    company_id: Mapped[str] = mapped_column("CompanyId", sa.String(40), primary_key=True)
    user_id: Mapped[str] = mapped_column("UserId", sa.String(40), primary_key=True)
    ts: Mapped[dt.datetime] = mapped_column("Timestamp", UTCDateTime, primary_key=True)
    entry_shard_id: Mapped[int] = shard_column(
        "company_id", "ts", count=N, algorithm="crc32_concat", name="EntryShardId"
    )
    log_entry: Mapped[str] = mapped_column("LogEntry", sa.String(100))
    __table_args__ = (
        ShardedIndex("LogEntriesByCompany", "CompanyId", "Timestamp", shard="EntryShardId"),
    )


def utcnow_like(i: int) -> dt.datetime:
    """Naive UTC timestamps, as ``datetime.utcnow()`` gives (one with no microseconds)."""
    base = dt.datetime(2018, 5, 1, 15, 16, 3, 386257)
    return base.replace(microsecond=0) if i == 0 else base + dt.timedelta(microseconds=7919 * i)


def write_by_hand(engine: sa.Engine, n: int) -> list[tuple[str, str, dt.datetime, int]]:
    """The application's old code: the shard computed by the seed's snippet, written as
    raw SQL that sharded-orm does not check."""
    rows = []
    for i in range(n):
        company, user, ts = f"Acme-{i % 3}", f"user{i}", utcnow_like(i)
        rows.append((company, user, ts, seed_shard(company, ts)))
    insert = sa.text(
        "INSERT INTO adopt_log_entries (CompanyId, UserId, Timestamp, EntryShardId, LogEntry) "
        "VALUES (:c, :u, :t, :s, 'old')"
    ).bindparams(sa.bindparam("t", type_=UTCDateTime))
    with engine.begin() as conn:
        for company, user, ts, shard in rows:
            conn.execute(
                insert.execution_options(sharded_orm_raw_sql_ok=True),
                {"c": company, "u": user, "t": ts.replace(tzinfo=UTC), "s": shard},
            )
    return rows


def test_verify_accepts_rows_written_by_the_seed_snippet(engine: sa.Engine) -> None:
    Base.metadata.create_all(engine)
    rows = write_by_hand(engine, 12)
    report = verify(engine, LogEntry, progress_mode="off")
    assert report.rows_checked == 12 and report.ok, report.mismatched

    with Session(engine) as s:  # point lookups by company and time find the old rows
        for company, user, ts, _ in rows:
            stmt = sharded_select(LogEntry, index="LogEntriesByCompany").where(
                LogEntry.company_id == company, LogEntry.ts == ts.replace(tzinfo=UTC)
            )
            assert [e.user_id for e in s.scalars(stmt)] == [user]
        # new rows through the library: the snippet's shard
        new_ts = dt.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC)
        s.add(LogEntry(company_id="Acme-0", user_id="new", ts=new_ts, log_entry="new"))
        s.commit()
    with engine.connect() as conn:
        stored = conn.execute(
            sa.select(LogEntry.__table__.c.EntryShardId).where(LogEntry.__table__.c.UserId == "new")
        ).scalar_one()
    assert stored == seed_shard("Acme-0", new_ts.replace(tzinfo=None))
    assert verify(engine, LogEntry, progress_mode="off").ok

    with engine.begin() as conn:  # a row the old code hashed some other way is reported
        conn.execute(
            sa.text(
                "UPDATE adopt_log_entries SET EntryShardId = :s WHERE UserId = 'user3'"
            ).execution_options(sharded_orm_raw_sql_ok=True),
            {"s": (rows[3][3] + 1) % N},
        )
    assert verify(engine, LogEntry, progress_mode="off").mismatched == {"EntryShardId": 1}


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=20),
    st.datetimes(min_value=dt.datetime(1000, 1, 1), max_value=dt.datetime(9999, 12, 31)),
)
def test_crc32_concat_is_the_seed_snippet(company: str, ts: dt.datetime) -> None:
    aware = ts.replace(tzinfo=UTC)
    assert compute_shard([company, aware], N, "crc32_concat") == seed_shard(company, ts)
    # the model's own function (coercion, then the concatenated form) agrees
    from sharded_orm import get_shard_column

    sc = get_shard_column(LogEntry)
    assert sc.compute([company, aware]) == seed_shard(company, ts)
    # the same instant in another zone is stored, and hashed, as its UTC instant
    other = aware.astimezone(dt.timezone(dt.timedelta(hours=-5)))
    assert sc.compute([company, other]) == seed_shard(company, ts)


def test_crc32_concat_cannot_be_computed_by_spanner() -> None:
    with pytest.raises(ShardConfigError, match="server_side=True needs"):
        shard_column("a", count=4, algorithm="crc32_concat", server_side=True)


def test_crc32_concat_refuses_what_has_no_plain_text() -> None:
    from sharded_orm import ShardTypeError

    with pytest.raises(ShardTypeError, match="crc32_concat"):
        compute_shard([b"bytes"], 4, "crc32_concat")
    assert compute_shard([7, dt.date(2020, 1, 2)], 4, "crc32_concat") == (
        zlib.crc32(b"72020-01-02") % 4
    )


def test_a_row_stored_without_its_fraction_is_reported_and_found_once_rewritten(
    tmp_path: Path,
) -> None:
    """R4: the seed's own code, through Python's sqlite3 adapter, stores a timestamp with 0
    microseconds as ``2018-05-01 15:16:03`` (no fraction). Its shard is right, but ``==``
    binds ``...03.000000``, so no lookup (sharded or not) finds it: ``verify`` reports it,
    and once rewritten in the column's own text the point lookup finds it."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'seed.db'}")
    Base.metadata.create_all(engine)
    rows = [(f"Acme-{i}", f"user{i}", utcnow_like(i)) for i in range(3)]  # row 0: 0 us
    raw = engine.raw_connection()
    try:
        raw.cursor().executemany(
            "INSERT INTO adopt_log_entries (CompanyId, UserId, Timestamp, EntryShardId, "
            "LogEntry) VALUES (?, ?, ?, ?, 'old')",
            [(c, u, ts.isoformat(" "), seed_shard(c, ts)) for c, u, ts in rows],
        )
        raw.commit()
    finally:
        raw.close()

    def found(company: str, ts: dt.datetime) -> list[str]:
        with Session(engine) as s:
            aware = ts.replace(tzinfo=UTC)
            point = sharded_select(LogEntry, index="LogEntriesByCompany").where(
                LogEntry.company_id == company, LogEntry.ts == aware
            )
            plain = sa.select(LogEntry).where(LogEntry.company_id == company, LogEntry.ts == aware)
            got = [e.user_id for e in s.scalars(point)]
            assert got == [e.user_id for e in s.scalars(plain)]  # the unsharded answer
            return got

    report = verify(engine, LogEntry, progress_mode="off")
    assert report.rows_checked == 3 and report.mismatched == {"EntryShardId": 1}
    assert found(*rows[0][::2]) == []  # no "=" finds it: it is reported, not clean
    assert found(*rows[1][::2]) == ["user1"]
    with engine.begin() as conn:  # the rewrite docs/shard_columns.md gives
        conn.execute(
            sa.text(
                "UPDATE adopt_log_entries SET Timestamp = Timestamp || '.000000' "
                "WHERE length(Timestamp) = 19"
            ).execution_options(sharded_orm_raw_sql_ok=True)
        )
    assert verify(engine, LogEntry, progress_mode="off").ok
    assert found(*rows[0][::2]) == ["user0"]
    engine.dispose()
