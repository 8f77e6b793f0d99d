"""DDL made safe to send again: a migration that failed half way is run again whole.

Spanner applies a schema change statement by statement, so after a failure some of a
batch may be applied; each statement the impl sends is rewritten with Spanner's ``IF NOT
EXISTS`` / ``IF EXISTS`` where the statement kind has one (tables, indexes, ADD COLUMN),
and :func:`is_ddl` tells a schema change from a data statement.
"""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa
from sqlalchemy.schema import ExecutableDDLElement

__all__ = ["idempotent_sql", "is_ddl"]

_DDL = re.compile(r"^\s*(CREATE|ALTER|DROP)\b", re.IGNORECASE)
#: (pattern, replacement) making a statement a no-op when already applied.
_IDEMPOTENT = [
    (re.compile(r"^(\s*CREATE\s+TABLE\s+)(?!IF\s)", re.I), r"\1IF NOT EXISTS "),
    (
        re.compile(r"^(\s*CREATE\s+(?:UNIQUE\s+)?(?:NULL_FILTERED\s+)?INDEX\s+)(?!IF\s)", re.I),
        r"\1IF NOT EXISTS ",
    ),
    (re.compile(r"^(\s*DROP\s+(?:TABLE|INDEX)\s+)(?!IF\s)", re.I), r"\1IF EXISTS "),
    (re.compile(r"^(\s*ALTER\s+TABLE\s+\S+\s+ADD\s+COLUMN\s+)(?!IF\s)", re.I), r"\1IF NOT EXISTS "),
]


def idempotent_sql(sql: str) -> str:
    """``sql`` with Spanner's ``IF [NOT] EXISTS`` where the statement kind has one."""
    for pattern, repl in _IDEMPOTENT:
        sql = pattern.sub(repl, sql, count=1)
    return sql


def is_ddl(construct: Any) -> bool:
    if isinstance(construct, ExecutableDDLElement):
        return True
    return isinstance(construct, sa.TextClause) and bool(_DDL.match(construct.text))
