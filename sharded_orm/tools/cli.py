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
  (lint, doctor, verify) or ``{..., "results"}`` (simulate, backfill); an error is the
  envelope ``{..., "error": {"type", "message"}}`` on stdout, nothing on stderr (but for
  a closed stdout: the line on stderr).
- No password is printed: a URL is shown with SQLAlchemy's ``hide_password``, and the
  password of a URL on the command line is blanked out of every error message.
- A target ``module:attr`` means one table for a mapped class or ``Table``, all tables for
  a declarative base or a ``MetaData``, and the tables of every MetaData of a module
  (:mod:`sharded_orm.tools.targets`).
- Long jobs report through :mod:`sharded_orm.progress` on stderr (a bar on a terminal, log
  lines otherwise); stdout carries only the result.
"""

from __future__ import annotations

import contextlib
import itertools
import json
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
    error_envelope,
    version,
)
from sharded_orm.tools.targets import load_target

__all__ = [
    "EXIT_ERROR",
    "EXIT_FINDINGS",
    "EXIT_OK",
    "envelope",
    "error_envelope",
    "load_target",
    "main",
    "version",
]

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
    parser.subcommands = tuple(sub.choices)
    return parser


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


class _Errors:
    """How this run reports an error: the JSON envelope on stdout (``--format json``) or one
    line on stderr; either way without the password of a URL on the command line."""

    def __init__(self, argv: Sequence[str], commands: Sequence[str]) -> None:
        self.as_json = "--format=json" in argv or any(
            a == "--format" and b == "json" for a, b in itertools.pairwise(argv)
        )
        self.command = next((a for a in argv if not a.startswith("-")), None)
        if self.command not in commands:
            self.command = None
        self.urls = [a for a in argv if "://" in a]

    def fail(self, message: str, kind: str, *, stdout_open: bool = True) -> int:
        from sharded_orm.checks import redact

        message = redact(message, *self.urls)
        with contextlib.suppress(OSError, ValueError):  # closed too: the exit code says it
            if self.as_json and stdout_open:
                print(json.dumps(error_envelope(self.command, message, kind), indent=2))
                sys.stdout.flush()
            else:
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
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    errors = _Errors(argv, parser.subcommands)
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return errors.fail(_one_line(exc).removeprefix("sharded-orm: "), "UsageError")
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    _progress_to_stderr()
    try:
        code = int(args.func(args))
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        _silence_stdout()
        return errors.fail(
            "the output was closed before everything was written (broken pipe)",
            "BrokenPipeError",
            stdout_open=False,
        )
    except KeyboardInterrupt:
        return errors.fail("interrupted", "KeyboardInterrupt")
    except ShardingError as exc:
        return errors.fail(_one_line(exc), type(exc).__name__)
    except Exception as exc:
        if os.environ.get(DEBUG_ENV):
            raise
        kind = type(exc).__name__
        return errors.fail(f"{kind}: {_one_line(exc)} (set {DEBUG_ENV}=1 for a traceback)", kind)


if __name__ == "__main__":
    sys.exit(main())
