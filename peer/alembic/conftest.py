"""Loads SQLAlchemy's pytest plugin for Alembic's suite, in one of two configurations.

``PEER_ALEMBIC_MODE=stock``: sqlalchemy-spanner as installed plus the minimal impl that
users write in env.py today; nothing of sharded-orm is imported (run.sh also passes
``-p no:sharded_orm``). ``PEER_ALEMBIC_MODE=ours``: sharded-orm's dialect and Alembic impl
(``import sharded_orm`` registers them), with its autogenerate plugin named in
``autogenerate_plugins`` as docs/migrations.md tells users to.
"""

import os

import pytest

MODE = os.environ.get("PEER_ALEMBIC_MODE", "")
if MODE not in ("stock", "ours"):
    raise RuntimeError(f"set PEER_ALEMBIC_MODE to stock or ours (got {MODE!r})")

pytest.register_assert_rewrite("sqlalchemy.testing.assertions")

if MODE == "stock":
    from alembic.ddl.impl import DefaultImpl
    from sqlalchemy.dialects import registry

    # SQLAlchemy's plugin loads the backend by its short name too; sqlalchemy-spanner's
    # own test conftest registers it the same way (its entry point is spanner.spanner)
    registry.register(
        "spanner", "google.cloud.sqlalchemy_spanner.sqlalchemy_spanner", "SpannerDialect"
    )

    class SpannerImpl(DefaultImpl):
        __dialect__ = "spanner+spanner"

else:
    import sharded_orm  # noqa: F401  (registers the dialect, which brings the impl)

    AUTOGENERATE_PLUGINS = ["alembic.autogenerate.*", "sharded_orm.*"]

from sqlalchemy.testing.plugin.pytestplugin import *  # noqa: E402,F403
from sqlalchemy.testing.plugin.pytestplugin import (  # noqa: E402
    pytest_sessionstart as _sqla_sessionstart,
)


def pytest_sessionstart(session):
    _sqla_sessionstart(session)
    import sys

    from sqlalchemy.testing import config

    dialect_module = type(config.db.dialect).__module__
    if MODE == "stock":
        # the comparison means nothing if sharded-orm got in (an entry point, a plugin)
        loaded = sorted(m for m in sys.modules if m.startswith("sharded_orm"))
        assert not loaded, f"stock run imported sharded-orm: {loaded[:5]}"
        assert dialect_module.startswith("google.cloud.sqlalchemy_spanner"), dialect_module
    else:
        assert dialect_module == "sharded_orm.spanner.dialect", dialect_module
        _enable_sharded_orm_plugin()


def _enable_sharded_orm_plugin():
    """Every MigrationContext of the suite configured as env.py does in the docs."""
    from alembic.runtime.migration import MigrationContext

    configure = MigrationContext.configure.__func__

    def configure_with_plugin(cls, *args, **kwargs):
        opts = dict(kwargs.pop("opts", None) or {})
        opts.setdefault("autogenerate_plugins", AUTOGENERATE_PLUGINS)
        return configure(cls, *args, opts=opts, **kwargs)

    MigrationContext.configure = classmethod(configure_with_plugin)
