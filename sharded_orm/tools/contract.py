"""The pieces of the ``sharded-orm`` contract every subcommand shares (see :mod:`.cli`):
exit codes, the one-line usage error, help with defaults, the JSON envelope, the output options.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any, NoReturn

from sharded_orm.errors import ShardingError

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def number(
    integer: bool = False, minimum: float = 0.0, above: bool = True, maximum: float | None = None
) -> Callable[[str], float]:
    """An argparse ``type=``: a finite number (an int if ``integer``) above ``minimum`` (at
    least it, where not ``above``) and at most ``maximum``; else the flag's range, said."""
    rule = f"> {minimum:g}" if above else f">= {minimum:g}"
    if maximum is not None:
        rule += f" and <= {maximum:g}"
    kind = "a whole number" if integer else "a number"

    def parse(text: str) -> float:
        try:
            value: float = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {kind} {rule}, got {text!r}") from None
        low = value > minimum if above else value >= minimum
        if not math.isfinite(value) or not low or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be {kind} {rule}, got {text!r}")
        return value

    parse.__name__ = kind  # argparse names the type by it when it fails otherwise
    return parse


def zipf_exponent(text: str) -> float:
    """An argparse ``type=`` for a tenant-skew exponent: 0 up to the simulator's
    ``MAX_ZIPF`` (read when a value is parsed: ``--help`` loads no simulator)."""
    from sharded_orm.tools.simulate.workload import MAX_ZIPF

    return number(above=False, maximum=MAX_ZIPF)(text)


zipf_exponent.__name__ = "a number"


class UsageError(ShardingError):
    """A command line argparse refused (exit 2, one line)."""


class Parser(argparse.ArgumentParser):
    """argparse with the contract's one-line usage error instead of usage text + exit."""

    #: the subcommands' names (the top-level parser's)
    subcommands: tuple[str, ...] = ()

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


class Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default, except None/False (their help says what they mean)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, argparse.SUPPRESS) or action.default == []:
            return action.help
        return super()._get_help_string(action)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("sharded-orm")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown"


def envelope(
    command: str,
    summary: dict[str, Any],
    *,
    findings: list[Any] | None = None,
    results: list[Any] | None = None,
) -> dict[str, Any]:
    """The one JSON shape of every subcommand's ``--format json``."""
    if (findings is None) == (results is None):
        raise ValueError("an envelope has findings or results, not both")
    out: dict[str, Any] = {"command": command, "version": version(), "summary": summary}
    if findings is not None:
        out["findings"] = findings
    else:
        out["results"] = results
    return out


def error_envelope(command: str | None, message: str, kind: str) -> dict[str, Any]:
    """The envelope of a run that could not do its job (exit 2) under ``--format json``:
    ``command`` (None when the command line named none), ``version``, ``summary``
    (``{"ok": false, "exit_code": 2}``) and ``error``: ``{"type", "message"}``, the message
    the text format prints after ``sharded-orm: error:``."""
    return {
        "command": command,
        "version": version(),
        "summary": {"ok": False, "exit_code": EXIT_ERROR},
        "error": {"type": kind, "message": message},
    }


def emit(
    args: argparse.Namespace,
    as_json: Callable[[], dict[str, Any]],
    text: Callable[[], str],
) -> None:
    """Print the JSON envelope (--format json), else the text report (and the heatmap path)."""
    if args.format == "json":
        print(json.dumps(as_json(), indent=2, default=str))
    else:
        print(text())
        if getattr(args, "heatmap", None):
            print(f"heatmap: {args.heatmap}")


def output_args(p: argparse.ArgumentParser, *, heatmap: bool = False) -> None:
    """The output options: ``--heatmap PNG`` (simulate, doctor) and ``--format``."""
    if heatmap:
        p.add_argument(
            "--heatmap",
            default=None,
            metavar="PNG",
            help="also draw a heatmap into this PNG file (needs matplotlib: "
            "pip install 'sharded-orm[heatmap]')",
        )
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text for people, json for programs (one envelope: command, version, summary, "
        "findings or results)",
    )


def tenant_mix(args: argparse.Namespace) -> tuple[int, tuple[float, ...] | None]:
    """``--tenants`` and ``--tenant-weights`` as a workload takes them: the tenant count
    (the weights' count when not given) and the weights, refused unless numbers."""
    weights = None
    if args.tenant_weights:
        try:
            weights = tuple(float(x) for x in args.tenant_weights.split(","))
        except ValueError:
            raise ShardingError(
                f"--tenant-weights takes numbers separated by commas, got {args.tenant_weights!r}"
            ) from None
    tenants = args.tenants if args.tenants is not None else len(weights or (1,))
    return tenants, weights
