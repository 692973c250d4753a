"""A retirement round and the changes it waits for (``sidecar.service.retirement``).

The round decides on what it read, then takes the topic's change lock to act. Changes
hold that lock: while the round waits, one can bring a read-only partition back, write to
it, and a next one make it read-only again. Its mode is the same, but it holds records
past the ends the round read, that no group has consumed. Chaos run 14 found that round
truncating such a partition at its old end and removing it, which opened the gate of the
keys' new partition over records not yet delivered.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from sidecar.adapters.kafka import KafkaGateway
from sidecar.adapters.zookeeper import MetadataStore
from sidecar.core.generations import (
    Boundary,
    GenerationLog,
    PartitionMode,
    RetirementAction,
    modes_after_commit,
)
from sidecar.core.topics import TopicConfig, TopicState
from sidecar.metrics import SidecarMetrics
from sidecar.service.retirement import Retirer

TOPIC = "orders"
RW, RO = PartitionMode.READ_WRITE, PartitionMode.READ_ONLY


def _state(
    log: GenerationLog, modes: tuple[PartitionMode, ...], *, compacted: bool = False
) -> TopicState:
    config = TopicConfig(TOPIC, 2, 3, compacted=compacted)
    return TopicState(config, log, modes, (None,) * len(modes))


def _after(state: TopicState, count: int, ends: list[int]) -> TopicState:
    """``state`` once a change to ``count`` partitions committed at ``ends``."""
    generation = state.log.next_generation(count, [Boundary(end) for end in ends])
    return _state(state.log.append(generation), modes_after_commit(state.modes, generation))


class _Store:
    """The topic's state in ZooKeeper; ``while_locking`` runs as the lock is taken (the
    changes the round waited for)."""

    def __init__(self, state: TopicState) -> None:
        self.state = state
        self.while_locking: Callable[[], None] = lambda: None
        self.written: list[tuple[PartitionMode, ...]] = []

    async def read_topic(self, topic: str) -> TopicState:
        return self.state

    async def known_groups(self) -> list[str]:
        return ["billing"]

    async def acknowledged_revocations(self, group: str, topic: str) -> set[tuple[int, int]]:
        # The group's app acknowledged every keys_revoked of partition 2 (both shrinks).
        return {(2, 2), (2, 4)}

    @contextlib.asynccontextmanager
    async def lock(self, topic: str, owner: str, wait_s: float) -> AsyncIterator[None]:
        self.while_locking()
        yield

    async def set_partitions(
        self, topic: str, modes: tuple[PartitionMode, ...], delete_after: Any
    ) -> None:
        self.written.append(modes)
        self.state = _state(self.state.log, modes)


class _Kafka:
    def __init__(
        self, ends: list[int], committed: dict[int, int], highs: list[int] | None = None
    ) -> None:
        self.ends = ends
        """Last stable offsets."""
        self.highs = highs
        """High watermarks; None: equal to the stable offsets (no transaction open)."""
        self.committed = committed
        self.deleted: list[dict[int, int]] = []

    async def log_start_offsets(self, topic: str, count: int) -> list[int]:
        return [0] * count

    async def end_offsets(self, topic: str, count: int) -> list[int]:
        return self.ends[:count]

    async def high_watermarks(self, topic: str, count: int) -> list[int]:
        return (self.ends if self.highs is None else self.highs)[:count]

    async def committed_offsets(self, group: str, topic: str, count: int) -> dict[int, int]:
        return self.committed

    async def delete_records(self, topic: str, offsets: dict[int, int]) -> None:
        self.deleted.append(offsets)


def _retirer(store: _Store, kafka: _Kafka) -> Retirer:
    retirer = Retirer(
        "sidecar-a", cast(MetadataStore, store), cast(KafkaGateway, kafka), SidecarMetrics()
    )

    async def intact(topic: str, log: GenerationLog, what: str) -> None:
        return None  # the boundaries' truncation check has tests of its own

    retirer.boundaries.require_intact = intact  # type: ignore[method-assign,assignment]
    return retirer


def _shrunk() -> TopicState:
    """3 partitions shrunk to 2 at offsets (10, 10, 40): partition 2 is read-only."""
    start = _state(GenerationLog.start(2), (RW, RW))
    grown = _after(start, 3, [0, 0, 0])
    return _after(grown, 2, [10, 10, 40])


async def test_a_drained_read_only_partition_is_truncated_and_removed() -> None:
    store = _Store(_shrunk())
    kafka = _Kafka(ends=[10, 10, 40], committed={0: 10, 1: 10, 2: 40})
    decisions = await _retirer(store, kafka).retire(TOPIC)
    assert decisions == {2: RetirementAction.TRUNCATE}
    assert kafka.deleted == [{2: 40}]
    assert store.written == [(RW, RW, PartitionMode.REMOVED)]


async def test_a_compacted_topic_keeps_a_drained_read_only_partition() -> None:
    """Kafka refuses DeleteRecords under cleanup.policy=compact: the round used to ask,
    fail, and defer the topic's housekeeping every round. It keeps the partition now."""
    shrunk = _shrunk()
    store = _Store(_state(shrunk.log, shrunk.modes, compacted=True))
    kafka = _Kafka(ends=[10, 10, 40], committed={0: 10, 1: 10, 2: 40})
    decisions = await _retirer(store, kafka).retire(TOPIC)
    assert decisions == {2: RetirementAction.KEEP}
    assert (kafka.deleted, store.written) == ([], [])


