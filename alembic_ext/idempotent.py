"""DDL made safe to send again: a migration that failed half way is run again whole.

Spanner applies a schema change statement by statement, so after a failure some of a
batch may be applied. Each statement the impl sends is made a no-op when already applied
where Spanner has the clause (checked on the emulator): ``CREATE TABLE IF NOT EXISTS``,
``CREATE [UNIQUE] [NULL_FILTERED] INDEX IF NOT EXISTS``, ``ALTER TABLE ... ADD COLUMN IF
NOT EXISTS``, ``DROP TABLE IF EXISTS``, ``DROP INDEX IF EXISTS``. A construct says so
with its own flag (:func:`rerunnable`: SQLAlchemy's ``CreateTable``/``CreateIndex``
``if_not_exists`` and ``DropTable``/``DropIndex`` ``if_exists``, Alembic's ``AddColumn``
``if_not_exists``), which the dialect renders, in ``--sql`` output too. Only DDL given as
text (``op.execute("CREATE INDEX ...")``, ``sa.text``, ``DDL(...)``) has no flag to set:
:func:`idempotent_sql` adds the clause to such a statement's head. Spanner has none for
``DROP COLUMN`` (refused: "Syntax error"), CHECK constraints or stored columns: the impl
checks INFORMATION_SCHEMA online for those. :func:`is_ddl` tells a schema change from a
data statement.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import sqlalchemy as sa
from alembic.ddl.base import AddColumn
from sqlalchemy.schema import (
    DDL,
    CreateIndex,
    CreateTable,
    DropIndex,
    DropTable,
    ExecutableDDLElement,
)

__all__ = ["idempotent_sql", "is_ddl", "is_text_ddl", "rerunnable"]

_DDL = re.compile(r"^\s*(CREATE|ALTER|DROP)\b", re.IGNORECASE)
#: (pattern, replacement) making a text statement a no-op when already applied.
_IDEMPOTENT = [
    (re.compile(r"^(\s*CREATE\s+TABLE\s+)(?!IF\s)", re.I), r"\1IF NOT EXISTS "),
    (
        re.compile(r"^(\s*CREATE\s+(?:UNIQUE\s+)?(?:NULL_FILTERED\s+)?INDEX\s+)(?!IF\s)", re.I),
        r"\1IF NOT EXISTS ",
    ),
    (re.compile(r"^(\s*DROP\s+(?:TABLE|INDEX)\s+)(?!IF\s)", re.I), r"\1IF EXISTS "),
    (re.compile(r"^(\s*ALTER\s+TABLE\s+\S+\s+ADD\s+COLUMN\s+)(?!IF\s)", re.I), r"\1IF NOT EXISTS "),
]
#: constructs with a flag for Spanner's IF NOT EXISTS / IF EXISTS, by flag
_IF_NOT_EXISTS = (CreateTable, CreateIndex, AddColumn)
_IF_EXISTS = (DropTable, DropIndex)


def rerunnable(construct: Any) -> Any:
    """``construct``, or a copy of it with its own ``if_not_exists``/``if_exists`` set.

    The caller's object is left as it was (a construct may be executed elsewhere too).
    """
    for kinds, flag in ((_IF_NOT_EXISTS, "if_not_exists"), (_IF_EXISTS, "if_exists")):
        if isinstance(construct, kinds) and not getattr(construct, flag):
            construct = copy.copy(construct)
            setattr(construct, flag, True)
    return construct


def idempotent_sql(sql: str) -> str:
    """Text DDL ``sql`` with Spanner's ``IF [NOT] EXISTS`` where the statement kind has one.

    For statements given as text only (:func:`is_text_ddl`); a construct sets its own
    flag (:func:`rerunnable`).
    """
    for pattern, repl in _IDEMPOTENT:
        sql = pattern.sub(repl, sql, count=1)
    return sql


def is_text_ddl(construct: Any) -> bool:
    """Whether ``construct`` is a schema change given as SQL text (no flag to set)."""
    if isinstance(construct, DDL):
        return True
    return isinstance(construct, sa.TextClause) and bool(_DDL.match(construct.text))


def is_ddl(construct: Any) -> bool:
    return isinstance(construct, ExecutableDDLElement) or is_text_ddl(construct)
