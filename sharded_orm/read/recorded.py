"""What a sharded read is recorded under (``sharded_orm.telemetry``): its bind and table,
told before the read's own checks run (a refused read is a span too), and its figures as
one read's, summed into a ``MergeStats`` the caller passes to several reads."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from sqlalchemy.orm import Session

from sharded_orm.read.context import bind_arguments_of
from sharded_orm.read.plan import plan_of
from sharded_orm.read.stats import MergeStats

__all__ = ["add_stats", "operation_target"]


def operation_target(conn: Any, stmt: Any) -> tuple[Any, str | None]:
    """``(bind, table name)`` a read of ``stmt`` through ``conn`` is recorded under, as
    far as they can be told before the read's own checks (which may refuse it)."""
    plan = plan_of(stmt)
    bind = conn
    if isinstance(conn, Session) and plan is not None:
        try:  # the bind the statement runs on: a Session bound per mapper has several
            bind = conn.get_bind(**bind_arguments_of(stmt))
        except Exception:  # no bind: the read's own checks say so, with their error
            bind = None
    return bind, None if plan is None else plan.table.name


def add_stats(into: MergeStats, got: MergeStats) -> None:
    """Add one read's figures ``got`` to ``into`` (a MergeStats passed to several reads
    sums them; its plan is the last read's)."""
    if into is got:
        return
    for f in fields(MergeStats):
        value = getattr(got, f.name)
        if isinstance(value, list):
            getattr(into, f.name).extend(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            setattr(into, f.name, getattr(into, f.name) + value)
        else:
            setattr(into, f.name, value)
