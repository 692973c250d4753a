"""Gate waits one consumer instance announces in ZooKeeper.

A waiting instance announces what its group must consume (``WaitKey``); an owner of a
blocking partition that auto-commits reads the announcements and commits at once
instead of at its next commit interval (``Offsets.help_waiters``).
"""

from __future__ import annotations

import contextlib
import time

from sidecar.core.errors import SidecarError
from sidecar.core.gate import WaitKey
from sidecar.core.generations import ChangeKind
from sidecar.service.consume_context import ConsumerMetrics, GroupStore


class GateWaits:
    def __init__(
        self, group: str, instance_key: str, store: GroupStore, metrics: ConsumerMetrics
    ) -> None:
        self.group = group
        self.instance_key = instance_key
        """The instance's name in ZooKeeper's wait records (sidecar id and instance)."""
        self.store = store
        self.metrics = metrics
        self._waits: dict[WaitKey, tuple[float, ChangeKind]] = {}
        """Announced waits: when each began, and of which kind of change."""

    def topics(self) -> set[str]:
        return {key.topic for key in self._waits}

    async def announce(self, key: WaitKey, kind: ChangeKind) -> None:
        if key in self._waits:
            return
        self._waits[key] = (time.monotonic(), kind)
        self.metrics.gate_waiting(key.topic, self.group, +1)
        await self.store.add_wait(self.group, *key, self.instance_key)

    async def clear(self, topic: str) -> None:
        for key in [k for k in self._waits if k.topic == topic]:
            began, kind = self._waits.pop(key)
            self.metrics.gate_waiting(topic, self.group, -1)
            self.metrics.gate_waited(topic, self.group, kind, time.monotonic() - began)
            with contextlib.suppress(SidecarError):
                await self.store.remove_wait(self.group, *key, self.instance_key)

    async def clear_all(self) -> None:
        for topic in self.topics():
            await self.clear(topic)
