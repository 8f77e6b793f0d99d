"""Reflection binds names as query parameters and answers about any name (issue 20).

sqlalchemy-spanner pastes names into its INFORMATION_SCHEMA queries; our dialect used to
refuse every name that is not a valid Spanner name, so reflection asking about
``does-not-exist`` (sqlalchemy-spanner's compliance suite does) raised instead of
answering "no such table". Now every name is a parameter, and the answer is SQLAlchemy's.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from google.cloud.sqlalchemy_spanner import sqlalchemy_spanner as stock

HOSTILE = [
    "does-not-exist",
    'has"quote',
    "has'quote",
    "a`b",
    "x; DROP TABLE victim",
    'nope" OR "1"="1',
    "nope' OR '1'='1",
    "back\\slash",
]


def _schema(engine: sa.Engine) -> None:
    md = sa.MetaData()
    victim = sa.Table(
        "victim",
        md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(20), nullable=False),
    )
    sa.Index("victim_by_name", victim.c.name)
    sa.Table(
        "child",
        md,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("victim_id", sa.BigInteger, sa.ForeignKey("victim.id")),
    )
    md.create_all(engine)


@pytest.mark.emulator
def test_reflection_answers_about_any_name(spanner_engine: sa.Engine) -> None:
    _schema(spanner_engine)
    inspector = sa.inspect(spanner_engine)
    for name in HOSTILE:
        assert inspector.has_table(name) is False, name
        assert inspector.has_sequence(name) is False, name
        assert inspector.get_columns(name) == [], name
        assert inspector.get_indexes(name) == [], name
        assert inspector.get_foreign_keys(name) == [], name
        assert inspector.get_unique_constraints(name) == [], name
        with pytest.raises(sa.exc.NoSuchTableError):
            sa.Table(name, sa.MetaData(), autoload_with=spanner_engine)
        with pytest.raises(sa.exc.NoSuchTableError):
            inspector.get_view_definition(name)
    for reflect in (
        inspector.get_multi_columns,
        inspector.get_multi_indexes,
        inspector.get_multi_pk_constraint,
        inspector.get_multi_foreign_keys,
    ):
        found = reflect(filter_names=[*HOSTILE, "victim", "child"])
        assert {table for _, table in found} <= {"victim", "child"}, reflect
        assert reflect(filter_names=[]) == {}  # stock: ``IN ()``, a syntax error
    assert inspector.has_table("victim")  # and nothing was dropped
    assert set(inspector.get_table_names()) == {"victim", "child"}


@pytest.mark.emulator
def test_bound_reflection_gives_the_stock_answers(spanner_engine: sa.Engine) -> None:
    _schema(spanner_engine)
    with spanner_engine.connect() as conn:
        ours, theirs = spanner_engine.dialect, stock.SpannerDialect
        for method in ("get_multi_columns", "get_multi_indexes", "get_multi_foreign_keys"):
            mine = getattr(ours, method)(conn, filter_names=["victim", "child"])
            stocks = getattr(theirs, method)(ours, conn, filter_names=["victim", "child"])
            assert repr(mine) == repr(stocks), method
        mine_pk = ours.get_multi_pk_constraint(conn)
        assert mine_pk == theirs.get_multi_pk_constraint(ours, conn)
        assert mine_pk[(None, "victim")] == {"constrained_columns": ["id"]}
        assert ours.get_table_names(conn) == theirs.get_table_names(ours, conn)
        assert ours.get_unique_constraints(conn, "victim") == theirs.get_unique_constraints(
            ours, conn, "victim"
        )


@pytest.mark.emulator
def test_upstream_reflection_pastes_names_into_sql(spanner_engine: sa.Engine) -> None:
    """Trips when sqlalchemy-spanner binds names itself: then our override can go."""
    _schema(spanner_engine)
    with spanner_engine.connect() as conn:
        assert stock.SpannerDialect.has_table(spanner_engine.dialect, conn, 'nope" OR "1"="1')
        assert not spanner_engine.dialect.has_table(conn, 'nope" OR "1"="1')
