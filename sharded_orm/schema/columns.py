"""Shard columns: declared once on the model, right on every write path.

``shard_column("company_id", "ts", count=10)`` makes an INT64 column whose value
is ``compute_shard((company_id, ts), 10)``. The value is filled or checked in two
places, so no path can miss it:

* ORM unit of work (``Session.add`` + flush): mapper ``before_insert`` /
  ``before_update`` events compute it on the object, so the object knows its shard.
* Everything, including the flush: one ``Engine`` ``before_execute`` hook sees each
  INSERT and UPDATE against a sharded table with its parameters, fills missing shard
  values, refuses ones that disagree with their sources, and refuses an UPDATE that
  changes a source without it being able to recompute the shard. That covers ORM bulk
  inserts, ``bulk_insert_mappings``, ``bulk_save_objects``, Core single and
  executemany, multi-VALUES ``insert().values([...])`` and ``update()``.

See ``sharded_orm.write.engine_hook`` for the hook.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from sqlalchemy import Column, Integer, Table, event
from sqlalchemy import types as sqltypes
from sqlalchemy.orm import MappedColumn, Mapper, mapped_column
from sqlalchemy.schema import Computed
from sqlalchemy.sql.expression import text

from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.hashing import (
    CRC32,
    CRC32_CONCAT,
    FARM_FINGERPRINT,
    concat_text,
    validate_algorithm,
    validate_count,
)
from sharded_orm.schema.coerce import (
    Coercer,
    base_type,
    coercer_for,
    converts_on_bind,
    has_case_insensitive_collation,
    sends_stored_form,
)
from sharded_orm.schema.declare import check_source_declaration
from sharded_orm.schema.naive import check_policy, hashed_as_utc, naive_policy
from sharded_orm.schema.pieces import (
    PIECE_INT,
    PIECE_STR,
    PIECE_UTC_DATETIME,
    piece_function,
    shard_function_of_pieces,
)
from sharded_orm.schema.registry import register, register_cascades, watch_ddl

INFO_KEY = "sharded_orm.shard"
#: ``Table.info`` key of a sharded table: ORM attribute name -> column key (plain strings,
#: so the info dict stays plain data that Alembic can render), so sources can be
#: attribute names.
ATTR_COLUMNS_KEY = "sharded_orm.attr_columns"


def attr_column(table: Table, name: str) -> Column[Any] | None:
    """The column of ``table`` that ORM attribute ``name`` maps, if the mapper said so."""
    info = table.__dict__.get("info")
    attr_columns = info.get(ATTR_COLUMNS_KEY) if info else None
    if not attr_columns or name not in attr_columns:
        return None
    key = attr_columns[name]
    if not isinstance(key, str):  # a Column, as older releases kept it
        key = getattr(key, "key", None)
    col = table.c.get(key) if isinstance(key, str) else None
    return col


@dataclass(frozen=True)
class ShardSpec:
    """What a shard column is computed from, as declared."""

    sources: tuple[str, ...]
    count: int
    algorithm: str = CRC32
    server_side: bool = False
    #: what a naive datetime source means: "utc", "refuse", or None (the Base's, else
    #: refused): :mod:`sharded_orm.schema.naive`
    naive_datetimes: str | None = None

    def __post_init__(self) -> None:
        check_policy(self.naive_datetimes)
        validate_count(self.count)
        validate_algorithm(self.algorithm)
        if not self.sources:
            raise ShardConfigError("a shard column needs at least one source column")
        for s in self.sources:
            if not isinstance(s, str) or not s:
                raise ShardTypeError(
                    f"shard sources are column names (str), got {s!r}; "
                    "write shard_column('company_id', 'ts', count=10)"
                )
        if len(set(self.sources)) != len(self.sources):
            raise ShardConfigError(f"a shard source is listed twice: {self.sources}")
        if not isinstance(self.server_side, bool):
            raise ShardTypeError(f"server_side must be a bool, got {self.server_side!r}")
        if self.server_side and self.algorithm != FARM_FINGERPRINT:
            raise ShardConfigError(
                "server_side=True needs algorithm='farm_fingerprint': Spanner has no CRC32 "
                "function, so a crc32 shard can only be computed by the client"
            )


@dataclass(frozen=True, eq=False)
class ShardColumn:
    """A shard column resolved against its table: the column, its sources, its function.

    ``coercers`` turn each source value into what its column stores (see
    ``sharded_orm.schema.coerce``); ``compute`` hashes those stored values, so the shard
    is the hash of the row as the database holds it.
    """

    column: Column[Any]
    spec: ShardSpec
    sources: tuple[Column[Any], ...]
    #: values in source order -> shard, with no length check: the hot paths call it directly
    shard_fn: Callable[[Sequence[object]], int] = field(repr=False, compare=False)
    coercers: tuple[Coercer, ...] = field(default=(), repr=False, compare=False)
    #: per source: True when its collation may equate distinct strings (a WHERE ``==``
    #: on it does not tell the stored value)
    loose: tuple[bool, ...] = field(default=(), repr=False, compare=False)
    #: per source: True when its stored form is also the value to send (not for an Enum)
    sends: tuple[bool, ...] = field(default=(), repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.column.name

    @property
    def key(self) -> str:
        return self.column.key

    @property
    def count(self) -> int:
        return self.spec.count

    @property
    def algorithm(self) -> str:
        return self.spec.algorithm

    @property
    def server_side(self) -> bool:
        return self.spec.server_side

    @cached_property
    def source_keys(self) -> tuple[str, ...]:
        # read several times per row on the general write path; sources never change
        return tuple(c.key for c in self.sources)

    def compute(self, values: Sequence[object]) -> int:
        """The shard for source values given in source order (coerced to their stored form)."""
        if len(values) != len(self.sources):
            raise ShardConfigError(
                f"shard column {self.name!r} has {len(self.sources)} sources "
                f"({', '.join(self.source_keys)}), got {len(values)} values"
            )
        return self.shard_fn(values)

    def compute_from(self, row: Any) -> int:
        """The shard for a mapping or object holding the source values by key."""
        if isinstance(row, dict):
            return self.shard_fn([row[k] for k in self.source_keys])
        return self.shard_fn([getattr(row, k) for k in self.source_keys])

    def values_to_send(self, values: Sequence[object]) -> list[Any]:
        """The source values to write so that the database stores what is hashed: each in
        its stored form (an IntEnum member as its int, ``1`` into a Boolean as ``True``, an
        upper-case UUID as its canonical text); the value itself when that already is its
        stored form (the same object: callers test ``is`` to skip a copy)."""
        if not self.coercers:
            return list(values)
        return [
            c(v) if send else v
            for c, send, v in zip(self.coercers, self.sends, values, strict=True)
        ]


def make_shard_column(
    column: Column[Any],
    spec: ShardSpec,
    sources: Sequence[Column[Any]],
    naive_utc: Callable[[], bool] | None = None,
) -> ShardColumn:
    """A ShardColumn whose function coerces each source as its column stores it
    (where ``naive_utc()`` says so when asked, a naive datetime is stored as given and
    hashed as UTC)."""
    coercers = tuple(coercer_for(s, naive_utc) for s in sources)
    hashed = [hashed_as_utc(c) for c in coercers] if naive_utc else list(coercers)
    if spec.algorithm == CRC32_CONCAT:
        pieces = [_concat_piece(c) for c in hashed]
    else:
        pieces = [piece_function(piece_kind(s), c) for s, c in zip(sources, hashed, strict=True)]
    fn = shard_function_of_pieces(pieces, spec.count, spec.algorithm)
    loose = tuple(has_case_insensitive_collation(s) for s in sources)
    sends = tuple(sends_stored_form(s) for s in sources)
    return ShardColumn(column, spec, tuple(sources), fn, coercers, loose, sends)


def _concat_piece(coerce: Coercer) -> Callable[[Any], str]:
    def piece(v: Any) -> str:
        return concat_text(coerce(v))

    return piece


def piece_kind(column: Any) -> str | None:
    """Which inline fast path fits the column's stored Python type, if any (none where a
    TypeDecorator converts the value: the coercer applies that conversion first)."""
    if converts_on_bind(column):
        return None
    type_ = base_type(getattr(column, "type", None))
    if isinstance(type_, (sqltypes.Enum, sqltypes.Uuid)):
        return None
    if isinstance(type_, sqltypes.String):
        return PIECE_STR
    if isinstance(type_, sqltypes.Integer):
        return PIECE_INT
    if isinstance(type_, sqltypes.DateTime):
        return PIECE_UTC_DATETIME
    return None


class ShardComputed(Computed):
    """A Spanner generated column holding the shard; rendered by ``sharded_orm.spanner``.

    On other dialects it renders nothing and the client fills the column.
    """

    __visit_name__ = "sharded_orm_shard_computed"
    inherit_cache = True

    def __init__(self, spec: ShardSpec) -> None:
        super().__init__(text("0"), persisted=True)
        self.spec = spec

    def _copy(self, *, target_table: Any = None, **kw: Any) -> ShardComputed:
        return ShardComputed(self.spec)  # Column copies (mixins, to_metadata) keep the spec

    def copy(self, *, target_table: Any = None, **kw: Any) -> ShardComputed:
        return self._copy(target_table=target_table)


def shard_column(
    *sources: str,
    count: int,
    algorithm: str = CRC32,
    server_side: bool = False,
    naive_datetimes: str | None = None,
    **column_kwargs: Any,
) -> MappedColumn[int]:
    """A declarative column holding ``compute_shard(<sources>, count, algorithm)``.

    ``sources`` are keys of columns of the same table, in hashing order. The column is
    ``INT64 NOT NULL`` unless ``column_kwargs`` say otherwise. With ``server_side=True``
    (farm_fingerprint only) it is a STORED generated column on Spanner and is never sent
    by the client there; elsewhere the client fills it.

    ``naive_datetimes="utc"``: a naive datetime source is hashed as the UTC instant
    Spanner stores it as (refused by default; once for all models:
    ``set_naive_datetimes(Base, "utc")``).

    ``Table(...)`` users can take ``shard_column(...).column``.
    """
    spec = ShardSpec(tuple(sources), count, algorithm, server_side, naive_datetimes)
    for banned in ("default", "onupdate", "server_default", "server_onupdate"):
        if banned in column_kwargs:
            raise ShardConfigError(
                f"shard_column computes its own value; remove {banned}= from its arguments"
            )
    info = dict(column_kwargs.pop("info", None) or {})
    info[INFO_KEY] = spec
    column_kwargs.setdefault("nullable", False)
    type_ = column_kwargs.pop("type_", Integer)
    args: list[Any] = [type_]
    if server_side:
        args.append(ShardComputed(spec))
    made: MappedColumn[int] = mapped_column(*args, info=info, **column_kwargs)
    # on this column only, so no listener runs for the columns and tables that are not
    # sharded (a copy, for a mixin or by to_metadata, has none: it is resolved when
    # mapped or first used)
    event.listen(made.column, "after_parent_attach", _on_column_attach)
    return made


# --------------------------------------------------------------------------- introspection

_resolved: weakref.WeakKeyDictionary[Table, tuple[int, tuple[ShardColumn, ...]]] = (
    weakref.WeakKeyDictionary()
)


def _find_source(table: Table, name: str) -> Column[Any]:
    """A source by ORM attribute name, column key, or SQL name, in that order."""
    col = attr_column(table, name)
    if col is not None:
        return col
    col = table.c.get(name)
    if col is not None:
        return col
    for c in table.columns:
        if c.name == name:
            return c
    raise ShardConfigError(
        f"shard source {name!r} is not a column of table {table.name!r} "
        f"(columns: {', '.join(c.key for c in table.columns)})"
    )


def _resolve(table: Table) -> tuple[ShardColumn, ...]:
    found = []
    for col in table.columns:
        info = col.__dict__.get("info")
        spec = info.get(INFO_KEY) if info else None
        if spec is None:
            continue
        sources = tuple(_find_source(table, s) for s in spec.sources)
        if col in sources:
            raise ShardConfigError(f"shard column {col.name!r} cannot be its own source")
        for s in sources:
            if is_shard_column(s):
                raise ShardConfigError(
                    f"shard column {col.name!r} takes another shard column, {s.name!r}, "
                    "as a source; hash the original sources instead"
                )
            check_source_declaration(col, spec.server_side, s)
            if s.server_default is not None and not spec.server_side:
                raise ShardConfigError(
                    f"shard source {s.name!r} of {col.name!r} gets its value from the server "
                    "(server_default/Computed), so the client cannot hash it; give it a "
                    "client-side default, or use server_side=True on Spanner"
                )
        found.append(make_shard_column(col, spec, sources, naive_policy(spec, table)))
    return tuple(found)


def table_of(obj: Any) -> Table:
    """The Table behind a model class, mapper, instance or Table."""
    if isinstance(obj, Table):
        return obj
    from sqlalchemy import inspect

    insp = inspect(obj, raiseerr=False)
    table = getattr(insp, "local_table", None)
    if table is None:
        mapper = getattr(insp, "mapper", None)
        table = getattr(mapper, "local_table", None)
    if not isinstance(table, Table):
        raise ShardTypeError(f"expected a mapped class or a Table, got {obj!r}")
    return table


def shard_columns(obj: Any) -> tuple[ShardColumn, ...]:
    """Every shard column of a table or mapped class, resolved and validated."""
    table = table_of(obj)
    ncols = len(table.columns)
    hit = _resolved.get(table)
    if hit is not None and hit[0] == ncols:
        return hit[1]
    cols = _resolve(table)
    _resolved[table] = (ncols, cols)
    if cols:
        register(table)
        register_cascades(table, cols)
    return cols


def get_shard_column(obj: Any, name: str | None = None) -> ShardColumn:
    """The shard column of ``obj`` by ORM attribute, column key or SQL name.

    With ``name=None`` the table must have exactly one shard column.
    """
    cols = shard_columns(obj)
    table = table_of(obj)
    if name is None:
        if len(cols) == 1:
            return cols[0]
        raise ShardConfigError(
            f"table {table.name!r} has {len(cols)} shard columns; name the one you mean"
        )
    attr_col = attr_column(table, name)
    for sc in cols:
        if name in (sc.key, sc.name) or sc.column is attr_col:
            return sc
    raise ShardConfigError(
        f"{name!r} is not a shard column of table {table.name!r} "
        f"(shard columns: {', '.join(sc.key for sc in cols) or 'none'})"
    )


def is_shard_column(column: Any) -> bool:
    # ``Column.info`` is created on first read: look only at one that already exists, so
    # asking about a column that is not ours leaves it as it was
    info = getattr(column, "__dict__", {}).get("info")
    return isinstance(info, dict) and info.get(INFO_KEY) is not None


# --------------------------------------------------------------------------- ORM unit of work


def _on_mapper_constructed(mapper: Any, class_: Any) -> None:
    table = mapper.local_table
    if not isinstance(table, Table):
        return
    if not any(is_shard_column(c) for c in table.columns):
        return
    attr_columns = table.info.setdefault(ATTR_COLUMNS_KEY, {})
    for attr, col in mapper.columns.items():
        if isinstance(col, Column) and col.table is table:
            attr_columns.setdefault(attr, col.key)
    _resolved.pop(table, None)
    shard_columns(table)  # validate now, at class definition, not at first flush


def _on_column_attach(column: Any, table: Any) -> None:
    if isinstance(table, Table) and is_shard_column(column):
        register(table)  # resolved lazily: the sources may not be attached yet
        watch_ddl(table)


event.listen(Mapper, "after_mapper_constructed", _on_mapper_constructed)
