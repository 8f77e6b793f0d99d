"""Filling and checking the shard columns of one INSERT or UPDATE row.

Used by the engine hook for every row of every statement on a sharded table. For each
client-computed shard column:

* INSERT: every source comes from the row, the statement's ``.values()``, or the
  source's Python default (evaluated here and written too, so stored source and hash
  agree); the shard is computed, and a given one that disagrees is refused.
* UPDATE: a Python ``onupdate`` of a source is evaluated here and sent (SQLAlchemy
  would run it after this hook, behind the shard's back); if any source or the shard is
  set, every source must be known: set in the same row, or pinned by an exact
  ``column == value`` in the WHERE clause (not under a case-insensitive collation, not a
  value the column would convert); otherwise the UPDATE is refused.
* On Spanner a ``server_side=True`` shard is left to the database; a key source cannot
  change there, which is said plainly.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

from sqlalchemy.sql.elements import BindParameter

from sharded_orm.errors import ShardConfigError, ShardMismatchError, ShardValueError
from sharded_orm.memo import Memo
from sharded_orm.schema.columns import ShardColumn
from sharded_orm.write.fastpath import RowsFiller, UpdateFiller, rows_filler, update_rows_filler
from sharded_orm.write.key_moves import refuse_key_change
from sharded_orm.write.row_errors import mismatch, no_value, server_rewritten, unhashable_source
from sharded_orm.write.sql import (
    MISSING,
    RowDefaults,
    evaluate_default,
    evaluate_onupdate,
    literal_value,
    row_parameters,
)
from sharded_orm.write.stored import StoredRows, read_back_checks

#: ``(row, source keys) -> {key: stored value}`` read from the row an UPDATE targets
Fetch = StoredRows


def _exact_pin(sc: ShardColumn, i: int, value: Any) -> bool:
    """Whether ``WHERE source == value`` proves the row stores exactly ``value``."""
    if sc.loose and sc.loose[i]:
        return False
    try:
        stored = sc.coercers[i](value) if sc.coercers else value
    except (ShardValueError, TypeError, ValueError):
        return False
    if stored is value:
        return True
    if stored != value:
        return False
    return type(stored) is type(value) or isinstance(value, _dt.datetime)


class RowShards:
    """Fills or checks the shard columns of one table, row by row."""

    def __init__(
        self, shards: Sequence[ShardColumn], on_spanner: bool, connection: Any = None
    ) -> None:
        self.on_spanner = on_spanner
        #: the write's Connection: what a context-sensitive default sees as ``connection``
        self.connection = connection
        self.server_made = [sc for sc in shards if sc.server_side and on_spanner]
        self.client_made = [sc for sc in shards if sc not in self.server_made]
        #: timestamp sources whose values read back from the database are checked as such
        self.read_back = read_back_checks(self.client_made) if not on_spanner else {}
        onupdate = {}
        for sc in shards:
            for col in sc.sources:
                if getattr(col, "onupdate", None) is not None:
                    onupdate[col.key] = col
        #: sources SQLAlchemy would rewrite on UPDATE: evaluated here instead
        self.onupdate_sources = onupdate
        #: sources the database rewrites on UPDATE, of shards the client computes
        self.server_rewritten = [
            (sc, c) for sc in self.client_made for c in sc.sources if c.server_onupdate is not None
        ]
        #: sources with a default, of shards the client computes
        self.defaulted_sources = [c for sc in self.client_made for c in sc.sources if c.default]
        #: evaluates defaults and onupdates as SQLAlchemy would (``sql.RowDefaults``)
        self.defaults = RowDefaults(
            next((getattr(sc.column, "table", None) for sc in shards), None)
        )

    # ----------------------------------------------------------------------------- INSERT

    def insert_row(
        self, row: dict[str, Any], stmt_values: Mapping[str, Any], connection: Any = None
    ) -> dict[str, Any]:
        """The row to send, with shard values filled in; raises on a disagreeing one.
        ``connection``: the write's, when this object was made without it."""
        if any(c.key not in row and c.key not in stmt_values for c in self.defaulted_sources):
            # a source's default runs here: so does every default SQLAlchemy would run
            conn = connection or self.connection
            row = self.defaults.with_evaluated(row, stmt_values, isinsert=True, connection=conn)
        out = row
        for sc in self.client_made:
            values = self.insert_sources(sc, out, stmt_values, connection)
            if out is row:
                out = dict(row)
            for k, v in values.items():
                if k not in stmt_values:
                    out.setdefault(k, v)  # defaults we evaluated are written too
            given = [values[k] for k in sc.source_keys]
            send = sc.values_to_send(given)
            for k, v, stored in zip(sc.source_keys, given, send, strict=True):
                if stored is not v and resendable(k, stmt_values):
                    out[k] = stored  # what is hashed is what is stored
            shard = sc.compute(send)
            _check_given(sc, out, stmt_values, shard)
            out[sc.key] = shard
        for sc in self.server_made:
            out = self._drop_server_made(
                sc, stored_sources(sc, out, stmt_values), stmt_values, insert=True
            )
        return out

    def insert_sources(
        self,
        sc: ShardColumn,
        row: Mapping[str, Any],
        stmt_values: Mapping[str, Any],
        connection: Any = None,
    ) -> dict[str, Any]:
        values: dict[str, Any] = {}
        params: dict[str, Any] | None = None
        for col in sc.sources:
            k = col.key
            if k in row:
                v = row[k]
            elif k in stmt_values:
                v = literal_value(stmt_values[k], row)
                if v is MISSING:
                    raise unhashable_source(sc, k)
            else:
                if params is None:  # what SQLAlchemy's context shows: values, not binds
                    params = row_parameters(row, stmt_values)
                v = evaluate_default(col, {**params, **values}, connection or self.connection)
                if v is MISSING:
                    raise no_value(sc, k, row)
            values[k] = v
        return values

    # ----------------------------------------------------------------------------- UPDATE

    def update_row(
        self,
        row: dict[str, Any],
        stmt_values: Mapping[str, Any],
        pinned: Mapping[str, Any],
        fetch: Fetch | None = None,
    ) -> dict[str, Any]:
        """The UPDATE row to send. ``fetch(row, keys)`` reads sources the statement does not
        give from the one row its WHERE clause names by primary key (None: not possible)."""
        out = row
        if any(k not in row and k not in stmt_values for k in self.onupdate_sources):
            # a source's onupdate runs here: so does every onupdate SQLAlchemy would run
            conn = self.connection
            out = self.defaults.with_evaluated(row, stmt_values, isinsert=False, connection=conn)
            for k, col in self.onupdate_sources.items():
                if k not in out and k not in stmt_values:  # SQL: refused, with the way out
                    params = row_parameters(row, stmt_values)
                    out[k] = evaluate_onupdate(col, params, self.connection)
        for sc in self.client_made:
            setting = [k for k in sc.source_keys if k in out or k in stmt_values]
            shard_given = sc.key in out or sc.key in stmt_values
            if not setting and not shard_given:
                continue
            refuse_key_change(sc, setting, self.on_spanner)
            values = self._update_sources(sc, out, stmt_values, pinned, setting, fetch)
            if values is None:
                continue  # the WHERE clause's row does not exist: the UPDATE changes nothing
            send = sc.values_to_send(values)
            shard = sc.compute(send)
            try:
                _check_given(sc, out, stmt_values, shard)
            except ShardMismatchError:
                if not _resent(sc, out, fetch):
                    raise
            if out is row:
                out = dict(row)
            for k, v, stored in zip(sc.source_keys, values, send, strict=True):
                sent = k in out or k in stmt_values  # not a pinned or fetched one
                if stored is not v and sent and resendable(k, stmt_values):
                    out[k] = stored  # what is hashed is what is stored
            out[sc.key] = shard
        for sc in self.server_made:
            setting = [k for k in sc.source_keys if k in out or k in stmt_values]
            if setting:
                refuse_key_change(sc, setting, True)
            out = self._drop_server_made(
                sc, stored_sources(sc, out, stmt_values), stmt_values, insert=False
            )
        return out

    def update_rows(
        self,
        rows: Sequence[dict[str, Any]],
        stmt_values: Mapping[str, Any],
        pinned: Mapping[str, Any],
        fetch: Fetch | None,
        in_place: bool = False,
    ) -> list[dict[str, Any]]:
        """The UPDATE rows to send (see :meth:`update_row`). Rows of one statement share
        their keys: when they set sources of client-computed shards and give no shard,
        which sources each row gives and which are read from the stored rows is settled
        once, and the stored ones are read for every row in one batch. ``in_place``: the
        rows are the ORM flush's own, made for this statement alone, and get their shards
        themselves (no copy per row)."""
        for sc, col in self.server_rewritten:
            if col.key not in stmt_values and (not rows or col.key not in rows[0]):
                raise server_rewritten(sc, col)
        plans = self._update_plans(rows, stmt_values, pinned, fetch)
        if plans is None:
            return [self.update_row(r, stmt_values, pinned, fetch) for r in rows]
        missing = list(
            dict.fromkeys(
                k
                for sc, given in plans
                for k, g in zip(sc.source_keys, given, strict=True)
                if not g
            )
        )
        if not plans:
            return list(rows)

        def slow_row(row: dict[str, Any]) -> dict[str, Any]:
            return self.update_row(row, stmt_values, pinned, fetch)

        found: Mapping[Any, Any] = _NOTHING_READ
        keys: Sequence[Any] = [None] * len(rows)
        if missing and fetch is not None:
            found, keys = fetch.batch(missing), fetch.keys()
        return _update_filler(plans, missing, in_place)(rows, keys, found, slow_row)

    def _update_plans(
        self,
        rows: Sequence[dict[str, Any]],
        stmt_values: Mapping[str, Any],
        pinned: Mapping[str, Any],
        fetch: Fetch | None,
    ) -> list[tuple[ShardColumn, list[bool]]] | None:
        """Per shard whose sources the rows set: which sources each row gives (True) and
        which are read from the stored row (False); None where the general path applies
        (values in the statement, an onupdate, a Spanner-computed shard, a shard given,
        a source taken from the WHERE clause, nothing to read them with)."""
        if stmt_values or self.onupdate_sources or self.server_made or not rows:
            return None
        first = rows[0]
        plans = []
        for sc in self.client_made:
            if sc.key in first:
                return None
            given = [k in first for k in sc.source_keys]
            if not any(given):
                continue
            if not all(given) and (fetch is None or any(k in pinned for k in sc.source_keys)):
                return None
            setting = [k for k, g in zip(sc.source_keys, given, strict=True) if g]
            refuse_key_change(sc, setting, self.on_spanner)
            plans.append((sc, given))
        return plans

    def _update_sources(
        self,
        sc: ShardColumn,
        row: Mapping[str, Any],
        stmt_values: Mapping[str, Any],
        pinned: Mapping[str, Any],
        setting: list[str],
        fetch: Fetch | None,
    ) -> list[Any] | None:
        """The source values of the updated row; None when they had to be read from the
        one row the WHERE clause names by primary key and there is no such row."""
        values: list[Any] = []
        known = {k for k in sc.source_keys if k in row or k in stmt_values or k in pinned}
        missing = [k for k in sc.source_keys if k not in known]
        fetched = fetch(row, missing) if missing and fetch is not None else None
        if missing and fetch is not None and fetched is None:
            return None
        for i, k in enumerate(sc.source_keys):
            if k in row:
                v = row[k]
            elif k in stmt_values:
                v = literal_value(stmt_values[k], row)
                if v is MISSING:
                    raise unhashable_source(sc, k)
            elif k in pinned:
                v = literal_value(pinned[k], row)
                if v is MISSING:
                    raise unhashable_source(sc, k)
                if not _exact_pin(sc, i, v):
                    raise ShardConfigError(
                        f"this UPDATE changes the sources of {sc.name!r} and takes {k!r} from "
                        f"its WHERE clause ({k} == {v!r}), but that comparison does not prove "
                        "the stored value (a case-insensitive collation, or a value the column "
                        f"converts), so the new shard cannot be computed. Set all of "
                        f"{', '.join(sc.source_keys)} in the UPDATE."
                    )
            elif fetched is not None:
                v = fetched[k]
            else:
                what = f"sets {', '.join(setting)}" if setting else f"sets {sc.name!r}"
                if k in self.onupdate_sources or any(s in self.onupdate_sources for s in setting):
                    what += " (a source with onupdate= is rewritten by every UPDATE)"
                raise ShardConfigError(
                    f"this UPDATE {what} but not shard source {k!r}, so shard column "
                    f"{sc.name!r} cannot be recomputed and the row would be lost to "
                    f"sharded queries. Set all of {', '.join(sc.source_keys)} in the same "
                    f"UPDATE, pin {k!r} with {k} == value in the WHERE clause, or change "
                    "the row through the ORM (which knows the whole row)."
                )
            values.append(v)
        return values

    def _drop_server_made(
        self, sc: ShardColumn, row: dict[str, Any], stmt_values: Mapping[str, Any], *, insert: bool
    ) -> dict[str, Any]:
        if sc.key in stmt_values:
            raise ShardConfigError(
                f"{sc.name!r} is generated by Spanner (server_side=True); leave it out of .values()"
            )
        if sc.key not in row:
            return row
        if insert:
            values = self.insert_sources(sc, row, stmt_values)
            shard = sc.compute([values[k] for k in sc.source_keys])
            _check_given(sc, row, stmt_values, shard)
        out = dict(row)
        del out[sc.key]
        return out


