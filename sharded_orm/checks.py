"""Argument checks shared by every layer: identifiers that reach SQL text, positive counts."""

from __future__ import annotations

import re

from sharded_orm.errors import ShardConfigError, ShardTypeError

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def check_identifier(name: object, what: str = "index name") -> str:
    """Refuse anything that is not a plain identifier: hints are pasted into SQL text."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ShardConfigError(
            f"{what} {name!r} is not a plain identifier (letters, digits, _; not starting with "
            "a digit); it would be written into the SQL as is, so it is refused"
        )
    return name


def check_positive_int(value: object, what: str) -> int:
    """A count the caller gave: an int (not a bool) of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ShardTypeError(f"{what} must be a positive int, got {value!r}")
    if value <= 0:
        raise ShardConfigError(f"{what} must be at least 1, got {value}")
    return value
