"""The ``sharded-orm`` command: ``sharded-orm lint module:attr [--format json]``.

The target is imported from the current directory, like alembic or uvicorn do: a
``MetaData``, a declarative base, or a module holding one. Exit codes: 0 no errors,
1 errors found, 2 the command itself could not run (bad target, empty metadata).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from .errors import ShardingError
from .lint import lint


def load_target(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise ShardingError(f"give a module path, like models:Base (got {spec!r})")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ShardingError(f"cannot import {module_name!r}: {exc}") from exc
    if not attr:
        return module
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ShardingError(f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def cmd_lint(args: argparse.Namespace) -> int:
    findings = lint(load_target(args.target))
    if args.format == "json":
        print(json.dumps([f.as_dict() for f in findings], indent=2))
    else:
        for f in findings:
            print(f)
        errors = sum(f.severity == "error" for f in findings)
        print(f"{len(findings)} findings, {errors} errors")
    return 1 if any(f.severity == "error" for f in findings) else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sharded-orm", description="Hotspot checks for Spanner schemas."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_lint = sub.add_parser("lint", help="lint models for hotspots")
    p_lint.add_argument("target", help="module:attr of a MetaData or declarative base, or a module")
    p_lint.add_argument("--format", choices=("text", "json"), default="text")
    p_lint.set_defaults(func=cmd_lint)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ShardingError as exc:
        print(f"sharded-orm: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
