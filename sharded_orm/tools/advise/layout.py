"""The layout ``advise`` sizes: a table's shard column, the key space it leads, the read on it.

The key space is the ``ShardedIndex`` the shard column leads (or the table's key, when the
shard column leads it): its writes land at one tail per shard and per value of the parts
before the growing one (a tenant), so the busiest tail is what a count must spread. The
read is that key space's newest-first read of one tenant (or of everything, without one).

A table without a shard column yet (the moment its count must be chosen) is sized as it
would be sharded (:func:`proposed_layout`): its key or index that grows (a time or a
counter part, found as ``doctor`` finds it) led by a shard column over that growing part
and the tenant parts before it (``doctor --fix``'s choice), or over the columns named.

A key column's role is its declaration's, or what its sampled values show (:func:`held_roles`,
by ``doctor``'s own ``value_role``): a UUID or text key filled by an application's helper
whose values are time-ordered UUIDs, ULIDs or time-led text grows; one declared
time-ordered (a ``uuid7`` default) whose values are random version-4 UUIDs does not.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy import types as sqltypes

from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.schema.coerce import base_type
from sharded_orm.schema.columns import (
    ATTR_COLUMNS_KEY,
    ShardColumn,
    attr_column,
    shard_column,
    shard_columns,
    table_of,
)
from sharded_orm.schema.indexes import ShardedIndex
from sharded_orm.schema.keys import is_descending
from sharded_orm.schema.naive import INFO_KEY as NAIVE_INFO_KEY
from sharded_orm.schema.naive import UTC as NAIVE_UTC
from sharded_orm.schema.naive import naive_policy
from sharded_orm.tools.doctor.findings import MONOTONIC_ROLES
from sharded_orm.tools.doctor.groups import ROLE_SHARE
from sharded_orm.tools.doctor.keys import TIME_ORDERED, VALUE_ROLES, role_of, value_role
from sharded_orm.tools.lint import counter_reason, index_parts

#: the roles of a key part that grows with time (doctor's: declared, or shown by the values)
GROWING = MONOTONIC_ROLES


@dataclass(frozen=True)
class Held:
    """A key column whose sampled values show another role than its declaration's."""

    column: str
    #: doctor's value role: uuid7, ulid, time_prefix (growing); uuid4 (random) or uuid1 (a
    #: version-1 UUID: its inserts sweep the key space, no end grows)
    role: str
    why: str  # "its values are time-ordered UUIDs (version 7): 100% of 1,000 sampled"

    @property
    def growing(self) -> bool:
        return self.role in GROWING

    @property
    def text(self) -> str:
        """The line the advice prints."""
        what = "the part that grows" if self.growing else "not a part that grows"
        return f"{self.column}: {self.why}; {what}, whatever its declaration says"


