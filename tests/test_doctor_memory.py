"""``doctor`` streams its input (issue 33, item 2): the peak RSS of a subprocess running the
CLI on a generated 52 MB export (CSV and JSON) stays within a few MiB of its peak on a
5 MB one. Before, the whole file, every decoded row and the heatmap's rows were held at
once: 512 MB peak on a 52 MB export."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

MODELS = """
import datetime as dt
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sharded_orm import UTCDateTime


class Base(DeclarativeBase):
    pass


class Log(Base):
    __tablename__ = "Logs"
    ts: Mapped[dt.datetime] = mapped_column("Timestamp", UTCDateTime, primary_key=True)
    log_id: Mapped[str] = mapped_column("LogId", sa.String(36), primary_key=True)
"""

RUN = """
import resource, sys
from sharded_orm.tools.cli import main
code = main(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def _row(i: int) -> list[str]:
    """Minute rows of a timestamp-keyed table, each split starting later than the last."""
    end = T0 + dt.timedelta(minutes=i // 50)
    ts = (T0 + dt.timedelta(seconds=i)).isoformat().replace("+00:00", "Z")
    start = f'Logs({ts},"{i:032x}")'
    return [end.isoformat().replace("+00:00", "Z"), start, "<end>", str(50 + i % 51)]


def _write(path: Path, megabytes: float) -> tuple[Path, int]:
    """An export of at least ``megabytes``; returns it and its row count."""
    head = ["INTERVAL_END", "SPLIT_START", "SPLIT_LIMIT", "CPU_USAGE_SCORE"]
    size, i = 0, 0
    with path.open("w") as f:
        if path.suffix == ".json":
            f.write("[\n")
        else:
            f.write(",".join([*head, "AFFECTED_TABLES", "UNSPLITTABLE_REASONS"]) + "\n")
        while size < megabytes * 1_000_000:
            r = _row(i)
            if path.suffix == ".json":
                obj = dict(zip(head, r, strict=True))
                obj["AFFECTED_TABLES"] = ["Logs"]
                obj["UNSPLITTABLE_REASONS"] = ["MOVING_HOT_SPOT"]
                line = ("," if i else "") + json.dumps(obj) + "\n"
            else:
                cells = ",".join(f'"{c.replace(chr(34), chr(34) * 2)}"' for c in r)
                line = cells + ',Logs,"[""MOVING_HOT_SPOT""]"\n'
            f.write(line)
            size += len(line)
            i += 1
        if path.suffix == ".json":
            f.write("]\n")
    return path, i


def _peak_kib(cwd: Path, export: Path, rows: int) -> int:
    env = {**os.environ, "PYTHONPATH": str(cwd), "SHARDED_ORM_PROGRESS": "off"}
    proc = subprocess.run(
        [sys.executable, "-c", RUN, "doctor", str(export), "models:Base", "--format", "json"],
        cwd=cwd, capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]  # hot: findings
    data = json.loads(proc.stdout)
    assert [f["pattern"] for f in data["findings"]] == ["monotonic"]
    assert data["summary"]["rows"] == rows
    return int(proc.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_doctor_memory_is_bounded_not_by_the_input(tmp_path: Path, suffix: str) -> None:
    (tmp_path / "models.py").write_text(textwrap.dedent(MODELS))
    small, n_small = _write(tmp_path / f"export_5{suffix}", 5)
    big, n_big = _write(tmp_path / f"export_52{suffix}", 52)
    assert big.stat().st_size > 52_000_000
    peak_small = _peak_kib(tmp_path, small, n_small)
    peak_big = _peak_kib(tmp_path, big, n_big)
    print(f"{suffix}: peak RSS {peak_small >> 10} MiB at 5 MB, {peak_big >> 10} MiB at 52 MB")
    assert peak_big - peak_small < 24 * 1024, (peak_small, peak_big)
