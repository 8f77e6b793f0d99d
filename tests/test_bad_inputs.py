# ruff: noqa: E501  (the catalogue is a table: one row per line)
"""The bad-input catalogue: one row per bad input to a public function or CLI command.

Each row is the call, the input, the error a caller gets and a fragment of its message.
Every name in ``sharded_orm.__all__`` (bar result records and the exceptions themselves),
``alembic_ext``'s public functions and both CLI commands appear; ``test_catalogue_*`` check
that, and that the table holds at least 150 distinct inputs. Runs on SQLite, offline.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from typing import Any

import pytest
import sqlalchemy as sa
from seed_models import Event, LogEntry, Sharded, User
from sqlalchemy import orm

import alembic_ext
import sharded_orm as so
from sharded_orm.errors import (
    ShardConfigError,
    ShardingError,
    ShardTypeError,
    ShardValueError,
    UnsupportedOnDialectError,
)
from sharded_orm.tools.cli import main as cli_main

UTC = dt.timezone.utc
NAIVE = dt.datetime(2024, 1, 1, 12, 0)
AWARE = dt.datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
PLUS2 = dt.timezone(dt.timedelta(hours=2))
EARLY = dt.datetime(1, 1, 1, tzinfo=PLUS2)  # 0000-12-31T22:00Z: before year 1 in UTC
LATE = dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(dt.timedelta(hours=-2)))


class _NoOffset(dt.tzinfo):
    """A tzinfo that knows no offset: the datetime is aware by type, naive in fact."""

    def utcoffset(self, d: dt.datetime | None) -> None:
        return None

    def dst(self, d: dt.datetime | None) -> None:
        return None


NO_OFFSET = dt.datetime(2024, 1, 1, tzinfo=_NoOffset())
NAN = float("nan")
INF = float("inf")
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Case:
    call: str  # the public name called
    kind: str  # what kind of bad input
    input: str  # the bad input, as a reader would write it
    run: Callable[[], object]
    error: type[BaseException]
    fragment: str  # a piece of the message


# ----------------------------------------------------------------------------- environment


class Own(orm.DeclarativeBase):
    """Models of this file only (the seeds' metadata is shared with other tests)."""


class Hashed(so.HashedPrimaryKeyMixin, Own):
    __tablename__ = "HashedThings"
    name: orm.Mapped[str | None] = orm.mapped_column(sa.String(32))


@cache
def engine() -> sa.Engine:
    """SQLite with the seeds' sharded tables and a few rows of Events."""
    eng = sa.create_engine("sqlite://", poolclass=sa.pool.StaticPool)
    Sharded.metadata.create_all(eng)
    Own.metadata.create_all(eng)
    with orm.Session(eng) as s:
        s.add_all(
            Event(kind="k", payload="p", timestamp=AWARE + dt.timedelta(seconds=i))
            for i in range(5)
        )
        s.commit()
    return eng


def conn() -> sa.Connection:
    return engine().connect()


def session() -> orm.Session:
    return orm.Session(engine())


def events_stmt() -> Any:
    return so.sharded_select(Event, index="EventsByKind").where(Event.kind == "k")


def good_cursor() -> str:
    with conn() as c:
        cursor = so.page(c, events_stmt(), 2).next_cursor
    assert cursor is not None
    return cursor


def page_with(cursor: object) -> Callable[[], object]:
    def run() -> object:
        with conn() as c:
            return so.page(c, events_stmt(), 2, cursor=cursor)  # type: ignore[arg-type]

    return run


def tampered(cursor: str, at: int) -> str:
    ch = cursor[at]
    return cursor[:at] + ("A" if ch != "A" else "B") + cursor[at + 1 :]


def forged() -> str:
    """A cursor for the same query, signed with a key of the forger's choosing."""
    so.set_cursor_secret(b"f" * 32)
    try:
        with conn() as c:
            cursor = so.page(c, events_stmt(), 2).next_cursor
    finally:
        so.set_cursor_secret(None)
    assert cursor is not None
    return cursor


def log_row(**over: Any) -> dict[str, Any]:
    row = {"CompanyId": "c", "UserId": "u", "Timestamp": AWARE, "LogEntry": "x"}
    row.update(over)
    return row


def load(*args: Any, **kw: Any) -> Callable[[], object]:
    def run() -> object:
        bind = kw.pop("bind", None) or engine()
        rows = kw.pop("rows", [log_row()])
        return so.bulk_load(bind, *(args or (LogEntry,)), rows, **kw)

    return run


def workload(**kw: Any) -> Callable[[], object]:
    base: dict[str, Any] = {"rows_per_second": 10.0, "duration": 60.0}
    base.update(kw)
    return lambda: so.Workload(**base)


def instance(**kw: Any) -> Callable[[], object]:
    return lambda: so.Instance(**kw)


WORKLOAD = so.Workload(rows_per_second=10.0, duration=60.0)


def cli(*argv: str) -> Callable[[], object]:
    """The CLI: exit code 2 and the message on stderr become a CliExit for the table."""

    def run() -> object:
        import contextlib
        import io

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                code = cli_main(list(argv))
            except SystemExit as e:  # argparse's own refusals
                code = int(e.code or 0)
        if code != 0:
            raise CliExit(code, err.getvalue())
        return code

    return run


class CliExit(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"exit {code}: {message}")
        self.code = code


def index(*columns: Any, **kw: Any) -> Callable[[], object]:
    kw.setdefault("shard", "EntryShardId")
    name = kw.pop("name", "ix")
    return lambda: so.ShardedIndex(name, *(columns or ("CompanyId",)), **kw)


def attached_index(*columns: Any, **kw: Any) -> Callable[[], object]:
    """A ShardedIndex attached to a copy of LogEntries (checks that need the table)."""

    def run() -> object:
        table = LogEntry.__table__.to_metadata(sa.MetaData())  # type: ignore[attr-defined]
        ix = index(*columns, **kw)()
        table.append_constraint(ix)  # type: ignore[arg-type]
        return ix

    return run


def model(**attrs: Any) -> Callable[[], object]:
    """Declare a small model (a fresh base each time) with extra class attributes."""

    def run() -> object:
        class Base(orm.DeclarativeBase):
            pass

        mixins = attrs.pop("__mixins__", ())
        body: dict[str, Any] = {"__tablename__": "M"}
        body.update(attrs)
        return type("M", (*mixins, Base), body)

    return run


def shard_model(*sources: str, **kw: Any) -> Callable[[], object]:
    def run() -> object:
        class Base(orm.DeclarativeBase):
            pass

        class M(Base):
            __tablename__ = "M"
            id: orm.Mapped[int] = orm.mapped_column(sa.BigInteger, primary_key=True)
            ratio: orm.Mapped[float] = orm.mapped_column(sa.Float)
            shard: orm.Mapped[int] = so.shard_column(*sources, **kw)

        return so.shard_columns(M)

    return run


def create_on_sqlite(*items: Any, name: str = "t") -> Callable[[], object]:
    def run() -> object:
        md = sa.MetaData()
        sa.Table(name, md, sa.Column("id", sa.BigInteger, primary_key=True), *items)
        md.create_all(sa.create_engine("sqlite://"))
        return md

    return run


def backfill(**kw: Any) -> Callable[[], object]:
    base: dict[str, Any] = {
        "table": "LogEntries",
        "column": "EntryShardId",
        "sources": ["CompanyId", "Timestamp"],
        "count": 10,
        "progress": False,
    }
    base.update(kw)
    bind = base.pop("bind", None)
    return lambda: alembic_ext.backfill_shard(bind or engine(), **base)


# ----------------------------------------------------------------------------- the catalogue

C = Case

_PLAIN: dict[str, sa.Table] = {}


def _plain(name: str) -> sa.Table:
    """A table with no shard column (one per name, so the same name is the same table)."""
    if name not in _PLAIN:
        _PLAIN[name] = sa.Table(name, sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))
    return _PLAIN[name]


