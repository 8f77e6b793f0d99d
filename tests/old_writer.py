"""Helpers of the reshard journeys' old-writer process (tests/reshard_models.py ``writer``):
its environment, the stats file it replaces whole after each write, and waiting on them."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def env() -> dict[str, str]:
    """The environment of a process that imports the tests' model modules."""
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(HERE), out.get("PYTHONPATH", "")])
    return out


def stats(out: Path) -> dict[str, Any]:
    """The writer's counts so far (``ok``, ``failed``...); zero before its first write."""
    path = out / "writer.json"
    return json.loads(path.read_text()) if path.exists() else {"ok": 0, "failed": 0}


def wait_for(what: str, cond: Any, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def stop(writer: subprocess.Popen[Any], out: Path) -> None:
    """Asks the writer to stop (``out/stop``) and waits for it; killed after 60 s: never
    leave a writer holding the emulator's one transaction."""
    (out / "stop").touch()
    try:
        writer.wait(60)
    except subprocess.TimeoutExpired:
        writer.kill()
        raise
