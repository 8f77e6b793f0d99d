"""Where a copy stands: its saved cursor, and the rows it has left.

:func:`sharded_orm.load.copy.copy_table` walks the old table's key in its stored order.
With a ``cursor_table`` (:func:`cursor_table_ddl`) the key of the last row of each
committed batch is saved in the batch's own commit, and a run started again reads it
(:func:`saved_cursor`) and goes on after it. The Read API takes key values as it hands
them out (BYTES base64-encoded: :func:`read_api_value`, :func:`column_value`).

:func:`rows_after` counts what a run has to do: every row of a fresh copy, the rows past
the cursor (in key order, DESC parts included) of a resumed one, so that both report a
total, a percentage and the time left.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from sharded_orm.errors import ShardConfigError
from sharded_orm.load.verify import connect, quote
from sharded_orm.read.order import after_condition
from sharded_orm.schema.value_codec import ValueCodecError, loads_key

__all__ = [
    "CURSOR_COLUMNS",
    "column_value",
    "cursor_table_ddl",
    "read_api_value",
    "rows_after",
    "saved_cursor",
]

#: columns of a ``cursor_table`` (all ``STRING(MAX)``, key ``(Source, Target)``)
CURSOR_COLUMNS = ("Source", "Target", "Cursor")


def cursor_table_ddl(name: str) -> str:
    """The GoogleSQL ``CREATE TABLE IF NOT EXISTS`` of a ``cursor_table``."""
    s, t, c = (quote(n) for n in CURSOR_COLUMNS)
    return (
        f"CREATE TABLE IF NOT EXISTS {quote(name, 'table')} ({s} STRING(MAX) NOT NULL, "
        f"{t} STRING(MAX) NOT NULL, {c} STRING(MAX)) PRIMARY KEY ({s}, {t})"
    )


def read_api_value(value: Any) -> Any:
    """A value as Spanner's client reads it and takes it in a key (BYTES base64-encoded)."""
    return base64.b64encode(value) if isinstance(value, bytes) else value


def column_value(raw: Any) -> Any:
    """A value Spanner's client read as the column's value (only BYTES come as bytes)."""
    return base64.b64decode(raw) if isinstance(raw, bytes) else raw


def saved_cursor(bind: Any, table: str, src: str, dst: str, seconds: float) -> list[Any] | None:
    """The cursor ``table`` holds for the copy of ``src`` into ``dst`` (the old key of the
    last row copied, as the Read API takes it), or None: nothing saved, start over."""
    t = sa.table(table, *[sa.column(c) for c in CURSOR_COLUMNS])
    stmt = sa.select(t.c.Cursor).where(t.c.Source == src, t.c.Target == dst)
    with connect(bind) as conn:
        text = conn.execution_options(timeout=seconds).execute(stmt).scalar()
    if text is None:
        return None
    try:
        values = loads_key(text)
    except ValueCodecError as e:
        raise ShardConfigError(
            f"the cursor {table} holds for the copy of {src} into {dst} cannot be read ({e}). "
            f"Delete its row (Source {src!r}, Target {dst!r}) and run the copy again: it "
            "starts over, rewriting what it copied"
        ) from None
    if text.lstrip().startswith("["):  # saved before the codec: BYTES as the wire has them
        return values
    return [read_api_value(v) for v in values]


def rows_after(
    bind: Any,
    table: sa.Table,
    key: Sequence[tuple[Any, bool]],
    after: Sequence[Any] | None,
    seconds: float,
) -> int | None:
    """The rows of ``table`` after ``after`` in the order of ``key`` ((column, descending)
    pairs: the stored order), or all of them when ``after`` is None. ``after`` holds the
    key's values as the ORM has them (a cursor decoded). One ``COUNT(*)``, one attempt
    within ``seconds``: None if it fails (it only feeds progress lines)."""
    stmt = sa.select(sa.func.count()).select_from(table)
    if after is not None:
        stmt = stmt.where(after_condition(list(key), list(after)))
    try:
        with connect(bind) as conn:
            return int(conn.execution_options(timeout=seconds).scalar(stmt))
    except sa.exc.SQLAlchemyError:
        return None