CASES: list[Case] = [
    # compute_shard: values
    C("compute_shard", "None", "None", lambda: so.compute_shard(None, 8), ShardValueError, "None"),
    C("compute_shard", "None", "[None]", lambda: so.compute_shard([None], 8), ShardValueError, "None"),
    C("compute_shard", "None", "['a', None]", lambda: so.compute_shard(["a", None], 8), ShardValueError, "None"),
    C("compute_shard", "wrong type", "1.5", lambda: so.compute_shard(1.5, 8), ShardTypeError, "float"),
    C("compute_shard", "NaN/inf", "nan", lambda: so.compute_shard(NAN, 8), ShardTypeError, "float"),
    C("compute_shard", "NaN/inf", "inf", lambda: so.compute_shard(INF, 8), ShardTypeError, "float"),
    C("compute_shard", "NaN/inf", "-inf", lambda: so.compute_shard(-INF, 8), ShardTypeError, "float"),
    C("compute_shard", "NaN/inf", "Decimal('NaN')", lambda: so.compute_shard(Decimal("NaN"), 8), ShardValueError, "NaN"),
    C("compute_shard", "NaN/inf", "Decimal('Infinity')", lambda: so.compute_shard(Decimal("Infinity"), 8), ShardValueError, "Infinity"),
    C("compute_shard", "NaN/inf", "Decimal('sNaN')", lambda: so.compute_shard(Decimal("sNaN"), 8), ShardValueError, "NaN"),
    C("compute_shard", "naive datetime", "datetime(2024,1,1,12)", lambda: so.compute_shard(NAIVE, 8), ShardValueError, "naive"),
    C("compute_shard", "naive datetime", "[company, naive ts]", lambda: so.compute_shard(["c", NAIVE], 8), ShardValueError, "naive"),
    C("compute_shard", "out-of-range int", "2**70", lambda: so.compute_shard(2**70, 8), ShardValueError, "INT64"),
    C("compute_shard", "out-of-range int", "2**63", lambda: so.compute_shard(2**63, 8), ShardValueError, "INT64"),
    C("compute_shard", "out-of-range int", "-2**63 - 1", lambda: so.compute_shard(-(2**63) - 1, 8), ShardValueError, "INT64"),
    C("compute_shard", "empty collection", "[]", lambda: so.compute_shard([], 8), ShardValueError, "no source"),
    C("compute_shard", "empty collection", "()", lambda: so.compute_shard((), 8), ShardValueError, "no source"),
    C("compute_shard", "wrong type", "{'a'} (a set)", lambda: so.compute_shard({"a"}, 8), ShardTypeError, "set"),
    C("compute_shard", "wrong type", "{'k': 1} (a dict)", lambda: so.compute_shard({"k": 1}, 8), ShardTypeError, "dict"),
    C("compute_shard", "wrong type", "object()", lambda: so.compute_shard(object(), 8), ShardTypeError, "object"),
    C("compute_shard", "wrong type", "[[1, 2]] (nested)", lambda: so.compute_shard([[1, 2]], 8), ShardTypeError, "list"),
    C("compute_shard", "wrong type", "lone surrogate '\\ud800'", lambda: so.compute_shard("\ud800", 8), ShardValueError, "surrogate"),
    C("compute_shard", "wrong type", "count='8'", lambda: so.compute_shard("a", "8"), ShardConfigError, "shard count"),  # type: ignore[arg-type]
    C("compute_shard", "wrong type", "count=8.0", lambda: so.compute_shard("a", 8.0), ShardConfigError, "shard count"),  # type: ignore[arg-type]
    C("compute_shard", "wrong type", "count=True", lambda: so.compute_shard("a", True), ShardConfigError, "shard count"),
    C("compute_shard", "None", "count=None", lambda: so.compute_shard("a", None), ShardConfigError, "shard count"),  # type: ignore[arg-type]
    C("compute_shard", "out-of-range int", "count=0", lambda: so.compute_shard("a", 0), ShardConfigError, "between 1 and"),
    C("compute_shard", "out-of-range int", "count=-1", lambda: so.compute_shard("a", -1), ShardConfigError, "between 1 and"),
    C("compute_shard", "out-of-range int", "count=2**40", lambda: so.compute_shard("a", 2**40), ShardConfigError, "between 1 and"),
    C("compute_shard", "NaN/inf", "count=nan", lambda: so.compute_shard("a", NAN), ShardConfigError, "shard count"),  # type: ignore[arg-type]
    C("compute_shard", "bad option", "algorithm='md5'", lambda: so.compute_shard("a", 8, "md5"), ShardConfigError, "unknown shard algorithm"),
    C("compute_shard", "None", "algorithm=None", lambda: so.compute_shard("a", 8, None), ShardConfigError, "unknown shard algorithm"),  # type: ignore[arg-type]
        # non-UTC datetimes: an offset that pushes the instant out of range, a tzinfo with no offset
    C("compute_shard", "non-UTC datetime", "0001-01-01T00:00+02:00", lambda: so.compute_shard(EARLY, 8), ShardValueError, "out of range"),
    C("compute_shard", "non-UTC datetime", "9999-12-31T23:00-02:00", lambda: so.compute_shard(LATE, 8), ShardValueError, "out of range"),
    C("compute_shard", "non-UTC datetime", "a tzinfo whose utcoffset() is None", lambda: so.compute_shard(NO_OFFSET, 8), ShardValueError, "naive"),
    C("canonical_text", "non-UTC datetime", "0001-01-01T00:00+02:00", lambda: so.canonical_text(EARLY), ShardValueError, "out of range"),
    C("UTCDateTime", "non-UTC datetime", "bind 0001-01-01T00:00+02:00", lambda: so.UTCDateTime().process_bind_param(EARLY, _sqlite()), ShardValueError, "out of range"),
    C("UTCDateTime", "non-UTC datetime", "bind a tzinfo whose utcoffset() is None", lambda: so.UTCDateTime().process_bind_param(NO_OFFSET, _sqlite()), ShardValueError, "naive"),
    C("Workload", "non-UTC datetime", "start with a tzinfo whose utcoffset() is None", workload(start=NO_OFFSET), ShardTypeError, "timezone-aware"),
    C("bulk_load", "non-UTC datetime", "a row with Timestamp 0001-01-01T00:00+02:00", load(rows=[log_row(Timestamp=EARLY)]), ShardingError, "out of range"),
    C("TimestampShardedMixin", "non-UTC datetime", "timestamp 9999-12-31T23:00-02:00 on flush", lambda: _flush_event(timestamp=LATE), ShardValueError, "out of range"),
    # canonical_text / canonical_string
    C("canonical_text", "None", "None", lambda: so.canonical_text(None), ShardValueError, "None"),
    C("canonical_text", "wrong type", "1.0", lambda: so.canonical_text(1.0), ShardTypeError, "float"),
    C("canonical_text", "naive datetime", "naive datetime", lambda: so.canonical_text(NAIVE), ShardValueError, "naive"),
    C("canonical_text", "out-of-range int", "2**64", lambda: so.canonical_text(2**64), ShardValueError, "INT64"),
    C("canonical_text", "wrong type", "[1] (a list)", lambda: so.canonical_text([1]), ShardTypeError, "list"),
    C("canonical_string", "wrong type", "['\\udc80'] (a lone surrogate)", lambda: so.canonical_string(["\udc80"]), ShardValueError, "surrogate"),
    C("canonical_string", "None", "None", lambda: so.canonical_string(None), ShardTypeError, "sequence"),  # type: ignore[arg-type]
    C("canonical_string", "wrong type", "'abc' (a str)", lambda: so.canonical_string("abc"), ShardTypeError, "sequence"),
    C("canonical_string", "wrong type", "5", lambda: so.canonical_string(5), ShardTypeError, "sequence"),  # type: ignore[arg-type]
    C("canonical_string", "NaN/inf", "[nan]", lambda: so.canonical_string([NAN]), ShardTypeError, "float"),
    C("canonical_string", "naive datetime", "[naive]", lambda: so.canonical_string([NAIVE]), ShardValueError, "naive"),
    # shard_column / ShardSpec / shard_columns / get_shard_column
    C("shard_column", "empty collection", "no sources", lambda: so.shard_column(count=8), ShardConfigError, "source"),
    C("shard_column", "out-of-range int", "count=0", lambda: so.shard_column("a", count=0), ShardConfigError, "shard count"),
    C("shard_column", "wrong type", "count='8'", lambda: so.shard_column("a", count="8"), ShardConfigError, "shard count"),  # type: ignore[arg-type]
    C("shard_column", "bad option", "algorithm='sha1'", lambda: so.shard_column("a", count=8, algorithm="sha1"), ShardConfigError, "unknown shard algorithm"),
    C("shard_column", "bad option", "default=1", lambda: so.shard_column("a", count=8, default=1), ShardConfigError, "default="),
    C("shard_column", "wrong type", "source 1 (an int)", lambda: so.shard_column(1, count=8), ShardTypeError, "source"),  # type: ignore[arg-type]
    C("shard_column", "bad option", "sources 'a', 'a'", lambda: so.shard_column("a", "a", count=8), ShardConfigError, "twice"),
    C("shard_column", "wrong type", "server_side='yes'", lambda: so.shard_column("a", count=8, server_side="yes"), ShardTypeError, "server_side"),  # type: ignore[arg-type]
    C("shard_column", "bad option", "server_side with crc32", lambda: so.shard_column("a", count=8, server_side=True), ShardConfigError, "farm_fingerprint"),
    C("shard_column", "missing table", "source not a column", shard_model("nope", count=8), ShardConfigError, "nope"),
    C("shard_column", "wrong type", "a Float source", shard_model("ratio", count=8), ShardConfigError, "ratio"),
    C("shard_column", "identifier", "source 'a`b'", shard_model("a`b", count=8), ShardConfigError, "a`b"),
    C("shard_column", "bad option", "naive_datetimes='local'", lambda: so.shard_column("a", count=8, naive_datetimes="local"), ShardConfigError, "naive_datetimes must be one of"),
    C("set_naive_datetimes", "None", "None", lambda: so.set_naive_datetimes(None, "utc"), ShardTypeError, "None"),
    C("set_naive_datetimes", "bad option", "policy 'UTC'", lambda: so.set_naive_datetimes(sa.MetaData(), "UTC"), ShardConfigError, "naive_datetimes must be one of"),
    C("ShardSpec", "out-of-range int", "count=0", lambda: so.ShardSpec(("a",), 0), ShardConfigError, "shard count"),
    C("ShardSpec", "empty collection", "sources=()", lambda: so.ShardSpec((), 8), ShardConfigError, "source"),
    C("watch", "None", "None", lambda: so.watch(None), ShardTypeError, "None"),
    C("declare_successor", "None", "None", lambda: so.declare_successor(None, None), ShardTypeError, "None"),
    C("declare_successor", "bad option", "a table as its own successor", lambda: so.declare_successor(_plain("A"), _plain("A")), ShardConfigError, "its own successor"),
    C("declare_successor", "bad option", "a successor without a key shard", lambda: so.declare_successor(_plain("A"), _plain("B")), ShardConfigError, "no shard column in its primary key"),
    C("watch", "wrong type", "a URL string", lambda: so.watch("sqlite://"), ShardTypeError, "sqlite://"),
    C("shard_columns", "None", "None", lambda: so.shard_columns(None), ShardTypeError, "None"),
    C("shard_columns", "wrong type", "'LogEntries' (a name)", lambda: so.shard_columns("LogEntries"), ShardTypeError, "LogEntries"),
    C("get_shard_column", "wrong type", "object()", lambda: so.get_shard_column(object()), ShardTypeError, "object"),
    C("get_shard_column", "missing table", "a model with no shard column", lambda: so.get_shard_column(User), ShardConfigError, "0 shard columns"),
    C("get_shard_column", "missing table", "name='Nope'", lambda: so.get_shard_column(LogEntry, "Nope"), ShardConfigError, "Nope"),
    C("ShardColumn", "wrong type", "compute(['c']) with a source missing", lambda: so.get_shard_column(LogEntry).compute(["c"]), ShardConfigError, "has 2 sources"),
    # ShardedIndex
    C("ShardedIndex", "None", "name=None", index(name=None), ShardTypeError, "name"),
    C("ShardedIndex", "identifier", "name with a backtick", index(name="ix`"), ShardConfigError, "not a valid Spanner name"),
    C("ShardedIndex", "identifier", "name ix` ON t; DROP TABLE x", index(name="ix` ON t (a); DROP TABLE x; --"), ShardConfigError, "not a valid Spanner name"),
    C("ShardedIndex", "identifier", "name with a semicolon", index(name="ix;"), ShardConfigError, "not a valid Spanner name"),
    C("ShardedIndex", "identifier", "name with a double quote", index(name='ix"'), ShardConfigError, "not a valid Spanner name"),
    C("ShardedIndex", "identifier", "name with a single quote", index(name="ix'"), ShardConfigError, "not a valid Spanner name"),
    C("ShardedIndex", "identifier", "unicode name 'índice'", index(name="índice"), ShardConfigError, "not a valid Spanner name"),
    C("ShardedIndex", "identifier", "name with a space", index(name="my index"), ShardConfigError, "not a valid Spanner name"),
    C("ShardedIndex", "identifier", "empty name", index(name=""), ShardConfigError, "not a valid Spanner name"),
    C("ShardedIndex", "huge collection", "name of 129 characters", index(name="i" * 129), ShardConfigError, "not a valid Spanner name"),
    C("ShardedIndex", "empty collection", "no columns", lambda: so.ShardedIndex("ix", shard="EntryShardId"), ShardConfigError, "at least one column"),
    C("ShardedIndex", "None", "shard=None", index(shard=None), ShardTypeError, "shard"),
    C("ShardedIndex", "wrong type", "storing='LogEntry' (a str)", index(storing="LogEntry"), ShardTypeError, "storing"),
    C("ShardedIndex", "wrong type", "null_filtered='yes'", index(null_filtered="yes"), ShardTypeError, "null_filtered"),
    C("ShardedIndex", "wrong type", "unique=1", index(unique=1), ShardTypeError, "unique"),
    C("ShardedIndex", "wrong type", "interleave_in=5", index(interleave_in=5), ShardTypeError, "interleave_in"),
    C("ShardedIndex", "identifier", "interleave_in='Users; DROP TABLE x'", index(interleave_in="Users; DROP TABLE x"), ShardConfigError, "not a valid Spanner name"),
    C("ShardedIndex", "wrong type", "an expression column", index(sa.func.lower(sa.column("CompanyId"))), ShardConfigError, "expression"),
    C("ShardedIndex", "bad option", "shard among the columns", index("EntryShardId"), ShardConfigError, "leads the index"),
    C("ShardedIndex", "missing table", "a column not in the table", attached_index("Nope"), ShardConfigError, "is not a column"),
    C("ShardedIndex", "missing table", "shard not a shard column", attached_index(shard="UserId"), ShardConfigError, "not a shard column"),
    C("ShardedIndex", "bad option", "storing a key column", attached_index(storing=["UserId"]), ShardConfigError, "key column"),
    C("ShardedIndex", "missing table", "storing a missing column", attached_index(storing=["Nope"]), ShardConfigError, "Nope"),
    C("ShardedIndex", "bad option", "unique per shard only", attached_index("UserId", unique=True), ShardConfigError, "uniqueness only within each shard"),
    # interleave_in
    C("interleave_in", "None", "None", lambda: so.interleave_in(None), ShardTypeError, "interleave parent"),
    C("interleave_in", "wrong type", "5", lambda: so.interleave_in(5), ShardTypeError, "interleave parent"),
    C("interleave_in", "identifier", "'Users`'", lambda: so.interleave_in("Users`"), ShardConfigError, "not a valid Spanner name"),
    C("interleave_in", "identifier", "'Users; DROP TABLE x'", lambda: so.interleave_in("Users; DROP TABLE x"), ShardConfigError, "not a valid Spanner name"),
    C("interleave_in", "identifier", "'Üsers'", lambda: so.interleave_in("Üsers"), ShardConfigError, "not a valid Spanner name"),
    C("interleave_in", "identifier", "'Users\"'", lambda: so.interleave_in('Users"'), ShardConfigError, "not a valid Spanner name"),
    C("interleave_in", "empty collection", "''", lambda: so.interleave_in(""), ShardTypeError, "interleave parent"),
    C("interleave_in", "wrong type", "on_delete_cascade='yes'", lambda: so.interleave_in("Users", on_delete_cascade="yes"), ShardTypeError, "on_delete_cascade"),
    # key_column / primary_key / OrderedPrimaryKey
    C("key_column", "wrong type", "descending='yes'", lambda: so.key_column(sa.BigInteger, descending="yes"), ShardTypeError, "descending"),
    C("key_column", "bad option", "primary_key=False", lambda: so.key_column(sa.BigInteger, primary_key=False), ShardConfigError, "primary_key=False"),
    C("primary_key", "wrong type", "1", lambda: so.primary_key(1), ShardTypeError, "primary key parts"),
    C("primary_key", "None", "None", lambda: so.primary_key(None), ShardTypeError, "primary key parts"),
    C("primary_key", "wrong type", "func.now()", lambda: so.primary_key(sa.func.now()), ShardTypeError, "primary key parts"),
    C("OrderedPrimaryKey", "wrong type", "desc(func.now())", lambda: so.OrderedPrimaryKey(sa.desc(sa.func.now())), ShardTypeError, "cannot hold an expression"),
    C("primary_key", "identifier", "a key column named 'a;b' in DDL", lambda: sa.schema.CreateTable(sa.Table("t", sa.MetaData(), sa.Column("a;b", sa.Integer), so.primary_key("a;b"))).compile(dialect=_spanner()), ShardConfigError, "not a valid Spanner name"),
    C("primary_key", "missing table", "'Nope' not a column", lambda: sa.Table("t", sa.MetaData(), sa.Column("a", sa.Integer), so.primary_key("Nope")), sa.exc.ArgumentError, "Nope"),
    # UTCDateTime
    C("UTCDateTime", "naive datetime", "bind a naive datetime", lambda: so.UTCDateTime().process_bind_param(NAIVE, _sqlite()), ShardValueError, "naive"),
    C("UTCDateTime", "wrong type", "bind '2024-01-01'", lambda: so.UTCDateTime().process_bind_param("2024-01-01", _sqlite()), ShardTypeError, "datetime"),  # type: ignore[arg-type]
    C("UTCDateTime", "wrong type", "bind 1700000000", lambda: so.UTCDateTime().process_bind_param(1700000000, _sqlite()), ShardTypeError, "datetime"),  # type: ignore[arg-type]
    C("UTCDateTime", "naive datetime", "insert a naive Timestamp", lambda: _insert_log(Timestamp=NAIVE), ShardValueError, "naive"),
    # TimestampShardedMixin
    C("TimestampShardedMixin", "out-of-range int", "__shard_count__ = 0", model(__mixins__=(so.TimestampShardedMixin,), __shard_count__=0), ShardConfigError, "shard count"),
    C("TimestampShardedMixin", "wrong type", "__shard_count__ = '8'", model(__mixins__=(so.TimestampShardedMixin,), __shard_count__="8"), ShardConfigError, "shard count"),
    C("TimestampShardedMixin", "naive datetime", "a naive Timestamp on flush", lambda: _flush_event(timestamp=NAIVE), ShardValueError, "naive"),
    # ids
    C("bit_reverse", "out-of-range int", "-1", lambda: so.bit_reverse(-1), ShardValueError, "-1"),
    C("bit_reverse", "out-of-range int", "2**63", lambda: so.bit_reverse(2**63), ShardValueError, "2**63"),
    C("bit_reverse", "wrong type", "1.5", lambda: so.bit_reverse(1.5), ShardTypeError, "int"),  # type: ignore[arg-type]
    C("bit_reverse", "None", "None", lambda: so.bit_reverse(None), ShardTypeError, "int"),  # type: ignore[arg-type]
    C("bit_reverse", "wrong type", "True", lambda: so.bit_reverse(True), ShardTypeError, "int"),
    C("bit_reverse", "wrong type", "'1'", lambda: so.bit_reverse("1"), ShardTypeError, "int"),  # type: ignore[arg-type]
    C("hashed_id_of", "missing table", "a model without a hashed key", lambda: so.hashed_id_of(User, 1), ShardConfigError, "no hashed key"),
    C("hashed_id_of", "None", "id None", lambda: so.hashed_id_of(Hashed, None), ShardTypeError, "ids are ints"),  # type: ignore[arg-type]
    C("hashed_id_of", "out-of-range int", "id 2**64", lambda: so.hashed_id_of(Hashed, 2**64), ShardValueError, "INT64"),
    C("hashed_id_of", "wrong type", "id '1'", lambda: so.hashed_id_of(Hashed, "1"), ShardTypeError, "ids are ints"),  # type: ignore[arg-type]
    C("hashed_id_of", "NaN/inf", "id nan", lambda: so.hashed_id_of(Hashed, NAN), ShardTypeError, "ids are ints"),  # type: ignore[arg-type]
    C("id_filter", "None", "id None", lambda: so.id_filter(Hashed, None), ShardTypeError, "ids are ints"),  # type: ignore[arg-type]
    C("id_filter", "wrong type", "model object()", lambda: so.id_filter(object(), 1), ShardTypeError, "object"),
    C("get_by_id", "out-of-range int", "id -2**63 - 1", lambda: so.get_by_id(session(), Hashed, -(2**63) - 1), ShardValueError, "INT64"),
    C("get_by_id", "wrong type", "id True", lambda: so.get_by_id(session(), Hashed, True), ShardTypeError, "ids are ints"),
    C("hashed_reference", "identifier", "prefix 'a;b'", lambda: so.hashed_reference(User, Hashed, prefix="a;b"), ShardTypeError, "give an identifier"),
    C("hashed_reference", "identifier", "prefix 'clé'", lambda: so.hashed_reference(User, Hashed, prefix="clé"), ShardTypeError, "give an identifier"),
    C("hashed_reference", "empty collection", "prefix ''", lambda: so.hashed_reference(User, Hashed, prefix=""), ShardTypeError, "give an identifier"),
    C("hashed_reference", "wrong type", "enforced='no'", lambda: so.hashed_reference(User, Hashed, prefix="h", enforced="no"), ShardTypeError, "enforced"),  # type: ignore[arg-type]
    C("hashed_reference", "missing table", "parent without a hashed key", lambda: so.hashed_reference(User, Event, prefix="e"), ShardConfigError, "no hashed key"),
    C("hashed_reference", "wrong type", "child a Table", lambda: so.hashed_reference(LogEntry.__table__, Hashed, prefix="h"), ShardTypeError, "mapped class"),
    C("HashedPrimaryKeyMixin", "out-of-range int", "__hash_buckets__ = 0", model(__mixins__=(so.HashedPrimaryKeyMixin,), __hash_buckets__=0), ShardConfigError, "shard count"),
    C("HashedPrimaryKeyMixin", "wrong type", "__id_default__ = 5", model(__mixins__=(so.HashedPrimaryKeyMixin,), __id_default__=5), ShardTypeError, "__id_default__"),
    C("HashedPrimaryKeyMixin", "None", "flush with id None", lambda: _flush(Hashed(name="x")), ShardingError, "id"),
    C("BitReversedPrimaryKeyMixin", "out-of-range int", "id = -5", lambda: _BitReversed(id=-5), ShardValueError, "positive INT64"),
    C("BitReversedPrimaryKeyMixin", "out-of-range int", "id = 2**64", lambda: _BitReversed(id=2**64), ShardValueError, "positive INT64"),
    C("BitReversedPrimaryKeyMixin", "wrong type", "id = '7'", lambda: _BitReversed(id="7"), ShardTypeError, "ids are ints"),
    C("UUIDPrimaryKeyMixin", "wrong type", "id = 12", lambda: _Uuid(id=12), ShardTypeError, "UUID string"),
    C("UUIDPrimaryKeyMixin", "bad option", "id = 'not-a-uuid'", lambda: _Uuid(id="not-a-uuid"), ShardValueError, "canonical form"),
    C("UUIDPrimaryKeyMixin", "bad option", "id upper-case UUID", lambda: _Uuid(id=str(uuid.uuid4()).upper()), ShardValueError, "canonical form"),
    C("HashedPrimaryKeyMixin", "out-of-range int", "id = 2**63", lambda: Hashed(id=2**63), ShardValueError, "INT64"),
    # sequences
    C("SpannerSequence", "identifier", "name 'seq; DROP TABLE x'", lambda: so.SpannerSequence(_spanner_engine(), "seq; DROP TABLE x"), ShardConfigError, "plain identifier"),
    C("SpannerSequence", "identifier", "name 'séq'", lambda: so.SpannerSequence(_spanner_engine(), "séq"), ShardConfigError, "plain identifier"),
    C("SpannerSequence", "out-of-range int", "block_size=0", lambda: so.SpannerSequence(_spanner_engine(), "s", block_size=0), ShardConfigError, "block_size"),
    C("SpannerSequence", "out-of-range int", "block_size=2**63", lambda: so.SpannerSequence(_spanner_engine(), "s", block_size=2**63), ShardConfigError, "block_size"),
    C("SpannerSequence", "wrong type", "block_size=True", lambda: so.SpannerSequence(_spanner_engine(), "s", block_size=True), ShardTypeError, "block_size"),
    C("SpannerSequence", "bad URL", "engine='sqlite://'", lambda: so.SpannerSequence("sqlite://", "s"), ShardTypeError, "Engine"),  # type: ignore[arg-type]
    C("SpannerSequence", "bad option", "a SQLite engine", lambda: so.SpannerSequence(engine(), "s"), UnsupportedOnDialectError, "needs a Spanner engine"),
    C("SpannerSequence", "NaN/inf", "deadline=nan", lambda: so.SpannerSequence(_spanner_engine(), "s", deadline=NAN), ShardConfigError, "deadline"),
    C("TableSequence", "huge collection", "name of 10,000 characters", lambda: so.TableSequence(engine(), "s" * 10_000), ShardConfigError, "at most 128 characters"),
    C("TableSequence", "identifier", "table_name 'Seq`'", lambda: so.TableSequence(engine(), "s", table_name="Seq`"), ShardConfigError, "plain identifier"),
    C("TableSequence", "empty collection", "name ''", lambda: so.TableSequence(engine(), ""), ShardTypeError, "non-empty str"),
    C("TableSequence", "out-of-range int", "block_size=-1", lambda: so.TableSequence(engine(), "s", block_size=-1), ShardConfigError, "block_size"),
    C("TableSequence", "out-of-range int", "block_size=2**63", lambda: so.TableSequence(engine(), "s", block_size=2**63), ShardConfigError, "block_size"),
    C("TableSequence", "wrong type", "bit_reversed='yes'", lambda: so.TableSequence(engine(), "s", bit_reversed="yes"), ShardTypeError, "bit_reversed"),  # type: ignore[arg-type]
    C("TableSequence", "out-of-range int", "max_retries=-1", lambda: so.TableSequence(engine(), "s", max_retries=-1), ShardConfigError, "max_retries"),
    C("TableSequence", "NaN/inf", "deadline=nan", lambda: so.TableSequence(engine(), "s", deadline=NAN), ShardConfigError, "deadline"),
    C("TableSequence", "None", "engine None", lambda: so.TableSequence(None, "s"), ShardTypeError, "Engine"),  # type: ignore[arg-type]
    # bulk_load
    C("bulk_load", "bad URL", "bind 'sqlite://'", load(bind="sqlite://"), ShardTypeError, "Engine"),
    C("bulk_load", "bad URL", "bind 'spanner:///nonsense'", load(bind="spanner:///nonsense"), ShardTypeError, "Engine"),
    C("bulk_load", "None", "bind None", lambda: so.bulk_load(None, LogEntry, [log_row()]), ShardTypeError, "Engine"),
    C("bulk_load", "out-of-range int", "workers=0", load(workers=0), ShardConfigError, "workers"),
    C("bulk_load", "out-of-range int", "workers=10**6", load(workers=10**6), ShardConfigError, "workers"),
    C("bulk_load", "wrong type", "workers=2.5", load(workers=2.5), ShardTypeError, "workers"),
    C("bulk_load", "wrong type", "batch_bytes=True", load(batch_bytes=True), ShardTypeError, "batch_bytes"),
    C("bulk_load", "out-of-range int", "batch_bytes=0", load(batch_bytes=0), ShardConfigError, "batch_bytes"),
    C("bulk_load", "bad option", "mode='upsert'", load(mode="upsert"), ShardConfigError, "mode"),
    C("bulk_load", "out-of-range int", "max_retries=-1", load(max_retries=-1), ShardConfigError, "max_retries"),
    C("bulk_load", "NaN/inf", "deadline=nan", load(deadline=NAN), ShardConfigError, "deadline"),
    C("bulk_load", "out-of-range int", "deadline=-1", load(deadline=-1.0), ShardConfigError, "deadline"),
    C("bulk_load", "wrong type", "defer_indexes='yes'", load(defer_indexes="yes"), ShardTypeError, "defer_indexes"),
    C("bulk_load", "None", "rows None", load(rows=None), ShardTypeError, "rows"),
    C("bulk_load", "wrong type", "rows [1, 2]", load(rows=[1, 2]), so.BulkValidationError, "rows are mappings"),
    C("bulk_load", "wrong type", "rows 'abc'", load(rows="abc"), so.BulkValidationError, "rows are mappings"),
    C("bulk_load", "missing table", "a row with an unknown column", load(rows=[log_row(Nope=1)]), ShardingError, "Nope"),
    C("bulk_load", "None", "a row with a None key part", load(rows=[log_row(CompanyId=None)]), ShardingError, "CompanyId"),
    C("bulk_load", "naive datetime", "a row with a naive Timestamp", load(rows=[log_row(Timestamp=NAIVE)]), ShardingError, "naive"),
    C("bulk_load", "wrong type", "a row with a float key part", load(rows=[log_row(UserId=1.5)]), ShardingError, "UserId"),
    C("bulk_load", "None", "model None", lambda: so.bulk_load(engine(), None, [log_row()]), ShardTypeError, "None"),
    C("bulk_load", "missing table", "model 'LogEntries' (a name)", lambda: so.bulk_load(engine(), "LogEntries", [log_row()]), ShardTypeError, "LogEntries"),
    C("bulk_load", "missing table", "a table not created", lambda: so.bulk_load(sa.create_engine("sqlite://"), LogEntry, [log_row()]), ShardingError, "LogEntries"),
    C("bulk_load", "wrong type", "progress='yes'", load(progress="yes"), ShardTypeError, "progress"),
    # sharded_select / expand / merged / order_columns / page / set_cursor_secret
    C("sharded_select", "None", "None", lambda: so.sharded_select(None), ShardTypeError, "None"),
    C("sharded_select", "missing table", "a model whose key has no shard", lambda: so.sharded_select(User), ShardConfigError, "not led by a shard column"),
    C("sharded_select", "missing table", "index='Nope'", lambda: so.sharded_select(LogEntry, index="Nope"), ShardConfigError, "no index named"),
    C("sharded_select", "identifier", "index='ix}; DROP TABLE x'", lambda: so.sharded_select(LogEntry, index="ix}; DROP TABLE x"), ShardConfigError, "plain identifier"),
    C("sharded_select", "identifier", "index with a backtick", lambda: so.sharded_select(LogEntry, index="Log`Entries"), ShardConfigError, "plain identifier"),
    C("sharded_select", "wrong type", "index=5", lambda: so.sharded_select(LogEntry, index=5), ShardConfigError, "plain identifier"),  # type: ignore[arg-type]
    C("expand", "None", "None", lambda: so.expand(None), ShardTypeError, "None"),
    C("expand", "wrong type", "a plain select", lambda: so.expand(sa.select(User)), ShardConfigError, "sharded_select"),
    C("expand", "out-of-range int", "shard=-1", lambda: so.expand(events_stmt(), shard=-1), ShardValueError, "shard"),
    C("expand", "out-of-range int", "shard=8 of 8", lambda: so.expand(events_stmt(), shard=8), ShardValueError, "shard"),
    C("expand", "wrong type", "shard='1'", lambda: so.expand(events_stmt(), shard="1"), ShardTypeError, "shard"),  # type: ignore[arg-type]
    C("merged", "wrong type", "a plain select", lambda: list(so.merged(conn(), sa.select(User))), ShardConfigError, "sharded_select"),
    C("merged", "out-of-range int", "limit=0", lambda: list(so.merged(conn(), events_stmt(), 0)), ShardConfigError, "limit"),
    C("merged", "out-of-range int", "limit=-5", lambda: list(so.merged(conn(), events_stmt(), -5)), ShardConfigError, "limit"),
    C("merged", "wrong type", "limit=True", lambda: list(so.merged(conn(), events_stmt(), True)), ShardTypeError, "limit"),
    C("merged", "wrong type", "after='x'", lambda: list(so.merged(conn(), events_stmt(), 5, after="x")), ShardConfigError, "after="),
    C("merged", "None", "conn None", lambda: list(so.merged(None, events_stmt())), ShardTypeError, "None"),
    C("order_columns", "None", "None", lambda: so.order_columns(None), ShardConfigError, "sharded_select"),
    C("order_columns", "wrong type", "'SELECT 1'", lambda: so.order_columns("SELECT 1"), ShardConfigError, "sharded_select"),
    C("page", "out-of-range int", "page_size=0", lambda: so.page(conn(), events_stmt(), 0), ShardConfigError, "page_size"),
    C("page", "wrong type", "page_size='10'", lambda: so.page(conn(), events_stmt(), "10"), ShardTypeError, "page_size"),  # type: ignore[arg-type]
        C("page", "tampered cursor", "garbage", page_with("garbage"), so.CursorError, "cursor"),
    C("page", "tampered cursor", "one character changed", lambda: page_with(tampered(good_cursor(), 50))(), so.CursorError, "altered"),
    C("page", "tampered cursor", "signature changed", lambda: page_with(tampered(good_cursor(), 3))(), so.CursorError, "altered"),
    C("page", "tampered cursor", "truncated", lambda: page_with(good_cursor()[:-6])(), so.CursorError, "cursor"),
    C("page", "tampered cursor", "not base64 ('***')", page_with("***"), so.CursorError, "cursor"),
    C("page", "forged cursor", "signed with another secret", lambda: page_with(forged())(), so.CursorError, "another secret"),
    C("page", "forged cursor", "issued for another query", lambda: _cursor_for_other_query(), so.CursorError, "another query"),
    C("page", "wrong type", "cursor=5", page_with(5), so.CursorError, "cursor"),
    C("page", "empty collection", "cursor=''", page_with(""), so.CursorError, "cursor"),
    C("page", "huge collection", "a 1 MB cursor", page_with("A" * 2**20), so.CursorError, "cursor"),
    C("page", "missing table", "a table not created", lambda: so.page(sa.create_engine("sqlite://").connect(), events_stmt(), 2), sa.exc.OperationalError, "no such table"),
    C("set_cursor_secret", "wrong type", "5", lambda: so.set_cursor_secret(5), so.CursorError, "str or bytes"),  # type: ignore[arg-type]
    C("set_cursor_secret", "empty collection", "b''", lambda: so.set_cursor_secret(b""), so.CursorError, "at least 16 bytes"),
    C("set_cursor_secret", "bad option", "b'key' (3 bytes)", lambda: so.set_cursor_secret(b"key"), so.CursorError, "at least 16 bytes"),
    C("set_cursor_secret", "bad option", "SHARDED_ORM_CURSOR_SECRET of 1 byte", lambda: _env_secret("k"), so.CursorError, "SHARDED_ORM_CURSOR_SECRET"),
    # lint / simulate / sample_rows / Workload / Instance
    C("lint", "None", "None", lambda: so.lint(None), ShardConfigError, "None"),
    C("lint", "wrong type", "5", lambda: so.lint(5), ShardConfigError, "5"),
    C("lint", "missing table", "an empty MetaData", lambda: so.lint(sa.MetaData()), ShardConfigError, "no tables"),
    C("lint", "missing table", "'no.such.module:Base'", lambda: so.lint("no.such.module:Base"), ShardConfigError, "no.such.module"),
    C("simulate", "None", "schemas None", lambda: so.simulate(None, WORKLOAD), ShardingError, "None"),
    C("simulate", "wrong type", "workload 'fast'", lambda: so.simulate(LogEntry, "fast"), ShardTypeError, "Workload"),  # type: ignore[arg-type]
    C("simulate", "wrong type", "instance 3", lambda: so.simulate(LogEntry, WORKLOAD, 3), ShardTypeError, "Instance"),  # type: ignore[arg-type]
    C("simulate", "empty collection", "schemas []", lambda: so.simulate([], WORKLOAD), ShardConfigError, "at least one model"),
    C("sample_rows", "out-of-range int", "n=-1", lambda: so.sample_rows(LogEntry, WORKLOAD, n=-1), ShardConfigError, "n"),
    C("sample_rows", "None", "model None", lambda: so.sample_rows(None, WORKLOAD), ShardingError, "None"),
    C("Workload", "out-of-range int", "rows_per_second=-1", workload(rows_per_second=-1.0), ShardConfigError, "rows_per_second"),
    C("Workload", "NaN/inf", "rows_per_second=nan", workload(rows_per_second=NAN), ShardConfigError, "rows_per_second"),
    C("Workload", "NaN/inf", "rows_per_second=inf", workload(rows_per_second=INF), ShardConfigError, "rows_per_second"),
    C("Workload", "NaN/inf", "duration=inf", workload(duration=INF), ShardConfigError, "duration"),
    C("Workload", "out-of-range int", "duration=0", workload(duration=0), ShardConfigError, "duration"),
    C("Workload", "wrong type", "duration='60'", workload(duration="60"), ShardTypeError, "duration"),
    C("Workload", "out-of-range int", "tenants=0", workload(tenants=0), ShardConfigError, "tenants"),
    C("Workload", "NaN/inf", "zipf=nan", workload(zipf=NAN), ShardConfigError, "zipf"),
    C("Workload", "out-of-range int", "zipf=-1", workload(zipf=-1.0), ShardConfigError, "zipf"),
    C("Workload", "bad option", "3 tenants, 2 tenant_weights", workload(tenants=3, tenant_weights=(1.0, 2.0)), ShardConfigError, "tenant_weights"),
    C("Workload", "bad option", "insert_order='sideways'", workload(insert_order="sideways"), ShardConfigError, "insert_order"),
    C("Workload", "bad option", "roles={'x': 'bogus'}", workload(roles={"x": "bogus"}), ShardConfigError, "bogus"),
    C("Workload", "naive datetime", "start naive", workload(start=NAIVE), ShardTypeError, "timezone-aware"),
    C("Workload", "huge collection", "10**9 rows", workload(rows_per_second=10**6, duration=1000.0), ShardConfigError, "more than the simulator takes"),
    C("Workload", "out-of-range int", "history=-1", workload(history=-1.0), ShardConfigError, "history"),
    C("Instance", "out-of-range int", "nodes=0", instance(nodes=0), ShardConfigError, "at least 1 node"),
    C("Instance", "NaN/inf", "node_capacity=nan", instance(node_capacity=NAN), ShardConfigError, "node_capacity"),
    C("Instance", "out-of-range int", "tick=-1", instance(tick=-1.0), ShardConfigError, "tick"),
    C("Instance", "wrong type", "nodes='3'", instance(nodes="3"), ShardTypeError, "nodes"),
    # CLI: sharded-orm lint / simulate
    C("cli lint", "missing table", "lint no.such.module:Base", cli("lint", "no.such.module:Base"), CliExit, "no.such.module"),
    C("cli lint", "missing table", "lint seed_models:Nope", cli("lint", "seed_models:Nope"), CliExit, "Nope"),
    C("cli lint", "empty collection", "lint ''", cli("lint", ""), CliExit, "error"),
    C("cli lint", "bad option", "lint --format xml", cli("lint", "seed_models:Sharded", "--format", "xml"), CliExit, "xml"),
    C("cli simulate", "out-of-range int", "--rows-per-second -5", cli("simulate", "seed_models:LogEntry", "--rows-per-second=-5", "--duration", "60"), CliExit, "--rows-per-second: must be a number > 0"),
    C("cli simulate", "NaN/inf", "--duration nan", cli("simulate", "seed_models:LogEntry", "--rows-per-second", "5", "--duration", "nan"), CliExit, "duration"),
    C("cli simulate", "wrong type", "--nodes three", cli("simulate", "seed_models:LogEntry", "--rows-per-second", "5", "--duration", "60", "--nodes", "three"), CliExit, "three"),
    C("cli simulate", "out-of-range int", "--nodes 0", cli("simulate", "seed_models:LogEntry", "--rows-per-second", "5", "--duration", "60", "--nodes", "0"), CliExit, "node"),
    C("cli simulate", "bad option", "--role Timestamp=bogus", cli("simulate", "seed_models:LogEntry", "--rows-per-second", "5", "--duration", "60", "--role", "Timestamp=bogus"), CliExit, "bogus"),
    C("cli simulate", "wrong type", "--tenant-weights a,b", cli("simulate", "seed_models:LogEntry", "--rows-per-second", "5", "--duration", "60", "--tenant-weights", "a,b"), CliExit, "tenant"),
    C("cli simulate", "missing table", "target no.such:Model", cli("simulate", "no.such:Model", "--rows-per-second", "5", "--duration", "60"), CliExit, "no.such"),
    C("cli simulate", "None", "no --duration", cli("simulate", "seed_models:LogEntry", "--rows-per-second", "5"), CliExit, "duration"),
    # verify / presplit / doctor
    C("verify", "missing table", "a model with no shard column", lambda: so.verify(engine(), User), ShardConfigError, "no shard columns"),
    C("verify", "None", "model None", lambda: so.verify(engine(), None), ShardTypeError, "None"),
    C("verify", "bad URL", "bind 'sqlite://'", lambda: so.verify("sqlite://", LogEntry), ShardTypeError, "Engine"),
    C("verify", "missing table", "a table not created", lambda: so.verify(sa.create_engine("sqlite://"), LogEntry), sa.exc.OperationalError, "no such table"),
    C("verify", "wrong type", "progress_mode='loud'", lambda: so.verify(engine(), LogEntry, progress_mode="loud"), ShardConfigError, "loud"),
    C("presplit", "bad URL", "engine 'spanner:///x'", lambda: so.presplit("spanner:///x", LogEntry), ShardTypeError, "Engine or Connection"),
    C("presplit", "bad option", "a SQLite engine", lambda: so.presplit(engine(), LogEntry), UnsupportedOnDialectError, "AddSplitPoints"),
    C("presplit", "out-of-range int", "expire_after=31 days", lambda: so.presplit(_spanner_engine(), LogEntry, expire_after=dt.timedelta(days=31)), ShardConfigError, "expire_after"),
    C("presplit", "wrong type", "expire_after=3600", lambda: so.presplit(_spanner_engine(), LogEntry, expire_after=3600), ShardConfigError, "expire_after"),  # type: ignore[arg-type]
    C("presplit", "out-of-range int", "per_request=0", lambda: so.presplit(_spanner_engine(), LogEntry, per_request=0), ShardConfigError, "per_request"),
    C("presplit", "None", "model None", lambda: so.presplit(_spanner_engine(), None), ShardTypeError, "None"),
    C("doctor", "bad option", "window='second'", lambda: so.doctor([], Sharded, window="second"), ShardConfigError, "second"),
    C("doctor", "wrong type", "since='yesterday'", lambda: so.doctor([], Sharded, since="yesterday"), ShardTypeError, "since"),  # type: ignore[arg-type]
    C("doctor", "missing table", "source 'no/such/stats.csv'", lambda: so.doctor("no/such/stats.csv", Sharded), ShardConfigError, "no/such/stats.csv"),
    C("doctor", "None", "models None", lambda: so.doctor([], None), ShardConfigError, "None"),
    C("doctor", "wrong type", "source 5", lambda: so.doctor(5, Sharded), ShardTypeError, "5"),
    C("cli doctor", "missing table", "doctor no/such.csv", cli("doctor", "no/such.csv", "seed_models:Sharded"), CliExit, "no/such.csv"),
    C("cli doctor", "bad option", "doctor --window second", cli("doctor", "x.csv", "seed_models:Sharded", "--window", "second"), CliExit, "second"),
    C("cli doctor", "None", "doctor without models", cli("doctor", "x.csv"), CliExit, "models"),
    C("cli verify", "bad URL", "verify not-a-url", cli("verify", "not-a-url", "seed_models:LogEntry"), CliExit, "not-a-url"),
    C("cli verify", "missing table", "verify a model with no shard column", cli("verify", "sqlite://", "seed_models:User"), CliExit, "no shard columns"),
    # our Spanner dialect: URLs
    C("spanner URL", "bad URL", "spanner+spanner:///nonsense", lambda: sa.create_engine("spanner+spanner:///nonsense"), sa.exc.ArgumentError, "not a Spanner URL"),
    C("spanner URL", "bad URL", "spanner+spanner:///projects/p (no instance)", lambda: sa.create_engine("spanner+spanner:///projects/p"), sa.exc.ArgumentError, "not a Spanner URL"),
    C("spanner URL", "bad URL", ".../databases/ (empty database)", lambda: sa.create_engine("spanner+spanner:///projects/p/instances/i/databases/"), sa.exc.ArgumentError, "not a Spanner URL"),
    C("spanner URL", "bad URL", "spanner+spanner:// (no path)", lambda: sa.create_engine("spanner+spanner://"), sa.exc.ArgumentError, "not a Spanner URL"),
    C("spanner URL", "identifier", "database 'd;drop'", lambda: sa.create_engine("spanner+spanner:///projects/p/instances/i/databases/d;drop"), sa.exc.ArgumentError, "not a Spanner URL"),
    # alembic_ext
    C("backfill_shard", "identifier", "table 'Log`Entries'", backfill(table="Log`Entries"), ShardConfigError, "Log`Entries"),
    C("backfill_shard", "identifier", "column 'x; DROP TABLE y'", backfill(column="x; DROP TABLE y"), ShardConfigError, "x; DROP TABLE y"),
    C("backfill_shard", "identifier", "source 'Company\"Id'", backfill(sources=['Company"Id']), ShardConfigError, 'Company"Id'),
    C("backfill_shard", "empty collection", "sources=[]", backfill(sources=[]), ShardConfigError, "source"),
    C("backfill_shard", "out-of-range int", "count=0", backfill(count=0), ShardConfigError, "shard count"),
    C("backfill_shard", "wrong type", "batch_size=True", backfill(batch_size=True), ShardTypeError, "batch_size"),
    C("backfill_shard", "out-of-range int", "batch_size=0", backfill(batch_size=0), ShardConfigError, "batch_size"),
    C("backfill_shard", "bad option", "algorithm='md5'", backfill(algorithm="md5"), ShardConfigError, "unknown shard algorithm"),
    C("backfill_shard", "missing table", "table 'Nope'", backfill(table="Nope"), ShardConfigError, "Nope"),
    C("backfill_shard", "missing table", "column 'Nope'", backfill(column="Nope"), ShardConfigError, "Nope"),
    C("backfill_shard", "bad option", "target a data column", backfill(column="LogEntry"), ShardConfigError, "LogEntry"),
    C("backfill_shard", "bad URL", "bind 'sqlite://'", backfill(bind="sqlite://"), ShardTypeError, "Engine"),
    C("BackfillShardOp", "empty collection", "sources=[]", lambda: alembic_ext.BackfillShardOp("t", "c", sources=[], count=8), ShardConfigError, "source"),
    C("BackfillShardOp", "identifier", "column 'c`'", lambda: alembic_ext.BackfillShardOp("t", "c`", sources=["a"], count=8), ShardConfigError, "c`"),
    C("index_warnings", "None", "None", lambda: alembic_ext.index_warnings(None), ShardTypeError, "None"),  # type: ignore[arg-type]
    C("render_item", "None", "primary_key None", lambda: alembic_ext.render_item("primary_key", None, None), ShardTypeError, "primary_key"),  # type: ignore[arg-type]
]  # fmt: skip


