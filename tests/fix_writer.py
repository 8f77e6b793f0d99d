"""The OLD application of a seed scenario (docs/hotspots.md), writing through the library with
the model as it was before ``doctor --fix``: ``python fix_writer.py SCENARIO URL OUT``.
Stats in OUT/writer.json (tests/old_writer.py reads them); stops when OUT/stop exists."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples import hotspots as h  # noqa: E402

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
MODELS: dict[str, Any] = {
    "1": h.NaiveLogEntry,
    "2": h.sharded_log_entry(10),
    "3": h.NaiveUser,
    "4": h.NaiveEvent,
}


def table(scenario: str) -> sa.Table:
    t: sa.Table = MODELS[scenario].__table__
    return t


def row(scenario: str, i: int, tag: str) -> dict[str, Any]:
    ts = T0 + dt.timedelta(milliseconds=37 * i)
    if scenario in ("1", "2"):
        company = f"tenant-{(i % 3) + 1:05d}"
        return {"CompanyId": company, "UserId": f"{tag}{uuid.uuid4()}"[:36], "Timestamp": ts}
    if scenario == "3":
        return {"LastAccessTimestamp": ts, "UserId": (10**9 if tag == "old-" else 0) + i}
    return {"UserId": f"{tag}{uuid.uuid4()}"[:36], "Timestamp": ts}


def _publish(out: Path, stats: dict[str, Any]) -> None:
    tmp = out / "writer.json.tmp"
    tmp.write_text(json.dumps(stats))
    os.replace(tmp, out / "writer.json")


def writer(scenario: str, url: str, out: Path) -> None:
    import warnings

    warnings.simplefilter("ignore")
    t = table(scenario)
    engine = sa.create_engine(url)
    ok = failed = 0
    errors: list[str] = []
    i = 0
    while not (out / "stop").exists():
        i += 1
        try:
            with engine.begin() as conn:
                conn.execute(t.insert(), [row(scenario, i, "old-")])
            ok += 1
        except Exception as exc:  # aborts, and once fenced "column/table not found"
            failed += 1
            orig = getattr(exc, "orig", exc)
            errors.append(str(orig.__cause__ or orig)[:200])
        _publish(out, {"ok": ok, "failed": failed})
        time.sleep(0.25)  # the emulator runs one read-write transaction at a time
    _publish(out, {"ok": ok, "failed": failed, "errors": errors})
    engine.dispose()


if __name__ == "__main__":
    writer(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
