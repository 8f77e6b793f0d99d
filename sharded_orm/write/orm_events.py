"""Unit-of-work events: the object learns its shard before the flush sends it.

The execution hook (``sharded_orm.write.engine_hook``) would fill the value anyway; doing it
here too keeps the identity map truthful (``entry.entry_shard_id`` is right after
``flush()`` without a reload) and lets an UPDATE carry every source, so the hook can
check it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Table, event
from sqlalchemy.orm import Mapper, attributes
from sqlalchemy.orm.attributes import flag_modified, instance_dict

from sharded_orm.errors import ShardMismatchError, ShardValueError
from sharded_orm.schema.columns import ShardColumn, is_shard_column, shard_columns
from sharded_orm.write.sql import MISSING, evaluate_default


def _attr_keys(mapper: Mapper[Any], sc: ShardColumn) -> tuple[str, tuple[str, ...]]:
    shard_attr = mapper.get_property_by_column(sc.column).key
    source_attrs = tuple(mapper.get_property_by_column(c).key for c in sc.sources)
    return shard_attr, source_attrs


def _mismatch(sc: ShardColumn, given: Any, shard: int) -> ShardMismatchError:
    return ShardMismatchError(
        f"{sc.name}={given!r} disagrees with its sources ({', '.join(sc.source_keys)}), "
        f"which hash to {shard}; such a row would be invisible to sharded queries. "
        f"Leave {sc.name!r} unset and sharded-orm fills it."
    )


def install_mapper_events(mapper: Mapper[Any]) -> None:
    """Attach before_insert/before_update to one mapper whose table has shard columns."""
    plan = [(sc, *_attr_keys(mapper, sc)) for sc in shard_columns(mapper.local_table)]
    pk_cols = set(mapper.local_table.primary_key)

    def insert_values(
        sc: ShardColumn, source_attrs: tuple[str, ...], target: Any, d: Any
    ) -> list[Any]:
        """Source values for an INSERT, evaluating (and storing) Python-side defaults."""
        values = []
        for col, attr in zip(sc.sources, source_attrs, strict=True):
            v = d.get(attr)
            if v is None:
                dv = evaluate_default(col, {a: d[a] for a in source_attrs if a in d})
                if dv is not MISSING:
                    setattr(target, attr, dv)  # store exactly what we hash
                    v = dv
            values.append(v)
        return values

    def before_insert(mapper_: Any, connection: Any, target: Any) -> None:
        d = instance_dict(target)
        for sc, shard_attr, source_attrs in plan:
            fn = sc._fn
            try:
                values = [d[a] for a in source_attrs]
                shard = fn(values)
            except (KeyError, ShardValueError):  # unset or None: maybe a default applies
                values = insert_values(sc, source_attrs, target, d)
                shard = fn(values)
            given = d.get(shard_attr)
            if given is not None and given != shard:
                raise _mismatch(sc, given, shard)
            # A pending object's INSERT is built from its dict: no history to keep.
            d[shard_attr] = shard

    def before_update(mapper_: Any, connection: Any, target: Any) -> None:
        state = attributes.instance_state(target)
        for sc, shard_attr, source_attrs in plan:
            changed = [a for a in source_attrs if state.attrs[a].history.has_changes()]
            shard_hist = state.attrs[shard_attr].history
            if not changed and not shard_hist.has_changes():
                continue
            shard = sc.compute([getattr(target, a) for a in source_attrs])
            if shard_hist.has_changes() and shard_hist.added and shard_hist.added[0] != shard:
                raise _mismatch(sc, shard_hist.added[0], shard)
            if getattr(target, shard_attr) != shard:
                setattr(target, shard_attr, shard)
            # Send every non-key source so the execution hook can check the whole row;
            # key sources are pinned in the UPDATE's WHERE clause by the ORM.
            for col, attr in zip(sc.sources, source_attrs, strict=True):
                if col not in pk_cols and attr not in changed:
                    flag_modified(target, attr)

    event.listen(mapper, "before_insert", before_insert)
    event.listen(mapper, "before_update", before_update)


def _install_for_sharded_tables(mapper: Mapper[Any], class_: Any) -> None:
    """Every mapper of a table with shard columns fills them at flush."""
    table = mapper.local_table
    if isinstance(table, Table) and any(is_shard_column(c) for c in table.columns):
        install_mapper_events(mapper)


# Runs after the schema layer's own listener, which maps attribute names to columns.
event.listen(Mapper, "after_mapper_constructed", _install_for_sharded_tables)
