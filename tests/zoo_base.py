"""Model zoo, part 1: the registry, a TypeDecorator and a mixin shared by several modules."""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, declared_attr, mapped_column

from sharded_orm import ShardedIndex, UTCDateTime, shard_column

UTC = dt.timezone.utc
T_DEFAULT = dt.datetime(2024, 1, 1, tzinfo=UTC)


class LowerCase(sa.types.TypeDecorator[str]):
    """Stores e-mails lower-cased."""

    impl = sa.String(80)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> Any:
        return None if value is None else value.lower()


class Base(DeclarativeBase):
    pass


def _created_default() -> dt.datetime:
    return T_DEFAULT


class TenantSharded:
    """A tenant and creation time, sharded together, with the index sharded queries use."""

    @declared_attr
    def tenant_id(cls) -> Mapped[str]:
        return mapped_column(sa.String(40))

    @declared_attr
    def created(cls) -> Mapped[dt.datetime]:
        return mapped_column(UTCDateTime, default=_created_default)

    @declared_attr
    def tenant_shard(cls) -> Mapped[int]:
        return shard_column("tenant_id", "created", count=8)

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:
        name = cls.__tablename__  # type: ignore[attr-defined]
        return (ShardedIndex(f"ix_{name}_tenant", "tenant_id", "created", shard="tenant_shard"),)
