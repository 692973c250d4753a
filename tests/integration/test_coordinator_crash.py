"""Partition-count changes across sidecar processes, with crashes and partitions.

Sidecars here are separate ``sidecar serve`` processes, as in production, so a
coordinator can be SIGKILLed and a sidecar can lose ZooKeeper while keeping Kafka.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import (
    ProduceTally,
    SidecarProcess,
    check_no_record_crossed_a_barrier,
    produce_until,
    settings_for,
    start_process,
    stop_process,
    unique,
    wait_for_final_operation,
)
from tests.support.tcp_proxy import TcpProxy

KEYS = [f"key-{i}" for i in range(30)]


@asynccontextmanager
async def processes(
    cluster: ClusterEndpoints, root: str, *options: dict[str, object]
) -> AsyncIterator[list[SidecarProcess]]:
    started: list[SidecarProcess] = []
    try:
        for index, extra in enumerate(options):
            settings = settings_for(cluster, root, f"p{index}", **extra)  # type: ignore[arg-type]
            started.append(await start_process(settings))
        yield started
    finally:
        await asyncio.gather(*(stop_process(p) for p in started))


async def test_three_processes_through_random_changes(cluster: ClusterEndpoints) -> None:
    topic = unique("random")
    rng = random.Random(253)
    async with processes(cluster, f"/{unique('root')}", {}, {}, {}) as sidecars:
        await sidecars[0].create_topic(topic, 3, replication_factor=cluster.replication_factor)
        stop = asyncio.Event()
        tallies = [ProduceTally() for _ in sidecars]
        producers = [
            asyncio.create_task(produce_until(s, topic, KEYS[i::3], stop, tallies[i]))
            for i, s in enumerate(sidecars)
        ]
        counts = [3]
        try:
            while len(counts) < 9:
                target = rng.choice([c for c in range(3, 13) if c != counts[-1]])
                coordinator = rng.choice(sidecars)
                operation = await coordinator.change_count(topic, target)
                assert operation["phase"] == "done", operation
                counts.append(target)
                await asyncio.sleep(rng.uniform(0.05, 0.4))
        finally:
            stop.set()
            await asyncio.gather(*producers)
        assert [t.errors for t in tallies] == [[], [], []]
        description = await sidecars[0].describe(topic)
    assert [g["undeleted_count"] for g in description["generations"]] == counts
    checked = await check_no_record_crossed_a_barrier(cluster, description)
    assert checked == sum(t.written for t in tallies)


@pytest.mark.parametrize(
    "phase",
    [
        "creating_partitions",
        "barrier",
        "fencing",
        "reading_boundaries",
        "committing",
        "rolling_back",
    ],
)
async def test_a_coordinator_killed_at_any_step_leaves_no_one_held(
    cluster: ClusterEndpoints, phase: str
) -> None:
    topic = unique(f"kill-{phase.replace('_', '-')}")
    victim_options: dict[str, object] = {"kill_after_phase": phase, "session_timeout_s": 4.0}
    options: list[dict[str, object]] = [victim_options, {}, {}]
    if phase == "rolling_back":
        # A participant that never acks: the victim's barrier times out and rolls back.
        victim_options["barrier_timeout_s"] = 4.5
        options[2] = {"withhold_barrier_acks": True}
    if phase == "fencing":
        # A sidecar killed before the change leaves its producer registered: the change
        # fences it (once its session has expired) before it reads the boundaries.
        options.append({"session_timeout_s": 4.0})
    async with processes(cluster, f"/{unique('root')}", *options) as sidecars:
        victim, survivors = sidecars[0], sidecars[1:3]
        for gone in sidecars[3:]:
            gone.process.kill()
            await gone.process.wait()
        await survivors[0].create_topic(topic, 2, replication_factor=cluster.replication_factor)
        stop = asyncio.Event()
        tallies = [ProduceTally() for _ in survivors]
        producers = [
            asyncio.create_task(produce_until(s, topic, KEYS[i::2], stop, tallies[i], pause_s=0.02))
            for i, s in enumerate(survivors)
        ]
        try:
            await asyncio.sleep(0.3)
            with pytest.raises(aiohttp.ClientError):
                await victim.change_count(topic, 4)
            assert await asyncio.wait_for(victim.process.wait(), 10) == -9
            description = await wait_for_final_operation(survivors[0], topic, within_s=30)
            # Everyone routes again: a produce through each survivor goes straight through.
            for survivor in survivors:
                began = time.monotonic()
                status, body = await survivor.produce(topic, [{"key": "after", "value": 0}])
                assert status == 200, body
                assert time.monotonic() - began < 5
        finally:
            stop.set()
            await asyncio.gather(*producers)
        assert [t.errors for t in tallies] == [[], []]
    operation = description["operation"]
    assert isinstance(operation, dict)
    expected = "rolled_back" if phase == "rolling_back" else "done"
    assert operation["phase"] == expected
    assert description["undeleted_count"] == (2 if expected == "rolled_back" else 4)
    assert description["pending"] is None
    await check_no_record_crossed_a_barrier(cluster, description)


async def test_a_sidecar_cut_off_from_zookeeper_stops_before_the_barrier_passes(
    cluster: ClusterEndpoints,
) -> None:
    host, port = cluster.zookeeper_hosts.split(",")[0].rsplit(":", 1)
    proxy = TcpProxy(host, int(port))
    await proxy.start()
    topic = unique("partitioned")
    cut_off = {"zookeeper_hosts": proxy.address, "session_timeout_s": 4.0, "hold_timeout_s": 2.0}
    try:
        async with processes(cluster, f"/{unique('root')}", cut_off, {}, {}) as sidecars:
            isolated, others = sidecars[0], sidecars[1:]
            await others[0].create_topic(topic, 2, replication_factor=cluster.replication_factor)
            stop = asyncio.Event()
            tallies = [ProduceTally() for _ in sidecars]
            producers = [
                asyncio.create_task(produce_until(s, topic, KEYS[i::3], stop, tallies[i]))
                for i, s in enumerate(sidecars)
            ]
            try:
                await asyncio.sleep(0.5)
                proxy.cut()
                began = time.monotonic()
                # The barrier can only pass once the isolated sidecar's session expired.
                operation = await others[0].change_count(topic, 3)
                assert operation["phase"] == "done"
                waited = time.monotonic() - began
                proxy.restore()
                # The isolated sidecar comes back with a new session and the new count.
                deadline = time.monotonic() + 30
                while True:
                    status, body = await isolated.produce(topic, [{"key": "back", "value": 1}])
                    if status == 200:
                        break
                    assert (status, body["error_code"]) in ((503, 50330), (503, 50320)), body
                    assert time.monotonic() < deadline, "the isolated sidecar never recovered"
                assert body["generation"] == 1
            finally:
                stop.set()
                await asyncio.gather(*producers)
            description = await others[0].describe(topic)
    finally:
        await proxy.stop()
    # Only the isolated sidecar was refused anything, and only as held-too-long/unavailable.
    assert tallies[1].errors == []
    assert tallies[2].errors == []
    assert all(" 5033" in e or " 5032" in e for e in tallies[0].errors or []), tallies[0].errors
    assert waited > 2.0, "the barrier passed before the isolated session could have expired"
    await check_no_record_crossed_a_barrier(cluster, description)
