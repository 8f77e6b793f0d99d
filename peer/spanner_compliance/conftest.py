"""pytest wiring for sqlalchemy-spanner's compliance suite (``tests/test_suite_20.py``).

``run.sh`` copies this file next to the suite it downloads. ``SPANNER_COMPLIANCE_MODE``
chooses the dialect that ``spanner+spanner://`` URLs load:

* ``stock``: sqlalchemy-spanner's own ``SpannerDialect`` (run with ``-p no:sharded_orm``,
  so nothing imports sharded-orm);
* ``ours``: sharded-orm imported as an application imports it, which registers its
  subclass (``sharded_orm.spanner.dialect.SpannerDialect``) in SQLAlchemy's registry.

The collected session checks which dialect class is really in use, so a wiring mistake
cannot compare stock against stock.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest
import sqlalchemy.testing
from sqlalchemy import literal
from sqlalchemy.dialects import registry

MODE = os.environ.get("SPANNER_COMPLIANCE_MODE", "")
EXPECTED_MODULE = {
    "stock": "google.cloud.sqlalchemy_spanner.sqlalchemy_spanner",
    "ours": "sharded_orm.spanner.dialect",
}
if MODE == "stock":
    for _name in ("spanner.spanner", "spanner"):
        registry.register(_name, "google.cloud.sqlalchemy_spanner", "SpannerDialect")
elif MODE == "ours":
    import sharded_orm  # noqa: F401  (registers sharded-orm's dialect, as for any user)
else:
    raise pytest.UsageError(f"SPANNER_COMPLIANCE_MODE must be stock or ours, not {MODE!r}")

pytest.register_assert_rewrite("sqlalchemy.testing.assertions")

# The suite star-imports ``sqlalchemy.testing.suite.test_deprecations``, which SQLAlchemy 2.1
# removed (with the deprecated APIs it tested): an empty module stands in for it there, so
# the import brings in nothing, as the module would hold nothing to run. (Looked for as a
# file: importing the suite package now would define its fixtures before SQLAlchemy's
# plugin is configured.)
_removed = "sqlalchemy.testing.suite.test_deprecations"
if not (Path(sqlalchemy.testing.__file__).parent / "suite" / "test_deprecations.py").exists():
    sys.modules[_removed] = types.ModuleType(_removed)

from sqlalchemy.testing.plugin.pytestplugin import *  # noqa: E402,F403
from sqlalchemy.testing.schema import Column, Table  # noqa: E402


def pytest_report_header(config: pytest.Config) -> str:
    dialect = registry.load("spanner.spanner")
    found = dialect.__module__
    if found != EXPECTED_MODULE[MODE]:
        raise pytest.UsageError(f"{MODE} run loads the dialect from {found}")
    if MODE == "stock" and any(m.startswith("sharded_orm") for m in sys.modules):
        raise pytest.UsageError("the stock run imported sharded_orm: pass -p no:sharded_orm")
    return f"spanner compliance mode {MODE}: {found}.{dialect.__name__}"


@pytest.fixture
def literal_round_trip_spanner(metadata, connection):  # type: ignore[no-untyped-def]
    """The suite's round trip of a literal: insert it rendered, read it back, compare.

    The suite's Boolean tests ask for it (their own conftest, not in the sdist, defines it).
    """

    def run(type_, input_, output, filter_=None, compare=None, support_whereclause=True):  # type: ignore[no-untyped-def]
        table = Table("t", metadata, Column("x", type_))
        table.create(connection)
        for value in input_:
            connection.execute(table.insert().values(x=literal(value, type_, literal_execute=True)))
        stmt = table.select()
        if support_whereclause:
            wanted = compare if compare is not None else input_[0]
            stmt = stmt.where(table.c.x == literal(wanted, type_, literal_execute=True))
        rows = connection.execute(stmt).all()
        assert rows, "no rows returned"
        for (value,) in rows:
            assert (filter_(value) if filter_ is not None else value) in output

    return run
