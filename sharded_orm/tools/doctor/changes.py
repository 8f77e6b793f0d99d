"""From a doctor finding to the model change that removes it (pure SQLAlchemy, no Alembic).

Each finding a schema change can fix becomes a :class:`ModelChange`: the tables as the
models declare them now, the tables after the change (new ``Table`` objects in a new
``MetaData``, built with the library's own ``shard_column`` and ``ShardedIndex``), and the
change written out for the person who edits the models. ``alembic_ext.fix`` renders the
revision(s) from it; ``sharded_orm.tools.doctor.fix`` puts them together.

What each pattern becomes:

- ``unsharded_index``: a shard column over the index's tenant (if it leads the growing
  part) and growing column, and a ``ShardedIndex`` under a new name replacing the index
  (``shard_index``: expand: the column, backfilled, NOT NULL, and the new index;
  contract: drop the old index);
- ``tenant_skew``, or ``monotonic`` on a sharded index: a bigger count, by reshard
  (``reshard_index``: expand and contract revisions, docs/migrations.md);
- ``monotonic`` or ``tenant_skew`` on a table key (sharded or not): a new table whose key
  leads with a shard column, rows copied online (``key_reshard``: expand and contract);
- ``sequence``: bit-reversed ids for new rows (``bit_reversed``: a Spanner
  ``bit_reversed_positive`` sequence that skips the ids already used).

Everything else is refused with what it points at: ``hot_key`` and the ``HOT_ROW`` /
``UNISOLATABLE_HOT_ROW`` reasons (the row design), ``LARGE_SCAN_HOT_SPOT`` (scans),
``MOVING_HOT_SPOT`` without a key pattern, ``UNSPECIFIED``, and tables the models do not
declare.

Schemas whose change the revisions cannot carry are refused too, each with the manual path
(:mod:`.unsupported`): a table in a named schema; a key reshard of a table in an
interleaved hierarchy (as child or as parent) or in a foreign key (either direction); a new
ShardedIndex in place of an interleaved index; a shard computed from a nullable column (a
NULL has no shard) or from a commit-timestamp column (its value exists only at commit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from sharded_orm.checks import MADE_FROM, check_name_length, check_spanner_name
from sharded_orm.errors import ShardConfigError
from sharded_orm.schema.columns import is_shard_column, shard_column, shard_columns
from sharded_orm.schema.indexes import ShardedIndex
from sharded_orm.schema.keys import is_descending
from sharded_orm.tools.doctor.findings import MONOTONIC_ROLES, HotspotFinding
from sharded_orm.tools.doctor.keys import Catalog
from sharded_orm.tools.doctor.unsupported import unsupported
from sharded_orm.tools.lint import index_parts

KINDS = ("shard_index", "reshard_index", "key_reshard", "bit_reversed")

#: what no migration fixes, by pattern or Spanner reason code, and where to look instead
NOT_BY_MIGRATION = {
    "hot_key": "one row or a few keys take the load: the row design, not the key layout. "
    "No migration fixes it: spread that row's writes over N rows (a counter split into N "
    "rows keyed by a shard_column(..., count=N), summed on read), batch or cache the "
    "writes, keep its transactions short",
    "HOT_ROW": "Spanner says HOT_ROW: one row takes the load and a split cannot cut a row. "
    "No migration fixes it: the row design does (split the row into N rows, batch the "
    "writes, keep transactions short)",
    "UNISOLATABLE_HOT_ROW": "Spanner says UNISOLATABLE_HOT_ROW: a hot row it cannot even "
    "move into a split of its own. No migration fixes it: the row design does (split the "
    "row into N rows, batch the writes, keep transactions short)",
    "LARGE_SCAN_HOT_SPOT": "Spanner says LARGE_SCAN_HOT_SPOT: reads that scan a wide range "
    "keep the split busy, not writes. No migration fixes it; find the scans (Query "
    "Insights, the statements touching this table or index) and narrow them: an index for "
    "the filter, a LIMIT, a key range. Our own fan-out reads are scans too: merged() and "
    "page() read up to N x K index entries (N shards, K rows wanted) in one statement when "
    "N x K <= 1024, and sharded_select() without a shard point reads every shard; a large "
    "count or a large k on a hot path costs that on every call (sharded-orm advise prices "
    "it)",
    "MOVING_HOT_SPOT": "Spanner says MOVING_HOT_SPOT: the hot keys move through the key "
    "space (a growing key), so a cut is stale at once. The keys here show no growing part "
    "a shard column could spread; look for writes in key order (a bulk load sorted by key: "
    "load in random or shard order, presplit first)",
    "uuid1": "its key holds version-1 UUIDs, whose inserts land at a point that sweeps the "
    "key space and wraps (time_low first), not at a growing end: no shard column or count "
    "is the fix. No migration is needed either: make the new ids version 4 (uuid.uuid4()), "
    "the rows written stay as they are",
    "UNSPECIFIED": "Spanner gave no reason (UNSPECIFIED) and the keys show no pattern a "
    "migration fixes; watch the next windows, and look at Query and Lock Insights",
    "unknown_table": "its split keys name no table or index of the models: give the models "
    "that declare it (a declarative base or MetaData holding every table), then run doctor "
    "--fix again. No revision is written for a table the models do not declare",
}


@dataclass
class ModelChange:
    """One finding's fix: the models before, the models after, and the change in words."""

    finding: HotspotFinding
    kind: str  # one of KINDS
    table: sa.Table  # the table as the models declare it now
    after: sa.Table  # the table the change leaves (a new table for a key reshard)
    count: int  # the shard count the change uses (bit_reversed: 0)
    old_index: sa.Index | None = None
    new_index: sa.Index | None = None
    old_shard: str | None = None  # reshard_index: the shard column replaced
    new_shard: str | None = None
    sequence: str | None = None  # bit_reversed: the sequence's name
    column: str | None = None  # bit_reversed: the id column
    #: the models during the expand (key reshard: old table and successor), and after
    expand_metadata: sa.MetaData = field(default_factory=sa.MetaData)
    metadata: sa.MetaData = field(default_factory=sa.MetaData)
    model_text: str = ""

    @property
    def stages(self) -> int:
        """Revisions it takes: 2 where old readers must move first (expand, contract)."""
        return 2 if self.kind in ("shard_index", "reshard_index", "key_reshard") else 1


