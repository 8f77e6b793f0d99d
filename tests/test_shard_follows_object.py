"""The shard follows the object through every session state (issue 32, R1).

A shard the library derived is never taken for one the caller gave: after a flush that
is rolled back, an expunge, ``make_transient`` (a copy), ``make_transient_to_detached``,
``merge``, ``expire`` and ``refresh``, a changed source moves the shard; a shard the caller
set is still checked. The shard is computed from what the flush sends: an application's
own listeners (``before_insert``/``before_update`` registered after ours, ``before_flush``,
attribute ``set`` listeners, ``@validates``, a hybrid property's setter) that change a
source change the shard too, and the object holds what the row holds. A hypothesis state
machine drives objects through those transitions at random, with user listeners on, and
checks after each commit that every stored shard is the hash of its stored sources and
that every ``ShardMismatchError`` blames a shard value the caller set.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule
from sqlalchemy import event
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    make_transient,
    make_transient_to_detached,
    mapped_column,
    validates,
)

from sharded_orm import (
    ShardConfigError,
    ShardMismatchError,
    UTCDateTime,
    compute_shard,
    shard_column,
)
from sharded_orm.spanner import is_spanner

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
N = 16


class Base(DeclarativeBase):
    pass


class Item(Base):
    """The shard outside the primary key."""

    __tablename__ = "sfo_items"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    tenant: Mapped[str] = mapped_column(sa.String(20))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    note: Mapped[str | None] = mapped_column(sa.String(20), nullable=True)
    shard: Mapped[int] = shard_column("tenant", "ts", count=N)


class Keyed(Base):
    """The shard in the primary key (as TimestampShardedMixin keys it)."""

    __tablename__ = "sfo_keyed"
    shard: Mapped[int] = shard_column("tenant", "ts", count=N, primary_key=True)
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    tenant: Mapped[str] = mapped_column(sa.String(20))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    note: Mapped[str | None] = mapped_column(sa.String(20), nullable=True)


class Normalised(Base):
    """Sources changed by the application's own hooks of every kind."""

    __tablename__ = "sfo_normalised"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    tenant: Mapped[str] = mapped_column(sa.String(20))
    region: Mapped[str] = mapped_column(sa.String(20))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    shard: Mapped[int] = shard_column("tenant", "region", "ts", count=N)

    @validates("region")
    def _lower_region(self, key: str, value: str) -> str:
        return value.lower()  # a converting validator

    @hybrid_property
    def where(self) -> str:
        return f"{self.tenant}@{self.region}"

    @where.inplace.setter
    def _where_setter(self, value: str) -> None:  # a hybrid setter sets two sources
        self.tenant, self.region = value.split("@")


def stored_ok(engine: sa.Engine, model: Any) -> int:
    """Every stored shard is the hash of its stored sources; returns the row count."""
    table = model.__table__
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table)).mappings().all()
    for r in rows:
        if model is Normalised:
            want = compute_shard([r["tenant"], r["region"], r["ts"]], N)
        else:
            want = compute_shard([r["tenant"], r["ts"]], N)
        assert r["shard"] == want, dict(r)
    return len(rows)


@pytest.fixture
def eng(engine: sa.Engine) -> Iterator[sa.Engine]:
    Base.metadata.create_all(engine)
    yield engine
    Base.metadata.drop_all(engine)


MODELS = [Item, Keyed]


def key_moves_refused(engine: sa.Engine, model: Any) -> bool:
    """Whether changing a source moves the row's key where keys cannot move (Spanner)."""
    return model is Keyed and is_spanner(engine.dialect)


# --------------------------------------------------------------------------- transitions


