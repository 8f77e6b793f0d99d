"""The Session's first-transaction look for sharded tables, when a sharded table is
declared in a named schema.

A table declared in a schema an engine's database does not have (an attached SQLite
database, a PostgreSQL schema) made the look fail, and every engine that began a Session
transaction was then watched, plain ones included: a sharded model of one database put
every other engine of the process off SQLAlchemy's no-events path. Such a table is now
looked for in the default schema, where a ``schema_translate_map`` would put it.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sharded_orm import shard_column
from sharded_orm.write.engine_hook import is_watched


def _models(table: str) -> tuple[Any, Any]:
    class Base(DeclarativeBase):
        pass

    class Audit(Base):
        __tablename__ = table
        __table_args__ = {"schema": "audit_elsewhere"}
        id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
        who: Mapped[str] = mapped_column(sa.String(20))
        s: Mapped[int] = shard_column("who", count=8)

    class Item(Base):
        __tablename__ = f"{table}_items"
        id: Mapped[int] = mapped_column(primary_key=True)
        qty: Mapped[int]

    return Audit, Item


def test_a_schema_the_database_lacks_leaves_a_plain_engine_unwatched() -> None:
    audit, item = _models("ss_audit")
    engine = sa.create_engine("sqlite://")
    item.__table__.create(engine)
    with Session(engine) as s:
        s.add(item(id=1, qty=1))
        s.commit()
    assert not is_watched(engine)
    assert audit.__table__.schema == "audit_elsewhere"  # (declared: the registry holds it)


def test_a_translated_table_in_the_default_schema_is_found() -> None:
    """The same declaration, its table made in the default schema through a
    ``schema_translate_map``: the engine's database holds it, and the engine is watched
    at its first Session transaction."""
    audit, _ = _models("ss_audit2")
    engine = sa.create_engine("sqlite://")
    translated = engine.execution_options(schema_translate_map={"audit_elsewhere": None})
    with translated.begin() as conn:  # Core DDL: not the Session's look
        conn.execute(sa.schema.CreateTable(audit.__table__))
    assert not is_watched(engine)  # nothing of the library saw that DDL
    with Session(engine) as s:
        s.execute(sa.text("SELECT 1"))
    assert is_watched(engine)
