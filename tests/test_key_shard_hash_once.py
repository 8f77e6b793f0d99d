"""A new object of a key-shard model is hashed once on its way to an ORM INSERT.

A shard in the primary key is derived by the ``set`` listener of its sources as soon as
every source is known (``session.merge()`` and the identity map key the object by it),
and the flush takes that shard rather than hashing again (``DERIVED_MARK``). A source
left to its Python default is set at flush: the listener derives the shard as the default
is stored, and the flush used to hash the same values a second time (2N hashes for N
objects; ``orm_events._fill_slowly``).

What "once" means here: one hash per assignment that leaves every source of a new object
known (constructor keyword, attribute assignment, or a default stored at flush), and none
at flush for sources the listener saw; a source changed again is hashed again, once, when
it is set. A shard the caller gives is checked at flush, with one hash of its sources.

Counted through public observables, nothing patched: the source is a ``TypeDecorator``
whose ``process_bind_param`` the library calls, with its own hashing dialect (named
``"default"``), once per hash (as in tests/test_shard_once.py); and for the real
``TimestampShardedMixin`` (a plain ``UTCDateTime`` source, hashed inline), the calls of
``zlib.crc32`` seen by ``sys.setprofile``. Every case reads the stored rows back.
"""

from __future__ import annotations

import datetime as dt
import itertools
import sys
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, MappedAsDataclass, Session, mapped_column

from sharded_orm import TimestampShardedMixin, compute_shard, shard_column
from sharded_orm.errors import ShardMismatchError

COUNT = 16
N = 6


class Hashes:
    """Calls of the source's conversion made by the library to hash it."""

    n = 0


class Code(sa.types.TypeDecorator[str]):
    """A source stored stripped: the library hashes ``process_bind_param``'s output."""

    impl = sa.String(40)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        if dialect.name == "default":  # the library's hashing dialect, not the engine's
            Hashes.n += 1
        return None if value is None else value.strip()


def counted(work: Callable[[], Any]) -> int:
    Hashes.n = 0
    work()
    return Hashes.n


def crc32_calls(work: Callable[[], Any]) -> int:
    """The calls of ``zlib.crc32`` (the shard hash of a ``crc32`` shard) while ``work``
    runs on this thread."""
    calls = 0
    crc = zlib.crc32

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "c_call" and arg is crc:
            calls += 1

    before = sys.getprofile()
    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(before)
    return calls


def want(*values: Any) -> int:
    return compute_shard([v.strip() if isinstance(v, str) else v for v in values], COUNT)


def make_models() -> tuple[Any, type[Any], type[Any]]:
    made = itertools.count()

    def next_code() -> str:
        return f" d{next(made)} "

    class Base(DeclarativeBase):
        pass

    class Keyed(Base):
        """A key shard over one source with a Python default."""

        __tablename__ = "kso_keyed"
        shard: Mapped[int] = shard_column("code", count=COUNT, primary_key=True)
        code: Mapped[str] = mapped_column(Code, primary_key=True, default=next_code)
        note: Mapped[str] = mapped_column(sa.String(20), default="")

    class Pair(Base):
        """A key shard over two sources, the counted one with a Python default."""

        __tablename__ = "kso_pair"
        shard: Mapped[int] = shard_column("region", "code", count=COUNT, primary_key=True)
        region: Mapped[str] = mapped_column(sa.String(20), primary_key=True)
        code: Mapped[str] = mapped_column(Code, primary_key=True, default=next_code)

    return Base, Keyed, Pair


@pytest.fixture
def models(engine: sa.Engine) -> Iterator[tuple[sa.Engine, type[Any], type[Any]]]:
    base, keyed, pair = make_models()
    base.metadata.create_all(engine)
    try:
        yield engine, keyed, pair
    finally:
        base.metadata.drop_all(engine)


@pytest.fixture(scope="module")
def sqlite_models() -> Iterator[tuple[sa.Engine, type[Any], type[Any]]]:
    engine = sa.create_engine("sqlite://")
    base, keyed, pair = make_models()
    base.metadata.create_all(engine)
    try:
        yield engine, keyed, pair
    finally:
        engine.dispose()


