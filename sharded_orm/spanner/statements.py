"""The Spanner DB-API's statement classification, memoised per statement text.

The DB-API classifies every statement it executes (``parse_utils.classify_statement``):
it runs ``sqlparse.format(text, strip_comments=True)`` over the whole text, about 20 us a
token, on every execution, then converts the ``%s`` placeholders to ``@a0, @a1...`` and
picks the statement's type with regular expressions. At N = 64, k = 100 that pass was
39 % of ``merged()``'s CPU, and every statement an application sends pays it, although
SQLAlchemy sends the same few texts again and again.

What the classification returns depends on the text *and* the arguments: the
``Statement`` carries the arguments (as ``@aN`` parameters) and their Spanner types, and
the DB-API mutates nothing it shares. So only what depends on the text alone is kept,
per statement text and kind of arguments (none, a sequence): the text as the DB-API
reads it (comments stripped), the statement's type and the SQL it sends (an UPDATE or
DELETE without WHERE gets ``WHERE 1=1``). Each call then builds a new ``Statement``
from its own arguments with the DB-API's own functions (``sql_pyformat_args_to_spanner``,
``get_param_types``). A text is learnt the second time it is seen (a text sent once is
parsed once, as before), and learnt only if the rebuilt classification equals the
DB-API's own for that call; client-side statements (``BEGIN``, ``RUN BATCH``...),
mapping arguments and anything else are always classified by the DB-API.
``tests/test_statement_memo.py`` checks the memo against the DB-API on generated
statements, and trips when upstream memoises the classification itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FunctionType
from typing import Any

import sqlparse
from google.cloud.spanner_dbapi import parse_utils as _parse_utils
from google.cloud.spanner_dbapi.parsed_statement import ParsedStatement, Statement, StatementType

from sharded_orm.memo import Memo

#: Statement texts (per kind of arguments) the memo keeps, least recently used dropped,
#: and the characters they may hold in all (a text longer than a tenth of that is never
#: kept: the DB-API parses it each time, as before).
MEMO_SIZE = 1024
MEMO_CHARS = 8_000_000

_NONE, _SEQUENCE = "none", "sequence"
#: a text seen once, not learnt yet
_SEEN = "seen"
#: a text the DB-API always classifies (client-side statements, a rebuild that differs)
_DBAPI = "dbapi"


@dataclass(frozen=True)
class _Shape:
    """What a statement's classification takes from its text alone."""

    text: str  # as the DB-API reads it: comments stripped, trimmed
    kind: StatementType
    sql: str  # what the DB-API sends for arguments of this kind


def _args_kind(args: Any) -> str | None:
    if not args:
        return _NONE
    if isinstance(args, (list, tuple)):
        return _SEQUENCE
    return None  # a mapping or anything else: the DB-API's own classification


#: what the memo holds per text: (the characters it counts for, its shape or a marker)
_Entry = tuple[int, _Shape | str]


def _entry(sql: str, learnt: _Shape | str) -> _Entry:
    """An entry counts 3 x its text's characters: the text (the key), and the stripped text
    and SQL it learns."""
    return (3 * len(sql), learnt)


def _weight(entry: _Entry) -> int:
    return entry[0]


def _rebuilt(shape: _Shape, args: Any) -> ParsedStatement:
    """The classification of ``shape``'s text for these arguments."""
    _, params = _parse_utils.sql_pyformat_args_to_spanner(shape.text, args or None)
    return ParsedStatement(
        shape.kind, Statement(shape.sql, params, _parse_utils.get_param_types(params or None))
    )


class StatementMemo:
    """``classify(sql, args)``: the DB-API's ``classify_statement``, memoised per text
    (a :class:`~sharded_orm.memo.Memo` of ``size`` texts and ``chars`` characters)."""

    def __init__(self, size: int = MEMO_SIZE, chars: int = MEMO_CHARS) -> None:
        self.size = size
        self.chars = chars
        self._entries: Memo[tuple[str, str], _Entry] = Memo(
            "spanner.statements", size, maxbytes=chars, sizeof=_weight
        )
        #: classifications answered from the memo, and by the DB-API
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def classify(self, sql: Any, args: Any = None) -> ParsedStatement | None:
        kind = _args_kind(args)
        if kind is None or not isinstance(sql, str) or len(sql) * 10 > self.chars:
            return _parse_utils.classify_statement(sql, args)
        key = (sql, kind)
        held = self._entries.get(key)
        entry = None if held is None else held[1]
        if isinstance(entry, _Shape):
            self.hits += 1
            return _rebuilt(entry, args)
        self.misses += 1
        parsed = _parse_utils.classify_statement(sql, args)  # this call's, from the DB-API
        if entry is None:
            learnt: _Shape | str = _SEEN
        elif entry == _SEEN:
            learnt = self._learn(sql, args, parsed)
        else:
            return parsed
        self._entries.put(key, _entry(sql, learnt))
        return parsed

    @staticmethod
    def _learn(sql: str, args: Any, parsed: ParsedStatement | None) -> _Shape | str:
        if (
            parsed is None
            or parsed.statement_type is StatementType.CLIENT_SIDE
            or parsed.client_side_statement_type is not None
        ):
            return _DBAPI
        text = sqlparse.format(sql, strip_comments=True).strip()
        shape = _Shape(text, parsed.statement_type, parsed.statement.sql)
        try:
            same = _rebuilt(shape, args) == parsed
        except Exception:
            same = False
        return shape if same else _DBAPI


class ParseUtilsView:
    """The DB-API's ``parse_utils`` module with ``classify_statement`` memoised: every
    other name is the module's own."""

    def __init__(self, memo: StatementMemo) -> None:
        self.classify_statement = memo.classify

    def __getattr__(self, name: str) -> Any:
        return getattr(_parse_utils, name)


def run_with_names(func: Callable[..., Any], **names: Any) -> Callable[..., Any]:
    """``func``'s own code, with module-level ``names`` of its module resolved to these
    values (its module is not touched: only this copy of the function sees them)."""
    assert isinstance(func, FunctionType)
    namespace: Mapping[str, Any] = {**func.__globals__, **names}
    clone = FunctionType(
        func.__code__, dict(namespace), func.__name__, func.__defaults__, func.__closure__
    )
    clone.__kwdefaults__ = func.__kwdefaults__
    clone.__qualname__ = func.__qualname__
    clone.__doc__ = func.__doc__
    clone.__module__ = func.__module__
    return clone
