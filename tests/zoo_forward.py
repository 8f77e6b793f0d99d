"""Model zoo, part 4: a forward string relationship (``Comment.thread`` names ``Thread``,
defined further down), followed by a sharded class (``Reaction``) before ``Thread``: the
layout most applications have.
Its own registry, so that a failure to import it cannot break the other zoo models."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from zoo_base import TenantSharded


class ForwardBase(DeclarativeBase):
    pass


class Comment(ForwardBase):
    __tablename__ = "zoo_comments"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    thread_id: Mapped[int] = mapped_column(sa.ForeignKey("zoo_threads.id"))
    body: Mapped[str] = mapped_column(sa.String(80))
    thread: Mapped[Thread] = relationship("Thread", back_populates="comments")


class Reaction(TenantSharded, ForwardBase):
    __tablename__ = "zoo_reactions"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    emoji: Mapped[str] = mapped_column(sa.String(8))


class Thread(TenantSharded, ForwardBase):
    __tablename__ = "zoo_threads"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    title: Mapped[str] = mapped_column(sa.String(80))
    comments: Mapped[list[Comment]] = relationship(back_populates="thread")