@dataclass
class Refusal:
    """A finding no migration fixes, and what it points at instead."""

    finding: HotspotFinding
    reason: str


def _unique(name: str, taken: set[str], what: str, source: Any) -> str:
    """``name`` (made from the given name ``source``), or ``name2``... the first free."""
    out, i = name, 2
    while out in taken:
        out, i = f"{name}{i}", i + 1
    check_name_length(out, f"the new {what}", MADE_FROM.format(source))
    check_spanner_name(out, what)
    taken.add(out)
    return out


IndexSpec = tuple[str, list[Any], "str | None", dict[str, Any], bool]


def _index_spec(ix: sa.Index, name: str | None = None) -> IndexSpec:
    """(name, parts as names or ``sa.desc(name)``, shard column or None, keywords, unique)."""
    found = index_parts(ix)
    parts: list[Any] = [sa.desc(c.name) if desc else c.name for c, desc in found]
    shard = None
    if found and is_shard_column(found[0][0]):  # a ShardedIndex (or its copy in a MetaData)
        shard, parts = found[0][0].name, parts[1:]
    return (name or str(ix.name), parts, shard, dict(ix.dialect_kwargs), bool(ix.unique))


def _build(
    table: sa.Table,
    md: sa.MetaData,
    *,
    name: str | None = None,
    drop: tuple[str, ...] = (),
    add: tuple[sa.Column[Any], ...] = (),
    key: list[str] | None = None,
    indexes: list[IndexSpec] = (),  # type: ignore[assignment]
) -> sa.Table:
    """A copy of ``table`` in ``md``: renamed, columns dropped and added, a new key order,
    and ``indexes`` (given as specs) in place of its own."""
    cols: list[Any] = list(add)
    for c in table.columns:
        if c.name in drop:
            continue
        new = c._copy()
        new.info = dict(c.info)
        new.primary_key = False  # the key is the constraint below, in its order
        cols.append(new)
    pk = key or [c.name for c in table.primary_key.columns]
    items: list[Any] = [sa.PrimaryKeyConstraint(*pk)]
    for ix_name, parts, shard, kw, unique in indexes:
        if shard is None:
            items.append(sa.Index(ix_name, *parts, unique=unique, **kw))
        else:
            items.append(ShardedIndex(ix_name, *parts, shard=shard, unique=unique, **kw))
    info = dict(table.info)  # the ORM attribute names shard sources may be given by
    return sa.Table(name or table.name, md, *cols, *items, info=info, **dict(table.kwargs))