@dataclass(frozen=True)
class Layout:
    """What a shard count changes: ``shard`` leads ``parts`` (the index, or the key)."""

    table: sa.Table
    shard: ShardColumn
    index: str | None  # the ShardedIndex's name; None: the table's key
    parts: tuple[tuple[str, bool], ...]  # (column name, descending) after the shard
    tenant: str | None  # the part before the growing one that splits its tails, if any
    growing: str | None  # the growing part (time, counter)
    #: True: the table has no such shard column yet; ``table`` is the table as it would be
    #: with it (the same name, schema and columns, plus the shard column)
    proposed: bool = False
    #: the sources as the model names them (ORM attribute names), for ``shard_column(...)``
    source_names: tuple[str, ...] = ()
    #: the model says a naive datetime source means UTC (its Base's set_naive_datetimes)
    naive_utc: bool = False
    #: integer columns named like counters whose growth the sample is to show (kept in it)
    checked: tuple[str, ...] = ()
    #: (column, why): integer columns named like counters the sample showed not to grow
    flat: tuple[tuple[str, str], ...] = ()
    #: key columns whose sampled values decided their role (:func:`held_roles`)
    held: tuple[Held, ...] = ()

    def model_line(self, count: int) -> str:
        """The shard column as the model declares it, at ``count``."""
        names = ", ".join(f'"{n}"' for n in self.source_names)
        return f"shard_column({names}, count={count})"

    def variant(self, count: int) -> sa.Table:
        """The table (only the columns the layout needs) with ``count`` shards, in a MetaData
        of its own: where ``advise`` runs the merge to price a read."""
        md = sa.MetaData()
        keep = {c.name for c in self.table.primary_key.columns} | {p for p, _ in self.parts}
        keep |= {c.name for c in self.shard.sources} | set(self.checked)
        cols: list[Any] = []
        for c in self.table.columns:
            if c.name in keep and c.name != self.shard.name:
                cols.append(sa.Column(c.name, c.type, primary_key=c.primary_key, info=dict(c.info)))
        sources = [c.name for c in self.shard.sources]
        cols.append(
            shard_column(
                *sources, count=count, algorithm=self.shard.algorithm, name=self.shard.name,
                primary_key=self.shard.column.primary_key, naive_datetimes=self._naive(),
            ).column
        )  # fmt: skip
        items: list[Any] = []
        if self.index is not None:
            order = [sa.desc(p) if d else p for p, d in self.parts]
            items.append(ShardedIndex(self.index, *order, shard=self.shard.name))
        else:
            items.append(sa.PrimaryKeyConstraint(*[c.name for c in self.table.primary_key.columns]))
        return sa.Table(self.table.name, md, *cols, *items)

    def _naive(self) -> str | None:
        """What a naive datetime source means for the shard column, as its model says
        (its own ``naive_datetimes=``, else its Base's ``set_naive_datetimes``): the
        variant's fresh MetaData would otherwise refuse the rows the database returns."""
        spec = self.shard.spec
        if spec.naive_datetimes is not None:
            return spec.naive_datetimes
        says = naive_policy(spec, self.table)
        return "utc" if says is not None and says() else None


class SeveralGrow(ShardConfigError):
    """Several key spaces of a table without a shard column grow: ``guessed`` are the
    integer columns among their growing parts taken for counters by their name alone (the
    rows can tell whether they grow)."""

    def __init__(self, message: str, guessed: tuple[str, ...]) -> None:
        super().__init__(message)
        self.guessed = guessed


def layout_of(
    model: Any, column: str | None = None, *, shard_on: Any = None, index: str | None = None,
    flat: tuple[tuple[str, str], ...] = (), held: tuple[Held, ...] = (),
) -> Layout:  # fmt: skip
    """The layout of ``model``'s shard column ``column`` (default: its only one); for a
    table without a shard column (or with ``shard_on``/``index`` given), the layout a new
    shard column would have (:func:`proposed_layout`; ``flat``: (column, why) of integer
    columns named like counters that do not grow; ``held``: key columns whose sampled
    values decide their role)."""
    table = table_of(model)
    found = shard_columns(table)
    if shard_on is not None or index is not None:
        if column is not None:
            raise ShardConfigError(
                "give column= (--column: an existing shard column to size) or shard_on= / "
                "index= (--shard-on / --index: a new one to size), not both"
            )
        return proposed_layout(table, shard_on, index, flat, held)
    if not found and column is None:
        return proposed_layout(table, None, None, flat, held)
    if column is not None:
        found = tuple(sc for sc in found if column in (sc.name, sc.key))
    if not found:
        raise ShardConfigError(
            f"{table.name} has no shard column {column!r} (its shard columns: "
            f"{', '.join(sc.name for sc in shard_columns(table)) or 'none'}): name one of "
            "them, or leave --column out and name the columns a new one would hash "
            "(shard_on=..., --shard-on)"
        )
    if len(found) > 1:
        raise ShardConfigError(
            f"{table.name} has {len(found)} shard columns ({', '.join(s.name for s in found)}):"
            " name the one to size (column=..., --column)"
        )
    return replace(_layout(table, found[0], held=held), held=held)


