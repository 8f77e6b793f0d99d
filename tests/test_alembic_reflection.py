"""The sqlalchemy-spanner reflection gaps alembic_ext fills, and that they are still gaps.

``test_upstream_*`` assert the stock behaviour: when one fails, upstream fixed the gap,
and the matching part of ``alembic_ext.reflection.SpannerInspector`` can go.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine.reflection import Inspector

from alembic_ext.reflection import SpannerInspector, install_inspector

pytestmark = pytest.mark.emulator

DDL = [
    "CREATE TABLE P (A INT64 NOT NULL) PRIMARY KEY (A)",
    "CREATE TABLE T (A INT64 NOT NULL, B STRING(10), C STRING(10)) PRIMARY KEY (A),"
    " INTERLEAVE IN PARENT P",
    "CREATE NULL_FILTERED INDEX IxT ON T (A, B DESC) STORING (C), INTERLEAVE IN P",
]


@pytest.fixture
def engine(spanner_emulator: Any) -> Any:
    eng = sa.create_engine(spanner_emulator.url(spanner_emulator.create_database(DDL)))
    yield eng
    eng.dispose()


def _stock(engine: sa.Engine) -> Any:
    return Inspector._construct(Inspector._init_engine, engine)  # the plain inspector


def test_upstream_pk_has_no_name(engine: sa.Engine) -> None:
    assert "name" not in _stock(engine).get_pk_constraint("T")


def test_upstream_index_sorting_is_a_string_and_options_missing(engine: sa.Engine) -> None:
    (ix,) = _stock(engine).get_indexes("T")
    assert ix["column_sorting"]["B"] == "desc"
    assert "spanner_null_filtered" not in ix["dialect_options"]
    assert "spanner_interleave_in" not in ix["dialect_options"]


def test_upstream_empty_filter_names_is_a_syntax_error(engine: sa.Engine) -> None:
    # the stock dialect's own method: our dialect binds the names (spanner/reflection.py)
    from google.cloud.sqlalchemy_spanner.sqlalchemy_spanner import SpannerDialect as Stock

    with engine.connect() as conn, pytest.raises(Exception, match="Syntax error"):
        Stock.get_multi_columns(engine.dialect, conn, filter_names=[])
    with engine.connect() as conn:
        assert engine.dialect.get_multi_columns(conn, filter_names=[]) == {}


def test_spanner_inspector_fills_the_gaps(engine: sa.Engine) -> None:
    install_inspector(engine.dialect)
    insp = sa.inspect(engine)
    assert isinstance(insp, SpannerInspector)
    assert insp.get_pk_constraint("T")["name"] == "PRIMARY_KEY"
    (ix,) = insp.get_indexes("T")
    assert ix["column_sorting"] == {"B": ("desc",)}
    assert ix["dialect_options"] == {
        "spanner_storing": ["C"],
        "spanner_null_filtered": True,
        "spanner_interleave_in": "P",
    }
    assert insp.get_multi_columns(filter_names=[]) == {}