@pytest.mark.parametrize("model", MODELS, ids=["shard", "key_shard"])
def test_flushed_rolled_back_re_added_then_changed(eng: sa.Engine, model: Any) -> None:
    with Session(eng) as s:
        obj = model(id=1, tenant="a", ts=T0)
        s.add(obj)
        s.flush()
        s.rollback()  # the object is transient again, still holding the derived shard
        s.add(obj)
        obj.tenant = "b"
        s.commit()
        assert obj.shard == compute_shard(["b", T0], N)
    assert stored_ok(eng, model) == 1


@pytest.mark.parametrize("model", MODELS, ids=["shard", "key_shard"])
def test_make_transient_copy_with_a_new_source(eng: sa.Engine, model: Any) -> None:
    with Session(eng) as s:
        s.add(model(id=1, tenant="a", ts=T0))
        s.commit()
        obj = s.scalars(sa.select(model)).one()
        s.expunge(obj)
        make_transient(obj)  # the SQLAlchemy recipe for a copy
        obj.id = 2
        obj.tenant = "copy"
        s.add(obj)
        s.commit()
        assert obj.shard == compute_shard(["copy", T0], N)
    assert stored_ok(eng, model) == 2


@pytest.mark.parametrize("model", MODELS, ids=["shard", "key_shard"])
def test_expunged_and_re_added_objects_keep_following(eng: sa.Engine, model: Any) -> None:
    with Session(eng) as s:
        new = model(id=1, tenant="a", ts=T0)
        s.add(new)
        s.expunge(new)  # pending, expunged: transient
        new.ts = T0 + dt.timedelta(days=3)
        s.add(new)
        s.commit()
        s.expunge(new)  # persistent, expunged: detached
        new.tenant = "moved"
        s.add(new)
        if key_moves_refused(eng, model):
            with pytest.raises(ShardConfigError, match="cannot change key columns"):
                s.commit()
            return
        s.commit()
        assert new.shard == compute_shard(["moved", T0 + dt.timedelta(days=3)], N)
    assert stored_ok(eng, model) == 1


def test_make_transient_to_detached_then_changed(eng: sa.Engine) -> None:
    with Session(eng) as s:
        s.add(Item(id=1, tenant="a", ts=T0))
        s.commit()
    obj = Item(id=1, tenant="a", ts=T0, shard=compute_shard(["a", T0], N))
    make_transient_to_detached(obj)  # a row known by key, as if loaded
    with Session(eng) as s:
        s.add(obj)
        obj.tenant = "z"
        s.commit()
    assert stored_ok(eng, Item) == 1


@pytest.mark.parametrize("load", [True, False])
def test_merge_of_a_detached_object_whose_source_changed(eng: sa.Engine, load: bool) -> None:
    with Session(eng) as s:
        s.add(Item(id=1, tenant="a", ts=T0))
        s.commit()
        obj = s.get(Item, 1)
    assert obj is not None
    obj.tenant = "b"  # detached: its shard is the old one
    with Session(eng) as s:
        merged = s.merge(obj, load=load) if load else s.merge(obj)
        s.commit()
        assert merged.shard == compute_shard(["b", T0], N)
    assert stored_ok(eng, Item) == 1


def test_expire_and_refresh_discard_a_source_change(eng: sa.Engine) -> None:
    with Session(eng) as s:
        obj = Keyed(id=1, tenant="a", ts=T0)
        s.add(obj)
        s.commit()
        obj.tenant = "b"
        s.expire(obj, ["tenant"])  # the change is discarded: so is the key shard it moved
        assert obj.shard == compute_shard(["a", T0], N)
        obj.tenant = "c"
        s.refresh(obj)
        assert (obj.tenant, obj.shard) == ("a", compute_shard(["a", T0], N))
        s.commit()
    assert stored_ok(eng, Keyed) == 1