def _layout(
    table: sa.Table, sc: ShardColumn, proposed: bool = False, flat: frozenset[str] = frozenset(),
    held: tuple[Held, ...] = (),
) -> Layout:  # fmt: skip
    index = None
    parts: list[tuple[Any, bool]] = []
    for ix in table.indexes:
        ip = index_parts(ix)
        if ip and ip[0][0] is sc.column:
            index, parts = str(ix.name), ip[1:]
            break
    else:
        pk = list(table.primary_key.columns)
        if not pk or pk[0] is not sc.column:
            raise ShardConfigError(
                f"shard column {table.name}.{sc.name} leads no ShardedIndex and not the key: "
                "nothing is sharded by it to size"
            )
        parts = [(c, is_descending(c)) for c in pk[1:]]
    grow = _growing(parts, flat, held)
    tenant = None
    if grow is not None and grow > 0:
        tenant = parts[grow - 1][0].name
    return Layout(
        table, sc, index, tuple((c.name, d) for c, d in parts), tenant,
        parts[grow][0].name if grow is not None else None, proposed,
        tuple(_attr_name(table, c) for c in sc.sources),
    )  # fmt: skip


# --------------------------------------------------------------------------- before a shard column


def _attr_name(table: sa.Table, col: sa.Column[Any]) -> str:
    """The name the model gives ``col`` (its ORM attribute), else its key."""
    attrs = table.__dict__.get("info", {}).get(ATTR_COLUMNS_KEY) or {}
    return next((a for a, k in attrs.items() if k == col.key), col.key)


def _column(table: sa.Table, name: Any) -> sa.Column[Any]:
    """A column of ``table`` by ORM attribute name, key or SQL name; refused otherwise."""
    if not isinstance(name, str) or not name:
        raise ShardTypeError(f"shard_on takes column names (str), got {name!r}")
    col = attr_column(table, name)
    if col is None:
        col = table.c.get(name)
    if col is None:
        col = next((c for c in table.columns if c.name == name), None)
    if col is None:
        raise ShardConfigError(
            f"{table.name} has no column {name!r} to hash: its columns are "
            f"{', '.join(_attr_name(table, c) for c in table.columns)}"
        )
    return col


def _key_spaces(table: sa.Table) -> list[tuple[str | None, list[tuple[sa.Column[Any], bool]]]]:
    """(index name, or None for the key; its parts) of each key space no shard column leads."""
    out: list[tuple[str | None, list[tuple[sa.Column[Any], bool]]]] = []
    pk = [(c, is_descending(c)) for c in table.primary_key.columns]
    if pk:
        out.append((None, pk))
    for ix in sorted(table.indexes, key=lambda i: str(i.name)):
        try:
            out.append((str(ix.name), index_parts(ix)))
        except ShardConfigError:  # a part that is an expression: no tail to size
            continue
    return [(n, p) for n, p in out if p and role_of(p[0][0]) != "shard"]


def _role(col: sa.Column[Any], held: tuple[Held, ...] = ()) -> str:
    """A column's role: what its sampled values showed, else its declaration's."""
    return next((h.role for h in held if h.column == col.name), role_of(col))


def _describe(
    space: tuple[str | None, list[tuple[sa.Column[Any], bool]]], held: tuple[Held, ...] = ()
) -> str:
    name, parts = space
    cols = ", ".join(f"{c.name} ({_role(c, held)})" for c, _ in parts)
    return f"{'the key' if name is None else 'index ' + name}: {cols}"


def _growing(
    parts: list[tuple[sa.Column[Any], bool]], flat: frozenset[str] = frozenset(),
    held: tuple[Held, ...] = (),
) -> int | None:  # fmt: skip
    return next(
        (i for i, (c, _) in enumerate(parts) if c.name not in flat and _role(c, held) in GROWING),
        None,
    )


def value_columns(table: sa.Table) -> list[sa.Column[Any]]:
    """The key and index columns whose declaration leaves their role to their values (a
    UUID or text key filled by an application's helper): the ones :func:`held_roles` reads."""
    cols = list(table.primary_key.columns)
    for ix in table.indexes:
        cols += [c for c in ix.columns if isinstance(c, sa.Column)]
    seen: dict[str, sa.Column[Any]] = {}
    for c in cols:
        if role_of(c) in VALUE_ROLES:
            seen.setdefault(c.name, c)
    return list(seen.values())


