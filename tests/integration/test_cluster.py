"""The test cluster itself: what every later test relies on, checked against the real servers."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic, RecordsToDelete
from kazoo.client import KazooClient
from kazoo.protocol.states import WatchedEvent

from ordered_dev.devcluster.provider import ClusterEndpoints
from sidecar.core.routing import default_partition


def _topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def admin(cluster: ClusterEndpoints) -> AsyncIterator[AIOKafkaAdminClient]:
    client = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


async def _create_topic(
    admin: AIOKafkaAdminClient, cluster: ClusterEndpoints, name: str, partitions: int
) -> None:
    await admin.create_topics(
        [NewTopic(name, partitions, replication_factor=cluster.replication_factor)]
    )


async def _end_offsets(cluster: ClusterEndpoints, topic: str, count: int) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(count)]
        offsets = await consumer.end_offsets(partitions)
        return {tp.partition: offset for tp, offset in offsets.items()}
    finally:
        await consumer.stop()


async def test_every_broker_is_registered(
    cluster: ClusterEndpoints, admin: AIOKafkaAdminClient
) -> None:
    description = await admin.describe_cluster()
    assert len(description["brokers"]) == cluster.broker_count
    if cluster.servers is not None:
        assert cluster.broker_count == 3


async def test_keyed_records_land_where_the_java_partitioner_puts_them(
    cluster: ClusterEndpoints, admin: AIOKafkaAdminClient
) -> None:
    topic = _topic_name("roundtrip")
    await _create_topic(admin, cluster, topic, 6)
    producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all")
    await producer.start()
    sent: dict[bytes, int] = {}
    try:
        for i in range(60):
            key = f"key-{i}".encode()
            metadata = await producer.send_and_wait(topic, value=b"v%d" % i, key=key)
            sent[key] = metadata.partition
    finally:
        await producer.stop()
    # aiokafka's default partitioner is murmur2 like Java's; ours must agree with both.
    assert sent == {key: default_partition(key, 6) for key in sent}

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=cluster.kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    received: dict[bytes, int] = {}
    try:
        while len(received) < len(sent):
            batches = await consumer.getmany(timeout_ms=10_000)
            assert batches, f"no records within 10 s; have {len(received)} of {len(sent)}"
            for tp, records in batches.items():
                for record in records:
                    assert record.key is not None
                    received[record.key] = tp.partition
    finally:
        await consumer.stop()
    assert received == sent


async def test_partitions_can_be_added_and_records_deleted(
    cluster: ClusterEndpoints, admin: AIOKafkaAdminClient
) -> None:
    topic = _topic_name("grow")
    await _create_topic(admin, cluster, topic, 2)
    await admin.create_partitions({topic: NewPartitions(total_count=3)})

    producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        # Brokers learn of the new partition from the controller one after another: the
        # producer may first ask one that does not know it yet.
        deadline = time.monotonic() + 10
        while len(producer.client.cluster.partitions_for_topic(topic) or ()) < 3:
            assert time.monotonic() < deadline, "partition 2 never appeared in metadata"
            await producer.client.force_metadata_update()
        for _ in range(5):
            await producer.send_and_wait(topic, value=b"x", partition=2)
    finally:
        await producer.stop()
    assert await _end_offsets(cluster, topic, 3) == {0: 0, 1: 0, 2: 5}

    low = await admin.delete_records({TopicPartition(topic, 2): RecordsToDelete(before_offset=3)})
    assert low == {TopicPartition(topic, 2): 3}

    consumer = AIOKafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap)
    await consumer.start()
    try:
        beginning = await consumer.beginning_offsets([TopicPartition(topic, 2)])
    finally:
        await consumer.stop()
    assert beginning == {TopicPartition(topic, 2): 3}


def test_zookeeper_watches_and_ephemeral_nodes(cluster: ClusterEndpoints) -> None:
    root = f"/cluster-test-{uuid.uuid4().hex[:8]}"
    observer = KazooClient(hosts=cluster.zookeeper_hosts, timeout=10.0)
    member = KazooClient(hosts=cluster.zookeeper_hosts, timeout=10.0)
    observer.start(timeout=15)
    member.start(timeout=15)
    try:
        observer.ensure_path(f"{root}/members")
        changed = threading.Event()
        seen: list[WatchedEvent] = []

        def on_change(event: WatchedEvent) -> None:
            seen.append(event)
            changed.set()

        assert observer.get_children(f"{root}/members", watch=on_change) == []
        member.create(f"{root}/members/a", b"1", ephemeral=True)
        assert changed.wait(10), "the child watch did not fire"
        assert observer.get_children(f"{root}/members") == ["a"]

        # Closing the member's session removes its ephemeral node.
        member.stop()
        member.close()
        deadline = time.monotonic() + 10
        while observer.get_children(f"{root}/members"):
            assert time.monotonic() < deadline, "the ephemeral node outlived its session"
            time.sleep(0.1)
        assert seen[0].path == f"{root}/members"
    finally:
        observer.delete(root, recursive=True)
        observer.stop()
        observer.close()
