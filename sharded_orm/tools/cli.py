"""The ``sharded-orm`` command and the contract every subcommand keeps.

Subcommands (``sharded-orm SUBCOMMAND --help`` for each): ``lint``, ``simulate``, ``doctor``,
``verify``, ``backfill``. Their parsers and bodies live in :mod:`sharded_orm.tools.commands`
(``verify`` and ``backfill``, which open the user's database, in :mod:`.database`).

The contract (docs: README "Command line"):

- exit 0: done, nothing found; 1: findings (lint errors, a split hot longer than the
  threshold, shard mismatches); 2: the command could not do its job (usage, a target that
  does not import, a bad file, a database that cannot be opened, a missing driver, a closed
  output pipe), with one line ``sharded-orm: error: ...`` on stderr and no traceback
  (``SHARDED_ORM_DEBUG=1`` shows it).
- ``--format json`` prints one envelope: ``{"command", "version", "summary", "findings"}``
  (lint, doctor, verify) or ``{..., "results"}`` (simulate, backfill).
- A target ``module:attr`` means one table for a mapped class or ``Table``, and all tables
  for a declarative base, a ``MetaData`` or a module (:mod:`sharded_orm.tools.targets`).
- Long jobs report through :mod:`sharded_orm.progress` on stderr (a bar on a terminal, log
  lines otherwise); stdout carries only the result.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Sequence

from sharded_orm.errors import ShardingError
from sharded_orm.tools.commands import SUBCOMMANDS
from sharded_orm.tools.contract import (
    EXIT_ERROR,
    EXIT_FINDINGS,
    EXIT_OK,
    Formatter,
    Parser,
    UsageError,
    envelope,
    version,
)
from sharded_orm.tools.targets import load_target

__all__ = ["EXIT_ERROR", "EXIT_FINDINGS", "EXIT_OK", "envelope", "load_target", "main", "version"]

DEBUG_ENV = "SHARDED_ORM_DEBUG"


def build_parser() -> Parser:
    parser = Parser(
        prog="sharded-orm",
        description="Hotspot checks and maintenance for sharded Spanner schemas. Exit codes: "
        "0 ok, 1 findings (lint, doctor, verify), 2 the command could not run.",
        formatter_class=Formatter,
    )
    parser.add_argument("--version", action="version", version=f"sharded-orm {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _fail(message: str) -> int:
    with contextlib.suppress(OSError, ValueError):  # stderr closed too: the code says it
        print(f"sharded-orm: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def _progress_to_stderr() -> None:
    """Let progress log lines reach stderr when nobody configured logging (no basicConfig:
    other libraries' INFO lines, Alembic's among them, stay silent)."""
    log = logging.getLogger("sharded_orm.progress")
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush is quiet."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the exit code (see the module docstring)."""
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        return _fail(_one_line(exc).removeprefix("sharded-orm: "))
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    _progress_to_stderr()
    try:
        code = int(args.func(args))
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        _silence_stdout()
        return _fail("the output was closed before everything was written (broken pipe)")
    except KeyboardInterrupt:
        return _fail("interrupted")
    except ShardingError as exc:
        return _fail(_one_line(exc))
    except Exception as exc:
        if os.environ.get(DEBUG_ENV):
            raise
        return _fail(f"{type(exc).__name__}: {_one_line(exc)} (set {DEBUG_ENV}=1 for a traceback)")


if __name__ == "__main__":
    sys.exit(main())
