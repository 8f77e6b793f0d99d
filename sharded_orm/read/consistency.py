"""Whether a merge's rows statement saw the rows its bound round counted.

The two statements of a merge share a snapshot in a Spanner transaction (read-write or
read-only). Under AUTOCOMMIT each reads its own, and so does each statement under READ
COMMITTED elsewhere: a row written between them can make the rows statement's branches
cut a shard short, or leave fewer rows up to the bound than the bound round counted.
Each branch may then give one row more than the bound round saw, and the rows statement
returns each row's shard: where the rows cannot be the first ``n``, the merge reads
again (``sharded_orm.read.merge``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sharded_orm.errors import ShardReadError

T = TypeVar("T")


class RowsChanged(Exception):
    """The rows statement saw rows the bound round did not (or lost some it saw)."""


#: a merge whose two statements see different rows (no common snapshot: autocommit, or
#: READ COMMITTED) is read again this many times in all before it gives up
CONSISTENT_ATTEMPTS = 3


def rows_are_whole(shards: Sequence[int], limits: dict[int, int], top: int | None, n: int) -> bool:
    """Whether rows from branches limited to ``limits`` ({shard: LIMIT}; ``top``: one LIMIT
    for every shard), whose shards in order are ``shards``, are the first ``n`` rows.

    A branch holds a shard's first rows. One that gave its whole LIMIT may have left out
    rows sorting after its last: harmless if that last row is the last one kept, while
    ``n`` rows came back. With one more row allowed per branch than the bound round saw,
    that never happens when both statements see the same rows."""
    seen: Counter[int] = Counter()
    end = len(shards) - 1
    for pos, s in enumerate(shards):
        seen[s] += 1
        if seen[s] == (top if top is not None else limits.get(s, 0)) and (
            pos < end or len(shards) < n
        ):
            return False
    return True


def read_again(attempt: Callable[[], T], stats: Any = None) -> T:
    """``attempt()``, run again while it raises ``RowsChanged``, ``CONSISTENT_ATTEMPTS``
    times in all (each repeat counted in ``stats.consistency_retries``); then a
    ``ShardReadError``."""
    for i in range(CONSISTENT_ATTEMPTS):
        if i and stats is not None:
            stats.consistency_retries += 1
        try:
            return attempt()
        except RowsChanged:
            continue
    raise ShardReadError(
        f"merged()/page(): the rows changed between the bound round and the rows statement "
        f"on {CONSISTENT_ATTEMPTS} attempts (each statement saw its own snapshot). Nothing "
        "was written. Read in one transaction, so both statements see one snapshot: on "
        "Spanner a read-only one (connection.execution_options(read_only=True), not "
        "AUTOCOMMIT), elsewhere REPEATABLE READ or SERIALIZABLE."
    )
