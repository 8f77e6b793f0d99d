"""Schema constructs: what metadata.create_all makes, read back from the database.

On the emulator INFORMATION_SCHEMA must show each index's columns, order, directions,
STORING, NULL_FILTERED and interleave, and each table's key order and parent, exactly
as declared in tests/seed_models.py. The same models create and work on SQLite.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa
from seed_models import Event, LogEntry, Sharded, User, UserSession
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import (
    ShardConfigError,
    ShardedIndex,
    ShardTypeError,
    TimestampShardedMixin,
    UTCDateTime,
    compute_shard,
    interleave_in,
    key_column,
    shard_column,
)

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)


def _q(engine: sa.Engine, sql: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql))]


def index_columns(engine: sa.Engine, table: str, index: str) -> list[tuple[Any, ...]]:
    return _q(
        engine,
        "SELECT COLUMN_NAME, ORDINAL_POSITION, COLUMN_ORDERING "
        "FROM INFORMATION_SCHEMA.INDEX_COLUMNS "
        f"WHERE TABLE_SCHEMA = '' AND TABLE_NAME = '{table}' AND INDEX_NAME = '{index}' "
        "ORDER BY ORDINAL_POSITION, COLUMN_NAME",
    )


@pytest.mark.emulator
def test_seed_schemas_on_spanner(spanner_engine: sa.Engine) -> None:
    Sharded.metadata.create_all(spanner_engine)
    e = spanner_engine
    # keys, in order, with directions (stored columns have no position: listed first)
    assert index_columns(e, "Events", "PRIMARY_KEY") == [
        ("ShardId", 1, "ASC"),
        ("Timestamp", 2, "DESC"),
        ("EventId", 3, "ASC"),
    ]
    assert index_columns(e, "Users", "PRIMARY_KEY") == [
        ("UserId", 1, "ASC"),
        ("LastAccessTimestamp", 2, "DESC"),
    ]
    assert index_columns(e, "UserSessions", "PRIMARY_KEY") == [
        ("UserId", 1, "ASC"),
        ("LastAccessTimestamp", 2, "DESC"),
        ("SessionId", 3, "ASC"),
    ]
    # sharded indexes: shard first, DESC kept, STORING as columns without a position
    assert index_columns(e, "LogEntries", "LogEntriesByCompany") == [
        ("LogEntry", None, None),
        ("EntryShardId", 1, "ASC"),
        ("CompanyId", 2, "ASC"),
        ("Timestamp", 3, "DESC"),
    ]
    assert index_columns(e, "Events", "EventsByKind") == [
        ("Payload", None, None),
        ("ShardId", 1, "ASC"),
        ("Kind", 2, "ASC"),
        ("Timestamp", 3, "DESC"),
    ]
    assert index_columns(e, "BucketedEvents", "BucketedEventsByKind") == [
        ("ShardId", 1, "ASC"),
        ("Kind", 2, "ASC"),
    ]
    indexes = _q(
        e,
        "SELECT TABLE_NAME, INDEX_NAME, IS_UNIQUE, IS_NULL_FILTERED, PARENT_TABLE_NAME "
        "FROM INFORMATION_SCHEMA.INDEXES WHERE TABLE_SCHEMA = '' AND INDEX_TYPE = 'INDEX' "
        "ORDER BY INDEX_NAME",
    )
    assert indexes == [
        ("BucketedEvents", "BucketedEventsByKind", False, False, "EventBuckets"),
        ("Events", "EventsByKind", False, False, ""),
        ("LogEntries", "LogEntriesByCompany", False, False, ""),
        ("UserSessions", "SessionsByDevice", False, True, ""),
    ]
    tables = _q(
        e,
        "SELECT TABLE_NAME, PARENT_TABLE_NAME, ON_DELETE_ACTION FROM INFORMATION_SCHEMA.TABLES "
        "WHERE TABLE_SCHEMA = '' ORDER BY TABLE_NAME",
    )
    assert tables == [
        ("BucketedEvents", "EventBuckets", "CASCADE"),
        ("EventBuckets", None, None),
        ("Events", None, None),
        ("LogEntries", None, None),
        ("UserSessions", "Users", "CASCADE"),
        ("Users", None, None),
    ]


def test_seed_schemas_work_on_sqlite_and_spanner(engine: sa.Engine) -> None:
    Sharded.metadata.create_all(engine)
    with Session(engine) as s:
        s.add(User(user_id=1, last_access=T0, name="ada"))
        s.flush()
        s.add_all(
            [
                UserSession(user_id=1, last_access=T0, session_id="s1", device="phone"),
                LogEntry(company_id="Acme", user_id="u1", ts=T0, entry="hello"),
                Event(kind="click", payload="{}"),
                Event(kind="view", timestamp=T0),
            ]
        )
        s.commit()
    with Session(engine) as s:
        events = s.scalars(sa.select(Event).order_by(Event.kind)).all()
        assert [ev.kind for ev in events] == ["click", "view"]
        for ev in events:
            assert ev.shard_id == compute_shard(ev.timestamp, 8)
            assert len(ev.event_id) == 36
        log = s.scalars(sa.select(LogEntry)).one()
        assert log.entry_shard_id == compute_shard(("Acme", T0), 10)
        assert s.scalars(sa.select(UserSession.device_shard)).one() == compute_shard(1, 4)
        # the DESC key part is honoured by both: newest first by key order
        s.add(User(user_id=1, last_access=T0 + dt.timedelta(hours=1), name="ada"))
        s.commit()
        accesses = s.scalars(sa.select(User.last_access).where(User.user_id == 1)).all()
        assert sorted(accesses) == [T0, T0 + dt.timedelta(hours=1)]


def sqlite_index(engine: sa.Engine, index: str) -> list[tuple[str, bool]]:
    """(column, descending) of an SQLite index, key columns only, in order."""
    rows = _q(engine, f"PRAGMA index_xinfo('{index}')")
    return [(name, bool(desc)) for _, _, name, desc, _, is_key in rows if is_key]


def test_seed_schemas_on_sqlite() -> None:
    e = sa.create_engine("sqlite://")
    Sharded.metadata.create_all(e)
    # primary keys (SQLite's automatic index), in order, with directions
    assert sqlite_index(e, "sqlite_autoindex_Events_1") == [
        ("ShardId", False),
        ("Timestamp", True),
        ("EventId", False),
    ]
    assert sqlite_index(e, "sqlite_autoindex_Users_1") == [
        ("UserId", False),
        ("LastAccessTimestamp", True),
    ]
    assert sqlite_index(e, "sqlite_autoindex_UserSessions_1") == [
        ("UserId", False),
        ("LastAccessTimestamp", True),
        ("SessionId", False),
    ]
    # sharded indexes: same columns and directions; Spanner-only clauses left out
    assert sqlite_index(e, "LogEntriesByCompany") == [
        ("EntryShardId", False),
        ("CompanyId", False),
        ("Timestamp", True),
    ]
    assert sqlite_index(e, "EventsByKind") == [
        ("ShardId", False),
        ("Kind", False),
        ("Timestamp", True),
    ]
    assert sqlite_index(e, "SessionsByDevice") == [("DeviceShard", False), ("Device", False)]
    assert sqlite_index(e, "BucketedEventsByKind") == [("ShardId", False), ("Kind", False)]
    e.dispose()


def test_sharded_index_with_core_tables_and_attributes() -> None:
    from sqlalchemy.dialects import sqlite
    from sqlalchemy.schema import CreateIndex

    from sharded_orm.spanner.dialect import SpannerDialect

    def ddl(ix: sa.Index) -> tuple[str, str]:
        return (
            str(CreateIndex(ix).compile(dialect=SpannerDialect())),
            str(CreateIndex(ix).compile(dialect=sqlite.dialect())),
        )

    # Table(...), the index among its arguments
    t = sa.Table(
        "Logs",
        sa.MetaData(),
        sa.Column("Id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("Company", sa.String(10)),
        sa.Column("Ts", UTCDateTime),
        sa.Column("Body", sa.String(10)),
        shard_column("Company", "Ts", count=8, name="S").column,
        ShardedIndex("ix1", "Company", sa.desc("Ts"), shard="S", storing=["Body"]),
    )
    assert ddl(next(iter(t.indexes))) == (
        "CREATE INDEX ix1 ON `Logs` (`S`, `Company`, `Ts` DESC) STORING (`Body`)",
        'CREATE INDEX ix1 ON "Logs" ("S", "Company", "Ts" DESC)',
    )
    # Column objects, attached by them
    ix2 = ShardedIndex("ix2", t.c.Company, t.c.Ts.desc(), shard=t.c.S, unique=True)
    assert ix2.table is t and ix2.shard_column.count == 8
    assert ddl(ix2)[0] == "CREATE UNIQUE INDEX ix2 ON `Logs` (`S`, `Company`, `Ts` DESC)"

    class B(DeclarativeBase):
        pass

    class Log(B):
        __tablename__ = "Log"
        id: Mapped[int] = mapped_column("Id", primary_key=True, autoincrement=False)
        company: Mapped[str] = mapped_column("Company", sa.String(10))
        ts: Mapped[dt.datetime] = mapped_column("Ts", UTCDateTime)
        body: Mapped[str] = mapped_column("Body", sa.String(10))
        s: Mapped[int] = shard_column("company", count=4, name="Shard")
        # the class body's own mapped columns, by object
        __table_args__ = (ShardedIndex("LogByCompany", company, sa.desc(ts), shard=s),)

    assert ddl(next(iter(Log.__table__.indexes)))[0] == (
        "CREATE INDEX `LogByCompany` ON `Log` (`Shard`, `Company`, `Ts` DESC)"
    )
    # ORM attributes, once mapped
    ix3 = ShardedIndex("ix3", Log.company, Log.ts.desc(), shard=Log.s, storing=[Log.body])
    assert ix3.table is Log.__table__
    assert ddl(ix3)[0] == (
        "CREATE INDEX ix3 ON `Log` (`Shard`, `Company`, `Ts` DESC) STORING (`Body`)"
    )
    assert [(c.name, d) for c, d in ix3.ordering] == [("Company", False), ("Ts", True)]


@pytest.mark.emulator
def test_interleaved_children_need_their_parent_and_go_with_it(spanner_engine: sa.Engine) -> None:
    Sharded.metadata.create_all(spanner_engine)
    with Session(spanner_engine) as s:
        s.add(User(user_id=1, last_access=T0))
        s.flush()
        s.add(UserSession(user_id=1, last_access=T0, session_id="s1"))
        s.commit()
    with Session(spanner_engine) as s, pytest.raises(sa.exc.IntegrityError, match="parent"):
        s.add(UserSession(user_id=2, last_access=T0, session_id="orphan"))  # no user 2
        s.commit()
    with Session(spanner_engine) as s:
        s.execute(sa.delete(User).where(User.user_id == 1))
        s.commit()
        assert s.scalars(sa.select(UserSession.session_id)).all() == []  # ON DELETE CASCADE


def test_mixin_defaults_and_configuration() -> None:
    class B(DeclarativeBase):
        pass

    class Audit(TimestampShardedMixin, B):
        __tablename__ = "audit"
        __shard_count__ = 32
        __shard_column_name__ = "Bucket"
        __timestamp_column_name__ = "At"
        __id_column_name__ = "AuditId"
        what: Mapped[str]
        # the subclass's own table args add to the mixin's key, they don't replace it
        __table_args__ = (ShardedIndex("AuditByWhat", "what", shard="Bucket"),)

    t = Audit.__table__
    assert [c.name for c in t.primary_key.columns] == ["Bucket", "At", "AuditId"]
    assert [ix.name for ix in t.indexes] == ["AuditByWhat"]
    from sharded_orm import get_shard_column

    sc = get_shard_column(Audit)
    assert (sc.name, sc.count, [c.name for c in sc.sources]) == ("Bucket", 32, ["At"])


def test_sharded_index_introspection() -> None:
    ix = next(iter(LogEntry.__table__.indexes))
    assert isinstance(ix, ShardedIndex)
    assert ix.shard_column.name == "EntryShardId" and ix.shard_column.count == 10
    assert [(c.name, d) for c, d in ix.ordering] == [("CompanyId", False), ("Timestamp", True)]
    assert [c.name for c in ix.storing] == ["LogEntry"]
    assert ix.dialect_options["spanner"]["storing"] == ["LogEntry"]


# --------------------------------------------------------------------------- bad input


def _model(*table_args: Any, extra: dict[str, Any] | None = None) -> type:
    class B(DeclarativeBase):
        pass

    ns: dict[str, Any] = {
        "__tablename__": "m",
        "__annotations__": {
            "id": Mapped[int],
            "a": Mapped[str],
            "ts": Mapped[dt.datetime],
            "s": Mapped[int],
            "plain": Mapped[int],
        },
        "id": mapped_column(primary_key=True),
        "a": mapped_column(sa.String(10)),
        "ts": mapped_column(UTCDateTime),
        "s": shard_column("a", count=4),
        "plain": mapped_column(),
        "__table_args__": table_args,
        **(extra or {}),
    }
    try:
        return type("M", (B,), ns)
    except Exception:
        B.registry.dispose()  # a refused model leaves no mapper for a later configure
        raise


@pytest.mark.parametrize(
    ("index", "error", "message"),
    [
        (lambda: ShardedIndex("ix", "ts", shard="plain"), ShardConfigError, "not a shard column"),
        (lambda: ShardedIndex("ix", "ts", shard="nope"), ShardConfigError, "shard='nope' is not a"),
        (lambda: ShardedIndex("ix", "nope", shard="s"), ShardConfigError, "'nope' is not a column"),
        (
            lambda: ShardedIndex("ix", "s", "ts", shard="s"),
            ShardConfigError,
            "listed among the columns",
        ),
        (
            lambda: ShardedIndex("ix", "ts", shard="s", storing=["id"]),
            ShardConfigError,
            "key column",
        ),
        (
            lambda: ShardedIndex("ix", "ts", shard="s", storing=["ts"]),
            ShardConfigError,
            "indexed column",
        ),
        (
            lambda: ShardedIndex("ix", "ts", shard="s", storing=["zz"]),
            ShardConfigError,
            "not a column",
        ),
        (
            lambda: ShardedIndex("ix", sa.func.lower(sa.column("a")), shard="s"),
            ShardConfigError,
            "no expression indexes",
        ),
        (lambda: ShardedIndex("ix", "ts", shard="s", storing="a"), ShardTypeError, "sequence"),
        (lambda: ShardedIndex("ix", "ts", shard="s", null_filtered="yes"), ShardTypeError, "bool"),
    ],
)
def test_bad_sharded_indexes(index: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        _model(index())


def test_unique_sharded_index_must_be_unique_across_shards() -> None:
    # the shard of (s, ts) is computed from "a", which the index does not hold: two rows
    # with the same ts in different shards would both pass
    with pytest.raises(ShardConfigError, match="only within each shard"):
        _model(ShardedIndex("ix", "ts", shard="s", unique=True))
    # sources named by ORM attribute are only known once mapped: checked then
    with pytest.raises(ShardConfigError, match=r"only within each shard.*\(Org\)"):

        class B(DeclarativeBase):
            pass

        class Member(B):
            __tablename__ = "Members"
            id: Mapped[int] = mapped_column("Id", primary_key=True)
            org: Mapped[str] = mapped_column("Org", sa.String(10))
            email: Mapped[str] = mapped_column("Email", sa.String(10))
            shard: Mapped[int] = shard_column("org", count=4, name="S")
            __table_args__ = (ShardedIndex("ux", "Email", shard="S", unique=True),)

    # fine: the shard follows from the indexed columns, or the key is indexed
    _model(ShardedIndex("ix", "a", "ts", shard="s", unique=True))
    _model(ShardedIndex("ix", "id", shard="s", unique=True))


def test_unique_sharded_index_rejects_duplicates(engine: sa.Engine) -> None:
    class B(DeclarativeBase):
        pass

    class Account(B):
        __tablename__ = "Accounts"
        id: Mapped[int] = mapped_column("Id", sa.BigInteger, primary_key=True, autoincrement=False)
        email: Mapped[str] = mapped_column("Email", sa.String(64))
        shard: Mapped[int] = shard_column("email", count=4, name="EmailShard")
        __table_args__ = (
            ShardedIndex("AccountsByEmail", "Email", shard="EmailShard", unique=True),
        )

    B.metadata.create_all(engine)
    with Session(engine) as s:
        s.add(Account(id=1, email="ada@example.com"))
        s.commit()
    with Session(engine) as s, pytest.raises(sa.exc.DBAPIError):
        s.add(Account(id=2, email="ada@example.com"))
        s.commit()
    with Session(engine) as s:
        assert s.scalars(sa.select(Account.id)).all() == [1]


def test_interleave_parent_key_must_be_a_prefix(engine: sa.Engine) -> None:
    class B(DeclarativeBase):
        pass

    class Parent(B):
        __tablename__ = "Parent"
        pid: Mapped[int] = key_column("ParentId", autoincrement=False)

    class Child(B):
        __tablename__ = "Child"
        cid: Mapped[int] = key_column("ChildId", autoincrement=False)  # no ParentId first
        __table_args__ = (interleave_in(Parent),)

    with pytest.raises(ShardConfigError, match="is not a prefix of the child's key"):
        B.metadata.create_all(engine)


def test_interleaved_child_declared_before_its_parent_is_created_after(engine: sa.Engine) -> None:
    class B(DeclarativeBase):
        pass

    class Child(B):  # declared first: create_all must still create Parent first
        __tablename__ = "Child"
        pid: Mapped[int] = key_column("ParentId", autoincrement=False)
        cid: Mapped[int] = key_column("ChildId", autoincrement=False)
        __table_args__ = (interleave_in("Parent", on_delete_cascade=True),)

    class Parent(B):
        __tablename__ = "Parent"
        pid: Mapped[int] = key_column("ParentId", autoincrement=False)

    assert [t.name for t in B.metadata.sorted_tables] == ["Parent", "Child"]
    B.metadata.create_all(engine)
    assert sorted(sa.inspect(engine).get_table_names()) == ["Child", "Parent"]
    with engine.begin() as conn:
        conn.execute(Parent.__table__.insert(), {"ParentId": 1})
        conn.execute(Child.__table__.insert(), {"ParentId": 1, "ChildId": 7})


def test_interleaved_index_must_start_with_the_parent_key(engine: sa.Engine) -> None:
    class B(DeclarativeBase):
        pass

    class Parent(B):
        __tablename__ = "Parent"
        pid: Mapped[int] = key_column("ParentId", autoincrement=False)

    class Child(B):
        __tablename__ = "Child"
        pid: Mapped[int] = key_column("ParentId", autoincrement=False)
        cid: Mapped[int] = key_column("ChildId", autoincrement=False)
        name: Mapped[str] = mapped_column("Name", sa.String(10))
        shard: Mapped[int] = shard_column("name", count=4, name="NameShard")
        __table_args__ = (
            ShardedIndex("ChildByName", "Name", shard="NameShard", interleave_in="Parent"),
            interleave_in(Parent),
        )

    with pytest.raises(ShardConfigError, match="start with the parent's key"):
        B.metadata.create_all(engine)


def test_misspelt_spanner_keyword_is_an_error() -> None:
    with pytest.raises(sa.exc.ArgumentError, match="spanner_storeing"):
        sa.Index("ix", "a", spanner_storeing=["b"])
    with pytest.raises(sa.exc.ArgumentError, match="spanner_interleave"):
        sa.Table("t", sa.MetaData(), sa.Column("a", sa.Integer), spanner_interleave="p")


def test_interleave_in_bad_input() -> None:
    with pytest.raises(ShardTypeError):
        interleave_in(3)
    with pytest.raises(ShardTypeError):
        interleave_in("P", on_delete_cascade="yes")  # type: ignore[arg-type]