@pytest.mark.parametrize("model", MODELS, ids=["shard", "key_shard"])
def test_a_shard_the_caller_gave_is_still_checked_after_a_rollback(
    eng: sa.Engine, model: Any
) -> None:
    right = compute_shard(["a", T0], N)
    with Session(eng) as s:
        obj = model(id=1, tenant="a", ts=T0, shard=right)  # the caller's, and right
        s.add(obj)
        s.flush()
        s.rollback()
        s.add(obj)
        obj.tenant = "b"  # the caller's shard no longer agrees: refused, not replaced
        with pytest.raises(ShardMismatchError, match=f"={right}"):
            s.flush()


def test_a_wrong_shard_given_to_a_loaded_object_is_refused(eng: sa.Engine) -> None:
    with Session(eng) as s:
        s.add(Item(id=1, tenant="a", ts=T0))
        s.commit()
        obj = s.get(Item, 1)
        assert obj is not None
        obj.tenant = "b"
        right, old = compute_shard(["b", T0], N), compute_shard(["a", T0], N)
        obj.shard = next(v for v in range(N) if v not in (right, old))
        with pytest.raises(ShardMismatchError):
            s.flush()


# --------------------------------------------------------------------------- user listeners


@pytest.fixture
def upper_casing_listeners() -> Iterator[None]:
    """An application's listeners registered after the mappers are configured (after
    the library's own), which normalise a source."""
    Base.registry.configure()

    def upper(mapper: Any, connection: Any, target: Any) -> None:
        target.tenant = target.tenant.upper()

    for model in (Item, Keyed):
        event.listen(model, "before_insert", upper)
        event.listen(model, "before_update", upper)
    yield
    for model in (Item, Keyed):
        event.remove(model, "before_insert", upper)
        event.remove(model, "before_update", upper)


@pytest.mark.parametrize("model", MODELS, ids=["shard", "key_shard"])
def test_a_later_listener_that_normalises_a_source(
    eng: sa.Engine, upper_casing_listeners: None, model: Any
) -> None:
    with Session(eng) as s:
        objs = [model(id=i, tenant=f"acme{i}", ts=T0) for i in range(3)]
        s.add_all(objs)
        s.commit()
        for i, obj in enumerate(objs):
            assert (obj.tenant, obj.shard) == (f"ACME{i}", compute_shard([f"ACME{i}", T0], N))
        objs[0].tenant = "globex"
        objs[1].ts = T0 + dt.timedelta(hours=1)
        if key_moves_refused(eng, model):
            with pytest.raises(ShardConfigError, match="cannot change key columns"):
                s.commit()
            return
        s.commit()
        assert objs[0].shard == compute_shard(["GLOBEX", T0], N)
        assert objs[1].shard == compute_shard(["ACME1", T0 + dt.timedelta(hours=1)], N)
    assert stored_ok(eng, model) == 3


def test_before_flush_set_listeners_validators_and_hybrids(eng: sa.Engine) -> None:
    def before_flush(session: Session, context: Any, instances: Any) -> None:
        for obj in session.new:
            if isinstance(obj, Normalised):
                obj.tenant = obj.tenant.strip()

    def set_tenant(target: Any, value: Any, old: Any, initiator: Any) -> Any:
        return value.replace(" ", "-") if isinstance(value, str) else value

    event.listen(Session, "before_flush", before_flush)
    event.listen(Normalised.tenant, "set", set_tenant, retval=True)
    try:
        with Session(eng) as s:
            a = Normalised(id=1, tenant=" a b ", region="EU", ts=T0)
            b = Normalised(id=2, tenant="x", region="x", ts=T0)
            b.where = "c d@US"  # hybrid setter -> set listener -> validator
            s.add_all([a, b])
            s.commit()
            assert (a.tenant, a.region) == ("-a-b-".strip(), "eu")
            assert (b.tenant, b.region) == ("c-d", "us")
            assert a.shard == compute_shard([a.tenant, "eu", T0], N)
            b.where = "e@FR"
            s.commit()
            assert b.shard == compute_shard(["e", "fr", T0], N)
    finally:
        event.remove(Session, "before_flush", before_flush)
        event.remove(Normalised.tenant, "set", set_tenant)
    assert stored_ok(eng, Normalised) == 2


