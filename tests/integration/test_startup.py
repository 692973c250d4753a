"""A sidecar starts without its dependencies (DESIGN §9): it listens at once, says on
``/readyz`` what it waits for, refuses data requests with a retriable 503 meanwhile,
becomes ready by itself soon after Kafka and ZooKeeper are, stops promptly on SIGTERM
while waiting, and exits only for a configuration error.

"Before the cluster is ready" is a cluster behind loopback proxies that refuse every
connection until restored: the sidecar cannot tell it from a cluster still starting,
and the session's one cluster keeps serving the other tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import (
    SidecarProcess,
    free_port,
    settings_for,
    start_process,
    stop_process,
    unique,
)
from ordered_dev.harness.waiting import eventually
from sidecar.config import Settings
from sidecar.core.errors import NotReady
from tests.support.failure_load import local_servers
from tests.support.tcp_proxy import TcpProxy

READY_AFTER_CLUSTER_S = 5.0
"""The bound the issue states: ready within 5 s of the cluster being ready."""
_SIDECAR = str(Path(sys.executable).with_name("sidecar"))


def _listening_settings(
    cluster: ClusterEndpoints, kafka: str, zookeeper: str, **extra: Any
) -> Settings:
    """A test sidecar's settings, with both ports chosen so the test can reach it before
    it is ready."""
    settings = settings_for(cluster, f"/{unique('startup')}", "startup", zookeeper_hosts=zookeeper)
    return dataclasses.replace(
        settings,
        kafka=dataclasses.replace(settings.kafka, bootstrap_servers=kafka),
        http=dataclasses.replace(settings.http, port=free_port(), ops_port=free_port(), **extra),
    )


async def _readyz(sidecar: SidecarProcess) -> tuple[int, dict[str, Any]]:
    async with sidecar.http.get(f"{sidecar.ops_url}/readyz") as response:
        return response.status, await response.json()


async def _ready_within(sidecar: SidecarProcess, within_s: float) -> float:
    began = time.monotonic()

    async def ready() -> bool:
        status, _ = await _readyz(sidecar)
        return status == 200

    await eventually(ready, within_s, f"{sidecar.id} ready")
    return time.monotonic() - began


async def _produce_refused_as_not_ready(sidecar: SidecarProcess, topic: str) -> None:
    status, body = await sidecar.produce(topic, [{"value": {"n": 1}}])
    assert status == 503, body
    assert body["error_code"] == NotReady.error_code
    assert body["retriable"] is True


async def test_a_sidecar_started_before_its_cluster_is_ready_soon_after_it(
    cluster: ClusterEndpoints,
) -> None:
    broker_host, broker_port = cluster.kafka_bootstrap.split(",")[0].rsplit(":", 1)
    zk_host, zk_port = cluster.zookeeper_hosts.split(",")[0].split("/")[0].rsplit(":", 1)
    kafka_proxy = TcpProxy(broker_host, int(broker_port))
    zookeeper_proxy = TcpProxy(zk_host, int(zk_port))
    for proxy in (kafka_proxy, zookeeper_proxy):
        await proxy.start()
        proxy.cut()
    settings = _listening_settings(cluster, kafka_proxy.address, zookeeper_proxy.address)
    sidecar = await start_process(settings, wait_ready=False)
    topic = unique("early")
    try:
        status, body = await _readyz(sidecar)
        assert status == 503, body
        assert "kafka" in body["waiting_for"], body
        await _produce_refused_as_not_ready(sidecar, topic)
        # Kafka first: the sidecar now waits for ZooKeeper, and says so.
        kafka_proxy.restore()

        async def waits_for_zookeeper_only() -> bool:
            _, body = await _readyz(sidecar)
            return "kafka" not in body["waiting_for"] and "zookeeper" in body["waiting_for"]

        await eventually(waits_for_zookeeper_only, 30, "waiting for ZooKeeper alone")
        await _produce_refused_as_not_ready(sidecar, topic)
        zookeeper_proxy.restore()
        took = await _ready_within(sidecar, READY_AFTER_CLUSTER_S)
        print(f"ready {took:.2f} s after the cluster")
        await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        status, body = await sidecar.produce(topic, [{"key": "k", "value": {"n": 1}}])
        assert status == 200, body
    finally:
        await stop_process(sidecar)
        for proxy in (kafka_proxy, zookeeper_proxy):
            await proxy.stop()


async def test_a_sidecar_whose_zookeeper_is_stopped_at_start_recovers_when_it_is_back(
    cluster: ClusterEndpoints,
) -> None:
    servers = local_servers(cluster)
    settings = _listening_settings(cluster, cluster.kafka_bootstrap, cluster.zookeeper_hosts)
    await asyncio.to_thread(servers.stop_zookeeper)
    try:
        sidecar = await start_process(settings, wait_ready=False)

        async def waits_for_zookeeper() -> bool:
            status, body = await _readyz(sidecar)
            return status == 503 and "zookeeper" in body["waiting_for"]

        await eventually(waits_for_zookeeper, 30, "waiting for ZooKeeper")
        await _produce_refused_as_not_ready(sidecar, unique("zk-later"))
    finally:
        await asyncio.to_thread(servers.start_zookeeper)
    try:
        await _ready_within(sidecar, READY_AFTER_CLUSTER_S)
    finally:
        await stop_process(sidecar)


async def test_sigterm_while_waiting_for_the_cluster_exits_within_the_grace_period(
    cluster: ClusterEndpoints,
) -> None:
    unreachable = TcpProxy("127.0.0.1", free_port())
    await unreachable.start()
    unreachable.cut()
    grace_s = 5.0
    settings = _listening_settings(
        cluster, unreachable.address, unreachable.address, shutdown_grace_s=grace_s
    )
    sidecar = await start_process(settings, wait_ready=False)
    try:
        await asyncio.sleep(1.0)  # well into its retries
        sidecar.process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(sidecar.process.wait(), grace_s)
        assert code == 0
    finally:
        await stop_process(sidecar)
        await unreachable.stop()


async def _serve(env: dict[str, str]) -> tuple[int | None, str]:
    process = await asyncio.create_subprocess_exec(
        _SIDECAR,
        "serve",
        env=os.environ | env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 30)
    return process.returncode, stderr.decode()


async def test_a_configuration_error_exits_with_one_line_naming_the_setting() -> None:
    code, stderr = await _serve({"ORDERED_SIDECAR__HTTP__OPS_PORT": "eighty"})
    assert (code, stderr.splitlines()) == (
        2,
        ["sidecar: http.ops_port must be a int, got 'eighty'"],
    )
    code, stderr = await _serve({"ORDERED_SIDECAR__HTTP__HOST": "0.0.0.0"})
    assert code == 2
    assert len(stderr.splitlines()) == 1, stderr
    assert "http.data_token" in stderr


async def test_a_port_in_use_exits_with_one_line_naming_the_setting() -> None:
    taken = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = taken.sockets[0].getsockname()[1]
    try:
        # Nothing listens at these: the ports are bound before anything is connected.
        code, stderr = await _serve(
            {
                "ORDERED_SIDECAR__KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
                "ORDERED_SIDECAR__ZOOKEEPER__HOSTS": f"127.0.0.1:{free_port()}",
                "ORDERED_SIDECAR__HTTP__PORT": "0",
                "ORDERED_SIDECAR__HTTP__OPS_PORT": str(port),
            }
        )
    finally:
        taken.close()
    assert code == 2
    lines = [line for line in stderr.splitlines() if line.startswith("sidecar:")]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("sidecar: http.ops_port: cannot listen"), stderr
    assert "Traceback" not in stderr
