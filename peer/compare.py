"""Compare two JUnit XML reports of one peer suite: stock configuration against sharded-orm's.

A test that passes stock and does not pass with sharded-orm (failed, error, skipped or missing)
is a regression, and the exit code is 1. Deliberate, documented differences are listed in a
``--known`` file (one test id a line, ``# reason`` after it) and reported apart, never silently.
With ``--exact`` (our own suites, written to pass in both configurations) any difference of
outcome, either way, fails.

    python peer/compare.py NAME stock.xml ours.xml [--known peer/x/known_differences.txt] [--exact]
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def outcomes(path: Path) -> dict[str, str]:
    """Map each test id (``classname::name``) to passed, failed, error or skipped."""
    result: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = {child.tag for child in case}
        if "error" in kinds:
            outcome = "error"
        elif "failure" in kinds:
            outcome = "failed"
        elif "skipped" in kinds:
            outcome = "skipped"
        else:
            outcome = "passed"
        # a test reported twice (call failed, teardown errored) keeps its worst outcome
        if result.get(test_id) not in ("failed", "error"):
            result[test_id] = outcome
    return result


def read_known(path: Path | None) -> dict[str, str]:
    known: dict[str, str] = {}
    if path is None:
        return known
    for line in path.read_text(encoding="utf-8").splitlines():
        test_id, _, reason = line.partition("#")
        if test_id.strip():
            known[test_id.strip()] = reason.strip()
    return known


def summary(name: str, label: str, result: dict[str, str]) -> str:
    counts = Counter(result.values())
    parts = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "error", "skipped"))
    return f"{name} {label}: {len(result)} tests: {parts}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name")
    parser.add_argument("stock", type=Path)
    parser.add_argument("ours", type=Path)
    parser.add_argument("--known", type=Path, default=None)
    parser.add_argument("--exact", action="store_true", help="any difference of outcome fails")
    args = parser.parse_args(argv)
    stock, ours, known = outcomes(args.stock), outcomes(args.ours), read_known(args.known)
    print(summary(args.name, "stock", stock))
    print(summary(args.name, "sharded-orm", ours))
    regressions, differences = [], []
    for test_id, outcome in sorted(stock.items()):
        if outcome != "passed" or ours.get(test_id) == "passed":
            continue
        (differences if test_id in known else regressions).append(test_id)
    fixed = [t for t, o in ours.items() if o == "passed" and stock.get(t) not in (None, "passed")]
    print(
        f"{args.name}: {len(fixed)} fixed by sharded-orm, {len(regressions)} regressions, "
        f"{len(differences)} known differences"
    )
    for test_id in differences:
        print(f"  known difference: {test_id} ({ours.get(test_id, 'missing')}): {known[test_id]}")
    for test_id in regressions:
        print(f"  REGRESSION: {test_id}: passes stock, {ours.get(test_id, 'missing')} with us")
    if args.exact:
        both = set(stock) | set(ours)
        other = sorted(t for t in both if stock.get(t) != ours.get(t) and t not in regressions)
        for test_id in other:
            print(
                f"  DIFFERENCE: {test_id}: {stock.get(test_id, 'missing')} stock, "
                f"{ours.get(test_id, 'missing')} with us"
            )
        print(f"{args.name}: {len(regressions) + len(other)} differences (--exact)")
        return 1 if regressions or other else 0
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