# ----------------------------------------------------------------------------- helpers used above


def _spanner() -> Any:
    from sharded_orm.spanner.dialect import SpannerDialect

    return SpannerDialect()


@cache
def _spanner_engine() -> sa.Engine:
    """An engine on our Spanner dialect; never connected (checks run before any call)."""
    return sa.create_engine("spanner+spanner:///projects/p/instances/i/databases/d")


def _sqlite() -> sa.Dialect:
    return engine().dialect


def _insert_log(**over: Any) -> object:
    with engine().begin() as c:
        return c.execute(sa.insert(LogEntry), [log_row(**over)])


def _flush(obj: Any) -> None:
    with session() as s:
        s.add(obj)
        s.flush()


def _flush_event(**kw: Any) -> None:
    _flush(Event(kind="k", **kw))


class _BitReversed(so.BitReversedPrimaryKeyMixin, Own):
    __tablename__ = "BitReversedThings"


class _Uuid(so.UUIDPrimaryKeyMixin, Own):
    __tablename__ = "UuidThings"


def _env_secret(value: str) -> object:
    import os

    os.environ["SHARDED_ORM_CURSOR_SECRET"] = value
    so.set_cursor_secret(None)
    try:
        return page_with(None)()
    finally:
        del os.environ["SHARDED_ORM_CURSOR_SECRET"]
        so.set_cursor_secret(None)


