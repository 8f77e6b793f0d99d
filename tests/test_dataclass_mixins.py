"""Every mixin the library ships, in every mapping style SQLAlchemy documents (issue 32, R3).

``TimestampShardedMixin``, ``UUIDPrimaryKeyMixin``, ``BitReversedPrimaryKeyMixin`` and
``HashedPrimaryKeyMixin`` are combined with plain declarative, ``MappedAsDataclass``, the
``registry.mapped_as_dataclass`` decorator, and an application's own dataclass mixin made
of ``declared_attr`` columns (a ``shard_column`` and its sources) and a
``declared_attr.directive`` ``__table_args__`` with a ``ShardedIndex``. Each model is
written by the unit of work, the ORM bulk insert and ``merge``, then read back: every
stored shard is the hash of its stored sources, and a dataclass model's ``__init__`` takes
the values it should (and no computed shard).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    MappedAsDataclass,
    Session,
    declared_attr,
    mapped_column,
    registry,
)

from sharded_orm import (
    BitReversedPrimaryKeyMixin,
    HashedPrimaryKeyMixin,
    ShardedIndex,
    TimestampShardedMixin,
    UTCDateTime,
    UUIDPrimaryKeyMixin,
    compute_shard,
    get_shard_column,
    shard_column,
    shard_columns,
)
from sharded_orm.schema.coerce import stored_value

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)


class TenantShardMixin(MappedAsDataclass):
    """An application's own dataclass mixin, with the ``declared_attr`` patterns."""

    @declared_attr
    def tenant(cls) -> Mapped[str]:
        return mapped_column("Tenant", sa.String(20), kw_only=True)

    @declared_attr
    def happened(cls) -> Mapped[dt.datetime]:
        return mapped_column("Happened", UTCDateTime, kw_only=True, default=T0)

    @declared_attr
    def tenant_shard(cls) -> Mapped[int]:
        return shard_column("tenant", "happened", count=8, name="TenantShard", init=False)

    @declared_attr.directive
    def __table_args__(cls) -> Any:
        return (ShardedIndex(f"{cls.__tablename__}ByTenant", "Tenant", shard="TenantShard"),)


MIXINS = {
    "timestamp": TimestampShardedMixin,
    "uuid": UUIDPrimaryKeyMixin,
    "bit_reversed": BitReversedPrimaryKeyMixin,
    "hashed": HashedPrimaryKeyMixin,
}
STYLES = ["declarative", "dataclass", "decorator", "own_mixin"]


def make_model(mixin_name: str, style: str) -> tuple[Any, sa.MetaData]:
    """A model of ``mixin`` in mapping ``style`` (a fresh registry each time)."""
    mixin = MIXINS[mixin_name]
    name = f"dcm_{mixin_name}_{style}"
    body: dict[str, Any] = {
        "__tablename__": name,
        "__annotations__": {"note": Mapped[str]},
        "note": mapped_column(sa.String(20)),
    }
    if style == "declarative":

        class Base(DeclarativeBase):
            pass

        return type(name, (mixin, Base), body), Base.metadata
    if style in ("dataclass", "own_mixin"):

        class DBase(MappedAsDataclass, DeclarativeBase):
            pass

        bases = (TenantShardMixin, mixin, DBase) if style == "own_mixin" else (mixin, DBase)
        return type(name, bases, body), DBase.metadata
    reg = registry()
    return reg.mapped_as_dataclass(type(name, (mixin,), body)), reg.metadata


def construct(model: Any, mixin_name: str, i: int, style: str) -> Any:
    kw: dict[str, Any] = {"note": f"n{i}"}
    if mixin_name == "hashed":
        kw["id"] = 1000 + i
    if style == "own_mixin":
        kw["tenant"] = f"t{i % 3}"
    return model(**kw)


def assert_shards_hold(engine: sa.Engine, model: Any, n: int) -> None:
    table = model.__table__
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table)).mappings().all()
    assert len(rows) == n
    for sc in shard_columns(model):
        for row in rows:
            stored = [stored_value(c, row[c.key]) for c in sc.sources]
            assert row[sc.key] == compute_shard(stored, sc.count, sc.algorithm), (sc.name, row)


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("mixin_name", list(MIXINS))
def test_every_mixin_in_every_mapping_style(engine: sa.Engine, mixin_name: str, style: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "ambiguous default" deprecation either
        model, metadata = make_model(mixin_name, style)
    metadata.create_all(engine)
    if style != "declarative":
        assert dataclasses.is_dataclass(model)
        fields = {f.name: f for f in dataclasses.fields(model)}
        for sc in shard_columns(model):  # a computed shard is no argument of __init__
            attr = next(k for k, c in model.__mapper__.columns.items() if c is sc.column)
            assert not fields[attr].init
    with Session(engine) as s:  # unit of work
        objs = [construct(model, mixin_name, i, style) for i in range(3)]
        s.add_all(objs)
        s.commit()
        assert_shards_hold(engine, model, 3)
        for obj in objs:  # the objects hold what was stored
            for sc in shard_columns(model):
                state = sa.inspect(obj)
                values = [
                    getattr(obj, state.mapper.get_property_by_column(c).key) for c in sc.sources
                ]
                shard_attr = state.mapper.get_property_by_column(sc.column).key
                assert getattr(obj, shard_attr) == sc.compute(values)
    if mixin_name != "bit_reversed":  # ORM bulk insert: no objects, the hook fills rows
        with Session(engine) as s:
            rows = [
                {
                    k: v
                    for k, v in vars(construct(model, mixin_name, i, style)).items()
                    if not k.startswith("_") and v is not None
                }
                for i in range(3, 5)
            ]
            s.execute(sa.insert(model), rows)
            s.commit()
        assert_shards_hold(engine, model, 5)
    with Session(engine) as s:  # merge of a detached copy with a changed value
        obj = s.scalars(sa.select(model).limit(1)).one()
        s.expunge(obj)
        obj.note = "merged"
        s.merge(obj)
        s.commit()
        assert s.scalars(sa.select(model).where(model.note == "merged")).one()


def test_dataclass_init_takes_the_made_at_flush_values_as_optional_keywords() -> None:
    model, _ = make_model("timestamp", "dataclass")
    sig = model.__init__.__code__.co_varnames
    assert "timestamp" in sig and "event_id" in sig and "shard_id" not in sig
    given = model(note="x", timestamp=T0, event_id="e")
    assert (given.timestamp, given.event_id) == (T0, "e")
    sc = get_shard_column(model)
    assert given.shard_id == sc.compute([T0])  # a key shard is known at once (merge needs it)
    hashed, _ = make_model("hashed", "dataclass")
    with pytest.raises(TypeError, match="id"):
        hashed(note="x")  # no __id_default__: the id is a required keyword


def _id_factory() -> Callable[[], int]:
    counter = iter(range(500, 10**6))
    return lambda: next(counter)


def test_hashed_mixin_with_an_id_default_in_a_dataclass(engine: sa.Engine) -> None:
    class DBase(MappedAsDataclass, DeclarativeBase):
        pass

    class Order(HashedPrimaryKeyMixin, DBase):
        __tablename__ = "dcm_orders"
        __id_default__ = _id_factory()
        note: Mapped[str] = mapped_column(sa.String(20))

    DBase.metadata.create_all(engine)
    with Session(engine) as s:
        made = Order(note="a")
        assert made.id is None  # made at flush, not at construction
        s.add_all([made, Order(note="b", id=7)])
        s.commit()
        assert made.id == 500
    assert_shards_hold(engine, Order, 2)
