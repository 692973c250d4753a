"""Commits carry leader epochs, through aiokafka's own commit path.

The group consumer adapter over a real (never started) ``AIOKafkaConsumer`` whose
coordinator runs aiokafka's real ``GroupCoordinator`` commit methods on a stand-in for
the network: the stand-in prepares each request for the versions a broker announced,
as aiokafka's connection does, encodes it, and answers with bytes packed after Kafka's
OffsetCommit response definition (not captured from a broker), decoded by the
request's own response type.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable
from io import BytesIO
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.errors import OffsetMetadataTooLargeError
from aiokafka.structs import TopicPartition as KafkaTopicPartition

from sidecar.adapters.group_consumer import GroupConsumer
from sidecar.adapters.offset_commit import carry_epochs
from sidecar.core.consume import TopicPartition
from sidecar.core.errors import KafkaUnavailable

TP0, TP1 = TopicPartition("orders", 0), TopicPartition("orders", 1)
KAFKA_4_3 = {8: (2, 9)}
"""OffsetCommit versions a Kafka 4.3 broker announces."""
KAFKA_2_0 = {8: (0, 4)}
"""... and one before KIP-320 (no v6)."""


class _Coordinator:
    """aiokafka's GroupCoordinator commit methods over a scripted coordinator node."""

    commit_offsets = GroupCoordinator.commit_offsets
    _do_commit_offsets = GroupCoordinator._do_commit_offsets
    _send_req = GroupCoordinator._send_req

    def __init__(self, versions: dict[int, tuple[int, int]], error_code: int = 0) -> None:
        self.group_id = "billing"
        self.generation = 7
        self.member_id = "sidecar-1-4b7c"
        self.coordinator_id: int | None = 1
        self._retry_backoff_ms = 1
        self._commit_lock = asyncio.Lock()
        self.sent: list[dict[str, Any]] = []

        async def send(node_id: int, request: Any, **_: Any) -> Any:
            prepared = request.prepare(versions)  # raises before sending, as a connection
            self.sent.append(prepared.to_object())
            body = struct.pack(">i", 0) if prepared.API_VERSION >= 3 else b""
            topics = prepared.to_object()["topics"]
            body += struct.pack(">i", len(topics))
            for topic in topics:
                name = topic.get("name", topic.get("topic"))
                body += struct.pack(">h", len(name)) + name.encode()
                body += struct.pack(">i", len(topic["partitions"]))
                for partition in topic["partitions"]:
                    index = partition.get("partition_index", partition.get("partition"))
                    body += struct.pack(">ih", index, error_code)
            return prepared.RESPONSE_TYPE.decode(BytesIO(body))

        self._client = SimpleNamespace(send=send)

    async def ensure_coordinator_known(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def coordinator_dead(self) -> None:
        self.coordinator_id = None


Adapter = Callable[[_Coordinator], GroupConsumer]


@pytest.fixture
async def adapter() -> AsyncIterator[Adapter]:
    """The adapter over a consumer assigned TP0 and TP1, with ``coordinator``."""
    made: list[GroupConsumer] = []

    def make(coordinator: _Coordinator) -> GroupConsumer:
        consumer = AIOKafkaConsumer(group_id="billing", bootstrap_servers="127.0.0.1:1")
        consumer.assign([KafkaTopicPartition(tp.topic, tp.partition) for tp in (TP0, TP1)])
        consumer._coordinator = coordinator
        made.append(GroupConsumer(consumer, carry_epochs(consumer)))
        return made[-1]

    yield make
    for group_consumer in made:
        await group_consumer.stop()


def _committed(sent: dict[str, Any]) -> dict[int, tuple[int, int]]:
    [topic] = sent["topics"]
    return {
        p["partition_index"]: (p["committed_offset"], p["committed_leader_epoch"])
        for p in topic["partitions"]
    }


async def test_a_commit_carries_each_offsets_leader_epoch_in_offset_commit_v6(
    adapter: Adapter,
) -> None:
    coordinator = _Coordinator(KAFKA_4_3)
    consumer = adapter(coordinator)
    await consumer.commit({TP0: 42, TP1: 10}, {TP0: 3, TP1: 5})
    [sent] = coordinator.sent
    assert (sent["group_id"], sent["generation_id"], sent["member_id"]) == (
        "billing",
        7,
        "sidecar-1-4b7c",
    )
    assert _committed(sent) == {0: (42, 3), 1: (10, 5)}
    assert [p["committed_metadata"] for p in sent["topics"][0]["partitions"]] == ["", ""]


async def test_a_commit_with_unknown_epochs_sends_minus_one(adapter: Adapter) -> None:
    coordinator = _Coordinator(KAFKA_4_3)
    consumer = adapter(coordinator)
    await consumer.commit({TP0: 42, TP1: 10}, {TP1: None})
    assert _committed(coordinator.sent[0]) == {0: (42, -1), 1: (10, -1)}


async def test_the_epochs_go_with_the_commit_that_named_them(adapter: Adapter) -> None:
    coordinator = _Coordinator(KAFKA_4_3)
    consumer = adapter(coordinator)
    await consumer.commit({TP0: 42}, {TP0: 3})
    await consumer.commit({TP0: 42}, {})
    assert [_committed(sent) for sent in coordinator.sent] == [{0: (42, 3)}, {0: (42, -1)}]


async def test_aiokafka_reads_the_v6_answers_errors(adapter: Adapter) -> None:
    coordinator = _Coordinator(KAFKA_4_3, error_code=OffsetMetadataTooLargeError.errno)
    consumer = adapter(coordinator)
    with pytest.raises(KafkaUnavailable, match="commit failed"):
        await consumer.commit({TP0: 42}, {TP0: 3})
    assert coordinator.sent[0]["topics"][0]["partitions"][0]["committed_leader_epoch"] == 3


async def test_a_broker_before_kip_320_gets_aiokafkas_own_commit(adapter: Adapter) -> None:
    coordinator = _Coordinator(KAFKA_2_0)
    consumer = adapter(coordinator)
    await consumer.commit({TP0: 42}, {TP0: 3})
    [sent] = coordinator.sent
    # v3 at most (aiokafka's): no epoch field.
    assert sent["topics"] == [
        {"topic": "orders", "partitions": [{"partition": 0, "offset": 42, "metadata": ""}]}
    ]
    assert sent["consumer_group_generation_id"] == 7
