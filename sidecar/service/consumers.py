"""Every consumer instance of this sidecar (the consume path's registry).

Creates instances with what they need (``ConsumeContext``), finds them by (group,
name), closes idle ones, and asks the groups subscribed to a topic to rebalance when
the topic's assignable partitions change. The consume path itself is in
``sidecar.service.instance`` and the components it composes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

from sidecar.core.errors import ConsumerStateConflict, UnknownConsumerInstance
from sidecar.service.consume_context import ConsumeContext
from sidecar.service.instance import ConsumerInstance, InstanceConfig
from sidecar.service.stalls import StallWatch

_log = logging.getLogger(__name__)


class Consumers:
    """Every consumer instance of this sidecar, by (group, name)."""

    def __init__(self, context: ConsumeContext) -> None:
        self.context = context
        self.instance_timeout_s = context.settings.instance_idle_timeout_s
        self.instances: dict[tuple[str, str], ConsumerInstance] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._changed_topics: set[str] = set()
        """Topics whose assignable partitions changed in the current window."""
        self._rebalance_timer: asyncio.TimerHandle | None = None
        self.stall_watch = StallWatch(context.settings.stall_fence_s)
        self._stall_watcher: asyncio.Task[None] | None = None

    def assignable_changed(self, topic: str) -> None:
        """The topic's assignable partitions changed: rebalance the groups reading it.

        Every rebalance revokes and reassigns every partition of the group (aiokafka's
        eager protocol): a pause of the group and one more chance to lose track. So the
        changes of one window (``consumer.rebalance_window_s``) make one rebalance, and
        only groups subscribed to a changed topic rebalance.
        """
        self._changed_topics.add(topic)
        if self._rebalance_timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on the event loop (a test calling directly)
            self._rebalance_changed()
            return
        self._rebalance_timer = loop.call_later(
            self.context.settings.rebalance_window_s, self._rebalance_changed
        )

    def _rebalance_changed(self) -> None:
        self._rebalance_timer = None
        topics, self._changed_topics = sorted(self._changed_topics), set()
        rejoined = [
            i.instance_id for i in self.instances.values() if i.rebalance_if_subscribed(topics)
        ]
        if rejoined:
            _log.info("%s: assignable partitions changed; rebalancing %s", topics, rejoined)

    def instance_key(self, config: InstanceConfig) -> str:
        return f"{self.context.sidecar_id}-{config.name}"

    async def create(self, config: InstanceConfig) -> ConsumerInstance:
        key = (config.group, config.name)
        if key in self.instances:
            raise ConsumerStateConflict(
                f"consumer instance {config.name} already exists in group {config.group}"
            )
        instance = ConsumerInstance(
            config,
            self.context,
            instance_key=self.instance_key(config),
            stalled=self.stall_watch.stalled,
        )
        if self._stall_watcher is None:
            self._stall_watcher = self.stall_watch.start(self._stalled)
        self.instances[key] = instance
        await self.context.store.register_group(config.group)
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._expire_idle())
        return instance

    def _stalled(self, seconds: float) -> None:
        fenced = [i.instance_id for i in self.instances.values() if i.stalled(seconds)]
        _log.warning(
            "this process did not run for %.1f s; rebalancing before telling or "
            "delivering more: %s",
            seconds,
            fenced or "no instance subscribed",
        )

    def get(self, group: str, name: str) -> ConsumerInstance:
        instance = self.instances.get((group, name))
        if instance is None:
            raise UnknownConsumerInstance(f"consumer instance {name} not found in group {group}")
        instance.last_used = time.monotonic()
        return instance

    async def delete(self, group: str, name: str) -> None:
        instance = self.get(group, name)
        del self.instances[(group, name)]
        await instance.close()

    async def close(self) -> None:
        if self._rebalance_timer is not None:
            self._rebalance_timer.cancel()
            self._rebalance_timer = None
        for task in (self._reaper, self._stall_watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for key in list(self.instances):
            await self.instances.pop(key).close()

    async def _expire_idle(self) -> None:
        while True:
            interval_s = self.context.settings.idle_check_interval_s
            await asyncio.sleep(min(interval_s, self.instance_timeout_s / 2))
            now = time.monotonic()
            for key, instance in list(self.instances.items()):
                if now - instance.last_used > self.instance_timeout_s and not instance.busy:
                    _log.info("consumer instance %s of %s expired (idle)", key[1], key[0])
                    del self.instances[key]
                    await instance.close()


def new_instance_name() -> str:
    return f"instance-{uuid.uuid4().hex[:12]}"
