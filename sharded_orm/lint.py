"""A schema linter for hotspots, reading the real models.

Spanner's migration tool flags any TIMESTAMP in a key, so ``(UserId, Timestamp)``, which
the seeds recommend, is a false positive. These rules look at what matters: the *first*
part of each key and index, and whether a shard leads. Each finding cites the best
practice and names the fix.

Silence a rule for one table with ``__table_args__ = {"info": {LINT_IGNORE: ["SO104"]}}``
(``LINT_IGNORE`` is ``"sharded_orm.lint.ignore"``).

==========  ========  =====================================================================
rule        severity  finding
==========  ========  =====================================================================
SO101       error     the primary key starts with a monotonic value (TIMESTAMP/DATE, a
                      non-bit-reversed sequence, a time-ordered UUID v1/v6/v7)
SO102       error     a non-interleaved index starts with a monotonic column
SO103       error     an index holds a shard column, but not first
SO104       advice    a timestamp key part is ascending (newest-first reads want DESC)
SO105       error     a foreign key to a hashed-key table carries only ``id``
SO106       warning   a shard column with a count of 1 (no sharding at all)
SO107       warning   an unsharded index with a monotonic column behind its first ones:
                      each value of the leading columns (a big tenant) is its own hotspot
==========  ========  =====================================================================
"""

from __future__ import annotations

import types
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Column, Index, MetaData, Sequence, Table
from sqlalchemy import types as sqltypes
from sqlalchemy.sql.elements import UnaryExpression

from .columns import INFO_KEY, is_shard_column
from .errors import ShardConfigError
from .keys import is_descending

LINT_IGNORE = "sharded_orm.lint.ignore"
SEVERITIES = ("error", "warning", "advice")
SEED = "Spanner schema design best practices"


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    table: str
    target: str  # "table", "index <name>" or "column <name>"
    message: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.severity.upper():7} {self.rule} {self.table}: {self.target}: {self.message}"


def _base_type(col: Column[Any]) -> Any:
    t = col.type
    return t.impl_instance if isinstance(t, sqltypes.TypeDecorator) else t


def _is_time(col: Column[Any]) -> bool:
    return isinstance(_base_type(col), (sqltypes.DateTime, sqltypes.Date))


def _uuid_version_of_default(col: Column[Any]) -> int | None:
    default = col.default
    if default is None or not getattr(default, "is_callable", False):
        return None
    try:
        value = default.arg(None)  # type: ignore[attr-defined]
        return uuid.UUID(str(value)).version
    except Exception:
        return None


def monotonic_reason(col: Column[Any]) -> str | None:
    """Why ``col`` grows with time, or None."""
    if is_shard_column(col):
        return None
    if _is_time(col):
        return f"{type(_base_type(col)).__name__} values grow with time"
    version = _uuid_version_of_default(col)
    if version in (1, 6, 7):
        return f"UUID version {version} starts with a timestamp"
    if isinstance(_base_type(col), sqltypes.Integer):
        if isinstance(col.default, Sequence):
            return "it is filled from a sequence counter"
        if col.info.get("sharded_orm.sequential"):
            return "it is marked sequential"
    return None


def _first_column(index: Index) -> Column[Any] | None:
    exprs = list(index.expressions)
    if not exprs:
        return None
    first = exprs[0]
    first = first.element if isinstance(first, UnaryExpression) else first
    return first if isinstance(first, Column) else None


def _hashed_tables(tables: Iterable[Table]) -> set[Table]:
    out = set()
    for t in tables:
        h = t.c.get("hashed_id")
        if h is not None and h.primary_key and is_shard_column(h) and "id" in t.c:
            out.add(t)
    return out