def stored_sources(
    sc: ShardColumn, row: dict[str, Any], stmt_values: Mapping[str, Any]
) -> dict[str, Any]:
    """``row`` with the sources it sets of a shard Spanner computes in their stored form,
    so the row holds what a lookup hashes (and the driver gets no IntEnum member)."""
    out = row
    for i, k in enumerate(sc.source_keys):
        if not sc.sends or not sc.sends[i] or not resendable(k, stmt_values):
            continue
        v = out[k] if k in out else literal_value(stmt_values[k], out) if k in stmt_values else None
        if v is None or v is MISSING:
            continue  # not set here, or NULL: the database says what it thinks of that
        stored = sc.coercers[i](v)
        if stored is not v:
            if out is row:
                out = dict(row)
            out[k] = stored
    return out


def resendable(key: str, stmt_values: Mapping[str, Any]) -> bool:
    """Whether a source can be sent in the row: it is not in ``.values()``, or is there as
    a plain literal, which an execution parameter of the same key overrides."""
    if key not in stmt_values:
        return True
    v = stmt_values[key]
    return isinstance(v, BindParameter) and v.unique and v.callable is None


def _resent(sc: ShardColumn, row: Mapping[str, Any], fetch: Fetch | None) -> bool:
    """Whether the disagreeing shard an UPDATE row carries is the one the row already
    stores: an object saved with all its columns (``bulk_save_objects``, a detached object
    whose source changed) resends its loaded shard, which is no caller's choice; the new
    one replaces it. Read from the stored row only on this (rare) path."""
    if fetch is None or sc.key not in row:
        return False
    stored = fetch(row, [sc.key])
    return stored is not None and stored.get(sc.key) == row[sc.key]


