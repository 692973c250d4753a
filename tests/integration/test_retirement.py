"""Read-only partitions left by a shrink are retired: empty, drained, or past a delay."""

from __future__ import annotations

import asyncio
import json
import time

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from sidecar.core.routing import partition_for_key
from sidecar.devcluster.provider import ClusterEndpoints
from tests.integration.sidecars import RunningSidecar, running_sidecars, unique


async def _modes(sidecar: RunningSidecar, topic: str) -> list[str]:
    status, body = await sidecar.admin("GET", f"/admin/topics/{topic}")
    assert status == 200, body
    return [p["mode"] for p in body["partitions"]]


async def _wait_for_modes(
    sidecar: RunningSidecar, topic: str, expected: list[str], within_s: float = 15.0
) -> None:
    deadline = time.monotonic() + within_s
    while (modes := await _modes(sidecar, topic)) != expected:
        assert time.monotonic() < deadline, f"modes stayed {modes}, expected {expected}"
        await asyncio.sleep(0.2)


def _key_for(partition: int, initial: int, count: int) -> str:
    for i in range(10_000):
        key = f"k{i}"
        if partition_for_key(json.dumps(key).encode(), initial, count) == partition:
            return key
    raise AssertionError("no key found")


async def test_empty_and_delayed_partitions_are_removed(cluster: ClusterEndpoints) -> None:
    topic = unique("retire")
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        await sidecar.change_count(topic, 4)
        # Partition 3 gets data, partition 2 stays empty.
        status, body = await sidecar.produce(topic, [{"key": _key_for(3, 2, 4), "value": 1}])
        assert status == 200, body
        assert body["offsets"][0]["partition"] == 3, body
        await sidecar.change_count(topic, 2)
        # Empty partition 2 goes at once; 3 holds unconsumed data and no group is known.
        await _wait_for_modes(sidecar, topic, ["read_write", "read_write", "removed", "read_only"])
        await asyncio.sleep(2.5)  # another housekeeping round changes nothing
        assert await _modes(sidecar, topic) == ["read_write"] * 2 + ["removed", "read_only"]

        # Writing to a read-only partition is refused, per record.
        status, body = await sidecar.produce(topic, [{"value": 1}], partition=3)
        assert status == 200
        assert body["offsets"][0]["error_code"] == 40902

        # A later expansion brings the partitions back, read-write.
        await sidecar.change_count(topic, 4)
        assert await _modes(sidecar, topic) == ["read_write"] * 4
        await sidecar.change_count(topic, 3, delete_after_seconds=0)
        await _wait_for_modes(sidecar, topic, ["read_write"] * 3 + ["removed"])


async def test_partitions_drained_by_every_group_are_truncated(cluster: ClusterEndpoints) -> None:
    topic = unique("drain")
    group = unique("group")
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        await sidecar.change_count(topic, 3)
        key = _key_for(2, 2, 3)
        for _ in range(3):
            await sidecar.produce(topic, [{"key": key, "value": 1}])
        await sidecar.server.store.register_group(group)
        await sidecar.change_count(topic, 2)
        await asyncio.sleep(2.5)
        assert await _modes(sidecar, topic) == ["read_write", "read_write", "read_only"]

        # Three records, each in a transaction of its own: a marker after each.
        end = (await sidecar.server.kafka.end_offsets(topic, 3))[2]
        assert end == 6
        consumer = AIOKafkaConsumer(
            bootstrap_servers=cluster.kafka_bootstrap, group_id=group, enable_auto_commit=False
        )
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 2)])
            # Consumed up to the last record, not past its marker: not drained yet.
            await consumer.commit({TopicPartition(topic, 2): OffsetAndMetadata(end - 1, "")})
            await asyncio.sleep(2.5)
            assert await _modes(sidecar, topic) == ["read_write", "read_write", "read_only"]
            await consumer.commit({TopicPartition(topic, 2): OffsetAndMetadata(end, "")})
        finally:
            await consumer.stop()
        await _wait_for_modes(sidecar, topic, ["read_write", "read_write", "removed"])
        starts = await sidecar.server.kafka.log_start_offsets(topic, 3)
        assert starts[2] == end