def stored_keyed(engine: sa.Engine, model: Any) -> set[tuple[Any, ...]]:
    with engine.connect() as conn:
        return set(conn.execute(sa.select(model.code, model.shard)).all())


def test_n_objects_with_a_defaulted_source_hash_n_times(models: Any) -> None:
    """On SQLite and on the emulator: the default stored at flush is hashed once."""
    engine, Keyed, _ = models
    with Session(engine) as session:
        objs = [Keyed(note=f"n{i}") for i in range(N)]
        session.add_all(objs)
        assert counted(session.flush) == N  # it was 2N
        assert [o.shard for o in objs] == [want(o.code) for o in objs]
        assert all(session.get(Keyed, (o.shard, o.code)) is o for o in objs)
        codes = [o.code for o in objs]
        session.commit()
    assert stored_keyed(engine, Keyed) == {(c.strip(), want(c)) for c in codes}


def test_two_sources_one_defaulted_hash_once_each(sqlite_models: Any) -> None:
    engine, _, Pair = sqlite_models
    with Session(engine) as session:
        session.execute(sa.delete(Pair))
        objs = [Pair(region=f"r{i % 3}") for i in range(N)]
        session.add_all(objs)
        assert counted(session.flush) == N
        assert [o.shard for o in objs] == [want(o.region, o.code) for o in objs]
        rows = {(o.region, o.code.strip(), want(o.region, o.code)) for o in objs}
        session.commit()
    with engine.connect() as conn:
        got = set(conn.execute(sa.select(Pair.region, Pair.code, Pair.shard)).all())
    assert got == rows


def test_a_given_source_is_hashed_when_set_and_not_at_flush(sqlite_models: Any) -> None:
    engine, Keyed, _ = sqlite_models
    codes = [f" g{i} " for i in range(N)]
    with Session(engine) as session:
        session.execute(sa.delete(Keyed))
        objs: list[Any] = []
        assert counted(lambda: objs.extend(Keyed(code=c) for c in codes)) == N
        session.add_all(objs)
        assert counted(session.flush) == 0
        session.commit()
    assert stored_keyed(engine, Keyed) == {(c.strip(), want(c)) for c in codes}


def test_a_given_shard_is_checked_with_one_hash(sqlite_models: Any) -> None:
    """The caller's shard, given before its source: the listener does not hash what the
    flush must check anyway (it did: two hashes per object); a wrong one is refused."""
    engine, Keyed, _ = sqlite_models
    codes = [f" s{i} " for i in range(N)]
    with Session(engine) as session:
        session.execute(sa.delete(Keyed))
        shards = [want(c) for c in codes]
        objs: list[Any] = []
        assert (
            counted(lambda: objs.extend(map(lambda c, s: Keyed(shard=s, code=c), codes, shards)))
            == 0
        )
        session.add_all(objs)
        assert counted(session.flush) == N
        session.commit()
    assert stored_keyed(engine, Keyed) == {(c.strip(), want(c)) for c in codes}
    with Session(engine) as session:
        wrong = (want(" bad ") + 1) % COUNT
        session.add(Keyed(shard=wrong, code=" bad "))
        with pytest.raises(ShardMismatchError, match=f"shard={wrong} disagrees with its sources"):
            session.flush()


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    plan=st.lists(
        st.tuples(
            # how the source first gets a value: a constructor keyword, its default at
            # flush, or an assignment after a constructor that left it out
            st.sampled_from(["keyword", "default", "assigned"]),
            st.integers(min_value=0, max_value=2),  # then changed this many times
        ),
        min_size=1,
        max_size=5,
    )
)
def test_hashes_follow_the_assignments_whatever_their_order(
    sqlite_models: Any, plan: list[tuple[str, int]]
) -> None:
    """One hash per assignment of the source of a new object, one per default stored at
    flush, none at flush for a value the listener saw; the stored shard is the hash of
    the source's last value."""
    engine, Keyed, _ = sqlite_models
    fresh = itertools.count()
    objs: list[Any] = []
    set_while_built = sum(changes + (how != "default") for how, changes in plan)
    defaults_at_flush = sum(how == "default" and changes == 0 for how, changes in plan)

    def build() -> None:
        for how, changes in plan:
            obj = Keyed(code=f" c{next(fresh)} ") if how == "keyword" else Keyed()
            if how == "assigned":
                obj.code = f" c{next(fresh)} "
            for _ in range(changes):
                obj.code = f" c{next(fresh)} "
            objs.append(obj)

    with Session(engine) as session:
        session.execute(sa.delete(Keyed))
        assert counted(build) == set_while_built
        session.add_all(objs)
        assert counted(session.flush) == defaults_at_flush
        assert [o.shard for o in objs] == [want(o.code) for o in objs]
        codes = [o.code for o in objs]
        session.commit()
    assert stored_keyed(engine, Keyed) == {(c.strip(), want(c)) for c in codes}


