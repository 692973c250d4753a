"""The guarantee when ZooKeeper goes away: longer than the session timeout, or
restarting while a barrier is pending (and produces hold while it is away).

What every such test checks, and how: ``tests/support/failure_load.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any

import pytest
from kazoo.client import KazooClient

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.ledger import (
    check_order,
    describe_gates,
)
from ordered_dev.harness.sidecars import (
    SidecarProcess,
    check_no_record_crossed_a_barrier,
    read_all,
    running_sidecars,
    unique,
    wait_for_final_operation,
)
from tests.support.failure_load import (
    HELD_OR_UNAVAILABLE,
    Load,
    first_delivery,
    local_servers,
    nobody_held,
    sidecar_processes,
)


def _registrations(hosts: str, root: str) -> dict[str, int]:
    """Registered sidecar ids under ``root`` and the session owning each registration."""
    client = KazooClient(hosts=hosts)
    client.start(timeout=10)
    try:
        owners = {}
        for child in client.get_children(f"{root}/sidecars"):
            _, stat = client.get(f"{root}/sidecars/{child}")
            owners[child] = int(stat.ephemeralOwner)
        return owners
    finally:
        client.stop()
        client.close()


async def _wait_ready(sidecars: list[SidecarProcess], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    for sidecar in sidecars:
        while True:
            async with sidecar.http.get("/readyz") as response:
                if response.status == 200:
                    break
            assert time.monotonic() < deadline, f"{sidecar.id} never became ready again"
            await asyncio.sleep(0.1)


async def test_zookeeper_away_longer_than_the_session_timeout(cluster: ClusterEndpoints) -> None:
    """ZooKeeper down for 8 s under produce load, sessions of 4 s: managed produces are
    held and then refused (503, retriable), nothing is written meanwhile, and afterwards
    both sidecars are registered again (a restarted ZooKeeper restores sessions, so a
    sidecar that reconnects early keeps its session, a later one gets a new one and
    re-registers) and an expansion works."""
    local = local_servers(cluster)
    topic, group = unique("zk-gone"), unique("group")
    load = Load()
    options = {"session_timeout_s": 4.0, "hold_timeout_s": 3.0}
    root = f"/{unique('zk-gone')}"
    async with sidecar_processes(cluster, options, options, root=root) as sidecars:
        await sidecars[0].create_topic(topic, 2, replication_factor=cluster.replication_factor)
        try:
            load.consume(sidecars[1], group, "a", topic)
            for index, sidecar in enumerate(sidecars):
                load.produce(sidecar, index, topic, tolerated=HELD_OR_UNAVAILABLE)
            await first_delivery(load.ledger)
            sessions_before = await asyncio.to_thread(_registrations, cluster.zookeeper_hosts, root)
            await asyncio.to_thread(local.stop_zookeeper)
            stopped_at = time.time()
            try:
                await asyncio.sleep(8.0)
            finally:
                restarted_at = time.time()
                await asyncio.to_thread(local.start_zookeeper)
            await _wait_ready(sidecars, within_s=30)
            # Both are registered again, as live sidecars the next barrier waits for.
            deadline = time.monotonic() + 10
            while True:
                sessions_after = await asyncio.to_thread(
                    _registrations, cluster.zookeeper_hosts, root
                )
                if set(sessions_after) == {s.id for s in sidecars}:
                    break
                assert time.monotonic() < deadline, f"registered after: {sessions_after}"
                await asyncio.sleep(0.2)
            operation = await sidecars[1].change_count(topic, 3)
            assert operation["phase"] == "done", operation
            await asyncio.sleep(0.5)
            await load.stop_producers()
            await nobody_held(sidecars, topic, load.ledger)
            await load.drain(30, lambda: describe_gates(sidecars))
            description = await sidecars[0].describe(topic)
        finally:
            await load.cancel()
    assert load.ledger.refused, "no produce was held past its timeout while ZooKeeper was away"
    print(f"sessions before {sessions_before}, after {sessions_after}")
    check_order(load.ledger)
    await check_no_record_crossed_a_barrier(cluster, description)
    # Nothing was written while ZooKeeper was away (the sessions were suspended within
    # a moment of the server going; allow 0.5 s for the sidecars to see it).
    stored = await read_all(cluster, topic, description["physical_count"])
    blind = [
        (partition, record.offset, record.timestamp / 1000 - stopped_at)
        for partition, records in stored.items()
        for record in records
        if stopped_at + 0.5 < record.timestamp / 1000 < restarted_at
    ]
    assert not blind, f"written while ZooKeeper was away (partition, offset, s after): {blind}"


async def test_zookeeper_restarted_while_a_barrier_is_pending(cluster: ClusterEndpoints) -> None:
    """A ZooKeeper blip (about a second, far shorter than any session timeout) while a
    change waits at its barrier: the change is finished or rolled back within its
    barrier timeout all the same, and then nobody holds produces."""
    local = local_servers(cluster)
    topic, group = unique("zk-blip"), unique("group")
    load = Load()
    async with sidecar_processes(cluster, {}, {}) as sidecars:
        coordinator, frozen = sidecars
        await coordinator.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        change: asyncio.Task[tuple[int, dict[str, Any]]] | None = None
        try:
            load.consume(coordinator, group, "a", topic)
            load.produce(coordinator, 0, topic, tolerated=HELD_OR_UNAVAILABLE)
            await first_delivery(load.ledger)
            # A sidecar that cannot ack keeps the barrier pending (its session lives on).
            os.kill(frozen.process.pid, signal.SIGSTOP)
            change = asyncio.create_task(
                coordinator.admin("POST", f"/admin/topics/{topic}/partition-count", {"count": 3})
            )
            deadline = time.monotonic() + 10
            while (await coordinator.describe(topic))["pending"] is None:
                assert time.monotonic() < deadline, "the barrier was never published"
                await asyncio.sleep(0.05)
            await asyncio.to_thread(local.stop_zookeeper)
            try:
                await asyncio.sleep(1.0)
            finally:
                await asyncio.to_thread(local.start_zookeeper)
                os.kill(frozen.process.pid, signal.SIGCONT)
            status, body = await asyncio.wait_for(change, 30)
            # The coordinator may answer that ZooKeeper went away (503, retriable); the
            # change must end all the same, by the barrier deadline (20 s) at the latest.
            description = await wait_for_final_operation(coordinator, topic, within_s=25)
            assert description["pending"] is None
            await load.stop_producers()
            await nobody_held(sidecars, topic, load.ledger)
            await load.drain(30, lambda: describe_gates(sidecars))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen.process.pid, signal.SIGCONT)
            if change is not None:
                change.cancel()
            await load.cancel()
    check_order(load.ledger)
    await check_no_record_crossed_a_barrier(cluster, description)
    print(f"the coordinator answered {status} {body}; the change ended {description['operation']}")


async def test_produces_hold_while_zookeeper_is_away(cluster: ClusterEndpoints) -> None:
    if cluster.servers is None:
        pytest.skip("stops ZooKeeper: needs a cluster this run starts (as in CI)")
    local = cluster.servers
    topic = unique("zk-away")
    async with running_sidecars(cluster, 1, session_timeout_s=8.0, hold_timeout_s=1.5) as (
        sidecar,
    ):
        # A topic the sidecar has not loaded yet cannot be told managed or not while
        # ZooKeeper is away (503 50320); a loaded one holds its produces.
        await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        status, body = await sidecar.produce(topic, [{"key": "first", "value": 0}])
        assert status == 200, body
        connected = sidecar.server.metrics.zookeeper_connected
        await asyncio.to_thread(local.stop_zookeeper)
        try:
            deadline = time.monotonic() + 10
            while connected._value.get() != 0:
                assert time.monotonic() < deadline, "the sidecar never saw the session drop"
                await asyncio.sleep(0.05)
            # Held, then refused as retriable once the hold timeout passes.
            status, body = await sidecar.produce(topic, [{"key": "a", "value": 1}])
            assert (status, body["error_code"], body["retriable"]) == (503, 50330, True)
            assert "zookeeper" in body["message"].lower()
            # A produce held now completes once the session is back.
            held = asyncio.create_task(sidecar.produce(topic, [{"key": "b", "value": 2}]))
            await asyncio.sleep(0.3)
            assert not held.done()
        finally:
            await asyncio.to_thread(local.start_zookeeper)
        status, body = await held
        # Either the session came back within the hold, or the hold ran out: never
        # anything else (no write without a connected session).
        assert status == 200 or (status, body["error_code"]) == (503, 50330), body
        deadline = time.monotonic() + 30
        while True:
            async with sidecar.http.get("/readyz") as response:
                if response.status == 200:
                    break
            assert time.monotonic() < deadline, "the sidecar never became ready again"
            await asyncio.sleep(0.1)
        assert connected._value.get() == 1
        status, body = await sidecar.produce(topic, [{"key": "c", "value": 3}])
        assert status == 200, body