# --------------------------------------------------------------------------- generated


TENANTS = st.sampled_from(["a", "b", "Cc", "dé"])
TIMES = st.integers(0, 3).map(lambda h: T0 + dt.timedelta(hours=h))
_BLAMED = re.compile(r"=(-?\d+) disagrees")


class Transitions(RuleBasedStateMachine):
    """Objects driven through session states at random; one model per run."""

    model: Any = Item
    listeners = False

    objects = Bundle("objects")

    def __init__(self) -> None:
        super().__init__()
        # a file, so the checks read committed rows on their own connection (an in-memory
        # database shares one connection, which a check would roll back)
        self.dir = tempfile.TemporaryDirectory()
        self.engine = sa.create_engine(f"sqlite:///{self.dir.name}/db.sqlite")
        Base.metadata.create_all(self.engine)
        self.session = Session(self.engine)
        self.next_id = 1
        self.given: set[int] = set()  # every shard value the caller set on any object

    def teardown(self) -> None:
        self.session.close()
        self.engine.dispose()
        self.dir.cleanup()

    def _flush(self, commit: bool) -> None:
        try:
            self.session.commit() if commit else self.session.flush()
        except ShardMismatchError as exc:
            blamed = _BLAMED.search(str(exc))
            assert blamed is not None and int(blamed.group(1)) in self.given, (
                f"a shard the caller never set was blamed: {exc}"
            )
            self.session.rollback()
        except sa.exc.IntegrityError:
            self.session.rollback()  # a copy or merge that reuses a key: the database says no
        except sa.exc.InvalidRequestError as exc:
            # SQLAlchemy's own refusal, as for any model: an object expired, then made
            # transient by a rollback, cannot be loaded again to be flushed
            assert "cannot be refreshed" in str(exc), exc
            self.session.rollback()

    @rule(target=objects, tenant=TENANTS, ts=TIMES, give=st.sampled_from([None, 0, 1]))
    def new(self, tenant: str, ts: dt.datetime, give: int | None) -> Any:
        kw: dict[str, Any] = {"id": self.next_id, "tenant": tenant, "ts": ts}
        self.next_id += 1
        if give is not None:  # right (0) or wrong (1)
            kw["shard"] = (compute_shard([tenant, ts], N) + give) % N
            self.given.add(kw["shard"])
        obj = self.model(**kw)
        self.session.add(obj)
        return obj

    @rule(obj=objects, tenant=TENANTS)
    def set_tenant(self, obj: Any, tenant: str) -> None:
        if not _expired_detached(obj):
            obj.tenant = tenant

    @rule(obj=objects, ts=TIMES)
    def set_ts(self, obj: Any, ts: dt.datetime) -> None:
        if not _expired_detached(obj):
            obj.ts = ts

    @rule(obj=objects, delta=st.integers(0, 1))
    def set_shard(self, obj: Any, delta: int) -> None:
        if _expired_detached(obj) or "tenant" not in obj.__dict__ or "ts" not in obj.__dict__:
            return
        value = (compute_shard([obj.tenant, obj.ts], N) + delta) % N
        self.given.add(value)
        obj.shard = value

    @rule()
    def flush(self) -> None:
        self._flush(commit=False)

    @rule()
    def commit(self) -> None:
        self._flush(commit=True)

    @rule()
    def rollback(self) -> None:
        self.session.rollback()

    @rule(obj=objects)
    def expunge(self, obj: Any) -> None:
        if obj in self.session:
            self.session.expunge(obj)

    @rule(obj=objects)
    def add(self, obj: Any) -> None:
        if obj not in self.session and sa.inspect(obj).deleted is False:
            with contextlib.suppress(sa.exc.InvalidRequestError):
                self.session.add(obj)  # unless another object holds its key in this session

    @rule(obj=objects)
    def copy(self, obj: Any) -> None:
        state = sa.inspect(obj)
        if not state.persistent or _expired_detached(obj):
            return
        with self.session.no_autoflush:  # flushes are the flush rules' (and checked there)
            self.session.refresh(obj)
        self.session.expunge(obj)
        make_transient(obj)
        obj.id = self.next_id
        self.next_id += 1
        self.session.add(obj)

    @rule(obj=objects)
    def merge(self, obj: Any) -> None:
        # merge() of a detached object (a row it knows by key). A transient one that an
        # earlier flush gave a derived shard is merged with that shard as if the caller
        # had set it (merge copies attributes through their set events): not generated
        state = sa.inspect(obj)
        if obj in self.session or not state.detached or _expired_detached(obj):
            return
        with contextlib.suppress(sa.exc.InvalidRequestError), self.session.no_autoflush:
            self.session.merge(obj)

    @precondition(lambda self: True)
    @rule(obj=objects)
    def expire(self, obj: Any) -> None:
        if sa.inspect(obj).persistent:
            self.session.expire(obj)

    @invariant()
    def every_loaded_object_holds_its_shard_after_a_commit(self) -> None:
        if self.session.new or self.session.dirty:
            return
        for obj in list(self.session.identity_map.values()):
            d = obj.__dict__
            if all(k in d for k in ("tenant", "ts", "shard")):
                assert d["shard"] == compute_shard([d["tenant"], d["ts"]], N), d

    @invariant()
    def the_database_holds_only_right_shards(self) -> None:
        stored_ok(self.engine, self.model)