def _cursor_for_other_query() -> object:
    cursor = good_cursor()
    other = so.sharded_select(Event, index="EventsByKind").where(Event.kind == "other")
    with conn() as c:
        return so.page(c, other, 2, cursor=cursor)


# ----------------------------------------------------------------------------- the tests


def case_id(case: Any) -> str:
    return f"{case.call}: {case.input}"


@pytest.fixture(autouse=True)
def _fresh_secret() -> Iterator[None]:
    so.set_cursor_secret(None)
    yield
    so.set_cursor_secret(None)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_bad_input(case: Case) -> None:
    with pytest.raises(case.error) as caught:
        case.run()
    assert case.fragment in str(caught.value), f"{caught.value!r} lacks {case.fragment!r}"
    if isinstance(caught.value, CliExit):
        assert caught.value.code == 2


# ----------------------------------------------------------------------------- on the emulator


@dataclass(frozen=True)
class EmulatorCase:
    call: str
    kind: str
    input: str
    run: Callable[[sa.Engine], object]
    error: type[BaseException]
    fragment: str


def _emu_page(eng: sa.Engine) -> object:
    with eng.connect() as c:
        return so.page(c, events_stmt(), 2)


E = EmulatorCase
EMULATOR_CASES: list[EmulatorCase] = [
    E("bulk_load", "missing table", "a table not created on the emulator", lambda eng: so.bulk_load(eng, LogEntry, [log_row()], progress=False), ShardingError, "LogEntries"),
    E("page", "missing table", "a table not created on the emulator", _emu_page, sa.exc.DBAPIError, "Events"),
    E("verify", "missing table", "a table not created on the emulator", lambda eng: so.verify(eng, LogEntry), ShardingError, "LogEntries"),
    E("SpannerSequence", "missing table", "a sequence not created", lambda eng: so.SpannerSequence(eng, "NoSuchSeq", deadline=10).next_id(), ShardingError, "NoSuchSeq"),
    E("TableSequence", "missing table", "a Sequences table not created", lambda eng: so.TableSequence(eng, "s", deadline=10).next_id(), ShardingError, "Sequences"),
    E("backfill_shard", "missing table", "a table not created", lambda eng: alembic_ext.backfill_shard(eng, "LogEntries", "EntryShardId", sources=["CompanyId", "Timestamp"], count=10, progress=False), ShardingError, "LogEntries"),
    E("create_all", "identifier", "index name with a backtick", lambda eng: _create_with_index(eng, "ix` ON t (ts); DROP TABLE x; CREATE INDEX `z"), ShardConfigError, "not a valid Spanner name"),
    E("create_all", "identifier", "table name with a quote", lambda eng: _create_table(eng, 't"; DROP TABLE x; --'), ShardConfigError, "not a valid Spanner name"),
    E("create_all", "identifier", "column name with unicode", lambda eng: _create_table(eng, "t", column="naïve"), ShardConfigError, "not a valid Spanner name"),
    E("create_all", "identifier", "interleave parent with a space", lambda eng: _create_table(eng, "t", parent="My Parent"), ShardConfigError, "not a valid Spanner name"),
    E("reflection", "identifier", "table name 'x\' OR 1=1' (bound, not pasted)", lambda eng: sa.Table("x' OR 1=1", sa.MetaData(), autoload_with=eng), sa.exc.NoSuchTableError, "x' OR 1=1"),
    E("insert().values", "huge collection", "200 rows x 5 columns", lambda eng: _multi_values(eng, 200), sa.exc.ProgrammingError, "at most 950"),
    E("in_", "huge collection", "an IN list of 1,000 values", lambda eng: _long_in(eng, 1000), sa.exc.ProgrammingError, "at most 950"),
]  # fmt: skip


