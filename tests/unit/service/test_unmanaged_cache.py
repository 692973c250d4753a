"""A produce to an unmanaged topic asks ZooKeeper at most once per ``unmanaged_cache_s``.

Every produce to an unmanaged topic used to read ZooKeeper, which made unmanaged topics
slower through the sidecar than managed ones. "Not managed" is now believed for a short
while, and forgotten at once when the managed topics' list changes or the topic is
adopted: a topic that becomes managed must not keep bypassing routing. The store is a
fake that answers reads; the clock is the sidecar's own.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from sidecar.config import ProduceSettings, Settings
from sidecar.core.errors import UnknownTopic
from sidecar.core.generations import GenerationLog, PartitionMode
from sidecar.core.topics import TopicConfig, TopicState
from sidecar.metrics import SidecarMetrics
from sidecar.service.registry import TopicRegistry


class _Store:
    def __init__(self) -> None:
        self.reads = 0
        self.managed: dict[str, TopicState] = {}

    async def read_topic(self, name: str, changed: Any = None) -> TopicState:
        self.reads += 1
        if name not in self.managed:
            raise UnknownTopic(name)
        return self.managed[name]


def _sidecar(cache_s: float) -> tuple[TopicRegistry, _Store]:
    store = _Store()
    kafka: Any = object()
    settings = replace(
        Settings(sidecar_id="cache"), produce=ProduceSettings(unmanaged_cache_s=cache_s)
    )
    sidecar = TopicRegistry(settings, store, kafka, SidecarMetrics())  # type: ignore[arg-type]
    sidecar.writer = object()  # type: ignore[assignment]
    sidecar.spawn = lambda coroutine: coroutine.close()  # type: ignore[method-assign,attr-defined]
    return sidecar, store


def _managed(name: str) -> TopicState:
    return TopicState(
        TopicConfig(name, 2, 3), GenerationLog.start(2), (PartitionMode.READ_WRITE,) * 2
    )


async def test_not_managed_is_read_once_within_the_cache_time() -> None:
    sidecar, store = _sidecar(cache_s=60.0)
    for _ in range(5):
        assert await sidecar.runtime("plain") is None
    assert store.reads == 1


async def test_a_topic_becoming_managed_is_believed_at_once_after_the_list_changes() -> None:
    sidecar, store = _sidecar(cache_s=60.0)
    assert await sidecar.runtime("soon") is None
    store.managed["soon"] = _managed("soon")
    assert await sidecar.runtime("soon") is None  # within the cache time, before the watch
    sidecar._topic_list_changed()  # the watch on the managed topics' list fires
    runtime = await sidecar.runtime("soon")
    assert runtime is not None
    assert runtime.name == "soon"


async def test_not_managed_is_asked_again_after_the_cache_time() -> None:
    sidecar, store = _sidecar(cache_s=0.05)
    assert await sidecar.runtime("plain") is None
    await asyncio.sleep(0.1)
    store.managed["plain"] = _managed("plain")
    assert await sidecar.runtime("plain") is not None
    assert store.reads == 2


async def test_adopting_a_topic_forgets_that_it_was_not_managed() -> None:
    sidecar, _ = _sidecar(cache_s=60.0)
    assert await sidecar.runtime("adopted") is None
    sidecar._adopt_runtime(_managed("adopted"))  # as the topic list loop does
    assert await sidecar.runtime("adopted") is not None
    assert "adopted" not in sidecar._unmanaged
