"""Models as applications write them, through every write path, on SQLite and the emulator.

The zoo (``zoo_base``, ``zoo_people``, ``zoo_content`` share one registry; ``zoo_forward``
has its own): string relationships across modules with ``back_populates``, an
association table, a mixin of ``declared_attr`` columns, a shard column and
``__table_args__``, a TypeDecorator source, joined and single inheritance, a dataclass
mapping, and a forward ``relationship("Thread")`` declared before ``Thread``.

Each sharded model is written through ``Session.add`` + flush, ``insert(Model)`` with a
list, ``bulk_insert_mappings``, ``bulk_save_objects``, Core single / executemany /
multi-VALUES inserts, an ORM change of one source and a Core UPDATE by key; then every
stored shard is checked (``verify``), sharded point lookups find the rows, and the
relationships and polymorphic loads read them back.
"""

from __future__ import annotations

import datetime as dt
import importlib
import itertools
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, selectinload

from sharded_orm import compute_shard, shard_columns, sharded_select, verify

Row = dict[str, Any]


def _import_zoo() -> Any:
    """The zoo modules, imported in the order an application's package imports them
    (``zoo_people`` names ``Post`` before ``zoo_content`` defines it). Imported by the
    tests, not at collection, so an import failure fails each test with its message."""
    return (importlib.import_module("zoo_people"), importlib.import_module("zoo_content"))


@pytest.fixture(scope="module")
def zoo() -> Any:
    people, content = _import_zoo()
    return type(
        "Zoo",
        (),
        {
            "Base": importlib.import_module("zoo_base").Base,
            "User": people.User,
            "Group": people.Group,
            "Post": content.Post,
            "Event": content.Event,
            "Click": content.Click,
            "Alert": content.Alert,
            "Ticket": content.Ticket,
        },
    )


UTC = dt.timezone.utc
T_DEFAULT = dt.datetime(2024, 1, 1, tzinfo=UTC)  # zoo_base's default for created
TS = dt.datetime(2025, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)
CORE_PATHS = ("core_single", "core_many", "core_multi_values")
ORM_PATHS = ("add_flush", "orm_insert_list", "bulk_insert_mappings", "bulk_save_objects")


def _ids() -> Callable[[], int]:
    counter = itertools.count(1)
    return lambda: next(counter)


def write_paths(
    engine: sa.Engine,
    model: Any,
    make_row: Callable[[int], Row],
    core_row: Callable[[Row], Row] | None,
) -> list[int]:
    """Writes two rows of ``model`` through each path; returns the ids written."""
    table = model.__table__
    next_id = _ids()
    written: list[int] = []

    def rows(n: int = 2) -> list[Row]:
        out = [make_row(1000 * len(written) + next_id()) for _ in range(n)]
        written.extend(r["id"] for r in out)
        return out

    with Session(engine) as s:
        s.add_all([model(**r) for r in rows()])
        s.flush()
        s.commit()
        s.execute(sa.insert(model), rows())
        s.commit()
        s.bulk_insert_mappings(model, rows())
        s.commit()
        s.bulk_save_objects([model(**r) for r in rows()])
        s.commit()
    if core_row is not None:
        with engine.begin() as conn:
            conn.execute(table.insert(), core_row(rows(1)[0]))
            conn.execute(table.insert(), [core_row(r) for r in rows()])
            conn.execute(table.insert().values([core_row(r) for r in rows()]))
    return written


def check_table(engine: sa.Engine, model: Any, ids: list[int]) -> None:
    table = model.__table__
    with engine.connect() as conn:
        got = set(conn.execute(sa.select(table.c.id)).scalars())
    assert set(ids) <= got
    report = verify(engine, model, progress_mode="off")
    assert report.ok, (table.name, report.mismatched)


def _user(i: int) -> Row:
    return {"id": i, "tenant_id": f"t{i % 3}", "email": f"User{i}@Zoo.COM"}


def _post(i: int) -> Row:
    return {"id": i, "tenant_id": f"t{i % 2}", "author_id": 1, "title": f"post {i}"}


def _event(i: int) -> Row:
    return {"id": i, "ts": TS + dt.timedelta(seconds=i)}


def _click(i: int) -> Row:
    return {"id": 50_000 + i, "ts": TS - dt.timedelta(seconds=i), "url": f"/p/{i}"}


def _alert(i: int) -> Row:
    return {"id": 90_000 + i, "ts": TS + dt.timedelta(days=i), "level": i % 5}


def _ticket(i: int) -> Row:
    return {"id": i, "subject": f"Ticket {i}", "opened": TS + dt.timedelta(minutes=i)}