async def test_changes_committed_while_the_round_waited_for_the_lock_make_it_decide_again() -> None:
    store = _Store(_shrunk())
    kafka = _Kafka(ends=[10, 10, 40], committed={0: 10, 1: 10, 2: 40})

    def brought_back_written_and_shrunk_again() -> None:
        # While the round waited: partition 2 read-write again, records 40-55 written
        # to it, then read-only again. Nobody has read them.
        again = _after(store.state, 3, [10, 10, 40])
        store.state = _after(again, 2, [12, 12, 56])
        kafka.ends = [12, 12, 56]

    store.while_locking = brought_back_written_and_shrunk_again
    decisions = await _retirer(store, kafka).retire(TOPIC)
    assert decisions == {2: RetirementAction.KEEP}
    assert kafka.deleted == []
    assert store.written == []
    assert store.state.modes == (RW, RW, RO)

    # The next round decides on what is there now: not drained, so kept.
    store.while_locking = lambda: None
    assert await _retirer(store, kafka).retire(TOPIC) == {2: RetirementAction.KEEP}
    kafka.committed = {0: 12, 1: 12, 2: 56}
    assert await _retirer(store, kafka).retire(TOPIC) == {2: RetirementAction.TRUNCATE}
    assert kafka.deleted == [{2: 56}]


async def test_a_partition_with_a_transaction_still_open_is_neither_empty_nor_drained() -> None:
    """A transaction left open (a failed warm-up's, a writer's outside the sidecars)
    holds the stable offset at its first record: partition 2 of nothing but that
    record looked empty, and was removed while records past it were still to be
    committed and read."""
    store = _Store(_shrunk())
    kafka = _Kafka(ends=[10, 10, 0], committed={0: 10, 1: 10}, highs=[10, 10, 25])
    assert await _retirer(store, kafka).retire(TOPIC) == {2: RetirementAction.KEEP}
    kafka.ends, kafka.committed = [10, 10, 40], {0: 10, 1: 10, 2: 40}
    kafka.highs = [10, 10, 41]
    assert await _retirer(store, kafka).retire(TOPIC) == {2: RetirementAction.KEEP}
    assert (kafka.deleted, store.written) == ([], [])
    # Ended: decided on what is there.
    kafka.highs = None
    assert await _retirer(store, kafka).retire(TOPIC) == {2: RetirementAction.TRUNCATE}
    assert kafka.deleted == [{2: 40}]
