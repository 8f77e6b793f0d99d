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
SO101       error     the primary key's leading part (the first that varies) is monotonic
                      (TIMESTAMP/DATE, a non-bit-reversed sequence, a UUID v1/v6/v7)
SO102       error     a non-interleaved index starts with a monotonic column
SO103       error     an index holds a shard column, but not first
SO104       advice    a timestamp key part is ascending (newest-first reads want DESC)
SO105       error     a foreign key to a hashed-key table carries only ``id``
SO106       warning   a shard column with a count of 1 (no sharding at all)
SO107       warning   an unsharded index with a monotonic column behind its first ones:
                      each value of the leading columns (a big tenant) is its own hotspot
SO108       warning   a primary key part after the first filled from a plain counter (a
                      sequence that is not bit-reversed): each leading value appends at its
                      own end
SO109       advice    IDENTITY / autoincrement keys while the metadata does not declare the
                      database's ``default_sequence_kind``
==========  ========  =====================================================================
"""

from __future__ import annotations

import itertools
import types
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Column, Index, MetaData, Table
from sqlalchemy import Sequence as SASequence
from sqlalchemy import types as sqltypes
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import UnaryExpression, _textual_label_reference

from sharded_orm.errors import ShardConfigError, ShardTypeError
from sharded_orm.schema.coerce import base_type
from sharded_orm.schema.columns import INFO_KEY, is_shard_column
from sharded_orm.schema.keys import is_descending

LINT_IGNORE = "sharded_orm.lint.ignore"
#: MetaData.info key declaring the database's default_sequence_kind (silences SO109)
SEQUENCE_KIND_KEY = "sharded_orm.default_sequence_kind"
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


def _is_time(col: Column[Any]) -> bool:
    return isinstance(base_type(col.type), (sqltypes.DateTime, sqltypes.Date))


_TIME_ORDERED_UUID_FUNCS = {"uuid1": 1, "uuid6": 6, "uuid7": 7}


def default_function(col: Column[Any]) -> Any:
    """The user's own callable behind a column's Python-side default, or None."""
    default = col.default
    if default is None or not getattr(default, "is_callable", False):
        return None
    fn = default.arg  # type: ignore[attr-defined]
    return getattr(fn, "__wrapped__", fn)  # SQLAlchemy wraps no-argument callables


def uuid_default_version(col: Column[Any]) -> int | None:
    """The UUID version a column's default makes, if it makes UUIDs.

    Known generators (``uuid.uuid1/4``, ``uuid6``/``uuid7`` from any module) are recognised
    by name; other plain functions are called once to look at a sample value. Bound methods
    (a sequence's ``next_id``, say) are never called: they may reserve ids in a database.
    """
    fn = default_function(col)
    if fn is None:
        return None
    name = getattr(fn, "__name__", "")
    if name in _TIME_ORDERED_UUID_FUNCS:
        return _TIME_ORDERED_UUID_FUNCS[name]
    if fn is uuid.uuid4:
        return 4
    if not isinstance(fn, types.FunctionType):
        return None
    try:
        wrapped = col.default.arg is not fn  # type: ignore[union-attr]
        value = fn() if wrapped else fn(None)
        return uuid.UUID(str(value)).version
    except Exception:
        return None


def counter_reason(col: Column[Any]) -> str | None:
    """Why an integer column is filled from a plain, growing counter, or None.

    Spanner renders ``Sequence`` and ``Identity`` as ``bit_reversed_positive``, so those
    spread; a client-side counter (``TableSequence.next_id``, ``itertools.count``) does not.
    """
    if col.info.get("sharded_orm.sequential"):
        return "it is marked sequential (info['sharded_orm.sequential'])"
    fn = default_function(col)
    owner = getattr(fn, "__self__", None)
    if type(owner).__name__ == "TableSequence" and not getattr(owner, "bit_reversed", True):
        return "its default is a TableSequence without bit_reversed=True, a plain counter"
    if isinstance(owner, itertools.count):
        return "its default is an itertools.count counter"
    return None


def monotonic_reason(col: Column[Any]) -> str | None:
    """Why ``col`` grows (or shrinks) with time, or None."""
    if is_shard_column(col):
        return None
    if _is_time(col):
        return f"{type(base_type(col.type)).__name__} values grow with time"
    version = uuid_default_version(col)
    if version in (1, 6, 7):
        return f"UUID version {version} starts with a timestamp"
    if isinstance(base_type(col.type), sqltypes.Integer):
        return counter_reason(col)
    return None


def index_parts(index: Index) -> list[tuple[Column[Any], bool]]:
    """(column, descending) for each part of ``index``, names in ``desc("x")`` resolved."""
    table = index.table
    parts = []
    for expr in index.expressions:
        desc = isinstance(expr, UnaryExpression) and expr.modifier is operators.desc_op
        col: Any = expr.element if isinstance(expr, UnaryExpression) else expr
        if isinstance(col, _textual_label_reference) and table is not None:
            name = str(col.element)
            col = table.c.get(name)
            if col is None:
                col = next((c for c in table.columns if c.name == name), None)
        if not isinstance(col, Column):
            raise ShardConfigError(f"index {index.name} has a part that is not a column: {expr}")
        parts.append((col, desc))
    return parts


def _constant(col: Column[Any]) -> bool:
    """A key part that does not spread rows: a shard column with count=1, or a column
    marked ``info["sharded_orm.constant"]`` (one value for every row, e.g. a schema version)."""
    spec = col.info.get(INFO_KEY) if col.info else None
    if spec is not None and spec.count == 1:
        return True
    return bool(col.info.get("sharded_orm.constant"))


def leading_part(columns: list[Column[Any]]) -> Column[Any] | None:
    """The first key part that can tell rows apart: parts before it never vary."""
    return next((c for c in columns if not _constant(c)), None)


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
    lead = leading_part(pk)
    if lead is not None:
        reason = monotonic_reason(lead)
        if reason:
            after = pk[: pk.index(lead)]
            starts = (
                f"starts with {lead.name}"
                if not after
                else f"starts with {lead.name} behind {', '.join(c.name for c in after)}, "
                "which never vary (a shard column with count=1, or marked "
                "info['sharded_orm.constant']),"
            )
            add(
                "SO101",
                "error",
                f"column {lead.name}",
                f"the primary key {starts} and {reason}: every insert goes to "
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
    for pos, col in enumerate(pk[1:], start=1):
        reason = counter_reason(col) if isinstance(base_type(col.type), sqltypes.Integer) else None
        if reason and col is not lead and not (lead is not None and is_shard_column(lead)):
            add(
                "SO108",
                "warning",
                f"column {col.name}",
                f"key part {pos + 1}, {col.name}, comes from a counter that is not "
                f"bit-reversed ({reason}): under each value of "
                f"{', '.join(c.name for c in pk[:pos])} every insert appends at the end, so a "
                "busy one is a hotspot. Use bit-reversed ids (BitReversedPrimaryKeyMixin, "
                "SpannerSequence, TableSequence(bit_reversed=True)) or a UUID v4.",
            )
    # an explicit autoincrement key with no Identity/Sequence is AUTO_INCREMENT (or IDENTITY
    # without a kind) on Spanner: both take the database's default_sequence_kind
    identity = [
        c
        for c in pk
        if c.autoincrement is True
        and c.identity is None
        and not isinstance(c.default, SASequence)
        and c.server_default is None
    ]
    kind_known = table.metadata.info.get(SEQUENCE_KIND_KEY) if table.metadata is not None else None
    if identity and not kind_known:
        add(
            "SO109",
            "advice",
            f"column {identity[0].name}",
            f"{identity[0].name} is an IDENTITY (auto-increment) key: Spanner needs the "
            "database option default_sequence_kind for IDENTITY or AUTO_INCREMENT columns "
            "declared without a kind. Run ALTER DATABASE ... SET OPTIONS "
            "(default_sequence_kind = 'bit_reversed_positive') and declare it with "
            f"MetaData(info={{{SEQUENCE_KIND_KEY!r}: 'bit_reversed_positive'}}).",
        )
    for index in sorted(table.indexes, key=lambda i: str(i.name)):
        opts: Any = index.dialect_options.get("spanner", {})  # .get never loads a dialect
        try:
            cols = [c for c, _ in index_parts(index)]
        except ShardConfigError:
            cols, first = list(index.columns), None
        else:
            # an interleaved index starts with its parent's key: spread by the parent
            first = None if opts.get("interleave_in") else leading_part(cols)
        # once per index: it may call the user's default function for a sample value
        reason = monotonic_reason(first) if first is not None else None
        if first is not None and reason:
            add(
                "SO102",
                "error",
                f"index {index.name}",
                f"index {index.name} starts with {first.name}, and {reason}: the index is a "
                f"hotspot of its own ({SEED}: indexes on monotonic columns). Lead it with a "
                "shard column: ShardedIndex(..., shard=...).",
            )
        if first is not None and not reason and not any(is_shard_column(c) for c in cols):
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


def index_warnings(index: Index) -> list[Finding]:
    """The findings of :func:`lint_table` about one index (Alembic writes them above
    ``op.create_index``)."""
    if not isinstance(index, Index):
        raise ShardTypeError(f"index_warnings takes a sqlalchemy Index, got {index!r}")
    table = index.table
    if not isinstance(table, Table):
        return []
    target = f"index {index.name}"
    return [f for f in lint_table(table) if f.target == target]


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
