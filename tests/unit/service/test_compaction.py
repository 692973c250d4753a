"""One compaction pass (``sidecar.service.compaction``) against a store and Kafka in
memory: it folds only as far as every partition's log start and every group's hand-off
allow, writes in batches each of which is a valid log, and a pass that dies between
reading and writing, or between two batches, leaves a log the next pass completes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.compaction import compact, foldable_count
from sidecar.core.errors import MetadataUnavailable, OperationInProgress
from sidecar.core.generations import Boundary, GenerationLog, PartitionMode
from sidecar.core.procedures import Operation, OperationKind, Phase, SidecarId
from sidecar.core.topics import TopicConfig, TopicState
from sidecar.faults import FaultHooks
from sidecar.metrics import SidecarMetrics
from sidecar.service.compaction import Compactor
from tests.support.retained_topic import RetainedTopic, assert_same_decisions, retained_topics
from tests.unit.adapters.zookeeper.support import memory_topics, stored_topic

TOPIC = "orders"


def _log(changes: int) -> GenerationLog:
    """One partition grown to two and shrunk back, ``changes`` times in all; the
    boundaries of change ``i`` are ``10 * i`` in both partitions. Change 1 (an
    expansion) moved keys away from partition 0, change 2 (a shrink) from partition 1,
    and so on alternately."""
    log = GenerationLog.start(1)
    for index in range(1, changes + 1):
        count = 2 if log.current.undeleted_count == 1 else 1
        log = log.append(log.next_generation(count, [Boundary(10 * index)] * 2))
    return log


class Store:
    """The topic's stored log, its journal, its lock and the groups' acknowledgements."""

    def __init__(self, log: GenerationLog) -> None:
        modes = (PartitionMode.READ_WRITE,) * log.current.physical_count
        self.state = TopicState(TopicConfig(TOPIC, 1, 1), log, modes)
        self.acknowledged: dict[str, set[tuple[int, int]]] = {}
        self.lock_holder: str | None = None
        self.locks_taken: list[str] = []
        """The owner of every lock taken, in order."""
        self.writes: list[tuple[int, int]] = []
        """(first generation before, after) of every compaction written."""
        self.fail_write: int | None = None
        """Refuse the write with this index (0: the first): the compactor's session is
        lost before its multi-op reaches ZooKeeper."""

    @property
    def log(self) -> GenerationLog:
        return self.state.log

    @contextlib.asynccontextmanager
    async def _held(self, owner: str) -> AsyncIterator[None]:
        if self.lock_holder is not None:
            raise OperationInProgress(f"{self.lock_holder} holds the change lock")
        self.lock_holder = owner
        self.locks_taken.append(owner)
        try:
            yield
        finally:
            self.lock_holder = None

    def lock(
        self, topic: str, owner: str, timeout: float, purpose: str = "change"
    ) -> contextlib.AbstractAsyncContextManager[None]:
        assert purpose == "compaction"
        return self._held(owner)

    async def read_topic(self, topic: str) -> TopicState:
        return self.state

    async def known_groups(self) -> list[str]:
        return sorted(self.acknowledged)

    async def acknowledged_revocations(self, group: str, topic: str) -> set[tuple[int, int]]:
        return set(self.acknowledged[group])

    async def compact_log(self, topic: str, log: GenerationLog, compacted: GenerationLog) -> int:
        assert self.lock_holder is not None, "written without the lock"
        if len(self.writes) == self.fail_write:
            self.fail_write = None
            raise MetadataUnavailable("the session was lost")
        if log != self.log:
            raise OperationInProgress("the log changed since it was read")
        # What the adapter writes is a log as a reader rebuilds it: a valid one.
        assert compacted == compact(self.log, compacted.first_number)
        self.writes.append((log.first_number, compacted.first_number))
        self.state = dataclasses.replace(self.state, log=compacted)
        return compacted.first_number - log.first_number


class Kafka:
    def __init__(self, log_start: list[int], committed: dict[str, dict[int, int]]) -> None:
        self.log_start = log_start
        self.committed = committed
        self.reads = 0

    async def log_start_offsets(self, topic: str, count: int) -> list[int]:
        self.reads += 1
        return self.log_start[:count]

    async def committed_offsets(self, group: str, topic: str, count: int) -> dict[int, int]:
        return dict(self.committed.get(group, {}))


def _compactor(store: Store, kafka: Kafka, batch: int = 1000) -> tuple[Compactor, SidecarMetrics]:
    metrics = SidecarMetrics()
    return Compactor("s1", store, kafka, metrics, batch=batch), metrics


def _folded(metrics: SidecarMetrics) -> float:
    value = metrics.registry.get_sample_value("sidecar_generations_folded_total", {"topic": TOPIC})
    return value or 0.0


async def test_nothing_is_folded_while_a_record_of_every_old_generation_is_left() -> None:
    store = Store(_log(4))
    compactor, metrics = _compactor(store, Kafka([0, 0], {}))
    assert (await compactor.compact(TOPIC)).folded == 0
    assert store.writes == []
    assert _folded(metrics) == 0
    # One partition's log start past the boundaries, the other's not: still nothing.
    compactor, _ = _compactor(store, Kafka([40, 9], {}))
    assert (await compactor.compact(TOPIC)).folded == 0


async def test_the_generations_whose_records_are_gone_are_folded() -> None:
    store = Store(_log(4))
    compactor, metrics = _compactor(store, Kafka([25, 31], {}))
    # Generation 2's boundaries (20, 20) are at or below both log starts, 3's (30) not.
    assert (await compactor.compact(TOPIC)).folded == 2
    assert store.log == compact(_log(4), 2)
    assert store.writes == [(0, 2)]
    assert _folded(metrics) == 2
    # Again, with nothing more gone: nothing more folded, nothing written.
    assert (await compactor.compact(TOPIC)).folded == 0
    assert store.writes == [(0, 2)]


async def test_the_current_generation_is_never_folded() -> None:
    store = Store(_log(3))
    compactor, _ = _compactor(store, Kafka([1000, 1000], {}))
    assert (await compactor.compact(TOPIC)).folded == 3
    assert store.log.first_number == store.log.current.number == 3
    # Only the current generation left: not even Kafka is asked.
    kafka = Kafka([1000, 1000], {})
    compactor, _ = _compactor(store, kafka)
    assert (await compactor.compact(TOPIC)).folded == 0
    assert kafka.reads == 0


async def test_a_group_that_owes_a_revocation_stops_the_fold_at_its_change() -> None:
    store = Store(_log(4))
    store.acknowledged = {"billing": set()}
    # billing read partition 0 before retention removed it: it must still be told that
    # change 1 moved keys away from there, and acknowledge it.
    kafka = Kafka([45, 45], {"billing": {0: 45}})
    compactor, _ = _compactor(store, kafka)
    assert (await compactor.compact(TOPIC)).folded == 0
    # Acknowledged: change 1 may go; change 3 moved keys away from partition 0 again,
    # and is owed too.
    store.acknowledged["billing"] = {(0, 1)}
    assert (await compactor.compact(TOPIC)).folded == 2
    store.acknowledged["billing"] = {(0, 1), (0, 3)}
    assert (await compactor.compact(TOPIC)).folded == 2
    assert store.log == compact(_log(4), 4)


async def test_a_group_that_never_committed_in_the_source_owes_nothing() -> None:
    store = Store(_log(4))
    store.acknowledged = {"audit": set()}
    compactor, _ = _compactor(store, Kafka([45, 45], {"audit": {1: 45}}))
    # audit read only partition 1: change 2 (keys away from 1) is owed, change 1 not.
    assert (await compactor.compact(TOPIC)).folded == 1


async def test_a_long_prefix_is_folded_in_batches_each_a_valid_log() -> None:
    store = Store(_log(7))
    compactor, metrics = _compactor(store, Kafka([65, 65], {}), batch=2)
    assert (await compactor.compact(TOPIC)).folded == 6
    assert store.writes == [(0, 2), (2, 4), (4, 6)]
    assert store.log == compact(_log(7), 6)
    assert _folded(metrics) == 6


async def test_a_pass_that_dies_before_writing_leaves_the_old_log() -> None:
    store = Store(_log(4))
    store.fail_write = 0
    compactor, metrics = _compactor(store, Kafka([45, 45], {}))
    with pytest.raises(MetadataUnavailable):
        await compactor.compact(TOPIC)
    assert store.log == _log(4)
    assert store.lock_holder is None
    assert _folded(metrics) == 0
    # The next pass (here the same sidecar's) does it all.
    assert (await compactor.compact(TOPIC)).folded == 4


async def test_a_pass_that_dies_between_batches_leaves_a_log_the_next_one_completes() -> None:
    store = Store(_log(7))
    store.fail_write = 1
    compactor, _ = _compactor(store, Kafka([65, 65], {}), batch=2)
    with pytest.raises(MetadataUnavailable):
        await compactor.compact(TOPIC)
    assert store.log == compact(_log(7), 2)
    assert (await compactor.compact(TOPIC)).folded == 4
    assert store.log == compact(_log(7), 6)


async def test_a_pass_cancelled_while_reading_writes_nothing() -> None:
    store = Store(_log(4))
    reading = asyncio.Event()

    class SlowKafka(Kafka):
        async def log_start_offsets(self, topic: str, count: int) -> list[int]:
            reading.set()
            await asyncio.sleep(60)
            return await super().log_start_offsets(topic, count)

    compactor, _ = _compactor(store, SlowKafka([45, 45], {}))
    task = asyncio.create_task(compactor.compact(TOPIC))
    await reading.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert store.log == _log(4)
    assert store.writes == []
    assert store.lock_holder is None


async def test_nothing_is_folded_while_a_change_is_in_progress() -> None:
    store = Store(_log(4))
    operation = Operation(
        topic=TOPIC,
        kind=OperationKind.EXPAND,
        from_generation=4,
        from_count=1,
        target_count=2,
        phase=Phase.BARRIER,
        coordinator=SidecarId("s2"),
        started_at=0.0,
        barrier_deadline=1.0,
        physical_count=2,
    )
    store.state = dataclasses.replace(store.state, operation=operation)
    kafka = Kafka([45, 45], {})
    compactor, _ = _compactor(store, kafka)
    assert (await compactor.compact(TOPIC)).folded == 0
    assert kafka.reads == 0
    store.state = dataclasses.replace(
        store.state, operation=dataclasses.replace(operation, phase=Phase.DONE)
    )
    assert (await compactor.compact(TOPIC)).folded == 4


async def test_only_the_lock_holder_compacts() -> None:
    store = Store(_log(4))
    store.lock_holder = "s2"
    compactor, _ = _compactor(store, Kafka([45, 45], {}))
    with pytest.raises(OperationInProgress, match="s2 holds"):
        await compactor.compact(TOPIC)
    assert store.writes == []


def test_a_batch_folds_at_least_one_generation() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Compactor("s1", Store(_log(1)), Kafka([], {}), SidecarMetrics(), batch=0)


async def test_the_fault_hook_runs_after_the_fold_is_decided_and_before_it_is_written() -> None:
    store = Store(_log(4))
    seen: list[tuple[str, list[tuple[int, int]], str | None]] = []

    class Hooks(FaultHooks):
        def before_compaction_write(self, topic: str) -> None:
            seen.append((topic, list(store.writes), store.lock_holder))

    metrics = SidecarMetrics()
    compactor = Compactor("s1", store, Kafka([45, 45], {}), metrics, batch=2, faults=Hooks())
    assert (await compactor.compact(TOPIC)).folded == 4
    assert seen == [(TOPIC, [], "s1")]  # once per pass, holding the lock, nothing written
    assert (await compactor.compact(TOPIC)).folded == 0
    assert len(seen) == 1  # nothing to fold: not called


class StoredTopic:
    """The pass's store over the adapter's own topic reads and writes (``Topics``), on
    ZooKeeper in memory: what it writes is what every sidecar reads back."""

    def __init__(self, log: GenerationLog) -> None:
        self.client, self.topics = stored_topic(log, TOPIC)
        self.writes = 0

    def lock(
        self, topic: str, owner: str, timeout: float, purpose: str = "change"
    ) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    async def read_topic(self, topic: str) -> TopicState:
        return await self.topics.read_topic(topic)

    async def known_groups(self) -> list[str]:
        return []

    async def acknowledged_revocations(self, group: str, topic: str) -> set[tuple[int, int]]:
        raise AssertionError("no group is known")

    async def compact_log(self, topic: str, log: GenerationLog, compacted: GenerationLog) -> int:
        self.writes += 1
        return await self.topics.compact_log(topic, log, compacted)


@settings(max_examples=100, deadline=None)
@given(retained=retained_topics(), batch=st.integers(1, 4))
def test_a_stored_log_compacted_by_passes_decides_every_remaining_record_the_same(
    retained: RetainedTopic, batch: int
) -> None:
    """Random changes and retention; the pass folds the stored full log in batches, and
    the log read back from ZooKeeper is the core's fold, deciding every record still in
    Kafka as the full log does."""
    store = StoredTopic(retained.full)
    kafka = Kafka(retained.log_start, {})
    compactor = Compactor("s1", store, kafka, SidecarMetrics(), batch=batch)
    done = asyncio.run(compactor.compact(TOPIC))
    first = foldable_count(retained.full, retained.starts, groups=())
    assert done.first_generation == first
    assert done.folded == first
    assert store.writes == -(-first // batch)  # ceiling: one multi-op per batch
    stored = asyncio.run(memory_topics(store.client).read_topic(TOPIC)).log
    assert stored == compact(retained.full, first)
    assert_same_decisions(retained, stored)
    nodes = store.client.get_children(f"/ordered/topics/{TOPIC}/generations")
    assert sorted(int(name) for name in nodes) == [g.number for g in stored.generations]


async def test_a_pass_given_the_topic_as_seen_takes_no_lock_unless_it_could_fold() -> None:
    """Housekeeping's passes: nothing to fold costs no lock (every lock taken wakes
    every sidecar's journal watch); something to fold goes through the locked pass."""
    store = Store(_log(4))
    taken = store.locks_taken
    kafka = Kafka([0, 0], {})
    compactor, metrics = _compactor(store, kafka)
    assert (await compactor.compact(TOPIC, seen=store.state)).folded == 0
    assert (taken, store.writes, kafka.reads) == ([], [], 1)
    # The log starts moved past every old boundary: the locked pass folds.
    kafka.log_start = [10**6, 10**6]
    assert (await compactor.compact(TOPIC, seen=store.state)).folded == 4
    assert taken == ["s1"]
    assert _folded(metrics) == 4
    # Only the current generation is left: nothing asked, no lock.
    reads = kafka.reads
    assert (await compactor.compact(TOPIC, seen=store.state)).folded == 0
    assert (taken, kafka.reads) == (["s1"], reads)
