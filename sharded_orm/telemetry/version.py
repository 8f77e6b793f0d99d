"""The library's version for the instrumentation scope, read once from its metadata."""

from __future__ import annotations

from functools import cache


@cache
def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("sharded-orm")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "0"
