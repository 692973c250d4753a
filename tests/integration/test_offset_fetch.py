"""A group's committed offset survives an OffsetFetch answered by a broker that is not
its coordinator (what every consumer sees while a coordinator moves after a broker
left, and, with a loading coordinator, what chaos run 13 saw).

The answer is a real broker's: the consumer's cached coordinator is pointed at another
broker of the cluster, which answers OffsetFetch v3 with a group-level NOT_COORDINATOR
and no partitions (``sidecar.adapters.offset_fetch``). Each test first shows what
aiokafka alone does with that answer, then what the sidecar's group consumer does.
"""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import unique
from sidecar.adapters.group_consumer import GroupConsumer, GroupConsumerOptions, ordered_assignor
from sidecar.config import KafkaSettings
from sidecar.core.consume import TopicPartition

COMMITTED = 7
WRITTEN = 10


async def _topic_with_a_commit(cluster: ClusterEndpoints, group: str) -> str:
    """A one-partition topic with WRITTEN records, ``group`` committed at COMMITTED."""
    topic = unique("offset-fetch")
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 3)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for index in range(WRITTEN):
            await producer.send_and_wait(topic, str(index).encode(), partition=0)
    finally:
        await producer.stop()
    committer = AIOKafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap, group_id=group, enable_auto_commit=False
    )
    await committer.start()
    try:
        tp = KafkaTopicPartition(topic, 0)
        committer.assign([tp])
        await committer.commit({tp: COMMITTED})
    finally:
        await committer.stop()
    return topic


async def _point_at_another_broker(consumer: AIOKafkaConsumer) -> None:
    """Make the consumer's next coordinator request go to a broker that is not the
    group's coordinator, as it does until it learns that the coordinator moved."""
    coordinator = consumer._coordinator
    await coordinator.ensure_coordinator_known()
    brokers = {broker.nodeId for broker in consumer._client.cluster.brokers()}
    coordinator.coordinator_id = min(brokers - {coordinator.coordinator_id})


def _settings(cluster: ClusterEndpoints) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=cluster.kafka_bootstrap, security=cluster.kafka_security)


async def _group_consumer(cluster: ClusterEndpoints, group: str) -> GroupConsumer:
    options = GroupConsumerOptions(
        group=group,
        client_suffix="offset-fetch",
        auto_offset_reset="latest",
        fetch_min_bytes=1,
        metadata_max_age_ms=5000,
    )
    return await GroupConsumer.start(_settings(cluster), options, ordered_assignor(lambda _: None))


async def test_the_position_starts_at_the_commit_not_at_the_reset(
    cluster: ClusterEndpoints,
) -> None:
    group = unique("group")
    topic = await _topic_with_a_commit(cluster, group)
    tp = KafkaTopicPartition(topic, 0)

    # aiokafka alone: the empty answer reads as "never committed", and "latest" skips
    # the three records the group had not read.
    plain = AIOKafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="latest",
    )
    await plain.start()
    try:
        await _point_at_another_broker(plain)
        plain.assign([tp])
        skipped_to = await plain.position(tp)
    finally:
        await plain.stop()
    assert skipped_to == WRITTEN

    consumer = await _group_consumer(cluster, group)
    try:
        await _point_at_another_broker(consumer._consumer)
        consumer.assign([TopicPartition(topic, 0)])
        assert await consumer.position(TopicPartition(topic, 0)) == COMMITTED
    finally:
        await consumer.stop()


async def test_reading_the_commit_asks_the_coordinator_again(cluster: ClusterEndpoints) -> None:
    group = unique("group")
    topic = await _topic_with_a_commit(cluster, group)

    plain = AIOKafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap, group_id=group, enable_auto_commit=False
    )
    await plain.start()
    try:
        await _point_at_another_broker(plain)
        assert await plain.committed(KafkaTopicPartition(topic, 0)) is None
    finally:
        await plain.stop()

    consumer = await _group_consumer(cluster, group)
    try:
        await _point_at_another_broker(consumer._consumer)
        assert await consumer.committed(TopicPartition(topic, 0)) == COMMITTED
    finally:
        await consumer.stop()
