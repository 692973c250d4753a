"""Noticing that this process stopped running for a while.

A stopped process (SIGSTOP, a paused VM or container, a long swap storm) runs on as if
nothing happened when it resumes: its consumer instances still think they own their
partitions, and would tell their apps of key hand-off that the group may already have
given to another instance, whose app is told too. Kafka tells a consumer it was
expelled only at its next heartbeat; the event loop knows at once that it was not
scheduled. ``StallWatch`` measures that, and ``Consumers`` fences its instances until
their groups have said again who owns what.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

_log = logging.getLogger(__name__)


class StallWatch:
    """Ticks on the event loop; more than ``threshold_s`` between two ticks is a stall."""

    def __init__(self, threshold_s: float) -> None:
        self.threshold_s = threshold_s
        self.tick_s = threshold_s / 4
        self._last_tick = time.monotonic()

    def stalled(self) -> bool:
        """True while a stall is under way or has not been reported yet (the loop has
        just resumed and the watch has not ticked): asked before telling an app."""
        return self.threshold_s > 0 and time.monotonic() - self._last_tick > self.threshold_s

    def start(self, on_stall: Callable[[float], None]) -> asyncio.Task[None]:
        """Call ``on_stall(seconds)`` after every stall, until the task is cancelled."""
        self._last_tick = time.monotonic()
        return asyncio.create_task(self._watch(on_stall))

    async def _watch(self, on_stall: Callable[[float], None]) -> None:
        if self.threshold_s <= 0:
            return
        while True:
            await asyncio.sleep(self.tick_s)
            now = time.monotonic()
            # The gap between two ticks, as ``stalled`` measures it: a stall that began
            # between two ticks is seen, whatever part of the tick it fell in.
            gap = now - self._last_tick
            self._last_tick = now
            if gap > self.threshold_s:
                try:
                    on_stall(gap)
                except Exception:
                    # The watch must outlive a failing callback: stopped, it would leave
                    # ``stalled`` true for good and every hand-off refused.
                    _log.exception("reacting to a stall of %.1f s failed", gap)
