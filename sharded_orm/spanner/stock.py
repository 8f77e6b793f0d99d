"""Engines on sqlalchemy-spanner's own dialect class: what they get, and what they are refused.

``import sharded_orm`` registers our dialect subclass for ``spanner+spanner://`` and
``spanner://`` URLs, but two common layouts still give an app an engine on the stock class:
an engine made before the library is imported (a ``db.py`` imported before ``models.py``),
and an app that registers the stock dialect itself (upstream's samples and test setup do,
``registry.register("spanner", "google.cloud.sqlalchemy_spanner.sqlalchemy_spanner",
"SpannerDialect")``). Such an engine never silently runs without the library:

* **given** where the fix needs no dialect class (hooks keyed by dialect name): a
  ``CREATE TABLE`` whose key has a descending part is rendered by our DDL compiler (the
  stock one renders that part ascending: the hotspot the library exists to prevent), and
  a ``CREATE INDEX`` renders Spanner's clauses only when set (the stock compiler fails
  with ``TypeError`` on an index given any ``spanner_*`` keyword once ours are declared);
* **refused** with :class:`~sharded_orm.errors.UnsupportedOnDialectError`, naming the fix,
  where the library's behaviour depends on our dialect class (statement and commit
  deadlines, Spanner's parameter limit, constraint errors raised as ``IntegrityError``):
  DDL of a sharded table or a ``ShardedIndex``, every INSERT/UPDATE of a sharded table
  (``sharded_orm.write``), every sharded read (``sharded_orm.read``), and ``watch()``.

An engine is ours when its dialect carries :data:`MARK` (our class and its subclasses).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateIndex, CreateTable

from sharded_orm.errors import UnsupportedOnDialectError
from sharded_orm.schema.columns import is_shard_column
from sharded_orm.schema.indexes import ShardedIndex
from sharded_orm.schema.keys import is_descending
from sharded_orm.spanner import SPANNER_DIALECT_NAMES, is_spanner

#: class attribute of sharded-orm's dialect (and of its DDL compiler)
MARK = "sharded_orm_dialect"


def is_stock_spanner(dialect: Any) -> bool:
    """True for a Spanner dialect that is not sharded-orm's (or an Engine/Connection on one)."""
    dialect = getattr(dialect, "dialect", dialect)
    return is_spanner(dialect) and not getattr(dialect, MARK, False)


def refuse_stock(dialect: Any, what: str) -> None:
    """Raise :class:`UnsupportedOnDialectError` if ``dialect`` is a stock Spanner dialect."""
    if not is_stock_spanner(dialect):
        return
    cls = type(getattr(dialect, "dialect", dialect))
    raise UnsupportedOnDialectError(
        f"{what} on an engine whose dialect is {cls.__module__}.{cls.__qualname__}, not "
        "sharded-orm's subclass (sharded_orm.spanner.dialect.SpannerDialect): the engine "
        "was created before `import sharded_orm`, or the application registered "
        "sqlalchemy-spanner's dialect itself (registry.register('spanner', "
        "'google.cloud.sqlalchemy_spanner...', 'SpannerDialect')). sharded-orm needs its "
        "own dialect there (statement and commit deadlines, Spanner's parameter limit, "
        "constraint errors as IntegrityError), so this is refused rather than run without "
        "them. Import sharded_orm before create_engine (in the module that creates the "
        "engine) and drop any registry.register of the stock dialect; see docs/dialect.md."
    )


def _ours(compiler: Any) -> bool:
    return bool(getattr(compiler, MARK, False))


def _with_our_compiler(element: Any, compiler: Any, **kw: Any) -> str:
    """``element`` rendered by our DDL compiler for ``compiler``'s (stock) dialect."""
    from sharded_orm.spanner.ddl import ShardedSpannerDDLCompiler

    ours = ShardedSpannerDDLCompiler(
        compiler.dialect,
        element,
        schema_translate_map=getattr(compiler, "schema_translate_map", None),
        compile_kwargs=kw,
    )
    return str(ours.string)


def _create_table(create: CreateTable, compiler: Any, **kw: Any) -> str:
    if _ours(compiler):
        return str(compiler.visit_create_table(create, **kw))
    table = create.element
    if any(is_shard_column(c) for c in table.columns):
        refuse_stock(compiler.dialect, f"CREATE TABLE {table.name} (a sharded table)")
    if any(is_descending(c) for c in table.primary_key.columns):
        return _with_our_compiler(create, compiler, **kw)
    return str(compiler.visit_create_table(create, **kw))


def _create_index(create: CreateIndex, compiler: Any, **kw: Any) -> str:
    if _ours(compiler):
        return str(compiler.visit_create_index(create, **kw))
    index = create.element
    if isinstance(index, ShardedIndex):
        refuse_stock(compiler.dialect, f"CREATE INDEX {index.name} (a ShardedIndex)")
    if "spanner" in index.dialect_options:
        return _with_our_compiler(create, compiler, **kw)
    return str(compiler.visit_create_index(create, **kw))


for _name in SPANNER_DIALECT_NAMES:
    compiles(CreateTable, _name)(_create_table)
    compiles(CreateIndex, _name)(_create_index)
