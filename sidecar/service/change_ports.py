"""What a partition-count change needs of ZooKeeper and Kafka: the ports the change
runner (``service.changes``), the boundary check (``service.boundaries``) and the
retirer (``service.retirement``) are given.

``MetadataStore`` and ``KafkaGateway`` are the production ones; the unit tests give
fakes that hold the same records in memory. Each port names only what its service
calls, so what a change can touch is read here, not in two adapters of 30 methods.

One module per domain, not one per service nor one for every service: retirement is the
last step of a shrink, taken under the same change lock and refused by the same lost
boundaries, so its ports extend the boundary check's here. Making topics managed and
following them have theirs in ``service.topic_ports``, the consume path in
``service.consume_context``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from sidecar.adapters.kafka import OffsetAndEpoch
from sidecar.adapters.zookeeper import LockHolder
from sidecar.core.generations import Generation, PartitionMode
from sidecar.core.procedures import Operation, SidecarId, TransactionalId
from sidecar.core.topics import PendingBarrier, TopicState
from sidecar.core.truncation import ConfirmedLoss


class TruncationStore(Protocol):
    """A topic's state and the boundary losses an operator confirmed (KIP-320)."""

    async def read_topic(
        self, topic: str, changed: Callable[[], None] | None = None
    ) -> TopicState: ...

    async def confirmed_truncations(self, topic: str) -> frozenset[ConfirmedLoss]: ...

    async def confirm_truncations(self, topic: str, losses: Sequence[ConfirmedLoss]) -> None: ...


class EpochEnds(Protocol):
    """Where a partition's leader epochs end on its current leader (OffsetForLeaderEpoch)."""

    async def epoch_end_offsets(
        self, topic: str, epochs: Mapping[int, int]
    ) -> dict[int, OffsetAndEpoch | None]: ...


class ChangeStore(TruncationStore, Protocol):
    """The change's records in ZooKeeper: its lock and journal, the barrier and its acks,
    the live sidecars and registered producers, and the generation it commits."""

    def lock(
        self, topic: str, owner: str, timeout: float, purpose: str = "change"
    ) -> AbstractAsyncContextManager[None]: ...

    async def lock_holder(self, topic: str) -> LockHolder | None: ...

    async def read_operation(self, topic: str) -> Operation | None: ...

    def watch_journal(
        self,
        topic: str,
        seen: Callable[[Operation | None], None],
        unreadable: Callable[[], None],
    ) -> None: ...

    async def take_over_operation(self, topic: str) -> Operation | None: ...

    async def save_operation(self, operation: Operation) -> None: ...

    async def publish_barrier(self, topic: str, pending: PendingBarrier) -> None: ...

    async def remove_barrier(self, topic: str, generation: int) -> None: ...

    async def barrier_acks(
        self, topic: str, generation: int
    ) -> dict[SidecarId, dict[int, int]]: ...

    async def barrier_ackers(self, topic: str, generation: int) -> frozenset[SidecarId]: ...

    async def live_sidecars(self) -> frozenset[SidecarId]: ...

    async def registered_producers(self) -> frozenset[TransactionalId]: ...

    async def live_producers(self) -> frozenset[TransactionalId]: ...

    async def forget_producers(self, transactional_ids: tuple[TransactionalId, ...]) -> None: ...

    async def commit_generation(
        self,
        topic: str,
        generation: Generation,
        modes: tuple[PartitionMode, ...],
        delete_after: tuple[float | None, ...],
        operation: Operation,
    ) -> None: ...


class RetirementStore(TruncationStore, Protocol):
    """What a retirement round reads and writes: the consumer groups and the revocations
    they acknowledged, and the partitions' modes, changed under the topic's change lock."""

    def lock(
        self, topic: str, owner: str, timeout: float, purpose: str = "change"
    ) -> AbstractAsyncContextManager[None]: ...

    async def known_groups(self) -> list[str]: ...

    async def acknowledged_revocations(self, group: str, topic: str) -> set[tuple[int, int]]: ...

    async def set_partitions(
        self,
        topic: str,
        modes: tuple[PartitionMode, ...],
        delete_after: tuple[float | None, ...],
    ) -> None: ...


class RetirementKafka(EpochEnds, Protocol):
    """What a retirement round asks of Kafka: where the read-only partitions start and
    end, how far each group consumed them, and their records deleted once drained."""

    async def log_start_offsets(self, topic: str, count: int) -> list[int]: ...

    async def end_offsets(self, topic: str, count: int) -> list[int]: ...

    async def high_watermarks(self, topic: str, count: int) -> list[int]: ...

    async def committed_offsets(self, group: str, topic: str, count: int) -> dict[int, int]: ...

    async def delete_records(self, topic: str, before: Mapping[int, int]) -> dict[int, int]: ...


class ChangeKafka(EpochEnds, Protocol):
    """What a change asks of Kafka: partitions created, writers fenced, offsets read, and
    records deleted below a retired partition's end."""

    async def partition_count(self, topic: str) -> int: ...

    async def create_partitions(self, topic: str, total_count: int) -> int: ...

    async def fence_producer(self, transactional_id: str) -> None: ...

    async def stable_offsets(self, topic: str, count: int) -> list[OffsetAndEpoch]: ...

    async def end_offsets(self, topic: str, count: int) -> list[int]: ...

    async def delete_records(self, topic: str, before: Mapping[int, int]) -> dict[int, int]: ...
