"""pytest wiring for the stock-surface suite (``test_stock_surface.py``), run twice by run.sh.

``SPANNER_SURFACE_MODE`` chooses how the suite's engines get their dialect, as an
application would:

* ``stock``: sqlalchemy-spanner as installed, nothing of sharded-orm imported (run.sh also
  passes ``-p no:sharded_orm``);
* ``ours``: ``import sharded_orm`` first, so its registry entries serve ``spanner+spanner://``.

``SPANNER_SURFACE_URL`` is an emulator database made by run.sh; each test gets a fresh
database of the same instance (the ``url`` fixture), dropped afterwards. The session checks
which dialect class is really in use, so a wiring mistake cannot compare stock with stock.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

MODE = os.environ.get("SPANNER_SURFACE_MODE", "")
EXPECTED_MODULE = {
    "stock": "google.cloud.sqlalchemy_spanner.sqlalchemy_spanner",
    "ours": "sharded_orm.spanner.dialect",
}
if MODE == "ours":
    import sharded_orm  # noqa: F401  (registers sharded-orm's dialect, as for any user)
elif MODE != "stock":
    raise pytest.UsageError(f"SPANNER_SURFACE_MODE must be stock or ours, not {MODE!r}")

_URL = re.compile(r"spanner\+spanner:///projects/([^/]+)/instances/([^/]+)/databases/[^/]+")
_ids = itertools.count()


def pytest_report_header(config: pytest.Config) -> str:
    url = os.environ["SPANNER_SURFACE_URL"]
    dialect = type(sa.create_engine(url).dialect)
    if dialect.__module__ != EXPECTED_MODULE[MODE]:
        raise pytest.UsageError(f"{MODE} run loads the dialect from {dialect.__module__}")
    if MODE == "stock" and any(m.startswith("sharded_orm") for m in sys.modules):
        raise pytest.UsageError("the stock run imported sharded_orm: pass -p no:sharded_orm")
    return f"spanner surface mode {MODE}: {dialect.__module__}.{dialect.__name__}"


@pytest.fixture(scope="session")
def instance() -> Any:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.spanner_v1 import Client

    match = _URL.fullmatch(os.environ["SPANNER_SURFACE_URL"])
    assert match, os.environ["SPANNER_SURFACE_URL"]
    project, instance_id = match.groups()
    client = Client(project=project, credentials=AnonymousCredentials())
    return client.instance(instance_id)


@pytest.fixture
def database(instance: Any) -> Iterator[Any]:
    """A fresh, empty database (the client's ``Database``)."""
    db = instance.database(f"surface-{os.getpid()}-{next(_ids)}")
    db.create().result(120)
    try:
        yield db
    finally:
        with contextlib.suppress(Exception):
            db.drop()


@pytest.fixture
def url(database: Any) -> str:
    return f"spanner+spanner:///{database.name}"


@pytest.fixture
def engine(url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(url)
    try:
        yield eng
    finally:
        eng.dispose()
