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
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import ClassVar

from sqlalchemy import String
from sqlalchemy.orm import Mapped, declared_attr

from sharded_orm.schema.columns import shard_column
from sharded_orm.schema.keys import key_column
from sharded_orm.schema.types import UTCDateTime


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def new_event_id() -> str:
    return str(uuid.uuid4())


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
        )

    @declared_attr
    def timestamp(cls) -> Mapped[dt.datetime]:
        return key_column(
            cls.__timestamp_column_name__,
            UTCDateTime,
            descending=True,
            default=utc_now,
            sort_order=-20,
        )

    @declared_attr
    def event_id(cls) -> Mapped[str]:
        return key_column(cls.__id_column_name__, String(36), default=new_event_id, sort_order=-10)
