"""Model zoo, part 2: users and groups (association table, back_populates, a TypeDecorator
source); ``User.posts`` names ``Post``, which another module defines."""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column, relationship
from zoo_base import Base, LowerCase, TenantSharded

from sharded_orm import shard_column

if TYPE_CHECKING:
    from zoo_content import Post

user_groups = sa.Table(
    "zoo_user_groups",
    Base.metadata,
    sa.Column("user_id", sa.ForeignKey("zoo_users.id"), primary_key=True),
    sa.Column("group_id", sa.ForeignKey("zoo_groups.id"), primary_key=True),
)


class User(TenantSharded, Base):
    __tablename__ = "zoo_users"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    email: Mapped[str] = mapped_column(LowerCase)
    email_shard: Mapped[int] = shard_column("email", count=16)
    posts: Mapped[list[Post]] = relationship(back_populates="author")
    groups: Mapped[list[Group]] = relationship(secondary=user_groups, back_populates="members")


class Group(Base):
    __tablename__ = "zoo_groups"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(sa.String(40))
    members: Mapped[list[User]] = relationship(secondary=user_groups, back_populates="groups")