def lint_table(table: Table, hashed: set[Table] | None = None) -> list[Finding]:
    findings: list[Finding] = []
    ignore = set(table.info.get(LINT_IGNORE, ()))

    def add(rule: str, severity: str, target: str, message: str) -> None:
        if rule not in ignore:
            findings.append(Finding(rule, severity, table.name, target, message))

    pk = list(table.primary_key.columns)
    if pk:
        reason = monotonic_reason(pk[0])
        if reason:
            add(
                "SO101",
                "error",
                f"column {pk[0].name}",
                f"the primary key starts with {pk[0].name}, and {reason}: every insert goes to "
                f"the last split ({SEED}: don't start a key with a monotonic value). Lead the "
                "key with a shard_column(...) over it, a UUID v4, or a bit-reversed id.",
            )
        for col in pk[1:]:
            if (
                _is_time(col)
                and not is_descending(col)
                and "SO101" not in [f.rule for f in findings]
            ):
                add(
                    "SO104",
                    "advice",
                    f"column {col.name}",
                    f"{col.name} is an ascending key part; if newest-first reads are the norm, "
                    f"declare it descending (key_column(..., descending=True)): {SEED}, "
                    "descending timestamp keys.",
                )
    for index in sorted(table.indexes, key=lambda i: str(i.name)):
        first = _first_column(index)
        opts: Any = index.dialect_options.get("spanner", {})  # .get never loads a dialect
        # an interleaved index starts with its parent's key: spread by the parent
        if first is not None and not opts.get("interleave_in"):
            reason = monotonic_reason(first)
            if reason:
                add(
                    "SO102",
                    "error",
                    f"index {index.name}",
                    f"index {index.name} starts with {first.name}, and {reason}: the index is a "
                    f"hotspot of its own ({SEED}: indexes on monotonic columns). Lead it with a "
                    "shard column: ShardedIndex(..., shard=...).",
                )
        cols = list(index.columns)
        if (
            first is not None
            and not opts.get("interleave_in")
            and not monotonic_reason(first)
            and not any(is_shard_column(c) for c in cols)
        ):
            later = next((c for c in cols[1:] if monotonic_reason(c)), None)
            if later is not None:
                add(
                    "SO107",
                    "warning",
                    f"index {index.name}",
                    f"index {index.name} orders {later.name} after "
                    f"{', '.join(c.name for c in cols[: cols.index(later)])}: every value of "
                    "those columns writes at the end of its own range, so a busy one (a large "
                    f"tenant) is a hotspot ({SEED}: shard timestamp-ordered indexes). Lead the "
                    "index with a shard column: ShardedIndex(..., shard=...).",
                )
        for pos, col in enumerate(cols):
            if pos > 0 and is_shard_column(col):
                add(
                    "SO103",
                    "error",
                    f"index {index.name}",
                    f"shard column {col.name} is at position {pos + 1} of index {index.name}; a "
                    "shard spreads writes only when it comes first. Use ShardedIndex, which "
                    "always puts it first.",
                )
    for col in table.columns:
        spec = col.info.get(INFO_KEY) if col.info else None
        if spec is not None and spec.count == 1:
            add(
                "SO106",
                "warning",
                f"column {col.name}",
                f"shard column {col.name} has count=1: every row is in shard 0, which shards "
                "nothing. Use about 10 x the node count.",
            )
    for fk in table.foreign_key_constraints:
        target = fk.referred_table
        if hashed is not None and target in hashed:
            referred = {e.column.name for e in fk.elements}
            if "hashed_id" not in referred:
                add(
                    "SO105",
                    "error",
                    f"column {', '.join(c.name for c in fk.columns)}",
                    f"references {target.name} by id alone, but its key is (hashed_id, id): "
                    "every lookup and join would scan. Carry both columns: "
                    "hashed_reference(...).",
                )
    return findings


def metadata_of(obj: Any) -> MetaData:
    """The MetaData of a MetaData, a declarative base, or a module (its one MetaData)."""
    if isinstance(obj, MetaData):
        return obj
    md = getattr(obj, "metadata", None)
    if isinstance(md, MetaData):
        return md
    if isinstance(obj, types.ModuleType):
        found = {id(v): v for v in vars(obj).values() if isinstance(v, MetaData)}
        for v in vars(obj).values():
            m = getattr(v, "metadata", None)
            if isinstance(v, type) and isinstance(m, MetaData):
                found[id(m)] = m
        if len(found) == 1:
            return next(iter(found.values()))
        if found:
            raise ShardConfigError(
                f"module {obj.__name__} has {len(found)} MetaData objects: name one (module:attr)"
            )
    raise ShardConfigError(f"{obj!r} is not a MetaData, a declarative base, or a module with one")


def lint(target: Any) -> list[Finding]:
    """Findings for a ``MetaData``, a declarative base, or a module holding ``metadata``."""
    md = metadata_of(target)
    if not md.tables:
        raise ShardConfigError("the metadata has no tables: nothing to lint")
    tables = list(md.sorted_tables)
    hashed = _hashed_tables(tables)
    findings: list[Finding] = []
    for t in tables:
        findings.extend(lint_table(t, hashed))
    return findings
