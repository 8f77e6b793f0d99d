"""``TimestampShardedMixin``: the seeds' event table, keyed ``(ShardId, Timestamp DESC, EventId)``.

Events keyed by their timestamp would all be appended to the last split. The seeds'
cure: a shard column first, ``ShardId = hash(Timestamp) % N``, the timestamp descending
(newest first within each shard), and a random id to make the key unique.

Configure on the class (defaults shown)::

    class Event(TimestampShardedMixin, Base):
        __tablename__ = "Events"
        __shard_count__ = 16                   # N
        __shard_algorithm__ = "crc32"          # "farm_fingerprint" with ...
        __shard_server_side__ = False          # ... True: Spanner computes it (new models)
        __shard_column_name__ = "ShardId"
        __timestamp_column_name__ = "Timestamp"
        __id_column_name__ = "EventId"

Attributes: ``shard_id``, ``timestamp`` (defaults to now, UTC) and ``event_id`` (a UUID v4
string). The key lives on the columns (``primary_key`` flags, ``sort_order``, the
descending mark), not in ``__table_args__``, so a subclass's own ``__table_args__`` (say,
a ``ShardedIndex``) adds to it and cannot drop it.

The mixin works in declarative and dataclass mappings (``MappedAsDataclass``) alike
(:func:`dataclass_ready`): there ``timestamp`` and ``event_id`` are optional keyword
arguments of ``__init__`` (made at flush when not given) and ``shard_id`` is no argument
(computed).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any, ClassVar, TypeVar

from sqlalchemy import ColumnDefault, String
from sqlalchemy.orm import Mapped, MappedAsDataclass, declared_attr

from sharded_orm.schema.columns import shard_column
from sharded_orm.schema.keys import key_column
from sharded_orm.schema.types import UTCDateTime

_T = TypeVar("_T")


def dataclass_ready(mixin: type[_T]) -> type[_T]:
    """Let a mixin of mapped attributes serve dataclass mappings too.

    SQLAlchemy turns a ``MappedAsDataclass`` model into a dataclass and refuses attributes
    that come from a superclass which is not one (``dcmx``). So the mixin is made a
    dataclass with no fields and no generated methods (no ``__init__``, ``__repr__``,
    ``__eq__``): nothing changes for a declarative model, and a dataclass model takes its
    attributes as fields. Their dataclass options are set on each column (``init=False``
    for a computed shard, ``kw_only=True`` and ``default=None`` with the real default as
    ``insert_default`` for a value made at flush), only where the class is mapped as a
    dataclass (:func:`dataclass_options`)."""
    return dataclasses.dataclass(init=False, repr=False, eq=False, match_args=False)(mixin)


#: dataclass options of a computed column: no argument of ``__init__``
COMPUTED: dict[str, Any] = {"init": False}


def dataclass_mapped(cls: Any) -> bool:
    """Whether ``cls`` is being mapped as a dataclass (``MappedAsDataclass``, or
    ``registry.mapped_as_dataclass``, which marks the class with the dataclass arguments
    it applies): plain declarative refuses dataclass arguments."""
    return issubclass(cls, MappedAsDataclass) or bool(getattr(cls, "_sa_apply_dc_transforms", None))


def dataclass_options(cls: Any, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` when ``cls`` is mapped as a dataclass, else none."""
    return options if dataclass_mapped(cls) else {}


def made_at_flush(cls: Any, make: Any) -> tuple[list[Any], dict[str, Any]]:
    """``(column args, keyword args)`` of a column whose value ``make()`` gives at flush
    when none was given (``make=None``: the database gives it, or the caller must).

    In a dataclass mapping it is an optional keyword argument of ``__init__`` (``None``
    until the flush) with ``make`` as the Core default: passed as a ``ColumnDefault``,
    because a dataclass ``default=`` is also the Core default (SQLAlchemy 2.1 refuses it
    beside ``insert_default``) and a ``default_factory`` would run at construction."""
    if dataclass_mapped(cls):
        return ([ColumnDefault(make)] if make is not None else []), {
            "default": None,
            "kw_only": True,
        }
    return [], ({"default": make} if make is not None else {})


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def new_event_id() -> str:
    return str(uuid.uuid4())


@dataclass_ready
class TimestampShardedMixin:
    """Adds ``shard_id``, ``timestamp`` and ``event_id``, keyed ``(shard, ts DESC, id)``."""

    __shard_count__: ClassVar[int] = 16
    __shard_algorithm__: ClassVar[str] = "crc32"
    #: ``True`` (with ``__shard_algorithm__ = "farm_fingerprint"``): Spanner computes the
    #: shard as a STORED generated column, the recommended setting for new Spanner models.
    __shard_server_side__: ClassVar[bool] = False
    __shard_column_name__: ClassVar[str] = "ShardId"
    __timestamp_column_name__: ClassVar[str] = "Timestamp"
    __id_column_name__: ClassVar[str] = "EventId"

    @declared_attr
    def shard_id(cls) -> Mapped[int]:
        return shard_column(
            "timestamp",
            count=cls.__shard_count__,
            algorithm=cls.__shard_algorithm__,
            server_side=cls.__shard_server_side__,
            name=cls.__shard_column_name__,
            primary_key=True,
            autoincrement=False,
            sort_order=-30,
            **dataclass_options(cls, COMPUTED),
        )

    @declared_attr
    def timestamp(cls) -> Mapped[dt.datetime]:
        args, kwargs = made_at_flush(cls, utc_now)
        return key_column(
            cls.__timestamp_column_name__,
            UTCDateTime,
            *args,
            descending=True,
            sort_order=-20,
            **kwargs,
        )

    @declared_attr
    def event_id(cls) -> Mapped[str]:
        args, kwargs = made_at_flush(cls, new_event_id)
        return key_column(cls.__id_column_name__, String(36), *args, sort_order=-10, **kwargs)