#: what a column's values are, by the role doctor's ``value_role`` gives them
_HELD = {
    "uuid7": "time-ordered UUIDs",
    "uuid4": "random UUIDs",
    "uuid1": "version-1 UUIDs, whose inserts sweep the key space and wrap (time_low first)",
    "ulid": "ULIDs (time-ordered)",
    "time_prefix": "text led by a time (a date, a date-time or Unix seconds)",
}


def _uuid_version(value: Any) -> int:
    """The version of a value ``value_role`` took for a UUID (a UUID, 16 bytes or text)."""
    if isinstance(value, bytes):
        value = uuid.UUID(bytes=value)
    u = value if isinstance(value, uuid.UUID) else uuid.UUID(str(value).strip())
    return int(u.version or 0)


def held_roles(table: sa.Table, rows: Iterable[Mapping[str, Any]]) -> tuple[Held, ...]:
    """The :func:`value_columns` of ``table`` whose values in ``rows`` show another role than
    their declaration's: a role doctor's ``value_role`` gives ``ROLE_SHARE`` (90 %) of a
    column's values, counting a value it cannot tell as the declared role (doctor's rule;
    a column declared for a user takes only a time-ordered role)."""
    cols = value_columns(table)
    rows = list(rows)
    out: list[Held] = []
    for col in cols:
        declared = role_of(col)
        values = [r[col.name] for r in rows if r.get(col.name) is not None]
        shown: Counter[str] = Counter()
        versions: set[int] = set()
        for v in values:
            seen = value_role(v)
            if seen is None or (declared == "user" and seen not in TIME_ORDERED):
                seen = declared
            elif seen in ("uuid4", "uuid7"):
                versions.add(_uuid_version(v))
            shown[seen] += 1
        if not shown:
            continue
        role, n = shown.most_common(1)[0]
        if role == declared or n < ROLE_SHARE * len(values):
            continue
        what = _HELD[role]
        if role in ("uuid4", "uuid7"):  # the versions of the UUIDs that showed it
            which = sorted(versions & ({4} if role == "uuid4" else {6, 7}))
            what += f" (version{'s' if len(which) > 1 else ''} {', '.join(map(str, which))})"
        why = f"its values are {what}: {n / len(values):.0%} of {len(values):,} sampled"
        out.append(Held(col.name, role, why))
    return tuple(out)


def guessed_counter(col: sa.Column[Any]) -> bool:
    """An integer column taken for a counter by its name (``id``) alone: nothing declares it
    one (``counter_reason``), so the rows are to show whether it grows."""
    return (
        role_of(col) == "counter"
        and isinstance(base_type(col.type), sqltypes.Integer)
        and counter_reason(col) is None
    )