def _check_given(
    sc: ShardColumn, row: Mapping[str, Any], stmt_values: Mapping[str, Any], shard: int
) -> None:
    if sc.key in row:
        given = row[sc.key]
    elif sc.key in stmt_values:
        given = literal_value(stmt_values[sc.key], row)
    else:
        return
    if given is None or given is MISSING:
        return  # the ORM sends None for an attribute it was never given
    if given != shard or isinstance(given, bool):
        raise mismatch(sc, given, shard)


#: the generated INSERT filler of each table's client-computed shards, with the
#: ``RowShards`` its slow rows go through
_fillers: Memo[tuple[tuple[ShardColumn, ...], bool], tuple[RowsFiller, RowShards]] = Memo(
    "write.insert_fillers", 256
)


#: ``found`` when every source is given: the row of no key holds no value to read
_NOTHING_READ: dict[Any, tuple[Any, ...]] = {None: ()}
#: the generated UPDATE filler of each shape of rows
_update_fillers: Memo[tuple[Any, ...], UpdateFiller] = Memo("write.update_fillers", 256)


def _update_filler(
    plans: list[tuple[ShardColumn, list[bool]]], missing: list[str], in_place: bool
) -> UpdateFiller:
    """The generated UPDATE filler (``sharded_orm.write.fastpath``) of one shape of rows."""
    key = (tuple((sc, tuple(given)) for sc, given in plans), tuple(missing), in_place)
    hit = _update_fillers.get(key)
    if hit is None:
        hit = update_rows_filler(plans, missing, in_place=in_place)
        _update_fillers.put(key, hit)
    return hit