def _expired_detached(obj: Any) -> bool:
    state = sa.inspect(obj)
    return state.detached and bool(state.expired_attributes)


class KeyedTransitions(Transitions):
    model = Keyed


def _case(machine: type[Transitions], runs: int = 12) -> Any:
    """The machine's test case: ``runs`` runs of up to 20 steps (each access to
    ``machine.TestCase`` makes a new class, so a quick and a wide case coexist)."""
    case = machine.TestCase
    case.settings = settings(
        max_examples=runs,
        stateful_step_count=20,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    return case


TestTransitions = _case(Transitions)
TestKeyedTransitions = _case(KeyedTransitions)


class ListenedTransitions(Transitions):
    """The same, with the application's listeners normalising the tenant on every flush."""

    def __init__(self) -> None:
        super().__init__()
        Base.registry.configure()
        event.listen(Item, "before_insert", _upper)
        event.listen(Item, "before_update", _upper)

    def teardown(self) -> None:
        event.remove(Item, "before_insert", _upper)
        event.remove(Item, "before_update", _upper)
        super().teardown()

    @invariant()
    def every_loaded_object_holds_its_shard_after_a_commit(self) -> None:
        super().every_loaded_object_holds_its_shard_after_a_commit()


def _upper(mapper: Any, connection: Any, target: Any) -> None:
    if target.tenant is not None:
        target.tenant = target.tenant.upper()


TestListenedTransitions = _case(ListenedTransitions)


# the machine's wide run (40 runs, the quick loop's TestTransitions has 12); quick loop:
# test_flushed_rolled_back_re_added_then_changed, test_expunged_and_re_added_objects_keep_following
@pytest.mark.slow
class TestTransitionsWide(_case(Transitions, runs=40)):
    pass


# the machine's wide run (40 runs, the quick loop's TestKeyedTransitions has 12); quick loop:
# test_flushed_rolled_back_re_added_then_changed, test_make_transient_copy_with_a_new_source
@pytest.mark.slow
class TestKeyedTransitionsWide(_case(KeyedTransitions, runs=40)):
    pass


# the machine's wide run (40 runs, the quick loop's TestListenedTransitions has 12); quick
# loop: test_a_later_listener_that_normalises_a_source
@pytest.mark.slow
class TestListenedTransitionsWide(_case(ListenedTransitions, runs=40)):
    pass
