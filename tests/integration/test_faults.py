"""The sidecar when ZooKeeper goes away: managed produces hold, nothing is written blind."""

from __future__ import annotations

import asyncio
import time

import pytest

from ordered_dev.devcluster.provider import ClusterEndpoints
from tests.support.sidecars import running_sidecars, unique


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
