"""The Kafka adapter against the real cluster: topics, sends, offsets, and its errors."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.structs import OffsetAndMetadata

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.waiting import eventually
from sidecar.adapters.kafka import (
    KafkaGateway,
    OffsetAndEpoch,
    OutgoingKafkaRecord,
    SendFailed,
    SentRecord,
    TopicExists,
)
from sidecar.config import KafkaSettings
from sidecar.core.errors import KafkaUnavailable, UnknownPartition, UnknownTopic
from sidecar.core.placement import SEQUENCE_HEADER, SIDECAR_HEADER
from tests.support.failure_load import local_servers


def _topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def _started(bootstrap: str, request_timeout_ms: int = 10_000) -> KafkaGateway:
    gateway = KafkaGateway(
        KafkaSettings(bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms)
    )
    await gateway.start()
    return gateway


@pytest.fixture
async def gateway(cluster: ClusterEndpoints) -> AsyncIterator[KafkaGateway]:
    gateway = await _started(cluster.kafka_bootstrap)
    try:
        yield gateway
    finally:
        await gateway.stop()


@pytest.fixture
async def admin(cluster: ClusterEndpoints) -> AsyncIterator[AIOKafkaAdminClient]:
    client = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


async def _new_topic(
    gateway: KafkaGateway, cluster: ClusterEndpoints, prefix: str, partitions: int
) -> str:
    topic = _topic_name(prefix)
    await gateway.create_topic(topic, partitions, cluster.replication_factor, compacted=False)
    return topic


async def _read_all(cluster: ClusterEndpoints, topic: str, count: int) -> list[Any]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=cluster.kafka_bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    records: list[Any] = []
    try:
        while len(records) < count:
            batches = await consumer.getmany(timeout_ms=10_000)
            assert batches, f"no records within 10 s; have {len(records)} of {count}"
            for batch in batches.values():
                records.extend(batch)
    finally:
        await consumer.stop()
    return records


async def test_create_topic_refuses_an_existing_topic_and_sets_compaction(
    cluster: ClusterEndpoints, gateway: KafkaGateway, admin: AIOKafkaAdminClient
) -> None:
    topic = _topic_name("create")
    await gateway.create_topic(topic, 3, cluster.replication_factor, compacted=True)
    assert await gateway.topic_exists(topic)
    assert await gateway.partition_count(topic) == 3

    with pytest.raises(TopicExists):
        await gateway.create_topic(topic, 3, cluster.replication_factor, compacted=True)

    [response] = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, topic, {"cleanup.policy": None})]
    )
    [(error_code, _, _, _, entries)] = response.resources
    assert error_code == 0
    assert {entry[0]: entry[1] for entry in entries}["cleanup.policy"] == "compact"


async def test_unknown_topic(gateway: KafkaGateway) -> None:
    topic = _topic_name("absent")
    assert not await gateway.topic_exists(topic)
    with pytest.raises(UnknownTopic):
        await gateway.partition_count(topic)
    with pytest.raises(UnknownTopic):
        await gateway.create_partitions(topic, 4)
    with pytest.raises(UnknownTopic):
        await gateway.send(topic, 0, b"k", b"v", [])


async def test_discovery_lists_describes_and_never_creates_a_topic(
    cluster: ClusterEndpoints, gateway: KafkaGateway
) -> None:
    topic = _topic_name("discover")
    await gateway.create_topic(
        topic, 3, cluster.replication_factor, compacted=True, configs={"segment.ms": "3600000"}
    )
    assert topic in await gateway.list_topics()
    assert "__consumer_offsets" not in await gateway.list_topics()
    brokers = await gateway.broker_ids()
    assert len(brokers) >= cluster.replication_factor
    partitions = await gateway.describe_partitions(topic)
    assert [p.partition for p in partitions] == [0, 1, 2]
    for info in partitions:
        assert len(info.replicas) == cluster.replication_factor
        assert info.leader in info.replicas
        assert set(info.in_sync) <= set(info.replicas)
        assert set(info.replicas) <= set(brokers)
    configs = await gateway.topic_configs(topic)
    assert (configs["cleanup.policy"], configs["segment.ms"]) == ("compact", "3600000")

    absent = _topic_name("absent")
    with pytest.raises(UnknownTopic):
        await gateway.describe_partitions(absent)
    with pytest.raises(UnknownTopic):
        await gateway.topic_configs(absent)
    assert absent not in await gateway.list_topics()


async def test_headers_keys_and_tombstones_arrive_as_sent(
    cluster: ClusterEndpoints, gateway: KafkaGateway
) -> None:
    topic = await _new_topic(gateway, cluster, "roundtrip", 2)
    first = await gateway.send(topic, 1, b"key", b"value", [("a", b"1"), ("b", None)])
    second = await gateway.send(topic, 1, b"key", None, [("a", b"2")])
    assert (first, second) == (SentRecord(1, 0), SentRecord(1, 1))

    records = await _read_all(cluster, topic, 2)
    assert [r.timestamp for r in records] == [first.timestamp_ms, second.timestamp_ms]
    assert [(r.partition, r.offset, r.key, r.value) for r in records] == [
        (1, 0, b"key", b"value"),
        (1, 1, b"key", None),
    ]
    assert [list(r.headers) for r in records] == [[("a", b"1"), ("b", None)], [("a", b"2")]]


async def test_new_partitions_are_writable_at_once_and_creation_is_idempotent(
    cluster: ClusterEndpoints, gateway: KafkaGateway
) -> None:
    topic = await _new_topic(gateway, cluster, "grow", 2)
    # Make the producer cache the 2-partition metadata before the topic grows.
    await gateway.send(topic, 1, b"k", b"before", [])

    assert await gateway.create_partitions(topic, 5) == 5
    assert await gateway.create_partitions(topic, 5) == 5
    assert await gateway.create_partitions(topic, 3) == 5
    assert await gateway.partition_count(topic) == 5

    # The producer's metadata still says 2: this send goes through the refresh path.
    assert await gateway.send(topic, 4, b"k", b"after", []) == SentRecord(4, 0)
    await gateway.wait_for_partition_count(topic, 5, timeout=10)


async def test_send_to_a_missing_partition_raises_unknown_partition(
    cluster: ClusterEndpoints,
) -> None:
    gateway = await _started(cluster.kafka_bootstrap, request_timeout_ms=2_000)
    try:
        topic = await _new_topic(gateway, cluster, "missing", 2)
        with pytest.raises(UnknownPartition):
            await gateway.send(topic, 2, b"k", b"v", [])
        [failed] = await gateway.send_batch(topic, [OutgoingKafkaRecord(7, b"k", b"v", [])])
        assert isinstance(failed, SendFailed)
        assert not failed.maybe_appended
    finally:
        await gateway.stop()


async def test_records_too_large_are_refused_as_not_appended(
    cluster: ClusterEndpoints, gateway: KafkaGateway, admin: AIOKafkaAdminClient
) -> None:
    topic = _topic_name("large")
    small_limit = NewTopic(
        topic, 1, cluster.replication_factor, topic_configs={"max.message.bytes": "1024"}
    )
    await admin.create_topics([small_limit])
    await gateway.wait_for_partition_count(topic, 1, timeout=10)

    # Refused by the broker: larger than the topic's max.message.bytes.
    with pytest.raises(SendFailed) as broker_refused:
        await gateway.send(topic, 0, b"k", b"x" * 4096, [])
    assert not broker_refused.value.maybe_appended
    # Refused by aiokafka before sending: larger than the producer's max_request_size.
    with pytest.raises(SendFailed) as client_refused:
        await gateway.send(topic, 0, b"k", b"x" * 2_000_000, [])
    assert not client_refused.value.maybe_appended

    assert await gateway.send(topic, 0, b"k", b"small", []) == SentRecord(0, 0)


async def test_a_batch_keeps_its_order(cluster: ClusterEndpoints, gateway: KafkaGateway) -> None:
    topic = await _new_topic(gateway, cluster, "batch", 2)
    records = [
        OutgoingKafkaRecord(
            i % 2, b"k", b"v%d" % i, [(SIDECAR_HEADER, b"me"), (SEQUENCE_HEADER, b"%d" % i)]
        )
        for i in range(10)
    ]
    outcomes = await gateway.send_batch(topic, records)
    assert outcomes == [SentRecord(i % 2, i // 2) for i in range(10)]


async def test_offsets_follow_sends_and_deleted_records(
    cluster: ClusterEndpoints, gateway: KafkaGateway
) -> None:
    topic = await _new_topic(gateway, cluster, "offsets", 3)
    for _ in range(5):
        await gateway.send(topic, 2, b"k", b"v", [])
    await gateway.send(topic, 0, b"k", b"v", [])
    assert await gateway.end_offsets(topic, 3) == [1, 0, 5]
    assert await gateway.log_start_offsets(topic, 3) == [0, 0, 0]

    assert await gateway.delete_records(topic, {2: 3, 0: 1}) == {2: 3, 0: 1}
    assert await gateway.log_start_offsets(topic, 3) == [1, 0, 3]
    assert await gateway.end_offsets(topic, 3) == [1, 0, 5]
    epochs = await gateway.leader_epochs(topic, 3)
    assert all(isinstance(epoch, int) and epoch >= 0 for epoch in epochs)
    assert await gateway.stable_offsets(topic, 3) == [
        OffsetAndEpoch(offset, epoch) for offset, epoch in zip([1, 0, 5], epochs, strict=True)
    ]


async def test_leader_epochs_before_and_after_a_leader_change(
    cluster: ClusterEndpoints, gateway: KafkaGateway
) -> None:
    servers = local_servers(cluster)
    topic = await _new_topic(gateway, cluster, "epochs", 1)
    for _ in range(4):
        await gateway.send(topic, 0, b"k", b"v", [])
    [before] = await gateway.leader_epochs(topic, 1)
    [described] = await gateway.describe_partitions(topic)
    assert before is not None
    assert described.leader_epoch == before
    assert await gateway.stable_offsets(topic, 1) == [OffsetAndEpoch(4, before)]

    # A clean stop: the controller moves the leadership and bumps the leader epoch.
    await asyncio.to_thread(servers.stop_broker, described.leader)
    try:

        async def moved() -> bool:
            [now] = await gateway.describe_partitions(topic)
            return now.leader not in (-1, described.leader)

        await eventually(moved, 60, "a new leader of partition 0")
        [after] = await gateway.leader_epochs(topic, 1)
        assert after is not None
        assert after > before
        for _ in range(2):
            await gateway.send(topic, 0, b"k", b"v", [])
        assert await gateway.stable_offsets(topic, 1) == [OffsetAndEpoch(6, after)]
        # The old epoch ended where the new leader began: nothing written under it was
        # lost, so a boundary of it at 4 is still in the log.
        assert await gateway.epoch_end_offsets(topic, {0: before}) == {0: OffsetAndEpoch(4, before)}
        assert await gateway.epoch_end_offsets(topic, {0: after}) == {0: OffsetAndEpoch(6, after)}
        # An epoch newer than any the leader knows has no end.
        assert await gateway.epoch_end_offsets(topic, {0: after + 5}) == {0: None}
    finally:
        await asyncio.to_thread(servers.start_broker, described.leader)


async def test_committed_offsets_of_a_group(
    cluster: ClusterEndpoints, gateway: KafkaGateway
) -> None:
    topic = await _new_topic(gateway, cluster, "committed", 3)
    group = _topic_name("group")
    assert await gateway.committed_offsets(group, topic, 3) == {}

    for partition in (0, 2):
        for _ in range(4):
            await gateway.send(topic, partition, b"k", b"v", [])
    consumer = AIOKafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 2)])
        await consumer.commit(
            {
                TopicPartition(topic, 0): OffsetAndMetadata(4, ""),
                TopicPartition(topic, 2): OffsetAndMetadata(1, ""),
            }
        )
    finally:
        await consumer.stop()
    assert await gateway.committed_offsets(group, topic, 3) == {0: 4, 2: 1}


async def test_start_fails_fast_when_kafka_is_unreachable() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(KafkaUnavailable):
        await _started(f"127.0.0.1:{port}", request_timeout_ms=2_000)


async def test_sends_survive_a_stopped_broker(
    cluster: ClusterEndpoints, gateway: KafkaGateway
) -> None:
    local = cluster.servers
    if local is None or cluster.replication_factor < 3:
        pytest.skip("needs a 3-broker cluster this run started")
    topic = await _new_topic(gateway, cluster, "failover", 3)
    for partition in range(3):
        await gateway.send(topic, partition, b"k", b"before", [])
    stopped = local.node_ids()[0]
    await asyncio.to_thread(local.stop_broker, stopped)
    try:
        outcomes = [await gateway.send(topic, p, b"k", b"during", []) for p in range(3)]
        assert [(o.partition, o.offset) for o in outcomes] == [(0, 1), (1, 1), (2, 1)]
    finally:
        await asyncio.to_thread(local.start_broker, stopped)
    assert await gateway.end_offsets(topic, 3) == [2, 2, 2]