def proposed_layout(
    table: sa.Table, shard_on: Any = None, index: str | None = None,
    flat: tuple[tuple[str, str], ...] = (), held: tuple[Held, ...] = (),
) -> Layout:  # fmt: skip
    """The layout of ``table`` with a new shard column: leading ``index`` (an index's name,
    or the table's name for its key; default: the one key space that grows) and hashing
    ``shard_on`` (column names; default: the growing part and the tenant parts before it).
    Refused, saying what to do, where no key space grows (nothing to shard) or several do
    (name one)."""
    spaces = _key_spaces(table)
    if index is not None:
        if not isinstance(index, str):
            raise ShardTypeError(f"index must be an index name (str), got {index!r}")
        chosen = [s for s in spaces if s[0] == index or (s[0] is None and index == table.name)]
        if not chosen:
            raise ShardConfigError(
                f"{table.name} has no unsharded index {index!r} to size a shard column for: "
                "name one of " + "; ".join(_describe(s, held) for s in spaces)
                + f" (or {table.name!r} for its key)"
            )  # fmt: skip
        spaces = chosen
    sources: list[sa.Column[Any]] | None = None
    if shard_on is not None:
        names = [shard_on] if isinstance(shard_on, str) else list(shard_on)
        if not names:
            raise ShardConfigError("shard_on names at least one column to hash")
        sources = [_column(table, n) for n in names]
        if len(set(sources)) != len(sources):
            raise ShardConfigError(f"a column is named twice in shard_on: {names}")
    skip = frozenset(c for c, _ in flat)
    growing = [(s, g) for s in spaces if (g := _growing(s[1], skip, held)) is not None]
    if sources is not None:
        growing = [(s, g) for s, g in growing if s[1][g][0] in sources]
    if not growing:
        times = [c.name for c in table.columns if _role(c, held) in GROWING]
        what = (
            f"no key or index of {table.name} grows with {', '.join(times)}"
            if times
            else f"{table.name} has no time-ordered column (a timestamp, a counter)"
        )
        if sources is not None:
            what += f" among the columns to hash ({', '.join(c.name for c in sources)})"
        raise ShardConfigError(
            f"{what}: nothing to size. advise sizes the shard column of a key or index "
            "whose new rows all land at its end (a timestamp or a counter after its "
            "leading parts); " + "; ".join(_describe(s, held) for s in spaces)
            + "".join(f" ({h.text})" for h in held)
            + ". If a column grows that the model does not show (a timestamp kept as "
            "text), name it with shard_on= (--shard-on) and the index with index= (--index)"
        )  # fmt: skip
    (name, parts), g = growing[0]
    if len(growing) > 1:
        guessed = {sp[1][i][0].name for sp, i in growing if guessed_counter(sp[1][i][0])}
        raise SeveralGrow(
            f"{table.name} has {len(growing)} key spaces that grow: "
            + "; ".join(_describe(s, held) for s, _ in growing)
            + "".join(f" ({h.text})" for h in held)
            + ". Name the one to size: index=<index name> (--index), or the table's name "
            "for its key",
            tuple(sorted(guessed)),
        )  # fmt: skip
    if sources is None:
        sources = [c for c, _ in parts[:g] if _role(c, held) == "tenant"] + [parts[g][0]]
    taken = {c.name for c in table.columns} | set(table.c.keys())
    shard_name, i = f"{parts[g][0].name}ShardId", 2
    while shard_name in taken:
        shard_name, i = f"{parts[g][0].name}ShardId{i}", i + 1
    md = sa.MetaData()
    cols: list[Any] = [
        sa.Column(c.name, c.type, key=c.key, nullable=c.nullable, info=dict(c.info))
        for c in table.columns
    ]
    in_key = name is None
    # naive datetimes hashed as UTC: the spread of the shards is what is estimated
    cols.append(
        shard_column(
            *[c.key for c in sources], count=1, name=shard_name, naive_datetimes="utc",
            primary_key=False,
        ).column
    )  # fmt: skip
    pk = [c.key for c in table.primary_key.columns]
    key: list[Any] = [sa.PrimaryKeyConstraint(shard_name, *pk)] if in_key else []
    if not in_key and pk:
        key.append(sa.PrimaryKeyConstraint(*pk))
    attrs = table.__dict__.get("info", {}).get(ATTR_COLUMNS_KEY)
    info = {ATTR_COLUMNS_KEY: dict(attrs)} if attrs else {}
    new = sa.Table(table.name, md, *cols, *key, schema=table.schema, info=info)
    if not in_key:  # by the columns themselves: a key may differ from its SQL name
        order = [sa.desc(new.c[c.key]) if d else new.c[c.key] for c, d in parts]
        old = next((ix for ix in table.indexes if ix.name == name), None)
        nf = bool(old is not None and old.dialect_kwargs.get("spanner_null_filtered"))
        ShardedIndex(str(name), *order, shard=shard_name, null_filtered=nf)
    sc = next(s for s in shard_columns(new) if s.name == shard_name)
    said = table.metadata.info.get(NAIVE_INFO_KEY) == NAIVE_UTC
    lay = _layout(new, sc, proposed=True, flat=skip, held=held)
    return replace(lay, naive_utc=said, flat=flat, held=held)
