"""pytest plugin for SQLAlchemy's own suite: sharded-orm imported, one sharded model defined.

Loaded with ``-p sharded_orm_peer`` by ``run.sh ours``. It imports the library (as an
application does) and maps one sharded model on its own registry and flushes a row, so
every module-level piece of the library is live while SQLAlchemy's tests run. Nothing is
re-registered between tests: the library must not depend on listeners anything clears.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import sharded_orm


class PeerBase(DeclarativeBase):
    pass


class PeerEvent(PeerBase):
    __tablename__ = "sharded_orm_peer_events"
    id: Mapped[int] = mapped_column(primary_key=True)
    company_id: Mapped[int]
    ts: Mapped[dt.datetime] = mapped_column(sa.DateTime(timezone=True))
    shard_id: Mapped[int] = sharded_orm.shard_column("company_id", "ts", count=8)


def _exercise() -> None:
    engine = sa.create_engine("sqlite://")
    PeerBase.metadata.create_all(engine)
    with Session(engine) as session:
        session.add(
            PeerEvent(id=1, company_id=7, ts=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc))
        )
        session.commit()
        row = session.get(PeerEvent, 1)
        assert row is not None and row.shard_id == sharded_orm.get_shard_column(PeerEvent).compute(
            [7, dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)]
        )
    engine.dispose()


_exercise()
