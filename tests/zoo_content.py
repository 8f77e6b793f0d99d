"""Model zoo, part 3: posts (a mixin, a relationship back to another module), events under
joined and single inheritance, and a dataclass mapping; all on the registry of zoo_base."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, MappedAsDataclass, mapped_column, relationship
from zoo_base import Base, TenantSharded
from zoo_people import User

from sharded_orm import UTCDateTime, shard_column


class Post(TenantSharded, Base):
    __tablename__ = "zoo_posts"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    author_id: Mapped[int] = mapped_column(sa.ForeignKey("zoo_users.id"))
    title: Mapped[str] = mapped_column(sa.String(80))
    author: Mapped[User] = relationship(back_populates="posts")


class Event(Base):
    """Joined-inheritance root, sharded on its timestamp."""

    __tablename__ = "zoo_events"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(sa.String(20))
    ts: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    ts_shard: Mapped[int] = shard_column("ts", count=8)
    __mapper_args__ = {"polymorphic_on": "kind", "polymorphic_identity": "event"}


class Click(Event):
    """Joined inheritance: its own table, with its own shard column."""

    __tablename__ = "zoo_clicks"
    id: Mapped[int] = mapped_column(sa.ForeignKey("zoo_events.id"), primary_key=True)
    url: Mapped[str] = mapped_column(sa.String(200))
    url_shard: Mapped[int] = shard_column("url", count=4)
    __mapper_args__ = {"polymorphic_identity": "click"}


class Alert(Event):
    """Single inheritance: rows in zoo_events."""

    level: Mapped[int | None] = mapped_column(nullable=True)
    __mapper_args__ = {"polymorphic_identity": "alert"}


class Ticket(MappedAsDataclass, Base):
    """A dataclass mapping: the shard is no constructor argument."""

    __tablename__ = "zoo_tickets"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    subject: Mapped[str] = mapped_column(sa.String(80))
    opened: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    shard: Mapped[int] = shard_column("subject", "opened", count=8, init=False)