def _create_table(eng: sa.Engine, name: str, column: str = "c", parent: str | None = None) -> None:
    md = sa.MetaData()
    extra = {"spanner_interleave_in": parent} if parent else {}
    sa.Table(
        name,
        md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column(column, sa.BigInteger),
        **extra,
    )
    md.create_all(eng)


def _create_with_index(eng: sa.Engine, index_name: str) -> None:
    md = sa.MetaData()
    t = sa.Table(
        "t",
        md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("ts", sa.BigInteger),
    )
    sa.Index(index_name, t.c.ts)
    md.create_all(eng)


def _wide(eng: sa.Engine) -> sa.Table:
    md = sa.MetaData()
    t = sa.Table(
        "wide",
        md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        *[sa.Column(f"c{i}", sa.BigInteger) for i in range(4)],
    )
    md.create_all(eng)
    return t


def _multi_values(eng: sa.Engine, n: int) -> None:
    t = _wide(eng)
    with eng.begin() as c:
        c.execute(
            t.insert().values([{"id": i, "c0": i, "c1": i, "c2": i, "c3": i} for i in range(n)])
        )


def _long_in(eng: sa.Engine, n: int) -> None:
    t = _wide(eng)
    with eng.connect() as c:
        c.execute(sa.select(t.c.id).where(t.c.c0.in_(range(n)))).all()