def test_every_write_path_over_the_zoo(engine: sa.Engine, zoo: Any) -> None:
    User, Group, Post, Event = zoo.User, zoo.Group, zoo.Post, zoo.Event
    Click, Alert, Ticket = zoo.Click, zoo.Alert, zoo.Ticket
    zoo.Base.metadata.create_all(engine)
    user_ids = write_paths(engine, User, _user, dict)
    post_ids = write_paths(engine, Post, _post, dict)
    event_ids = write_paths(engine, Event, _event, lambda r: {**r, "kind": "event"})
    click_ids = write_paths(engine, Click, _click, None)  # joined: the ORM writes both tables
    alert_ids = write_paths(engine, Alert, _alert, lambda r: {**r, "kind": "alert"})
    ticket_ids = write_paths(engine, Ticket, _ticket, dict)

    # updates: the ORM changes one source; Core UPDATEs by key set one or all
    with Session(engine) as s:
        user = s.get(User, user_ids[0])
        assert user is not None
        user.email = "Renamed@Zoo.COM"
        post = s.get(Post, post_ids[0])
        assert post is not None
        post.created = TS
        click = s.get(Click, click_ids[0])
        assert click is not None
        click.url, click.ts = "/moved", TS + dt.timedelta(hours=1)
        ticket = s.get(Ticket, ticket_ids[0])
        assert ticket is not None
        ticket.subject = "Reopened"
        s.add(Group(id=1, name="admins", members=[user]))
        s.commit()
    with engine.begin() as conn:
        users, tickets = User.__table__, Ticket.__table__
        conn.execute(users.update().where(users.c.id == user_ids[1]).values(tenant_id="t9"))
        conn.execute(
            tickets.update()
            .where(tickets.c.id == ticket_ids[1])
            .values(subject="Both", opened=TS + dt.timedelta(days=9))
        )

    for model, ids in (
        (User, user_ids),
        (Post, post_ids),
        (Event, event_ids + alert_ids),
        (Click, click_ids),
        (Ticket, ticket_ids),
    ):
        check_table(engine, model, ids)

    with Session(engine) as s:
        # sharded point lookups through the mixin's index
        for tenant in ("t0", "t1", "t2", "t9"):
            stmt = sharded_select(User, index="ix_zoo_users_tenant").where(
                User.tenant_id == tenant, User.created == T_DEFAULT
            )
            plain = sa.select(User).where(User.tenant_id == tenant, User.created == T_DEFAULT)
            assert {u.id for u in s.scalars(stmt)} == {u.id for u in s.scalars(plain)}
        renamed = s.get(User, user_ids[0])
        assert renamed is not None and renamed.email == "renamed@zoo.com"
        assert renamed.email_shard == compute_shard(["renamed@zoo.com"], 16)
        # relationships across modules and through the association table
        loaded = s.scalars(
            sa.select(User).where(User.id == 1).options(selectinload(User.posts))
        ).one()
        assert {p.id for p in loaded.posts} == set(post_ids)
        assert [g.name for g in renamed.groups] == ["admins"]
        # polymorphic loads over joined and single inheritance
        kinds = {type(e).__name__ for e in s.scalars(sa.select(Event))}
        assert kinds == {"Event", "Click", "Alert"}
        moved = s.get(Click, click_ids[0])
        assert moved is not None and moved.url_shard == compute_shard(["/moved"], 4)
        assert moved.ts_shard == compute_shard([TS + dt.timedelta(hours=1)], 8)


def test_a_dataclass_model_takes_no_shard_argument(zoo: Any) -> None:
    Ticket = zoo.Ticket
    t = Ticket(id=1, subject="x", opened=TS)
    assert "shard" not in {
        f for f in Ticket.__dataclass_fields__ if Ticket.__dataclass_fields__[f].init
    }
    assert t.subject == "x"
    assert [sc.key for sc in shard_columns(Ticket)] == ["shard"]


def test_a_forward_string_relationship_module_imports_and_writes(engine: sa.Engine) -> None:
    """``relationship("Thread")`` before ``Thread``, then a sharded class (issue 22 item 1)."""
    zoo_forward = importlib.import_module("zoo_forward")
    Thread, Comment = zoo_forward.Thread, zoo_forward.Comment
    zoo_forward.ForwardBase.metadata.create_all(engine)
    ids = write_paths(
        engine, Thread, lambda i: {"id": i, "tenant_id": f"t{i % 4}", "title": f"th {i}"}, dict
    )
    reaction_ids = write_paths(
        engine,
        zoo_forward.Reaction,
        lambda i: {"id": i, "tenant_id": f"t{i % 4}", "emoji": ":)"},
        dict,
    )
    check_table(engine, zoo_forward.Reaction, reaction_ids)
    with Session(engine) as s:
        thread = s.get(Thread, ids[0])
        assert thread is not None
        s.add(Comment(id=1, body="first", thread=thread))
        thread.tenant_id = "moved"
        s.commit()
        assert [c.body for c in s.get(Thread, ids[0]).comments] == ["first"]  # type: ignore[union-attr]
    check_table(engine, Thread, ids)


@pytest.mark.parametrize("name", ["User", "Post", "Event", "Click", "Ticket"])
def test_zoo_shard_columns_resolve(zoo: Any, name: str) -> None:
    assert shard_columns(getattr(zoo, name))
