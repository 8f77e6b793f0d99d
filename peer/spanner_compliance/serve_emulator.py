"""Start a Spanner emulator with one empty database for a peer suite; print its URL; wait.

Run by ``run.sh`` in the background: it prints ``HOST URL`` on one line once the database
exists, then waits until it is terminated (SIGTERM or SIGINT), and stops the emulator by
PID. If this process is killed outright, the emulator dies with it (it is started with
``PR_SET_PDEATHSIG``, see ``sharded_orm.testing.emulator``).

This process imports sharded-orm; the pytest process of the stock run never does.
"""

from __future__ import annotations

import signal
import sys
import threading

from sharded_orm.testing.emulator import host_env, start


def main() -> int:
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    emulator = start()
    try:
        with host_env(emulator.host):
            emulator.ensure_instance()
            database_id = emulator.create_database()
        print(emulator.host, emulator.url(database_id), flush=True)
        while not done.wait(1.0):
            pass
    finally:
        emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
