"""The per-shard branches of a merge as one FROM whose SQL text does not grow with N.

On Spanner, ``N`` branches are one correlated subquery evaluated once per shard::

    UNNEST(GENERATE_ARRAY(0, N - 1)) AS so_shard_n,
    UNNEST(ARRAY(SELECT AS STRUCT ... WHERE shard = so_shard_n ... LIMIT @L)) AS name

(as the right side of a JOIN, the same two in parentheses with CROSS JOIN: the rows
statement joins them on the primary key with no subquery around them).

The text is the same for every ``N`` (only the literal ``N - 1`` changes), so the
Spanner DB-API's sqlparse pass over it, and SQLAlchemy's compile, cost the same at
N = 64 as at N = 2 (a ``UNION ALL`` of 64 branches is about 20 kB of text). Every shard
gets the same LIMIT: LIMIT takes a constant or a parameter, not a per-row expression.
Other dialects (SQLite has no arrays) get a ``UNION ALL`` of branches, each its own LIMIT.

A joined fan-out may also carry a bound round (``bound``: the ``K``-th sort key of every
shard's first ``b``, a ``SELECT AS STRUCT ... LIMIT 1 OFFSET K - 1``), evaluated once,
ahead of the branches, which then stop at that key ``BOUND_VAR`` (NULL, and no bound,
where fewer than ``K`` keys exist)::

    ((SELECT (<bound>) AS so_t) AS so_tt
     CROSS JOIN UNNEST(GENERATE_ARRAY(0, N - 1)) AS so_shard_n
     CROSS JOIN UNNEST(ARRAY(SELECT AS STRUCT ... AND (so_t IS NULL OR <at or before so_t>)
                             ...)) AS name)

Both rounds are then one statement: one snapshot, one round trip, one parse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import column
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.selectable import TableClause
from sqlalchemy.sql.visitors import InternalTraversal

#: the name the enclosing query gives each shard number; a branch's own columns must not
#: be called so (GoogleSQL resolves a name against the innermost FROM first)
SHARD_VAR = "so_shard_n"
#: the name of the bound a fan-out finds itself (a struct of the sort keys, ``so_k<i>``)
BOUND_VAR = "so_t"


def on_spanner(dialect: Any) -> bool:
    return str(getattr(dialect, "name", "")).startswith("spanner")


def correlated_ok(dialect: Any, froms: Sequence[Any]) -> bool:
    """Whether the correlated form is used: on Spanner, when no column of the branches'
    tables (``froms``: the statement's final FROMs) is named like the shard variable or
    the bound (it would shadow them)."""
    if not on_spanner(dialect):
        return False
    for frm in froms:
        for table in getattr(frm, "_from_objects", [frm]):
            for c in getattr(table, "c", ()):
                if str(getattr(c, "name", "")).lower() in (SHARD_VAR, BOUND_VAR):
                    return False
    return True


#: the most elements Spanner's GENERATE_ARRAY makes ("Cannot generate arrays with more
#: than 16000 elements", on the emulator)
SPANNER_ARRAY = 16000


def shard_numbers(count: int) -> str:
    """The shard numbers 0 to ``count - 1`` as an UNNEST: beyond ``SPANNER_ARRAY``, the
    sums of two generated arrays (the library accepts up to 65,536 shards)."""
    if count <= SPANNER_ARRAY:
        return f"UNNEST(GENERATE_ARRAY(0, {count - 1}))"
    size, high = SPANNER_ARRAY, (count - 1) // SPANNER_ARRAY
    return (
        f"UNNEST(ARRAY(SELECT so_h * {size} + so_l FROM UNNEST(GENERATE_ARRAY(0, {high})) "
        f"AS so_h, UNNEST(GENERATE_ARRAY(0, {size - 1})) AS so_l "
        f"WHERE so_h * {size} + so_l < {count}))"
    )


class FanOut(TableClause):
    """``N`` runs of ``inner`` (a ``SELECT AS STRUCT`` naming the shard ``SHARD_VAR``, and
    ``BOUND_VAR`` when ``bound`` is given), as a table ``name`` with ``columns``."""

    __visit_name__ = "sharded_orm_fan_out"
    inherit_cache = True
    _traverse_internals = [
        *TableClause._traverse_internals,
        ("inner", InternalTraversal.dp_clauseelement),
        ("count", InternalTraversal.dp_plain_obj),
        ("joined", InternalTraversal.dp_plain_obj),
        ("bound", InternalTraversal.dp_clauseelement),
    ]

    def __init__(
        self,
        name: str,
        columns: list[str],
        inner: Any,
        count: int,
        joined: bool = False,
        bound: Any = None,
    ) -> None:
        super().__init__(name, *(column(c) for c in columns))
        self.inner = inner
        self.count = count
        #: rendered as a parenthesized join: the right side of a JOIN
        self.joined = joined
        #: a SELECT AS STRUCT of the sort key (one row or none) bounding the branches (joined only)
        self.bound = bound


@compiles(FanOut)
def _compile_fan_out(element: FanOut, compiler: Any, **kw: Any) -> str:
    # made only for Spanner (``correlated_ok``), rendered as GoogleSQL whatever compiles
    # it: the ORM compiles parts of a statement on a default dialect (joined eager loads
    # with LIMIT), and ``str()`` shows what runs
    shards = f"{shard_numbers(int(element.count))} AS {SHARD_VAR}"
    if element.bound is not None:  # (its text, parameters included, comes first)
        bound = compiler.process(element.bound)
        shards = f"(SELECT ({bound}) AS {BOUND_VAR}) AS so_tt CROSS JOIN {shards}"
    inner = compiler.process(element.inner)
    name = compiler.preparer.quote(element.name)
    if element.joined:
        return f"({shards} CROSS JOIN UNNEST(ARRAY({inner})) AS {name})"
    return f"{shards}, UNNEST(ARRAY({inner})) AS {name}"
