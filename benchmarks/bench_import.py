"""What ``import sharded_orm`` and the ``sharded-orm`` command cost before they do anything
(issue 33 item 10, issue 31 item 6).

Each measurement is a fresh interpreter (bytecode cached: one warm-up run of each first):

- imports: the CPU time (``time.process_time``) of the import statement alone, in the child,
  for ``import sqlalchemy``, ``import sqlalchemy.orm`` (which the library needs anyway) and
  ``import sharded_orm``; target: ``sharded_orm`` <= 1.1x ``sqlalchemy.orm``;
- commands: the CPU time (user + system) of the whole process for ``sharded-orm --version``
  and ``sharded-orm SUBCOMMAND --help``, next to ``python -c pass``; target: < 0.5 s.

Rounds interleave every measurement (the order rotates each round) so a busy machine
disturbs them alike; the figures are min / median / max over the rounds, and the ratios are
taken within a round.

    python benchmarks/bench_import.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
from collections.abc import Callable

IMPORTS = {
    "sqlalchemy": "import sqlalchemy",
    "sqlalchemy.orm": "import sqlalchemy.orm",
    "sharded_orm": "import sharded_orm",
}
TIMED = "import time; t = time.process_time(); {stmt}; print(time.process_time() - t)"
CLI = "import sys; from sharded_orm.tools.cli import main; sys.exit(main())"
#: children write and read bytecode, whatever this shell says (PYTHONDONTWRITEBYTECODE)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
COMMANDS = {
    "python -c pass": ["-c", "pass"],
    "--version": ["-c", CLI, "--version"],
    "--help": ["-c", CLI, "--help"],
    **{
        f"{sub} --help": ["-c", CLI, sub, "--help"]
        for sub in ("lint", "simulate", "doctor", "verify", "backfill")
    },
}


def import_cpu(stmt: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", TIMED.format(stmt=stmt)],
        check=True,
        capture_output=True,
        text=True,
        env=ENV,
    )
    return float(out.stdout)


def process_cpu(argv: list[str]) -> float:
    """User + system CPU of one child process, from wait4 (the child alone)."""
    proc = subprocess.Popen(
        [sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv} exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime


def row(name: str, values: list[float], unit: str = "s") -> str:
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"{name:<34}{lo:>9.3f}{mid:>9.3f}{hi:>9.3f}  {unit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    jobs: list[tuple[str, Callable[[], float]]] = [
        (f"import {k}", functools.partial(import_cpu, v)) for k, v in IMPORTS.items()
    ]
    jobs += [
        (k if k == "python -c pass" else f"sharded-orm {k}", functools.partial(process_cpu, v))
        for k, v in COMMANDS.items()
    ]
    for _, job in jobs:  # warm: bytecode written, files in the page cache
        job()
    got: dict[str, list[float]] = {name: [] for name, _ in jobs}
    ratios: dict[str, list[float]] = {
        "sharded_orm / sqlalchemy.orm": [],
        "sharded_orm / sqlalchemy": [],
    }
    for r in range(args.rounds):
        shift = r % len(jobs)
        for name, job in jobs[shift:] + jobs[:shift]:
            got[name].append(job())
        mine = got["import sharded_orm"][-1]
        ratios["sharded_orm / sqlalchemy.orm"].append(mine / got["import sqlalchemy.orm"][-1])
        ratios["sharded_orm / sqlalchemy"].append(mine / got["import sqlalchemy"][-1])
    print(f"{args.rounds} interleaved rounds, CPU time, bytecode cached")
    print(f"{'':<34}{'min':>9}{'median':>9}{'max':>9}")
    print("the import statement alone, in a fresh interpreter:")
    for name, _ in jobs[: len(IMPORTS)]:
        print(row(name, got[name]))
    for name, values in ratios.items():
        print(row(name, values, "x"))
    print("(target: sharded_orm / sqlalchemy.orm <= 1.1)")
    print("the whole process (interpreter start included; target < 0.5 s):")
    for name, _ in jobs[len(IMPORTS) :]:
        print(row(name, got[name]))


if __name__ == "__main__":
    main()
