"""Whether a blocking call left the event loop free, told without a stopwatch.

A heartbeat that checks how late the loop wakes up measures the machine as much as the
code: a full garbage collection or a busy core stalls a free loop too (0.85 s seen in
CI). :class:`LoopWatch` asks two questions whose answers do not depend on the machine:

* ``off_loop(what)``, called where the code under test blocks (a slowed statement, a
  reservation): is this running on the event loop's thread? If so, it is noted.
* ``wait_for_turns(what)``, called where something is held (the fault proxy's thread,
  a driver's thread): does the event loop keep turning while it is held? It returns as
  soon as the loop's task has run ``turns`` more times; a loop that a blocked call holds
  never does, and after ``timeout`` seconds that is noted. A blocked loop turns again
  once the call blocking it ends, so a call with a deadline is held with a ``timeout``
  under that deadline; the rest of the deadline is the margin a busy machine gets (the
  turns themselves take ``turns * PERIOD``: 60 ms). It is no performance target.

``watch.blocked`` lists what was noted; a test asserts it is empty.
"""

from __future__ import annotations

import asyncio
import threading

#: how often the watch's task wakes up, in seconds
PERIOD = 0.02


class LoopWatch:
    """A task on the running loop that counts its own turns (create it in the loop)."""

    def __init__(self) -> None:
        self.blocked: list[str] = []
        self.turns = 0
        self.held = 0
        self._loop_thread = threading.get_ident()
        self._turned = threading.Condition()
        self._stop = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._turn())

    async def _turn(self) -> None:
        while not self._stop.is_set():
            await asyncio.sleep(PERIOD)
            with self._turned:
                self.turns += 1
                self._turned.notify_all()

    def off_loop(self, what: str) -> bool:
        """True if this runs off the event loop's thread; else ``what`` is noted."""
        if threading.get_ident() == self._loop_thread:
            self.blocked.append(f"{what}: ran on the event loop's thread")
            return False
        return True

    def wait_for_turns(self, what: str, turns: int = 3, timeout: float = 10.0) -> None:
        """Hold the calling thread until the loop has turned ``turns`` more times."""
        if not self.off_loop(what):
            return
        with self._turned:
            self.held += 1
            target = self.turns + turns
            if not self._turned.wait_for(lambda: self.turns >= target, timeout):
                self.blocked.append(f"{what}: the event loop did not turn for {timeout} s")

    async def stop(self) -> list[str]:
        """End the watch's task; what was noted."""
        self._stop.set()
        await self._task
        return self.blocked
