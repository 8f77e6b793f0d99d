"""Server defaults as Spanner stores them, for ``SpannerImpl.compare_server_default``.

Spanner gives back a default as the SQL text it stores: a string default comes back as
a GoogleSQL literal (``'plain'``, or raw and triple-quoted as the dialect wrote it), an
expression possibly in parentheses. Strings are compared by value, expressions with
spacing, case and enclosing parentheses ignored, so an unchanged default shows no change.
"""

from __future__ import annotations

import re
from typing import Any

_STRING_LITERAL = re.compile(r"""^\s*([rR]?)('''|\"\"\"|'|")(.*)\2\s*$""", re.DOTALL)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0"}


def string_literal_value(sql: str) -> str | None:
    """The value of a GoogleSQL string literal (``'it\\'s'``, ``"plain"``, raw and
    triple-quoted ones), or None for anything else (an expression, two literals)."""
    m = _STRING_LITERAL.match(sql)
    if m is None:
        return None
    raw, quote, body = bool(m.group(1)), m.group(2), m.group(3)
    plain = body if raw else re.sub(r"\\.", "", body)
    if quote in plain or (raw and body.endswith("\\")):
        return None  # the quote closes earlier: not one literal
    if raw:
        return body
    return re.sub(r"\\(.)", lambda e: _ESCAPES.get(e.group(1), e.group(1)), body)


def _wrapped(sql: str) -> bool:
    """True when the outer parentheses of ``sql`` enclose all of it: ``(a + b)``, not
    ``(a) + (b)``."""
    if not (sql.startswith("(") and sql.endswith(")")):
        return False
    depth = 0
    for i, ch in enumerate(sql):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and i < len(sql) - 1:
            return False
    return True


def _expression_form(sql: str) -> str:
    """A default expression with spacing, case and enclosing parentheses removed."""
    sql = " ".join(sql.split()).lower()
    while _wrapped(sql):
        sql = sql[1:-1].strip()
    return sql


def differs(
    metadata_default: Any, rendered_metadata: str | None, rendered_reflected: str | None
) -> bool:
    """True when the model's server default differs from the stored one."""
    if rendered_metadata is None or rendered_reflected is None:
        return rendered_metadata != rendered_reflected
    real = string_literal_value(rendered_reflected)
    arg = getattr(metadata_default, "arg", None)
    meta = arg if isinstance(arg, str) else string_literal_value(rendered_metadata)
    if real is not None and meta is not None:
        return real != meta
    # an expression (``5``, ``CURRENT_TIMESTAMP()``) on either side
    return _expression_form(rendered_reflected) != _expression_form(rendered_metadata)
