"""REST Proxy v2 discovery through a real sidecar: topics, partitions, brokers.

Unmanaged topics answer exactly REST Proxy's shapes; managed ones add the generation,
the undeleted count and every partition's mode, read-only and removed ones included.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import RunningSidecar, read_all, running_sidecars, unique
from sidecar.core.routing import partition_for_key

V2 = "application/vnd.kafka.v2+json"


async def _get(sidecar: RunningSidecar, path: str) -> tuple[int, Any]:
    async with sidecar.http.get(path) as response:
        assert response.content_type == V2
        return response.status, await response.json(content_type=None)


def _check_partition_shape(partition: dict[str, Any], brokers: list[int], rf: int) -> None:
    assert set(partition) <= {"partition", "leader", "replicas", "mode"}
    replicas = partition["replicas"]
    assert len(replicas) == rf
    for replica in replicas:
        assert set(replica) == {"broker", "leader", "in_sync"}
        assert replica["broker"] in brokers
        assert replica["leader"] == (replica["broker"] == partition["leader"])
    assert [r["broker"] for r in replicas if r["leader"]] == [partition["leader"]]


async def test_an_unmanaged_topic_is_described_as_rest_proxy_v2_does(
    cluster: ClusterEndpoints,
) -> None:
    topic = unique("plain")
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(
                    topic,
                    3,
                    cluster.replication_factor,
                    topic_configs={"retention.ms": "3600000"},
                )
            ]
        )
    finally:
        await admin.close()
    rf = cluster.replication_factor
    async with running_sidecars(cluster, 1) as (sidecar,):
        status, brokers = await _get(sidecar, "/brokers")
        assert status == 200
        assert len(brokers["brokers"]) >= rf
        status, names = await _get(sidecar, "/topics")
        assert status == 200
        assert topic in names
        assert names == sorted(names)
        assert "__consumer_offsets" not in names  # internal topics are left out

        status, body = await _get(sidecar, f"/topics/{topic}")
        assert status == 200
        assert set(body) == {"name", "configs", "partitions", "managed"}
        assert (body["name"], body["managed"]) == (topic, False)
        assert body["configs"]["retention.ms"] == "3600000"
        assert [p["partition"] for p in body["partitions"]] == [0, 1, 2]
        for partition in body["partitions"]:
            assert "mode" not in partition
            _check_partition_shape(partition, brokers["brokers"], rf)

        status, partitions = await _get(sidecar, f"/topics/{topic}/partitions")
        assert (status, partitions) == (200, body["partitions"])
        status, one = await _get(sidecar, f"/topics/{topic}/partitions/2")
        assert (status, one) == (200, body["partitions"][2])

        for path, code in [
            (f"/topics/{topic}/partitions/3", 40402),
            (f"/topics/{topic}/partitions/x", 40402),
            (f"/topics/{unique('missing')}", 40401),
            (f"/topics/{unique('missing')}/partitions", 40401),
            (f"/topics/{unique('missing')}/partitions/0", 40401),
        ]:
            status, error = await _get(sidecar, path)
            assert (status, error["error_code"]) == (404, code), (path, error)
        status, error = await _get(sidecar, "/topics/bad%2Fname")
        assert (status, error["error_code"]) == (400, 40003)
        assert unique("missing") not in await _get(sidecar, "/topics")


def _key_for(partition: int, initial: int, count: int) -> str:
    for i in range(10_000):
        key = f"k{i}"
        if partition_for_key(json.dumps(key).encode(), initial, count) == partition:
            return key
    raise AssertionError("no key found")


async def _modes(sidecar: RunningSidecar, topic: str) -> list[str | None]:
    status, body = await _get(sidecar, f"/topics/{topic}/partitions")
    assert status == 200, body
    return [p["mode"] for p in body]


async def test_a_managed_topic_shows_read_only_and_removed_partitions_with_their_modes(
    cluster: ClusterEndpoints,
) -> None:
    topic = unique("modes")
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        await sidecar.change_count(topic, 4)
        status, body = await sidecar.produce(topic, [{"key": _key_for(3, 2, 4), "value": 1}])
        assert (status, body["offsets"][0]["partition"]) == (200, 3), body
        await sidecar.change_count(topic, 2)
        # Empty partition 2 is removed by housekeeping; 3 holds unconsumed data.
        deadline = time.monotonic() + 15
        expected = ["read_write", "read_write", "removed", "read_only"]
        while (modes := await _modes(sidecar, topic)) != expected:
            assert time.monotonic() < deadline, modes
            await asyncio.sleep(0.2)

        status, body = await _get(sidecar, f"/topics/{topic}")
        assert status == 200
        assert (body["managed"], body["generation"], body["undeleted_count"]) == (True, 2, 2)
        assert [p["mode"] for p in body["partitions"]] == expected
        status, one = await _get(sidecar, f"/topics/{topic}/partitions/2")
        assert (status, one["mode"]) == (200, "removed")

        # A produce naming a partition in its URL: the whole request is answered.
        for partition, answer in [(2, (404, 40402)), (3, (409, 40902)), (9, (404, 40402))]:
            status, body = await sidecar.produce(topic, [{"value": 2}], partition=partition)
            assert (status, body["error_code"]) == answer, (partition, body)
        status, body = await sidecar.produce(topic, [{"value": 3}], partition=1)
        assert (status, body["offsets"][0]["partition"]) == (200, 1)
    stored = await read_all(cluster, topic, 4)
    assert [len(stored[p]) for p in range(4)] == [0, 1, 0, 1]


async def test_produce_to_a_partition_out_of_range_is_a_404_and_writes_nothing(
    cluster: ClusterEndpoints,
) -> None:
    topic = unique("range")
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 2, cluster.replication_factor)])
    finally:
        await admin.close()
    async with running_sidecars(cluster, 1) as (sidecar,):
        status, body = await sidecar.produce(topic, [{"value": 1}], partition=2)
        assert (status, body["error_code"]) == (404, 40402)
        status, body = await sidecar.produce(unique("missing"), [{"value": 1}], partition=0)
        assert (status, body["error_code"]) == (404, 40401)
        status, body = await sidecar.produce(topic, [{"value": 1}], partition=1)
        assert status == 200
    stored = await read_all(cluster, topic, 2)
    assert [len(stored[p]) for p in range(2)] == [0, 1]
