"""Generated columns under autogenerate, on the emulator: Alembic's contract for the
user's own ``Computed`` columns, sharded-orm's checks for the shard columns it owns."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from sharded_orm import ShardConfigError, shard_column

pytestmark = pytest.mark.emulator

PLUGINS = {"autogenerate_plugins": ["alembic.autogenerate.*", "sharded_orm.*"]}
CANNOT_MODIFY = "Computed default on Gen.{} cannot be modified"


@pytest.fixture
def engine(spanner_emulator: Any) -> Any:
    eng = spanner_emulator.engine(spanner_emulator.create_database())
    yield eng
    eng.dispose()


def _table(md: sa.MetaData, *, count: int = 8, derived: str = "Bar * 5") -> sa.Table:
    return sa.Table(
        "Gen",
        md,
        sa.Column("Id", sa.String(36), primary_key=True),
        sa.Column("Bar", sa.BigInteger),
        sa.Column("Derived", sa.BigInteger, sa.Computed(derived)),
        shard_column(
            "Id", count=count, algorithm="farm_fingerprint", server_side=True, name="Shard"
        ).column,
    )


def _compare(engine: sa.Engine, md: sa.MetaData, warned: list[str]) -> list[Any]:
    """Autogenerate's diffs (plugin enabled as the docs say); its "cannot be modified"
    warnings are appended to ``warned``, also when it raises."""
    with engine.connect() as conn, warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            ctx = MigrationContext.configure(
                conn, opts={"compare_type": True, "compare_server_default": True, **PLUGINS}
            )
            return list(compare_metadata(ctx, md))
        finally:
            warned += [str(w.message) for w in seen if "cannot be modified" in str(w.message)]


def test_unchanged_generated_columns_show_nothing(engine: sa.Engine) -> None:
    """The server-side shard column used to draw Alembic's "cannot be modified" warning
    on every run: its ``Computed`` text is a placeholder the dialect replaces."""
    md = sa.MetaData()
    _table(md)
    md.create_all(engine)
    warned: list[str] = []
    assert _compare(engine, md, warned) == []
    assert warned == []


def test_a_changed_user_expression_is_alembics_warning_and_nothing_written(
    engine: sa.Engine,
) -> None:
    """Alembic's contract: a warning, no op (the plugin used to write a drop and re-add)."""
    old = sa.MetaData()
    _table(old)
    old.create_all(engine)
    new = sa.MetaData()
    _table(new, derived="Bar * 42")
    warned: list[str] = []
    assert _compare(engine, new, warned) == []
    assert warned == [CANNOT_MODIFY.format("Derived")]
    with engine.connect() as conn:
        expr = conn.exec_driver_sql(
            "SELECT GENERATION_EXPRESSION FROM INFORMATION_SCHEMA.COLUMNS "
            "WHERE TABLE_NAME = 'Gen' AND COLUMN_NAME = 'Derived'"
        ).scalar()
    assert expr is not None and "5" in expr  # untouched


def test_a_changed_shard_spec_still_stops_autogenerate(engine: sa.Engine) -> None:
    """The shard column is sharded-orm's: a changed count is refused with the way to
    reshard, not waved through with Alembic's warning."""
    old = sa.MetaData()
    _table(old, count=8)
    old.create_all(engine)
    new = sa.MetaData()
    _table(new, count=16)
    warned: list[str] = []
    with pytest.raises(ShardConfigError, match="cannot be recomputed in place"):
        _compare(engine, new, warned)
    assert warned == []