@pytest.mark.emulator
@pytest.mark.parametrize("case", EMULATOR_CASES, ids=case_id)
def test_bad_input_on_the_emulator(case: EmulatorCase, spanner_engine: sa.Engine) -> None:
    md = sa.MetaData()
    sa.Table("x", md, sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False))
    md.create_all(spanner_engine)  # a bystander: no bad input may touch it
    with pytest.raises(case.error) as caught:
        case.run(spanner_engine)
    assert case.fragment in str(caught.value), f"{caught.value!r} lacks {case.fragment!r}"
    assert "x" in sa.inspect(spanner_engine).get_table_names()


#: Public names that are records returned to the caller, not called with input.
RESULTS = {
    "BulkLoadReport",
    "Comparison",
    "Finding",
    "FoundBound",
    "MergeStats",
    "Page",
    "SimulationResult",
    "Diagnosis",
    "HotspotFinding",
    "PresplitReport",
    "VerifyReport",
}


def test_catalogue_covers_every_public_name() -> None:
    called = {c.call for c in CASES}
    public = {
        n
        for n in so.__all__
        if not (isinstance(getattr(so, n), type) and issubclass(getattr(so, n), BaseException))
    }
    missing = public - RESULTS - called
    assert not missing, f"no bad input for {sorted(missing)}"
    for name in ("backfill_shard", "BackfillShardOp", "index_warnings", "render_item"):
        assert name in called
    assert {"cli lint", "cli simulate", "cli doctor", "cli verify"} <= called


def test_catalogue_has_at_least_150_distinct_inputs() -> None:
    keys = [(c.call, c.input) for c in CASES] + [(c.call, c.input) for c in EMULATOR_CASES]
    assert len(set(keys)) == len(keys), [k for k, n in Counter(keys).items() if n > 1]
    assert len(keys) >= 150


def count_by_kind() -> dict[str, int]:
    return dict(sorted(Counter(c.kind for c in [*CASES, *EMULATOR_CASES]).items()))


if __name__ == "__main__":  # python -m tests.test_bad_inputs: the counts for the report
    print(len(CASES), "offline +", len(EMULATOR_CASES), "on the emulator:", count_by_kind())
