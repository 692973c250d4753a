"""What the release path reads of aiokafka's consumer without waiting or asserting.

A release that finds a partition no longer assigned (a rebalance ended while it
awaited the gate) must go on, not answer the app's poll with a 500: seen in chaos runs
as "AssertionError: Partition is not assigned" from ``AIOKafkaConsumer.highwater``.
The consumer is a real aiokafka consumer, never started.
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as KafkaTopicPartition

from sidecar.adapters.group_consumer import GroupConsumer
from sidecar.core.consume import LastBatch, TopicPartition


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