def fast_insert_rows(
    shards: RowShards,
    rows: Sequence[dict[str, Any]],
    plan: tuple[ShardColumn, ...] | None = None,
    *,
    in_place: bool = False,
) -> list[dict[str, Any]]:
    """INSERT rows carrying every source, through the generated filler of the table
    (``sharded_orm.write.fastpath``); a row it cannot settle goes through ``insert_row``.
    ``plan``: the shards to fill (default: every client-computed one); ``in_place``: the
    rows are the ORM flush's own, made for this statement alone, and get their shards
    themselves (no copy per row)."""
    if plan is None:
        plan = tuple(shards.client_made)
    key = (plan, in_place)
    hit = _fillers.get(key)
    if hit is None:
        checker = RowShards(plan, on_spanner=False)

        def slow_row(row: dict[str, Any]) -> dict[str, Any]:
            return checker.insert_row(row, _NO_VALUES, _writing.get())

        hit = (rows_filler(plan, slow_row, in_place=in_place), checker)
        _fillers.put(key, hit)
    filler, checker = hit
    token = _writing.set(shards.connection)  # the cached filler's slow rows see this write's
    try:
        return filler(rows)
    finally:
        _writing.reset(token)
        checker.defaults.end_write()  # (shared: keeps no connection past its write)


#: the ``.values()`` of the rows :func:`fast_insert_rows` fills: none
_NO_VALUES: Mapping[str, Any] = MappingProxyType({})

#: the connection of the INSERT :func:`fast_insert_rows` fills (its cached filler is shared)
_writing: ContextVar[Any] = ContextVar("sharded_orm_writing", default=None)
