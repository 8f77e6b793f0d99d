"""The cost rule's plans, each forced: test tables are small, and would otherwise only
ever take the one-statement rule (``sharded_orm.read.branches``). And a page walk."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from sharded_orm import page
from sharded_orm.read import branches

#: {name: (SINGLE_STATEMENT_READS, PROBE_SHARE)}
PLANS = {
    "rule": (branches.SINGLE_STATEMENT_READS, branches.PROBE_SHARE),
    "two rounds": (0, 10**9),
    "probe": (0, 1),
}


@contextmanager
def forced(plan: str) -> Iterator[None]:
    reads, share = PLANS[plan]
    with (
        mock.patch.object(branches, "SINGLE_STATEMENT_READS", reads),
        mock.patch.object(branches, "PROBE_SHARE", share),
    ):
        yield


def walk(conn: Any, stmt: Any, size: int, pages: int = 100) -> list[Any]:
    """Every page of ``stmt`` (at most ``pages``: a walk that does not end fails), each
    in at most two statements."""
    out: list[Any] = []
    cursor = None
    for _ in range(pages):
        p = page(conn, stmt, size, cursor)
        assert p.stats.statements <= 2
        out += p.rows
        cursor = p.next_cursor
        if cursor is None:
            return out
    raise AssertionError(f"the walk did not end after {pages} pages")
