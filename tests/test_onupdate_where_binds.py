"""The context a shard source's context-sensitive ``onupdate`` sees holds the WHERE
clause's binds under SQLAlchemy's compiled names (issue 41, brief s50/h2 item 3), checked
against a plain twin: the same statements on a table without the library (SQLite).

(Fixed by 59e8306: ``StatementDefaults`` builds the context's parameters with the
compiled statement's ``construct_params``; ``tests/test_write_defaults_matrix.py`` checks
``.values()`` UPDATEs. This file guards the other shapes: an executemany whose WHERE
binds by name, SQL in SET, and several WHERE binds.)
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sharded_orm import compute_shard, shard_column

N = 4


def _seen(ctx: Any) -> str:
    params = ctx.get_current_parameters()
    return repr(sorted((k, repr(v)) for k, v in params.items() if k != "shard"))[:200]


def _tables(sharded: bool) -> sa.Table:
    class Base(DeclarativeBase):
        pass

    class Row(Base):
        __tablename__ = "ow_rows"
        id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
        b: Mapped[str] = mapped_column(sa.String(20))
        src: Mapped[str] = mapped_column(sa.String(200), default="s", onupdate=_seen)
        if sharded:
            shard: Mapped[int] = shard_column("src", count=N)
        else:
            shard: Mapped[int | None] = mapped_column(nullable=True)  # type: ignore[no-redef]

    return Row.__table__  # type: ignore[return-value]


def _updates(t: sa.Table) -> list[tuple[Any, Any]]:
    return [
        (sa.update(t).where(t.c.id == 1).values(b="q"), None),
        (sa.update(t).where(t.c.id == sa.bindparam("k")), [{"k": 1, "b": "r"}, {"k": 2, "b": "r"}]),
        (sa.update(t).where(t.c.id == 2, t.c.b == "r").values(b=sa.func.upper("z")), None),
        (sa.update(t).where(t.c.id.in_([1, 2]), t.c.b != "x").values(b="w"), None),
    ]


@pytest.mark.parametrize("which", range(4))
def test_the_onupdate_sees_what_plain_sqlalchemy_shows(which: int) -> None:
    stored = []
    for sharded in (True, False):
        t = _tables(sharded)
        engine = sa.create_engine("sqlite://")
        t.create(engine)
        with engine.begin() as c:
            c.execute(sa.insert(t), [{"id": 1, "b": "p"}, {"id": 2, "b": "p"}])
            stmt, rows = _updates(t)[which]
            c.execute(stmt, rows) if rows else c.execute(stmt)
        with engine.connect() as c:
            got = {r.id: (r.b, r.src, r.shard) for r in c.execute(sa.select(t))}
        engine.dispose()
        if sharded:
            for _b, src, shard in got.values():
                assert shard == compute_shard([src], N)
        stored.append({k: v[:2] for k, v in got.items()})
    assert stored[0] == stored[1]
