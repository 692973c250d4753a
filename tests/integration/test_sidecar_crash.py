"""The guarantee when a sidecar is killed while it holds produce requests.

What every such test checks, and how: ``tests/support/failure_load.py``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import aiohttp
import pytest

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.ledger import (
    check_order,
    describe_gates,
)
from ordered_dev.harness.sidecars import (
    SidecarProcess,
    check_no_record_crossed_a_barrier,
    read_all,
    unique,
    wait_for_final_operation,
)
from tests.support.failure_load import (
    Load,
    first_delivery,
    kill,
    nobody_held,
    sidecar_processes,
)


async def _held_requests(sidecar: SidecarProcess, topic: str) -> float:
    async with sidecar.http.get("/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith("sidecar_produce_held_requests{") and f'topic="{topic}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_sidecar_killed_while_holding_produces(cluster: ClusterEndpoints) -> None:
    """A sidecar SIGKILLed while a pending barrier holds its produce requests: they end
    with connection errors and their records never reach Kafka; the change is finished
    by a survivor once the dead coordinator's session expired."""
    topic, group = unique("holder-kill"), unique("group")
    marker = f"never-written-{uuid.uuid4().hex}"
    load = Load()
    # The coordinator dies right after the barrier passed (every sidecar acked, the
    # boundaries not read yet): the barrier stays pending until a survivor resumes the
    # change, once the coordinator's session has expired.
    coordinator_options = {"kill_after_phase": "reading_boundaries", "session_timeout_s": 4.0}
    async with sidecar_processes(
        cluster, coordinator_options, {"session_timeout_s": 4.0}, {}
    ) as sidecars:
        coordinator, holder, survivor = sidecars
        await survivor.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        held: list[asyncio.Task[tuple[int, dict[str, Any]]]] = []
        try:
            load.consume(survivor, group, "a", topic)
            load.produce(survivor, 0, topic)
            load.produce(holder, 1, topic, until_connection_lost=True)
            await first_delivery(load.ledger)
            with pytest.raises(aiohttp.ClientError):
                await coordinator.change_count(topic, 4)
            assert await asyncio.wait_for(coordinator.process.wait(), 10) == -9
            coordinator_died = time.monotonic()
            held = [
                asyncio.create_task(
                    holder.produce(
                        topic,
                        [
                            {
                                "key": f"held-{i}",
                                "value": {"producer": 99, "key": "held", "seq": i, "m": marker},
                            }
                        ],
                    )
                )
                for i in range(3)
            ]
            deadline = time.monotonic() + 5
            while await _held_requests(holder, topic) < len(held):
                assert time.monotonic() < deadline, "the holder never held the requests"
                await asyncio.sleep(0.05)
            assert not any(task.done() for task in held)
            await kill(holder)
            for task in held:
                with pytest.raises(aiohttp.ClientError):
                    await task
            description = await wait_for_final_operation(survivor, topic, within_s=30)
            waited = time.monotonic() - coordinator_died
            await load.stop_producers()
            await nobody_held(sidecars, topic, load.ledger)
            await load.drain(30, lambda: describe_gates(sidecars))
        finally:
            for task in held:
                task.cancel()
            await load.cancel()
    operation = description["operation"]
    assert operation["phase"] == "done", operation
    assert description["undeleted_count"] == 4
    assert description["pending"] is None
    assert waited > 2.0, "the change finished before the coordinator's session could expire"
    check_order(load.ledger)
    await check_no_record_crossed_a_barrier(cluster, description)
    stored = await read_all(cluster, topic, description["physical_count"])
    leaked = [
        (partition, record.offset)
        for partition, records in stored.items()
        for record in records
        if record.value is not None and marker.encode() in record.value
    ]
    assert not leaked, f"records the killed sidecar held were written: {leaked}"
