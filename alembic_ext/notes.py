"""A comment in a generated revision, where a step has nothing to run in that direction.

The contract's fill before its NOT NULL (``CompleteShardOp``) reverses into one: the
downgrade makes the column nullable again, and the rows keep their shard, so a backfill
there would walk the whole table for nothing. The revision says so instead
(``# sharded_orm: nothing to undo for the fill of T.C: ...``, docs/adopting.md §6).
"""

from __future__ import annotations

from typing import Any

from alembic.operations.ops import MigrateOperation


class NoteOp(MigrateOperation):
    """Rendered as ``# sharded_orm: <text>``; never executed."""

    def __init__(self, text: str) -> None:
        self.text = text

    def reverse(self) -> MigrateOperation:
        return self

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("sharded_orm_note", self.text)
