"""`sharded-orm simulate` checks every numeric flag's range as `advise` does (one shared
argparse type, tools/contract.number): a 0, a negative or a NaN is refused in one line
naming the flag and its range, before any table is loaded."""

from __future__ import annotations

import pytest

from sharded_orm.tools.cli import main

FLAGS = {
    "--rows-per-second": "> 0",
    "--duration": "> 0",
    "--tenants": "> 0",
    "--users-per-tenant": "> 0",
    "--history": ">= 0",
    "--nodes": "> 0",
    "--node-capacity": "> 0",
    "--tick": "> 0",
    "--zipf": ">= 0 and <= 10",
}
WHOLE = {"--tenants", "--users-per-tenant", "--nodes"}


def _run(capsys: pytest.CaptureFixture[str], flag: str, value: str) -> tuple[int, str]:
    argv = {"--rows-per-second": "10", "--duration": "5"}
    argv[flag] = value
    code = main(["simulate", "examples.hotspots:LogEntry", *[f"{k}={v}" for k, v in argv.items()]])
    out, err = capsys.readouterr()
    assert out == ""
    return code, err


@pytest.mark.parametrize("flag", sorted(FLAGS))
@pytest.mark.parametrize("value", ["0", "-1", "-0.5", "nan", "inf", "-inf", "abc"])
def test_an_out_of_range_flag_is_one_line_naming_its_range(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    if value == "0" and flag in ("--history", "--zipf"):
        return  # in range: no history, no skew
    code, err = _run(capsys, flag, value)
    assert code == 2
    [line] = err.strip().splitlines()
    assert f"argument {flag}: must be a" in line and FLAGS[flag] in line and repr(value) in line


def test_zipf_above_its_maximum_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, "--zipf", "11")
    assert code == 2 and ">= 0 and <= 10" in err


def test_a_fraction_for_a_whole_number_flag_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in sorted(WHOLE):
        code, err = _run(capsys, flag, "1.5")
        assert code == 2 and "whole number" in err, flag
