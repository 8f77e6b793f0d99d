"""What the first Spanner engine costs to import, beside sqlalchemy-spanner's own (not a test).

Each row is a clean interpreter that imports one thing (and, for ``create_engine``, makes a
Spanner engine without connecting); the figure is the process's CPU seconds at the end
(interpreter start-up included, the same in every row), the best of ``--runs``, rows
interleaved so a busy machine weighs on all of them alike. Also printed: modules loaded,
how many of them are ``alembic_ext``'s and Alembic's.

Every module is loaded from its bytecode cache, as from an installed package (pip compiles
a wheel's modules when it installs it): the children run with a private
``PYTHONPYCACHEPREFIX`` and without ``PYTHONDONTWRITEBYTECODE``, after one warm-up round
that is not counted. Without that (``--compile``, and what this benchmark did before), a
checkout whose environment sets ``PYTHONDONTWRITEBYTECODE`` compiles our ~55 modules from
source in every run while stock's come from site-packages' caches: about 0.25 s of the 1.17x
first recorded was the compiler, not the import.

Rows: sqlalchemy-spanner's module (stock); ``sharded_orm.spanner.dialect``; a
``create_engine`` on it; the dialect plus ``alembic_ext.impl``, what the dialect loaded
before issue 45 (the Alembic impl); ``import sharded_orm`` and ``sqlalchemy.orm`` beside
stock, to show where the rest goes. Issue 45 asks the dialect within 10 % of stock.

    python benchmarks/bench_engine_import.py [--runs 5] [--compile]

Recorded figures (issue 45): docs/dialect.md, "What an engine costs".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

URL = "spanner+spanner:///projects/p/instances/i/databases/d"
ROWS = {
    "stock: import google.cloud.sqlalchemy_spanner": "import google.cloud.sqlalchemy_spanner",
    "ours: import sharded_orm.spanner.dialect": "import sharded_orm.spanner.dialect",
    "ours: sa.create_engine(spanner URL)": (
        f"import sqlalchemy as sa, sharded_orm; sa.create_engine({URL!r})"
    ),
    "before issue 45: dialect + alembic_ext.impl": (
        "import sharded_orm.spanner.dialect, alembic_ext.impl"
    ),
    "stock + import sharded_orm": "import google.cloud.sqlalchemy_spanner, sharded_orm",
    "stock + import sqlalchemy.orm": "import google.cloud.sqlalchemy_spanner, sqlalchemy.orm",
}
REPORT = (
    "import json, sys, time\n{code}\ncpu = time.process_time()\n"
    "mods = list(sys.modules)\n"
    "print(json.dumps([cpu, len(mods), sum(m.split('.')[0] == 'alembic_ext' for m in mods),"
    " sum(m.split('.')[0] == 'alembic' for m in mods)]))"
)


def child_env(pycache: str | None) -> dict[str, str]:
    """The children's environment: bytecode cached under ``pycache`` (None: compiled from
    source every time if the environment says so, as before)."""
    env = {**os.environ, "SPANNER_DISABLE_BUILTIN_METRICS": "true"}
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def measure(code: str, env: dict[str, str]) -> tuple[float, int, int, int]:
    out = subprocess.run(
        [sys.executable, "-c", REPORT.format(code=code)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    cpu, modules, ext, alembic = json.loads(out.stdout.strip().splitlines()[-1])
    return float(cpu), int(modules), int(ext), int(alembic)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--compile",
        action="store_true",
        help="no private bytecode cache: with PYTHONDONTWRITEBYTECODE set, our modules are "
        "compiled from source in every run (stock's are not)",
    )
    args = parser.parse_args()
    best: dict[str, tuple[float, int, int, int]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-pycache-") as pycache:
        env = child_env(None if args.compile else pycache)
        if not args.compile:
            for code in ROWS.values():  # warm-up: writes the bytecode cache, not counted
                measure(code, env)
        for _ in range(args.runs):
            for name, code in ROWS.items():
                got = measure(code, env)
                if name not in best or got[0] < best[name][0]:
                    best[name] = got
    stock = best["stock: import google.cloud.sqlalchemy_spanner"][0]
    cached = "compiled from source" if args.compile else "bytecode cached"
    print(
        f"best of {args.runs} ({cached}), process CPU s (ratio to stock), modules, "
        "alembic_ext, alembic"
    )
    for name, (cpu, modules, ext, alembic) in best.items():
        print(f"{name:48} {cpu:6.3f} ({cpu / stock:4.2f}x) {modules:5} {ext:3} {alembic:3}")


if __name__ == "__main__":
    main()
