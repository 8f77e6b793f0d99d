"""A statement built over the user's statement, reused with another read's values.

A merge's statements (per-shard branches around the user's statement) take as long to
build as N; their shape depends only on the user statement's SQLAlchemy cache key, the
backend and the plan, so each is built once with every value a named parameter (the
user's renamed by position in the key, ours given by name) and kept in ``SHAPES``; a
later read with the same key runs it with its own values (``MergeQuery.shaped``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import BindParameter, bindparam
from sqlalchemy.sql.visitors import replacement_traverse

from sharded_orm.memo import Memo

__all__ = [
    "BRANCH_BYTES",
    "NEW",
    "SHAPES",
    "UNCACHEABLE",
    "Shape",
    "Shaped",
    "UserKey",
    "user_key_of",
]

#: what one branch of a kept shape holds, with the compiled form SQLAlchemy keeps of it
#: (measured: a shape of 256 branches on SQLite keeps about 4 MB)
BRANCH_BYTES = 16 * 1024


class Shape(NamedTuple):
    """A statement built with every value a named parameter: ``names``, by position in
    the user statement's cache key, take the user's values; ``nbytes`` is its weight."""

    statement: Any
    names: tuple[str, ...]
    nbytes: int


def _weight(entry: Any) -> int:
    return entry.nbytes if isinstance(entry, Shape) else 64


#: the statement shapes built (``MergeQuery.shaped``): at most 128 and 64 MiB by
#: ``BRANCH_BYTES`` (sixteen reads of 256 shards), least recently used evicted; a
#: statement whose values cannot all be parameters is kept as ``UNCACHEABLE``
SHAPES: Memo[Any, Any] = Memo(
    "read statement shapes", 128, maxbytes=64 * 1024 * 1024, sizeof=_weight
)
NEW, UNCACHEABLE = object(), object()


class Shaped(NamedTuple):
    """A statement and the parameters it runs with."""

    statement: Any
    params: dict[str, Any]


class UserKey:
    """The user statement's SQLAlchemy cache key, and this read's values of its bound
    parameters (one per parameter, in the key's order: two statements with one key
    differ only there)."""

    def __init__(self, stmt: Any, key: Any, options: Any) -> None:
        self.stmt = stmt
        self.binds: Sequence[Any] = key.bindparams
        first: dict[int, int] = {}
        # which positions hold one parameter twice: part of the shape
        pattern = tuple(first.setdefault(id(b), i) for i, b in enumerate(self.binds))
        self.key = (key.key, pattern, options)
        #: the parameter names the user's values take in a shape, by position
        self.names = tuple(f"so_q{i}" for i in pattern)

    def params(self, names: Sequence[str]) -> dict[str, Any]:
        """This read's values under ``names`` (a shape's, by position)."""
        return {name: b.effective_value for name, b in zip(names, self.binds, strict=True)}

    def named(self) -> Any:
        """The user's statement with its parameters named ``names`` (their values kept)."""
        by_id = {id(b): name for b, name in zip(self.binds, self.names, strict=True)}

        def rename(element: Any, **_: Any) -> Any:
            name = by_id.get(id(element)) if isinstance(element, BindParameter) else None
            if name is None:
                return None
            return bindparam(
                name,
                element.value,
                type_=element.type,
                expanding=element.expanding,
                literal_execute=element.literal_execute,
                callable_=element.callable,
            )

        opts: dict[str, Any] = {}
        return replacement_traverse(self.stmt, opts, rename)

    @staticmethod
    def all_named(stmt: Any) -> bool:
        """Whether every value of ``stmt`` is a parameter of ours (``so_``), given at
        execution: a shape that holds a value elsewhere (loader criteria keep theirs in
        the option) cannot be reused with other values."""
        key = stmt._generate_cache_key()
        return key is not None and all(
            not b.unique and str(b.key).startswith("so_") for b in key.bindparams
        )


def user_key_of(stmt: Any) -> UserKey | None:
    """The statement's ``UserKey``, or None where its shapes cannot be reused: no cache
    key (SQLAlchemy cannot tell its shape either), values given to ``.params()`` or held
    by loader criteria (in the option, not in the statement's parameters), or execution
    options that cannot be told apart by hash."""
    if getattr(stmt, "_params", None):
        return None
    if any(not getattr(o, "_is_strategy_option", False) for o in stmt._with_options):
        return None
    key = stmt._generate_cache_key()
    if key is None:
        return None
    try:
        options = frozenset(stmt._execution_options.items())
        hash(options)
    except TypeError:
        return None
    return UserKey(stmt, key, options)
