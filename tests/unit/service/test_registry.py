"""A sidecar that adopts a managed topic while a change of it is under way.

The change's coordinator may have published its barrier before this sidecar registered,
and then does not count it among the participants it waits for: a record this sidecar
routed under the old generation could land after the boundaries. Adopted with the
barrier pending, the topic holds its produces until the change ends. The sidecar's
adapters are reduced to what adoption touches; the change's end is applied as a watch
would apply it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any

import pytest

from sidecar.config import Settings
from sidecar.core.errors import MetadataUnavailable, UnknownTopic
from sidecar.core.generations import Boundary, GenerationLog, PartitionMode
from sidecar.core.participant import Admission
from sidecar.core.topics import PendingBarrier, TopicConfig, TopicState
from sidecar.metrics import SidecarMetrics
from sidecar.service.registry import TopicRegistry


class _Store:
    def __init__(self) -> None:
        self.watched: list[str] = []
        """The topics whose reads armed watches (a ``changed`` callback given)."""


def _sidecar() -> TopicRegistry:
    store: Any = _Store()
    kafka: Any = object()
    sidecar = TopicRegistry(Settings(sidecar_id="adopting"), store, kafka, SidecarMetrics())
    sidecar.writer = object()  # type: ignore[assignment]  # a writer is up: not the reason to hold
    sidecar.spawn = lambda coroutine: coroutine.close()  # type: ignore[method-assign,attr-defined]
    return sidecar


def _state(pending: PendingBarrier | None) -> TopicState:
    log = GenerationLog.start(2)
    return TopicState(
        TopicConfig("t", 2, 3),
        log,
        (PartitionMode.READ_WRITE,) * 2,
        pending=pending,
    )


def test_a_topic_adopted_during_a_change_holds_until_it_commits() -> None:
    sidecar = _sidecar()
    runtime = sidecar._adopt_runtime(_state(PendingBarrier(generation=1, target_count=3)))
    assert runtime.participant.admission() is Admission.HOLD
    # The change commits: as a watch's refresh applies it, produces route again.
    state = _state(None)
    log = state.log.append(state.log.next_generation(3, [Boundary(5), Boundary(0), Boundary(0)]))
    committed = TopicState(state.config, log, (PartitionMode.READ_WRITE,) * 3)
    sidecar._apply_state(runtime, committed)
    assert runtime.participant.admission() is Admission.ROUTE
    assert runtime.participant.generation == 1


def test_a_topic_adopted_with_no_change_under_way_routes_at_once() -> None:
    sidecar = _sidecar()
    runtime = sidecar._adopt_runtime(_state(None))
    assert runtime.participant.admission() is Admission.ROUTE


class _Writer:
    def __init__(self) -> None:
        self.prepared: list[tuple[str, int]] = []

    async def prepare(self, topic: str, count: int) -> None:
        self.prepared.append((topic, count))


def _preparing_sidecar() -> tuple[TopicRegistry, _Writer]:
    sidecar = _sidecar()
    writer = _Writer()
    sidecar.writer = writer  # type: ignore[assignment]

    def run_now(coroutine: Any) -> None:
        # The writer's prepare() never suspends here: run it to its end at once. The
        # refresh adoption starts reads ZooKeeper, which this sidecar does not have.
        if coroutine.cr_code.co_name != "prepare":
            coroutine.close()
            return
        with contextlib.suppress(StopIteration):
            coroutine.send(None)

    sidecar.spawn = run_now  # type: ignore[method-assign]
    return sidecar, writer


def test_an_expansion_has_the_writer_learn_its_partitions_while_produces_are_held() -> None:
    sidecar, writer = _preparing_sidecar()
    runtime = sidecar._adopt_runtime(_state(None))
    sidecar._apply_state(runtime, _state(PendingBarrier(generation=1, target_count=5)))
    assert writer.prepared == [("t", 5)]
    assert runtime.participant.admission() is Admission.HOLD
    # The same barrier read again (another watch, a reconnect) asks nothing more.
    sidecar._apply_state(runtime, _state(PendingBarrier(generation=1, target_count=5)))
    assert writer.prepared == [("t", 5)]


def test_a_shrink_has_nothing_to_prepare() -> None:
    sidecar, writer = _preparing_sidecar()
    runtime = sidecar._adopt_runtime(_state(None))
    sidecar._apply_state(runtime, _state(PendingBarrier(generation=1, target_count=1)))
    assert writer.prepared == []
    assert runtime.participant.admission() is Admission.HOLD


class _SlowStore(_Store):
    """Reads of the topic wait until ``answer`` is set; each is counted."""

    def __init__(self, state: TopicState) -> None:
        super().__init__()
        self.state = state
        self.reads = 0
        self.answer = asyncio.Event()

    async def read_topic(self, name: str, changed: Any = None) -> TopicState:
        self.reads += 1
        if changed is not None:
            self.watched.append(name)
        await self.answer.wait()
        return self.state


async def test_refreshes_asked_while_one_reads_are_done_by_one_more_read() -> None:
    store = _SlowStore(_state(None))
    sidecar = _sidecar()
    sidecar.store = store  # type: ignore[assignment]
    runtime = sidecar._adopt_runtime(_state(None))
    reading = asyncio.create_task(sidecar.refresh(runtime))
    await asyncio.sleep(0)
    assert store.reads == 1
    # Watches fire while that read is under way: what it read may predate them.
    later = [asyncio.create_task(sidecar.refresh(runtime)) for _ in range(4)]
    await asyncio.sleep(0)
    store.answer.set()
    await asyncio.gather(reading, *later)
    assert store.reads == 2
    # Asked after everything was read: read again.
    await sidecar.refresh(runtime)
    assert store.reads == 3


class _ManyTopics(_Store):
    """``count`` managed topics; reads overlap as ZooKeeper round trips would."""

    def __init__(self, count: int, unknown: str = "", failing: str = "") -> None:
        super().__init__()
        self.names = [f"t{i:03d}" for i in range(count)]
        self.unknown = unknown
        self.failing = failing
        self.reading = 0
        self.most_at_once = 0

    async def list_topics(self) -> list[str]:
        return list(self.names)

    async def read_topic(self, name: str, changed: Any = None) -> TopicState:
        self.reading += 1
        self.most_at_once = max(self.most_at_once, self.reading)
        try:
            await asyncio.sleep(0.001)
            if name == self.unknown:
                raise UnknownTopic(f"topic {name!r} is not managed")
            if name == self.failing:
                raise MetadataUnavailable("ZooKeeper: connection lost")
            if changed is not None:
                self.watched.append(name)
            state = _state(None)
            return replace(state, config=replace(state.config, name=name))
        finally:
            self.reading -= 1


async def test_the_topic_list_is_read_a_few_topics_at_a_time() -> None:
    store = _ManyTopics(40, unknown="t007")
    sidecar = _sidecar()
    sidecar.store = store  # type: ignore[assignment]
    await sidecar.refresh_topic_list()
    assert sorted(sidecar.topics) == [name for name in store.names if name != "t007"]
    assert store.most_at_once == sidecar.settings.zookeeper.read_concurrency
    assert sorted(store.watched) == sorted(sidecar.topics)


async def test_a_read_that_fails_is_raised_after_the_others_are_adopted() -> None:
    store = _ManyTopics(20, failing="t003")
    sidecar = _sidecar()
    sidecar.store = store  # type: ignore[assignment]
    with pytest.raises(MetadataUnavailable):
        await sidecar.refresh_topic_list()
    assert len(sidecar.topics) == 19
    assert store.reading == 0
