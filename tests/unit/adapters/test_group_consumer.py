"""What the release path reads of aiokafka's consumer without waiting or asserting.

A release that finds a partition no longer assigned (a rebalance ended while it
awaited the gate) must go on, not answer the app's poll with a 500: seen in chaos runs
as "AssertionError: Partition is not assigned" from ``AIOKafkaConsumer.highwater``.
The consumer is a real aiokafka consumer, never started.
"""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as KafkaTopicPartition

from sidecar.adapters.group_consumer import GroupConsumer
from sidecar.core.consume import TopicPartition


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
