"""``advise`` against a sweep of ``simulate`` over the shard count (issue 34): on the seed
scenarios of docs/hotspots.md and two skewed tenant mixes (a Zipf over 1,000 tenants; one
tenant at 100x among 1,000), the count ``advise`` recommends costs, by the same cost
function, within 10 % of the best count the sweep finds (examples/advise_sweep.py prints
the tables; docs/hotspots.md shows them)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.slow  # every scenario simulated at up to 16 counts: a minute each

ROOT = Path(__file__).resolve().parent.parent


def _sweep() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "advise_sweep", ROOT / "examples" / "advise_sweep.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


SWEEP = _sweep()


@pytest.mark.parametrize("name", list(SWEEP.scenarios()))
def test_advise_is_within_10_percent_of_the_sweeps_best(name: str) -> None:
    compared = SWEEP.compare(name, SWEEP.scenarios()[name], cheapest_first=True)
    print(compared.table())
    assert compared.sweep_best is not None and compared.advice.best is not None
    ratio = compared.ratio()
    assert ratio is not None and ratio <= 1.10, compared.table()
