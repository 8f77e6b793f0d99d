"""What a merge cost (``MergeStats``), as ``merged(stats=...)`` and ``Page.stats`` report it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FoundBound:
    """A bound the statement found itself (in ``MergeStats.bounds``): the last of the
    first ``k`` sort keys of the round before it, in the same statement."""

    k: int


@dataclass
class MergeStats:
    """What a merge cost.

    ``statements``: statements sent. ``rows_transferred``: full rows (the user's rows)
    that came back. ``key_rows_transferred``: sort-key rows of the bound round.
    ``server_rows_read``: an upper bound of the index entries read: each branch is an
    index range read that stops at its LIMIT, or, for a shard known to hold no more rows
    up to the bound than round 1 saw, at the bound. ``rounds``: per round of branches
    (a statement may hold two), ``{shard: rows the branch may give}`` (on Spanner one
    correlated LIMIT serves every shard: the largest). ``bounds``: per round, the sort
    values its branches stop at (None: no bound; ``FoundBound``: the statement found them
    itself), so that the index entries actually read can be counted where the data is
    known (``benchmarks/bench_query.py`` does). ``plan``: the plan the cost rule took
    (``PLANS``); ``consistency_retries``: reads repeated because the rows changed between
    two statements. ``shapes_built``: statement shapes this read built; a shape is
    built once per (statement, shard count, plan) and reused with each read's values,
    so a repeated read builds none (``sharded_orm.read.branches.SHAPES``).
    """

    statements: int = 0
    rows_transferred: int = 0
    key_rows_transferred: int = 0
    server_rows_read: int = 0
    rounds: list[dict[int, int]] = field(default_factory=list)
    bounds: list[list[Any] | FoundBound | None] = field(default_factory=list)
    plan: str = ""
    consistency_retries: int = 0
    shapes_built: int = 0

    def add_bound_round(self, shards: Sequence[int], b: int) -> None:
        """A bound round: every shard's branch reads its first ``b`` keys, to no bound."""
        self.server_rows_read += b * len(shards)
        self.rounds.append(dict.fromkeys(shards, b))
        self.bounds.append(None)

    def figures(self) -> dict[str, Any]:
        """What a trace records of the read (``sharded_orm.telemetry``)."""
        found = [b for b in self.bounds if b is not None]
        return {
            "plan": self.plan,
            "statements": self.statements,
            "rows_transferred": self.rows_transferred,
            "key_rows_transferred": self.key_rows_transferred,
            "server_rows_read": self.server_rows_read,
            "bound_found": (
                "in the statement" if any(isinstance(b, FoundBound) for b in found)
                else "by a bound round" if found else "none"
            ),
            "consistency_retries": self.consistency_retries,
            "shapes_built": self.shapes_built,
        }  # fmt: skip


#: the plans a read takes (``MergeStats.plan``; docs/queries.md says when)
PLANS = (
    "point",  # the WHERE names one shard: one branch
    "one statement",  # every shard's first k rows, merged by the database
    "probe",  # every shard's first few rows, exact when no shard gave them all
    "probe, then two rounds",
    "two rounds",  # a key-only bound round, then the rows up to its bound
    "two rounds in one statement",  # Spanner: the bound round inside the rows statement
    "page bound",  # a later page, bounded by a key an earlier page's round found
)
