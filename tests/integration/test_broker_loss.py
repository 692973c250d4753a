"""The guarantee when a broker is killed during an expansion (a leader or controller).

What every such test checks, and how: ``tests/support/failure_load.py``.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.ledger import (
    check_order,
    describe_gates,
)
from ordered_dev.harness.sidecars import (
    SidecarClient,
    check_no_record_crossed_a_barrier,
    settings_for,
    unique,
)
from sidecar.compose import SidecarServer
from tests.support.failure_load import (
    BROKER_KILL_TIMING,
    Load,
    first_delivery,
    local_servers,
    nobody_held,
    sidecar_processes,
)


async def _leaders(cluster: ClusterEndpoints, topic: str) -> dict[int, int]:
    """Partition -> the broker leading it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return {int(entry["partition"]): int(entry["leader"]) for entry in described["partitions"]}


def _admin_controller(server: SidecarServer) -> int:
    """The broker the sidecar's admin client sends CreatePartitions to. A KRaft broker
    names a random live broker as "controller" in metadata, and aiokafka keeps sending a
    controller request to the node it picked first until the request timeout."""
    admin = server.kafka._connection.require().admin
    return int(admin._client.cluster.controller.nodeId)


@pytest.mark.parametrize("victim_role", ["leader", "controller"])
async def test_a_broker_killed_during_an_expansion(
    cluster: ClusterEndpoints, victim_role: str
) -> None:
    """The broker dies as the expansion starts: either one leading a partition of the
    topic (the sends in flight to it, and so the barrier, wait for a new leader), or the
    one the coordinator's CreatePartitions goes to. Done or cleanly rolled back, either
    way; no produce fails."""
    local = local_servers(cluster)
    topic, group, root = unique(f"broker-kill-{victim_role}"), unique("group"), unique("/bk")
    load = Load()
    # Every sidecar gets a request timeout of 14 s (and so a session of 17 s): a send to
    # the dead leader is retried until the controller moves leadership (its broker
    # session timeout is 9 s), not failed. The coordinator runs in this process so that
    # the test can tell which broker its admin client talks to.
    coordinator = SidecarServer(settings_for(cluster, root, "coordinator", **BROKER_KILL_TIMING))
    await coordinator.start()
    await coordinator.wait_ready()
    admin = SidecarClient(
        coordinator.url, coordinator.settings.sidecar_id, aiohttp.ClientSession(coordinator.url)
    )
    restart: asyncio.Task[None] | None = None
    try:
        async with sidecar_processes(
            cluster, BROKER_KILL_TIMING, BROKER_KILL_TIMING, root=root
        ) as sidecars:
            # Created through another sidecar: the coordinator's admin client then has no
            # connection to its controller whose closing would refresh its metadata.
            await sidecars[0].create_topic(topic, 3, replication_factor=cluster.replication_factor)
            try:
                load.consume(sidecars[0], group, "a", topic)
                load.consume(sidecars[1], group, "b", topic)
                for index, sidecar in enumerate(sidecars):
                    load.produce(sidecar, index, topic)
                await first_delivery(load.ledger)
                controller = _admin_controller(coordinator)
                if victim_role == "controller":
                    victim = controller
                else:
                    leaders = sorted(set((await _leaders(cluster, topic)).values()) - {controller})
                    assert leaders, "every partition is led by the admin's controller"
                    victim = leaders[0]
                load.ledger.disrupted()
                await asyncio.to_thread(local.stop_broker, victim, kill=True)
                began = time.monotonic()
                try:
                    status, body = await admin.admin(
                        "POST", f"/admin/topics/{topic}/partition-count", {"count": 6}
                    )
                finally:
                    took = time.monotonic() - began
                    restart = asyncio.create_task(asyncio.to_thread(local.start_broker, victim))
                description = await admin.describe(topic)
                operation = description["operation"]
                assert operation["phase"] in ("done", "rolled_back"), (
                    f"the change answered {status} {body} after {took:.1f} s and was left "
                    f"unfinished: {operation}"
                )
                # Done, or rolled back cleanly (40930): neither leaves a barrier behind.
                assert status == 200 or (status, body["error_code"]) == (409, 40930), body
                assert description["pending"] is None
                assert description["undeleted_count"] == (6 if status == 200 else 3)
                await asyncio.sleep(0.5)
                await load.stop_producers()
                await nobody_held(sidecars, topic, load.ledger)
                await load.drain(30, lambda: describe_gates(sidecars))
            finally:
                await load.cancel()
    finally:
        await admin.http.close()
        await coordinator.stop()
        if restart is not None:
            await restart
    duplicates = check_order(load.ledger)
    checked = await check_no_record_crossed_a_barrier(cluster, description)
    assert checked >= len(load.ledger.acknowledged)
    print(
        f"{victim_role}: broker {victim} killed; change {status} after {took:.1f} s; "
        f"{len(load.ledger.acknowledged)} records, {duplicates} duplicates, "
        f"poll errors {load.ledger.poll_errors[:3]}"
    )
