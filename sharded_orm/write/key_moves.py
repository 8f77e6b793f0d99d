"""An UPDATE that moves a row's primary key through its shard (a source of a shard in the
key changed): refused where the move cannot be made, with one message on every backend
(``sharded_orm.write.rows`` asks before it computes the row's shard)."""

from __future__ import annotations

from typing import Any

from sharded_orm.errors import ShardConfigError
from sharded_orm.memo import Memo
from sharded_orm.schema.columns import ShardColumn


def refuse_key_change(sc: ShardColumn, setting: list[str], on_spanner: bool) -> None:
    """An UPDATE that moves the row's primary key through its shard: refused on Spanner
    (no key column changes there) and, on every backend, where another table's foreign key
    references the shard (its rows would point at the old key: SQLite's raw
    ``FOREIGN KEY constraint failed``, or orphans where nothing enforces it), unless that
    key cascades the change (``onupdate="CASCADE"``)."""
    if not setting:
        return
    in_key = bool(getattr(sc.column, "primary_key", False))
    keys = [c.key for c in sc.sources if c.key in setting and getattr(c, "primary_key", False)]
    referrers = referrers_of(sc.column) if in_key else ()
    if not on_spanner and not referrers:
        return
    if not (keys or in_key):
        return
    changed = ", ".join(keys) or ", ".join(setting)
    why = []
    if on_spanner:
        why.append("Spanner cannot change key columns")
    if referrers:
        why.append(
            f"the foreign key of {', '.join(map(repr, referrers))} references that key "
            "without ON UPDATE CASCADE, so its rows would point at the old key"
        )
    raise ShardConfigError(
        f"this UPDATE changes {changed}, which moves the row's primary key (the shard "
        f"{sc.name!r} or its sources are key columns), and {'; and '.join(why)}. Delete the "
        "row (and the rows referencing it) and insert it with the new values."
    )


#: id(column) -> (the column, its MetaData's table count, the referring tables' names)
_referrers: Memo[int, tuple[Any, int, tuple[str, ...]]] = Memo("write.key_referrers", 4096)


def referrers_of(column: Any) -> tuple[str, ...]:
    """The tables of ``column``'s MetaData whose foreign key references ``column`` and does
    not cascade an UPDATE of it; computed once per column and number of tables."""
    table = getattr(column, "table", None)
    md = getattr(table, "metadata", None)
    if md is None:
        return ()
    hit = _referrers.get(id(column))
    if hit is not None and hit[0] is column and hit[1] == len(md.tables):
        return hit[2]
    found = []
    for other in md.tables.values():
        for fk in other.foreign_keys:
            try:
                target = fk.column
            except Exception:  # noqa: BLE001  (an unresolved foreign key references nothing here)
                continue
            if target is column and str(fk.onupdate or "").upper() != "CASCADE":
                found.append(other.name)
    names = tuple(dict.fromkeys(found))
    _referrers.put(id(column), (column, len(md.tables), names))
    return names