def test_assignments_are_counted_where_they_happen(sqlite_models: Any) -> None:
    """Constructor, then two changes: three hashes while built, none at flush."""
    engine, Keyed, _ = sqlite_models
    with Session(engine) as session:
        session.execute(sa.delete(Keyed))
        obj: list[Any] = []

        def build() -> None:
            o = Keyed(code=" a ")
            o.code = " b "
            o.code = " c "
            obj.append(o)

        assert counted(build) == 3
        session.add(obj[0])
        assert counted(session.flush) == 0
        assert obj[0].shard == want("c")
        session.commit()
    assert stored_keyed(engine, Keyed) == {("c", want("c"))}


# ----------------------------------------------------- the real TimestampShardedMixin


def mixin_models() -> tuple[Any, type[Any], Any, type[Any]]:
    class Base(DeclarativeBase):
        pass

    class Event(TimestampShardedMixin, Base):
        __tablename__ = "kso_events"
        payload: Mapped[str] = mapped_column(sa.String(40))

    class DataBase(MappedAsDataclass, DeclarativeBase):
        pass

    class DataEvent(TimestampShardedMixin, DataBase):
        __tablename__ = "kso_data_events"
        payload: Mapped[str] = mapped_column(sa.String(40))

    return Base, Event, DataBase, DataEvent


@pytest.fixture(scope="module")
def mixins() -> Iterator[tuple[sa.Engine, type[Any], type[Any]]]:
    engine = sa.create_engine("sqlite://")
    base, event, data_base, data_event = mixin_models()
    base.metadata.create_all(engine)
    data_base.metadata.create_all(engine)
    try:
        yield engine, event, data_event
    finally:
        engine.dispose()


def _utc(ts: dt.datetime) -> dt.datetime:
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=dt.timezone.utc)


@pytest.mark.parametrize("dataclass", [False, True], ids=["declarative", "dataclass"])
def test_mixin_flush_of_defaulted_timestamps_hashes_n_times(mixins: Any, dataclass: bool) -> None:
    engine, Event, DataEvent = mixins
    model = DataEvent if dataclass else Event
    with Session(engine) as session:
        objs: list[Any] = []
        assert crc32_calls(lambda: objs.extend(model(payload=f"p{i}") for i in range(N))) == 0
        session.add_all(objs)
        assert crc32_calls(session.flush) == N  # it was 2N
        shards = {o.event_id: (o.shard_id, o.timestamp) for o in objs}
        assert all(s == compute_shard([ts], 16) for s, ts in shards.values())
        session.commit()
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(model.event_id, model.shard_id, model.timestamp).where(
                model.event_id.in_(list(shards))
            )
        ).all()
    assert {r[0]: (r[1], _utc(r[2])) for r in rows} == shards


def test_mixin_given_timestamps_hash_when_built_not_at_flush(mixins: Any) -> None:
    engine, Event, _ = mixins
    start = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
    stamps = [start + dt.timedelta(seconds=i) for i in range(N)]
    with Session(engine) as session:
        objs: list[Any] = []
        assert (
            crc32_calls(lambda: objs.extend(Event(payload="x", timestamp=t) for t in stamps)) == N
        )
        session.add_all(objs)
        assert crc32_calls(session.flush) == 0
        assert [o.shard_id for o in objs] == [compute_shard([t], 16) for t in stamps]
        session.commit()
