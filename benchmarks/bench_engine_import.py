"""What the first Spanner engine costs to import, beside sqlalchemy-spanner's own (not a test).

Each row is a clean interpreter that imports one thing (and, for ``create_engine``, makes a
Spanner engine without connecting); the figure is the process's CPU seconds at the end
(interpreter start-up included, the same in every row), the best of ``--runs``, rows
interleaved so a busy machine weighs on all of them alike. Also printed: modules loaded,
how many of them are ``alembic_ext``'s and Alembic's.

Rows: sqlalchemy-spanner's module (stock); ``sharded_orm.spanner.dialect``; a
``create_engine`` on it; the dialect plus ``alembic_ext.impl``, what the dialect loaded
before issue 45 (the Alembic impl); ``import sharded_orm`` and ``sqlalchemy.orm`` beside
stock, to show where the rest goes. Issue 45 asks the dialect within 10 % of stock.

    python benchmarks/bench_engine_import.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

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


def measure(code: str) -> tuple[float, int, int, int]:
    env = {**os.environ, "SPANNER_DISABLE_BUILTIN_METRICS": "true"}
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
    args = parser.parse_args()
    best: dict[str, tuple[float, int, int, int]] = {}
    for _ in range(args.runs):
        for name, code in ROWS.items():
            got = measure(code)
            if name not in best or got[0] < best[name][0]:
                best[name] = got
    stock = best["stock: import google.cloud.sqlalchemy_spanner"][0]
    print(f"best of {args.runs}, process CPU s (ratio to stock), modules, alembic_ext, alembic")
    for name, (cpu, modules, ext, alembic) in best.items():
        print(f"{name:48} {cpu:6.3f} ({cpu / stock:4.2f}x) {modules:5} {ext:3} {alembic:3}")


if __name__ == "__main__":
    main()
