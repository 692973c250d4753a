"""End to end in containers: the cluster of ``SIDECAR_TEST_CLUSTER=docker`` and sidecar containers.

testcontainers runs ZooKeeper and three KRaft Kafka nodes from the test servers' image
(``ordered_dev.devcluster.docker_cluster``, what ``provide_cluster`` gives for ``docker``),
and two sidecar containers from the sidecar image beside them, all on the host's
network. When the session's own cluster is that one (``SIDECAR_TEST_CLUSTER=docker``)
it is used; otherwise (CI: the session cluster is local processes) this module starts
one for itself and removes it at its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from ordered_dev.devcluster.cluster import zookeeper_serving
from ordered_dev.devcluster.docker_cluster import DockerCluster
from ordered_dev.devcluster.docker_engine import Engine
from ordered_dev.devcluster.images import BuiltImage
from ordered_dev.devcluster.provider import KIND_ENV, ClusterEndpoints, provide_cluster
from ordered_dev.harness.ledger import (
    Ledger,
    check_order,
    consume_into,
    produce_sequences,
    wait_until_delivered,
)
from ordered_dev.harness.sidecars import (
    SidecarClient,
    check_no_record_crossed_a_barrier,
    unique,
)
from tests.containers.conftest import MEASURED
from tests.containers.support import (
    RunningContainer,
    container_settings,
    logs_of,
    sidecar_container,
)


@pytest.fixture(scope="module")
def docker_cluster(
    request: pytest.FixtureRequest, engine: Engine, servers_image: BuiltImage
) -> Iterator[ClusterEndpoints]:
    if os.environ.get(KIND_ENV) == "docker":
        endpoints: ClusterEndpoints = request.getfixturevalue("cluster")
        yield endpoints
        return
    began = time.monotonic()
    with provide_cluster(kind="docker") as endpoints:
        MEASURED["docker cluster (ZooKeeper + 3 brokers) start"] = (
            f"{time.monotonic() - began:.1f} s"
        )
        yield endpoints


@pytest.fixture(scope="module")
def sidecars(
    docker_cluster: ClusterEndpoints, sidecar_image: BuiltImage
) -> Iterator[tuple[RunningContainer, RunningContainer]]:
    """Two sidecar containers of one deployment (a shared ZooKeeper root)."""
    root = f"/{unique('docker-e2e')}"
    with (
        sidecar_container(sidecar_image.tag, container_settings(docker_cluster, root)) as first,
        sidecar_container(sidecar_image.tag, container_settings(docker_cluster, root)) as second,
    ):
        yield first, second


@contextlib.asynccontextmanager
async def clients(
    containers: tuple[RunningContainer, ...],
) -> AsyncIterator[list[SidecarClient]]:
    sessions = [aiohttp.ClientSession(c.url) for c in containers]
    try:
        yield [
            SidecarClient(c.url, c.sidecar_id, s) for c, s in zip(containers, sessions, strict=True)
        ]
    finally:
        for session in sessions:
            await session.close()


def _servers(cluster: ClusterEndpoints) -> DockerCluster:
    assert cluster.docker is not None, cluster.kind
    return cluster.docker


async def test_zookeeper_and_three_brokers_run_in_containers_on_the_host_network(
    docker_cluster: ClusterEndpoints, servers_image: BuiltImage
) -> None:
    servers = _servers(docker_cluster)
    assert docker_cluster.kind == "docker"
    assert docker_cluster.broker_count == 3
    for name, status in servers.status().items():
        assert status["alive"], (name, status)
        assert status["listening"], (name, status)
        attributes = servers.container(name).attrs
        assert attributes["HostConfig"]["NetworkMode"] == "host"
        assert attributes["Config"]["Image"] == servers_image.tag
    assert zookeeper_serving(servers.zookeeper_port)
    admin = AIOKafkaAdminClient(bootstrap_servers=docker_cluster.kafka_bootstrap)
    await admin.start()
    try:
        brokers = (await admin.describe_cluster())["brokers"]
    finally:
        await admin.close()
    listeners = {(broker["host"], broker["port"]) for broker in brokers}
    assert listeners == {("127.0.0.1", port) for port in servers.kafka_ports.values()}


async def test_ordered_delivery_through_sidecar_containers_across_an_expansion_and_a_shrink(
    docker_cluster: ClusterEndpoints, sidecars: tuple[RunningContainer, RunningContainer]
) -> None:
    topic, group = unique("docker-orders"), unique("docker-group")
    ledger = Ledger()
    async with clients(sidecars) as (first, second):
        await first.create_topic(topic, 3, replication_factor=docker_cluster.replication_factor)
        stop_producing, stop_consuming = asyncio.Event(), asyncio.Event()
        consumers = [
            asyncio.create_task(consume_into(first, group, "a", topic, ledger, stop_consuming)),
            asyncio.create_task(consume_into(second, group, "b", topic, ledger, stop_consuming)),
        ]
        producers = [
            asyncio.create_task(produce_sequences(client, index, topic, ledger, stop_producing))
            for index, client in enumerate((first, second))
        ]
        try:
            await asyncio.sleep(1.0)
            expanded = await first.change_count(topic, 5)
            assert expanded["phase"] == "done", expanded
            await asyncio.sleep(1.0)
            shrunk = await second.change_count(topic, 4)
            assert shrunk["phase"] == "done", shrunk
            await asyncio.sleep(1.0)
            stop_producing.set()
            await asyncio.gather(*producers)
            await wait_until_delivered(ledger, within_s=90, diagnose=logs_of(*sidecars))
        finally:
            stop_producing.set()
            stop_consuming.set()
            await asyncio.gather(*producers, *consumers, return_exceptions=True)
        description = await first.describe(topic)

    assert ledger.poll_errors == []
    assert [g["undeleted_count"] for g in description["generations"]] == [3, 5, 4]
    assert check_order(ledger) == 0
    await check_no_record_crossed_a_barrier(docker_cluster, description)
    assert {producer for _, producer, _, _ in ledger.delivered} == {0, 1}


async def test_a_stopped_broker_container_is_survived_and_rejoins(
    docker_cluster: ClusterEndpoints, sidecars: tuple[RunningContainer, RunningContainer]
) -> None:
    if docker_cluster.replication_factor < 3:
        pytest.skip("needs three brokers")
    servers = _servers(docker_cluster)
    topic = unique("docker-failover")
    async with clients(sidecars[:1]) as (sidecar,):
        await sidecar.create_topic(topic, 3, replication_factor=3)
        records = [{"key": f"k{i}", "value": i} for i in range(12)]
        status, body = await sidecar.produce(topic, records)
        assert status == 200, body
        stopped = servers.node_ids()[0]
        await asyncio.to_thread(servers.stop_broker, stopped)
        try:
            assert not servers.status()[f"kafka-{stopped}"]["alive"]
            status, body = await sidecar.produce(topic, records)
            assert status == 200, body
            assert all(entry["error_code"] is None for entry in body["offsets"])
        finally:
            await asyncio.to_thread(servers.start_broker, stopped)
        assert servers.status()[f"kafka-{stopped}"]["alive"]
        status, body = await sidecar.produce(topic, records)
        assert status == 200, body
