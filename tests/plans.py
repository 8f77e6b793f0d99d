"""The cost rule's plans, each forced: test tables are small, and would otherwise only
ever take the one-statement rule (``sharded_orm.read.branches``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

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