def _change_of(
    f: HotspotFinding, table: sa.Table, index: sa.Index | None, cols: list[Any]
) -> tuple[str, list[Any]]:
    """The change a finding becomes, and the columns its shard would be computed from."""
    if f.pattern == "unsharded_index":
        roles = [f.role_of(c) for c, _ in cols]
        mono = next(i for i, r in enumerate(roles) if r in MONOTONIC_ROLES)
        tenants = [c for c, _ in cols[:mono] if f.role_of(c) == "tenant"]
        return "shard_index", [*tenants, cols[mono][0]]
    if f.pattern == "sequence":
        return "bit_reversed", []
    if index is not None:
        _, _, shard_name, _, _ = _index_spec(index)
        old = next(sc for sc in shard_columns(table) if sc.name == shard_name)
        return "reshard_index", list(old.sources)
    pk = [c for c, _ in cols]
    existing = [sc for sc in shard_columns(table) if sc.column in pk]
    return "key_reshard", list(existing[0].sources) if existing else pk


def _suggested(finding: HotspotFinding, count: int) -> int:
    return max(2 * count, int(math.ceil(finding.peak_score / 50)) * count, 10)


class Planner:
    """Turns findings into model changes against one set of models."""

    def __init__(self, catalog: Catalog, metadata: sa.MetaData, count: int | None = None):
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
            raise ShardConfigError(f"count must be a positive int, got {count!r}")
        if count is not None and count < 2:
            raise ShardConfigError(f"count must be 2 or more (a shard count), got {count}")
        self.catalog = catalog
        self.metadata = metadata
        self.count = count
        self.names: set[str] = set(catalog.tables) | set(catalog.indexes)

    def plan(self, finding: HotspotFinding) -> ModelChange | Refusal:
        reasons = set(finding.reasons)
        if finding.pattern == "hot_key":
            for code in ("UNISOLATABLE_HOT_ROW", "HOT_ROW"):
                if code in reasons:
                    return Refusal(finding, NOT_BY_MIGRATION[code])
            return Refusal(finding, NOT_BY_MIGRATION["hot_key"])
        if finding.pattern == "large_scan":
            return Refusal(finding, NOT_BY_MIGRATION["LARGE_SCAN_HOT_SPOT"])
        if finding.pattern == "unknown":
            if finding.kind == "unknown":
                return Refusal(finding, NOT_BY_MIGRATION["unknown_table"])
            if "uuid1" in finding.roles.values() and "LARGE_SCAN_HOT_SPOT" not in reasons:
                return Refusal(finding, NOT_BY_MIGRATION["uuid1"])
            for code in ("MOVING_HOT_SPOT", "LARGE_SCAN_HOT_SPOT"):
                if code in reasons:
                    return Refusal(finding, NOT_BY_MIGRATION[code])
            return Refusal(finding, NOT_BY_MIGRATION["UNSPECIFIED"])
        found = self.catalog.columns_of(finding.table)
        if found is None:
            return Refusal(finding, NOT_BY_MIGRATION["unknown_table"])
        kind, cols, table = found
        index = self.catalog.indexes[finding.table] if kind == "index" else None
        change, sources = _change_of(finding, table, index, cols)
        why = unsupported(self.metadata, change, table, index, sources)
        if why is not None:
            return Refusal(finding, why)
        if change == "shard_index":
            assert index is not None
            return self._shard_index(finding, table, index, cols)
        if change == "bit_reversed":
            return self._bit_reversed(finding, table, cols)
        if change == "reshard_index":  # monotonic or tenant_skew on a sharded index
            assert index is not None
            return self._reshard_index(finding, table, index)
        return self._key_reshard(finding, table, cols)

    # -- the four changes

    def _others(self, table: sa.Table, but: sa.Index | None, suffix: str = "") -> list[IndexSpec]:
        new = (
            (lambda ix: _unique(f"{ix.name}{suffix}", self.names, "index", ix.name))
            if suffix
            else None
        )
        return [_index_spec(ix, new and new(ix)) for ix in table.indexes if ix is not but]

    def _shard_index(
        self, f: HotspotFinding, table: sa.Table, ix: sa.Index, cols: list[Any]
    ) -> ModelChange:
        roles = [f.role_of(c) for c, _ in cols]
        mono = next(i for i, r in enumerate(roles) if r in MONOTONIC_ROLES)
        sources = [c for c, _ in cols[:mono] if f.role_of(c) == "tenant"] + [cols[mono][0]]
        count = self.count or 10
        taken = set(table.c.keys()) | {c.name for c in table.columns}
        lead = cols[mono][0].name
        shard = _unique(f"{lead}ShardId", taken, "shard column name", lead)
        src = [s.name for s in sources]
        name = _unique(f"{ix.name}Sharded", self.names, "index name", ix.name)
        _, parts, _, kw, unique = _index_spec(ix)
        new_spec = (name, parts, shard, kw, unique)
        md1, md2 = sa.MetaData(), sa.MetaData()
        # NOT NULL from the expand on: old code, which does not fill it, then fails loudly
        # (Spanner refuses to change NOT NULL of a column an index uses, so it is now or
        # never; a row old code adds meanwhile makes the fence fail: run it again)
        col1 = shard_column(*src, count=count, name=shard).column
        _build(table, md1, add=(col1,), indexes=[*self._others(table, None), new_spec])
        col2 = shard_column(*src, count=count, name=shard).column
        new = _build(table, md2, add=(col2,), indexes=[*self._others(table, ix), new_spec])
        attrs = ", ".join(repr(self._attr(table, s)) for s in sources)
        text = (
            f"table {table.name}: a shard column, and index {ix.name} replaced by a "
            f"ShardedIndex under a new name, {name}.\n"
            "expand (deploy the new code right after the first revision: its NOT NULL "
            "stops old code's INSERTs, loudly):\n"
            f"+    {_attr_name(shard)}: Mapped[int] = shard_column({attrs}, count={count}, "
            f"name={shard!r})\n"
            f"+    ShardedIndex({name!r}, {', '.join(_part_text(p) for p in parts)}, "
            f"shard={shard!r}{_index_kw(ix)}),\n"
            f"contract (the second revision, once every reader uses {name}):\n"
            f"-    sa.Index({ix.name!r}, {', '.join(_part_text(p) for p in parts)}),"
        )
        return ModelChange(
            f, "shard_index", table, new, count, old_index=ix, new_index=_index(new, name),
            new_shard=shard, expand_metadata=md1, metadata=md2, model_text=text,
        )  # fmt: skip

    def _reshard_index(self, f: HotspotFinding, table: sa.Table, ix: sa.Index) -> ModelChange:
        _, _, shard_name, _, _ = _index_spec(ix)
        old = next(sc for sc in shard_columns(table) if sc.name == shard_name)
        count = self.count or _suggested(f, old.count)
        if count <= old.count:
            raise ShardConfigError(
                f"count={count} is not more than {old.count}, the count of {old.name}: a "
                "reshard for a hot tenant needs a bigger count"
            )
        taken = set(table.c.keys()) | {c.name for c in table.columns}
        shard = _unique(_strip_count(old.name, old.count) + str(count), taken, "column", old.name)
        name = _unique(
            _strip_count(str(ix.name), old.count) + str(count), self.names, "index", ix.name
        )
        _, parts, _, kw, unique = _index_spec(ix)
        src = [s.name for s in old.sources]
        new_spec = (name, parts, shard, kw, unique)
        md1, md2 = sa.MetaData(), sa.MetaData()
        col1 = shard_column(
            *src, count=count, algorithm=old.algorithm, name=shard, nullable=True
        ).column
        # nullable, and kept so (docs/migrations.md, "Writers that do not use the library"):
        # old code keeps writing until the contract drops its column, then the fill
        col2 = shard_column(
            *src, count=count, algorithm=old.algorithm, name=shard, nullable=True
        ).column
        _build(table, md1, add=(col1,), indexes=[*self._others(table, None), new_spec])
        new = _build(
            table, md2, add=(col2,), drop=(old.name,),
            indexes=[*self._others(table, ix), new_spec],
        )  # fmt: skip
        text = (
            f"table {table.name}: reshard {old.name} ({old.count} shards) to {shard} "
            f"({count} shards) and its index {ix.name} to {name}.\n"
            f"expand (deploy with the first revision; the library fills both columns):\n"
            f"+    {_attr_name(shard)}: Mapped[int] = shard_column("
            f"{', '.join(repr(self._attr(table, s)) for s in old.sources)}, count={count}, "
            f"algorithm={old.algorithm!r}, name={shard!r}, nullable=True)\n"
            f"+    ShardedIndex({name!r}, "
            f"{', '.join(_part_text(p) for p in parts)}, shard={shard!r}{_index_kw(ix)}),\n"
            f"contract (deploy with the second revision, once every reader uses {name}):\n"
            f"-    the shard column {old.name} and ShardedIndex({ix.name!r}, ...)\n"
            f"(keep {shard} nullable=True: Spanner cannot make an indexed column NOT NULL)"
        )
        return ModelChange(
            f, "reshard_index", table, new, count, old_index=ix, new_index=_index(new, name),
            old_shard=old.name, new_shard=shard, expand_metadata=md1, metadata=md2,
            model_text=text,
        )  # fmt: skip

    def _key_reshard(self, f: HotspotFinding, table: sa.Table, cols: list[Any]) -> ModelChange:
        pk = [c for c, _ in cols]
        existing = [sc for sc in shard_columns(table) if sc.column in pk]
        old_count = existing[0].count if existing else 1
        count = self.count or (_suggested(f, old_count) if existing else 16)
        suffix = str(count) if existing else "Sharded"
        base = _strip_count(table.name, old_count) if existing else table.name
        new_name = _unique(f"{base}{suffix}", self.names, "table name", table.name)
        mono = next(i for i, c in enumerate(pk) if f.role_of(c) in MONOTONIC_ROLES)
        if existing:
            shard, sources = existing[0].name, [s.name for s in existing[0].sources]
            drop: tuple[str, ...] = (shard,)
            key = [c.name for c in pk]
        else:
            shard = _unique("ShardId", set(table.c.keys()), "shard column name", "ShardId")
            sources, drop = [c.name for c in pk], ()
            key = [shard, *[c.name for c in pk]]
        md_expand, md_final = sa.MetaData(), sa.MetaData()
        _build(table, md_expand, indexes=self._others(table, None))
        renamed = self._others(table, None, suffix)
        for md in (md_expand, md_final):
            col = shard_column(*sources, count=count, name=shard).column
            _build(table, md, name=new_name, drop=drop, add=(col,), key=key, indexes=renamed)
        new = md_final.tables[new_name]
        key_text = ", ".join(
            f"sa.desc({c.name!r})" if is_descending(c) else repr(c.name)
            for c in new.primary_key.columns
        )
        text = (
            f"table {table.name}: its key ({', '.join(c.name for c in pk)}) grows at "
            f"{pk[mono].name}; a key column cannot change in place, so the rows move to a new "
            f"table {new_name} whose key leads with {shard} = shard of "
            f"({', '.join(sources)}) mod {count}.\n"
            f"expand (deploy with the first revision): keep the model of {table.name}, add\n"
            f"+ class <Name>{suffix}(Base):  # the same columns as {table.name}\n"
            f"+     __tablename__ = {new_name!r}\n"
            f"+     {_attr_name(shard)}: Mapped[int] = shard_column("
            f"{', '.join(repr(self._attr(table, table.c[s])) for s in sources)}, "
            f"count={count}, name={shard!r})\n"
            f"+     __table_args__ = (sharded_orm.primary_key({key_text}),)\n"
            f"+ declare_successor(<Name>, <Name>{suffix})  # every library write reaches both\n"
            f"contract (deploy with the second revision): remove the model of {table.name} "
            "and the declare_successor line; read and write only the new model"
        )
        return ModelChange(
            f, "key_reshard", table, new, count, new_shard=shard,
            expand_metadata=md_expand, metadata=md_final, model_text=text,
        )  # fmt: skip

    def _bit_reversed(self, f: HotspotFinding, table: sa.Table, cols: list[Any]) -> ModelChange:
        col = next(c for c, _ in cols if f.role_of(c) == "counter")
        seq = _unique(f"{table.name}{col.name}Sequence", self.names, "sequence name", table.name)
        md = sa.MetaData()
        new = _build(table, md, indexes=self._others(table, None))
        text = (
            f"table {table.name}: {col.name} comes from a plain counter; new ids come from "
            f"the bit-reversed sequence {seq} instead (the ids already used are skipped, "
            "existing rows keep theirs). In the model, replace the counter that fills "
            f"{col.name}:\n"
            f"-    {self._attr(table, col)}: ... default=<counter>.next_id\n"
            f"+    {self._attr(table, col)}: ... default=SpannerSequence(engine, {seq!r})"
            ".next_id  # from sharded_orm import SpannerSequence\n"
            "(no column changes: alembic check stays clean; TableSequence(..., "
            "bit_reversed=True) is the portable alternative)"
        )
        return ModelChange(
            f, "bit_reversed", table, new, 0, sequence=seq, column=col.name,
            metadata=md, expand_metadata=md, model_text=text,
        )  # fmt: skip

    def _attr(self, table: sa.Table, col: sa.Column[Any]) -> str:
        return self.catalog.attributes.get((table.name, col.name), col.name)


def _index(table: sa.Table, name: str) -> sa.Index:
    return next(ix for ix in table.indexes if ix.name == name)


def _attr_name(column: str) -> str:
    out = "".join(("_" + ch.lower()) if ch.isupper() else ch for ch in column).lstrip("_")
    return out if out.isidentifier() else "shard_id"


def _strip_count(name: str, count: int) -> str:
    return name[: -len(str(count))] if name.endswith(str(count)) else name


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return repr(part)
    inner = part.element
    return f"sa.desc({getattr(inner, 'element', None) or inner.name!r})"


def _index_kw(ix: sa.Index) -> str:
    kw = dict(ix.dialect_kwargs)
    out = ""
    if kw.get("spanner_storing"):
        out += f", storing={list(kw['spanner_storing'])!r}"
    if kw.get("spanner_null_filtered"):
        out += ", null_filtered=True"
    return out
