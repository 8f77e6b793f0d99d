"""From hot splits to the model, shard and tenant that is hot, and what to change.

Each split's start and limit keys are decoded with the models' metadata; splits are
grouped by table or index, shard and tenant over the window, and each group classified:

- ``monotonic``: writes append at the end of a range, led by a timestamp or a
  time-ordered UUID (or every shard's tail is hot: the count is too small);
- ``sequence``: the same, led by an integer from a plain counter;
- ``tenant_skew``: a sharded table or index whose hot splits are one tenant's, in several
  shards: the shard count is too small for that tenant (the seeds' "Company B");
- ``unsharded_index``: an index without a shard column, hot at the end of its range or
  of one tenant's;
- ``hot_key``: one row or a few keys (contention, not a key-design problem);
- ``unknown``: a split of a table not in the models, or no pattern the keys explain.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Column, MetaData

from sharded_orm.errors import ShardingError
from sharded_orm.schema.columns import INFO_KEY
from sharded_orm.tools.doctor.findings import (
    MONOTONIC_ROLES,
    DecodedRow,
    Diagnosis,
    EmptyWindowError,
    HotspotFinding,
)
from sharded_orm.tools.doctor.groups import (
    Group,
    Rows,
    value_of,
)
from sharded_orm.tools.doctor.keys import UUID1_KEYS, Catalog, role_of
from sharded_orm.tools.doctor.sources import INTERVAL_SECONDS, VIEWS, SplitRow

PATTERNS = (
    "monotonic",
    "tenant_skew",
    "hot_key",
    "unsharded_index",
    "sequence",
    "large_scan",
    "unknown",
)
#: Spanner's UNSPLITTABLE_REASONS codes (the minute, 10-minute and hour views)
REASONS = (
    "HOT_ROW",
    "MOVING_HOT_SPOT",
    "LARGE_SCAN_HOT_SPOT",
    "UNISOLATABLE_HOT_ROW",
    "UNSPECIFIED",
)
MIGRATIONS = "docs/migrations.md, Resharding"


def metadata_of_models(models: Any) -> MetaData:
    """A MetaData from a declarative base, a MetaData, or a list of models or Tables."""
    from sqlalchemy import Table

    from sharded_orm.schema.columns import table_of
    from sharded_orm.tools.lint import metadata_of

    if isinstance(models, (list, tuple, set)):
        md = MetaData()
        if not models:
            raise ShardingError("models is empty: give a declarative base, MetaData or models")
        for m in models:
            t = m if isinstance(m, Table) else table_of(m)
            if t.name not in md.tables:
                t.to_metadata(md)
        return md
    return metadata_of(models)


def attribute_names(models: Any) -> dict[tuple[str, str], str]:
    """(table, column) -> ORM attribute name, for the models that are mapped classes (a
    ``shard_column(...)`` names its sources by attribute)."""
    from sqlalchemy import inspect
    from sqlalchemy.orm import ColumnProperty, Mapper

    mappers: list[Mapper[Any]] = []
    registry = getattr(models, "registry", None)
    if registry is not None:
        mappers.extend(registry.mappers)
    elif isinstance(models, (list, tuple, set)):
        for m in models:
            mapper = inspect(m, raiseerr=False)
            if isinstance(mapper, Mapper):
                mappers.append(mapper)
    out: dict[tuple[str, str], str] = {}
    for mapper in mappers:
        for prop in mapper.column_attrs:
            if isinstance(prop, ColumnProperty):
                for col in prop.columns:
                    table = getattr(col, "table", None)
                    if table is not None and hasattr(table, "name") and hasattr(col, "name"):
                        out.setdefault((table.name, col.name), prop.key)
    return out


def _finding(
    name: str, kind: str, pattern: str, fix: str, rows: Rows, window: str, **kw: Any
) -> HotspotFinding:
    return HotspotFinding(
        table=name,
        kind=kind,
        pattern=pattern,
        fix=fix,
        peak_score=rows.peak,
        hot_seconds=len(rows.hot_ends) * float(INTERVAL_SECONDS[window]),
        intervals=len(rows.ends),
        keys=list(rows.starts),
        reasons=sorted(rows.reasons),
        **kw,
    )


def _attr(catalog: Catalog, col: Column[Any]) -> str:
    table = getattr(col, "table", None)
    return catalog.attributes.get((getattr(table, "name", ""), col.name), col.name)


def diagnose(rows: Iterable[SplitRow], catalog: Catalog, window: str) -> Diagnosis:
    """Classify ``rows`` (any iterable: a stream is read once, never held) into findings."""
    from sharded_orm.tools.doctor.findings import HeatSample

    groups: dict[str, Group] = {}
    heat = HeatSample()
    for row in rows:
        d = DecodedRow(row, catalog.decode(row.split_start), catalog.decode(row.split_limit))
        space = d.space
        group = groups.get(space.name)
        if group is None:
            group = groups[space.name] = Group(space, catalog)
        group.add(d)
        heat.add(d)
    if not heat.count:
        raise EmptyWindowError(
            f"no rows in {VIEWS[window]} for this window: Spanner lists only splits whose "
            "CPU_USAGE_SCORE reached 50, so no split was warm or hot then. Widen the window "
            "(since=..., --since) or read the 10-minute or hour view (window=...)"
        )
    findings: list[HotspotFinding] = []
    for name, group in groups.items():
        findings.extend(_classify(name, group, catalog, window))
    findings.sort(key=lambda f: (-f.hot_seconds, -f.peak_score, f.table))
    return Diagnosis(window, heat, findings)


def _classify(name: str, group: Group, catalog: Catalog, window: str) -> list[HotspotFinding]:
    space = group.space
    if group.found is None:
        what = f"unknown table {name!r}" if space.kind == "unknown" else "the whole key space"
        return [
            _finding(
                name,
                "unknown",
                "unknown",
                f"{what}: its split keys name no table or index of the given models. Pass "
                "the models that declare it (a declarative base or MetaData holding every "
                "table), then run doctor again.",
                group.all,
                window,
            )
        ]
    kind, cols, table = group.found
    out: list[HotspotFinding] = []
    if group.scans.n:
        out.append(
            _finding(
                name,
                kind,
                "large_scan",
                f"Spanner says LARGE_SCAN_HOT_SPOT: reads scanning {name} keep its splits "
                "busy, not writes. Find the scans (Query Insights) and narrow them: an index "
                "for the filter, a LIMIT, a key range. Fan-out reads scan too: merged() and "
                "page() read up to N x K index entries a call; sharded-orm advise prices a "
                "shard count's reads.",
                group.scans,
                window,
                base_table=table.name,
            )
        )
    for start, rs in group.hot_keys.items():
        assert rs.first is not None
        out.append(
            _finding(
                name,
                kind,
                "hot_key",
                f"one row or a few keys of {name} from {start} take the load: contention "
                "on the same rows, not a key-design problem. Spread that row's writes "
                "(split a counter or a status row into N rows keyed by a "
                "shard_column(..., count=N) and sum them on read), batch or cache the "
                "writes, and keep its transactions short. No lint rule can see this.",
                rs,
                window,
                base_table=table.name,
                tenant=value_of(rs.first.start, "tenant"),
                shard=value_of(rs.first.start, "shard"),
            )
        )
    if group.rest.n:
        out.append(_classify_range(catalog, name, kind, cols, table, group.rest, window))
    return out


#: what a key part's values showed, where its declaration did not say it grows
HELD = {
    "uuid7": "time-ordered UUIDs (version 6 or 7)",
    "ulid": "ULIDs (time-ordered)",
    "time_prefix": "values led by a time",
}


def _held(role: str, col: Column[Any]) -> str:
    """`` (its split keys hold ...)`` where the values, not the declaration, show growth."""
    return f" (its split keys hold {HELD[role]})" if role in HELD and role_of(col) != role else ""


def _classify_range(
    catalog: Catalog,
    name: str,
    kind: str,
    cols: list[tuple[Column[Any], bool]],
    table: Any,
    rows: Rows,
    window: str,
) -> HotspotFinding:
    roles = rows.roles(cols)  # declared, or what the split keys hold
    mono = next((i for i, r in enumerate(roles) if r in MONOTONIC_ROLES), None)
    shard_pos = 0 if roles and roles[0] == "shard" else None
    tenant_pos = next((i for i, r in enumerate(roles) if r == "tenant"), None)
    tenants = rows.tenants
    shards = sorted(rows.shards)
    top_tenant, top_n = tenants.most_common(1)[0] if tenants else (None, 0)
    shard_load: Counter[Any] = Counter()
    for (t, v), score in rows.tenant_shard.items():
        if top_tenant is None or t == top_tenant:
            shard_load[v] += score
    hottest_shard = shard_load.most_common(1)[0][0] if shard_load else None
    common = dict(
        base_table=table.name,
        shards=shards,
        roles={c.name: r for (c, _), r in zip(cols, roles, strict=True)},
    )
    if mono is None:
        reasons = sorted(rows.reasons)
        v1 = next((c.name for (c, _), r in zip(cols, roles, strict=True) if r == "uuid1"), None)
        if v1 is not None:
            return _finding(
                name,
                kind,
                "unknown",
                f"{name} is hot where new rows go, and {v1} holds version-1 UUIDs (its split "
                f"keys show them): {UUID1_KEYS}"
                + (f" (Spanner says: {', '.join(reasons)})" if reasons else "")
                + f". It is not a key that grows at its end: no shard column over {v1} and "
                f"no bigger count is the fix. Make the new ids version 4 (uuid.uuid4(): "
                "random, the inserts spread over the key space; the rows written stay as "
                "they are), or version 7 behind a leading shard column if reads need them "
                "in time order.",
                rows,
                window,
                tenant=top_tenant,
                column=v1,
                **common,
            )
        return _finding(
            name,
            kind,
            "unknown",
            f"{name} is hot over a range no key part explains"
            + (f" (Spanner says: {', '.join(reasons)})" if reasons else "")
            + ": look for scans over it (LARGE_SCAN_HOT_SPOT: add an index, narrow the "
            "query) or a burst of writes to existing keys; Query and Lock Insights show which.",
            rows,
            window,
            tenant=top_tenant,
            **common,
        )
    mcol = cols[mono][0]
    hot_col = mcol.name
    said = hot_col + _held(roles[mono], mcol)  # the column, and why it grows
    sources = (
        [_attr(catalog, cols[tenant_pos][0])]
        if tenant_pos is not None and tenant_pos < mono
        else []
    )
    sources.append(_attr(catalog, mcol))
    src = ", ".join(repr(s) for s in sources)
    if shard_pos is not None:
        scol = cols[0][0]
        spec = scol.info.get(INFO_KEY)
        count = getattr(spec, "count", None) or 0
        per_end: Counter[Any] = Counter()
        for (end, t), score in rows.end_tenant.items():
            if top_tenant is None or t == top_tenant:
                per_end[end] += score
        load = max(per_end.values(), default=0)
        suggested = max(2 * count, int(math.ceil(load / 50 / 10.0)) * 10, 10)
        reshard = (
            f"raise the count of {scol.name} to about {suggested} (shard_column(..., "
            f"count={suggested})) and reshard: a new shard column with the bigger count, "
            "op.backfill_shard(...), the new ShardedIndex, then drop the old column and index "
            f"({MIGRATIONS}); presplit the new shards before switching traffic"
        )
        if top_tenant is not None and top_n * 2 >= rows.n:
            return _finding(
                name,
                kind,
                "tenant_skew",
                f"tenant {top_tenant!r} is hot where its new rows go, in {len(shards)} of "
                f"the {count} shards of {name}: {count} shards are too few for "
                f"that tenant's write rate. {reshard[0].upper()}{reshard[1:]}. "
                "Simulate the new count first (sharded-orm simulate with that tenant's "
                "weight). No lint rule can see a rate.",
                rows,
                window,
                tenant=top_tenant,
                shard=hottest_shard,
                column=hot_col,
                **common,
            )
        return _finding(
            name,
            kind,
            "monotonic",
            f"every shard of {scol.name} is hot where new rows go ({said} grows): {count} "
            f"shards are too few for the write rate. {reshard[0].upper()}{reshard[1:]}.",
            rows,
            window,
            tenant=top_tenant,
            shard=hottest_shard,
            column=hot_col,
            **common,
        )
    tenant = top_tenant if mono > 0 else None
    if kind == "index":
        index_rule = "SO102" if mono == 0 else "SO107"
        index_cols = ", ".join(repr(c.name) for c, _ in cols[: mono + 1])
        return _finding(
            name,
            kind,
            "unsharded_index",
            f"index {name} has no shard column and {said} "
            + ("leads it" if mono == 0 else f"follows {', '.join(c.name for c, _ in cols[:mono])}")
            + ": every insert lands at the same end of "
            + (
                "the index"
                if mono == 0
                else f"each value's range (tenant {tenant!r} is the busy one)"
            )
            + f'. Make it a ShardedIndex({name!r}, {index_cols}, shard="ShardId") with '
            f"ShardId = shard_column({src}, count=N) (about 10 x the node count). "
            f"Lint rule {index_rule} flags this index.",
            rows,
            window,
            tenant=tenant,
            column=hot_col,
            rule=index_rule,
            **common,
        )
    pattern = "sequence" if roles[mono] == "counter" else "monotonic"
    rule: str | None = "SO101" if mono == 0 else ("SO108" if pattern == "sequence" else None)
    if pattern == "sequence":
        fix = (
            f"{table.name}.{hot_col} comes from a plain counter and "
            + (
                "leads the key"
                if mono == 0
                else "follows " + ", ".join(c.name for c, _ in cols[:mono])
            )
            + ": every insert appends at the end. Use bit-reversed ids: "
            "BitReversedPrimaryKeyMixin (IDENTITY bit_reversed_positive), SpannerSequence, or "
            "TableSequence(bit_reversed=True); or a UUID v4 key. Presplit the new key space "
            "before a bulk load."
        )
    else:
        fix = (
            f"the key of {table.name} "
            + (
                f"starts with {said}"
                if mono == 0
                else f"has {said} after " + ", ".join(c.name for c, _ in cols[:mono])
            )
            + ", which grows with time: every insert goes to the same end"
            + (f" (of tenant {tenant!r}'s keys)" if tenant is not None else "")
            + f". Lead the key with a shard column: ShardId = shard_column({src}, count=N) "
            "(about 10 x the node count) as the first primary key part, or put a spread "
            "column (UserId, a UUID v4) first."
        )
    if rule:
        fix += f" Lint rule {rule} flags this key."
    return _finding(
        name, kind, pattern, fix, rows, window, tenant=tenant, column=hot_col, rule=rule, **common
    )
