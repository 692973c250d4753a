"""What the consume path reads of aiokafka's consumer.

A release that finds a partition no longer assigned (a rebalance ended while it
awaited the gate) must go on, not answer the app's poll with a 500: seen in chaos runs
as "AssertionError: Partition is not assigned" from ``AIOKafkaConsumer.highwater``.
Fetches report the epoch of the last batch read where a fetch left the position, and
the group's commits are read with their leader epochs (OffsetFetch v5). The consumer is
a real aiokafka consumer, never started.
"""

from __future__ import annotations

import struct
from io import BytesIO
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.errors import NodeNotReadyError
from aiokafka.structs import TopicPartition as KafkaTopicPartition

from sidecar.adapters.group_consumer import COMMITTED_EPOCH_ATTEMPTS, GroupConsumer
from sidecar.adapters.kafka import OffsetAndEpoch
from sidecar.core.consume import LastBatch, TopicPartition
from sidecar.core.errors import KafkaFailure, KafkaUnavailable


async def test_highwater_and_position_of_a_partition_not_assigned_are_unknown() -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
    adapter = GroupConsumer(consumer)
    assigned, other = TopicPartition("t", 0), TopicPartition("t", 1)
    assert adapter.highwater(assigned) is None
    assert adapter.fetch_position(assigned) is None

    consumer.assign([KafkaTopicPartition("t", 0)])
    state = consumer._subscription.subscription.assignment.state_value(KafkaTopicPartition("t", 0))
    state.highwater = 7
    state.seek(5)
    assert adapter.highwater(assigned) == 7
    assert adapter.fetch_position(assigned) == 5
    assert adapter.highwater(other) is None
    assert adapter.fetch_position(other) is None
    await consumer.stop()


async def test_a_fetch_reports_the_last_batchs_epoch_where_a_fetch_left_the_position() -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
    adapter = GroupConsumer(consumer)
    moved, sought, legacy = (KafkaTopicPartition("t", p) for p in range(3))
    consumer.assign([moved, sought, legacy])

    async def nothing_more(**_: Any) -> dict[Any, Any]:
        return {}

    consumer.getmany = nothing_more
    assignment = consumer._subscription.subscription.assignment
    for tp, (position, last_batch) in {
        moved: (8, (8, 2)),  # as record_epochs leaves it after a fetch
        sought: (5, (8, 2)),  # a seek moved the position since
        legacy: (3, (3, -1)),  # a batch of magic 0 or 1
    }.items():
        state = assignment.state_value(tp)
        state.seek(position)
        state.last_batch = last_batch
    fetched = await adapter.fetch(timeout_ms=0)
    assert fetched.positions == {
        TopicPartition("t", 0): 8,
        TopicPartition("t", 1): 5,
        TopicPartition("t", 2): 3,
    }
    assert fetched.last_batches == {TopicPartition("t", 0): LastBatch(8, 2)}
    await consumer.stop()


# The group's commits with their leader epochs ---------------------------------------------


def _string(value: str) -> bytes:
    return struct.pack(">h", len(value)) + value.encode()


class _Coordinator:
    """aiokafka's coordinator send over a scripted coordinator node, which prepares the
    request for ``versions`` as a connection does and answers ``body``: bytes packed after
    Kafka's OffsetFetchResponse v5 definition (not captured from a broker)."""

    _send_req = GroupCoordinator._send_req

    _retry_backoff_ms = 0

    def __init__(
        self, body: bytes, versions: dict[int, tuple[int, int]], *, not_ready: int = 0
    ) -> None:
        self.group_id = "billing"
        self.coordinator_id: int | None = 1
        self.sent: list[dict[str, Any]] = []
        self.looked_up = 0
        self.not_ready = not_ready
        """Sends refused first, as to a coordinator whose connection is not ready yet."""

        async def send(node_id: int, request: Any, **_: Any) -> Any:
            prepared = request.prepare(versions)
            if self.not_ready:
                self.not_ready -= 1
                raise NodeNotReadyError(f"node {node_id} is not ready")
            self.sent.append(prepared.to_object())
            return prepared.RESPONSE_TYPE.decode(BytesIO(body))

        self._client = SimpleNamespace(send=send)

    def coordinator_dead(self) -> None:
        self.coordinator_id = None

    async def ensure_coordinator_known(self) -> None:
        self.looked_up += 1
        if self.coordinator_id is None:
            self.coordinator_id = 1

    async def close(self) -> None:
        pass


def _partition(index: int, offset: int, epoch: int, error_code: int = 0) -> bytes:
    return struct.pack(">iqi", index, offset, epoch) + _string("") + struct.pack(">h", error_code)


async def _committed_epochs(coordinator: _Coordinator) -> dict[TopicPartition, OffsetAndEpoch]:
    consumer = AIOKafkaConsumer(group_id="billing", bootstrap_servers="127.0.0.1:1")
    consumer._coordinator = coordinator
    try:
        return await GroupConsumer(consumer).committed_epochs(
            [TopicPartition("t", p) for p in range(4)]
        )
    finally:
        await consumer.stop()


async def test_the_groups_commits_are_read_with_their_leader_epochs() -> None:
    body = struct.pack(">i", 0) + struct.pack(">i", 1) + _string("t") + struct.pack(">i", 4)
    body += _partition(0, 42, 3)
    body += _partition(1, 17, -1)  # committed without an epoch
    body += _partition(2, -1, -1)  # never committed
    body += _partition(3, -1, -1, error_code=3)  # UNKNOWN_TOPIC_OR_PARTITION
    body += struct.pack(">h", 0)
    coordinator = _Coordinator(body, {9: (1, 9)})
    assert await _committed_epochs(coordinator) == {
        TopicPartition("t", 0): OffsetAndEpoch(42, 3),
        TopicPartition("t", 1): OffsetAndEpoch(17, None),
    }
    assert coordinator.sent == [
        {"group_id": "billing", "topics": [{"name": "t", "partition_indexes": [0, 1, 2, 3]}]}
    ]


async def test_a_loading_coordinator_is_not_read_as_no_commit() -> None:
    body = struct.pack(">i", 0) + struct.pack(">i", 0) + struct.pack(">h", 14)
    coordinator = _Coordinator(body, {9: (1, 9)})
    with pytest.raises(KafkaUnavailable):
        await _committed_epochs(coordinator)
    assert len(coordinator.sent) == COMMITTED_EPOCH_ATTEMPTS  # asked again, then given up


async def test_a_coordinator_not_ready_yet_is_asked_again() -> None:
    # A reading that just began: the coordinator's connection was not ready, and the
    # reading went on unvalidated (on a real cluster it skipped what an unclean election
    # wrote below the commit).
    body = struct.pack(">i", 0) + struct.pack(">i", 1) + _string("t") + struct.pack(">i", 1)
    body += _partition(0, 42, 3) + struct.pack(">h", 0)
    coordinator = _Coordinator(body, {9: (1, 9)}, not_ready=2)
    assert await _committed_epochs(coordinator) == {TopicPartition("t", 0): OffsetAndEpoch(42, 3)}
    assert coordinator.looked_up == 3


async def test_a_coordinator_without_committed_epochs_is_refused() -> None:
    with pytest.raises(KafkaFailure, match=r"Kafka 2\.1"):
        await _committed_epochs(_Coordinator(b"", {9: (1, 4)}))
