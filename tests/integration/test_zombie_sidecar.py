"""A sidecar paused past its ZooKeeper session (a zombie) writes nothing across a barrier.

Seen on a real cluster before fencing existed: a sidecar stopped with SIGSTOP for longer
than its session timeout, while it held admitted and in-flight produce requests, was
left behind by a change (rightly: its session had expired); on resuming it sent what it
had admitted, and acknowledged records landed after boundaries the others had already
committed. The storage has to refuse the stale writer: the coordinator fences the
zombie's transactional id before it reads the boundaries (DESIGN §5).

Here the zombie stops itself at the worst moment (``faults.stop_before_commit``: its
transaction's records appended, the commit not sent), more requests arrive while it is
stopped, a change completes without it, and then it is resumed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import (
    SidecarProcess,
    check_no_record_crossed_a_barrier,
    process_stopped,
    read_all,
    settings_for,
    start_process,
    stop_process,
    unique,
)
from ordered_dev.harness.waiting import eventually
from sidecar.adapters.zookeeper import MetadataStore
from sidecar.config import KafkaSettings
from sidecar.core.routing import partition_for_key

RECOVERY_BOUND_S = 30.0
"""A resumed zombie produces again within this: session expiry noticed, a new producer
registered and initialised, the metadata re-read."""


async def _produce(sidecar: SidecarProcess, topic: str, key: str, value: int) -> tuple[int, Any]:
    return await sidecar.produce(topic, [{"key": key, "value": value}])


async def test_a_zombie_sidecar_is_fenced_and_recovers(cluster: ClusterEndpoints) -> None:
    topic, root = unique("zombie"), f"/{unique('zombie')}"
    zombie_options: dict[str, Any] = {"session_timeout_s": 4.0, "stop_before_commit": 2}
    started: list[SidecarProcess] = []
    try:
        options: dict[str, Any]
        for name, options in (("live", {}), ("zombie", zombie_options)):
            started.append(await start_process(settings_for(cluster, root, name, **options)))
        live, zombie = started
        await live.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        # Transaction 1 commits; transaction 2 stops the zombie before its commit.
        status, body = await _produce(zombie, topic, "warm-up", 0)
        assert status == 200, body
        frozen = asyncio.create_task(_produce(zombie, topic, "frozen", 1))

        async def zombie_stopped() -> bool:
            return process_stopped(zombie.process.pid)

        await eventually(zombie_stopped, 30, "the zombie stops itself")
        # Requests admitted while it is stopped: they wait in its socket.
        admitted = [
            asyncio.create_task(_produce(zombie, topic, f"admitted-{i}", 10 + i)) for i in range(5)
        ]

        # Its session expires; a change completes without it and fences its producer.
        store = MetadataStore(cluster.zookeeper_hosts, root=root)
        await store.start()
        try:

            async def zombie_gone() -> bool:
                return zombie.id not in await store.live_sidecars()

            await eventually(zombie_gone, 30, "the zombie's session expires")
            registered = await store.registered_producers()
            # One id per lane, all of them registered.
            zombie_ids = {p for p in registered if p.startswith(f"ordered-sidecar.{zombie.id}.")}
            assert len(zombie_ids) == KafkaSettings().transaction_lanes, registered
        finally:
            await store.stop()
        began = time.monotonic()
        operation = await live.change_count(topic, 3)
        assert operation["phase"] == "done", operation
        assert zombie_ids <= set(operation["fenced"]), operation
        changed_in = time.monotonic() - began

        # Resumed: everything it held answers, with an error or a correct placement.
        os.kill(zombie.process.pid, signal.SIGCONT)
        answers = await asyncio.wait_for(asyncio.gather(frozen, *admitted), RECOVERY_BOUND_S)
        description = await live.describe(topic)
        acknowledged = []
        for status, body in answers:
            if status != 200:
                assert body["error_code"] in (50002, 50320, 50330, 50350), body
                continue
            for offset in body["offsets"]:
                if offset.get("error_code") is not None:
                    assert offset["error_code"] in (50002, 50350), body
                    continue
                assert body["generation"] == description["generation"], body
                acknowledged.append(offset)
        frozen_status, frozen_body = answers[0]
        assert frozen_status != 200 or frozen_body["offsets"][0].get("error_code"), (
            "the transaction that was open when the zombie stopped was acknowledged"
        )

        # It recovers by itself: a produce through it goes through, under the new count.
        recovered_at = None
        deadline = time.monotonic() + RECOVERY_BOUND_S
        while recovered_at is None:
            assert time.monotonic() < deadline, "the zombie did not recover"
            status, body = await _produce(zombie, topic, "after", 99)
            if status == 200 and body["offsets"][0].get("error_code") is None:
                recovered_at = time.monotonic()
                assert body["generation"] == description["generation"]
            else:
                await asyncio.sleep(0.2)
        async with zombie.http.get("/readyz") as response:
            assert response.status == 200

        # Nothing the zombie wrote became visible on the wrong side of the boundary, and
        # nothing of the frozen transaction became visible at all.
        checked = await check_no_record_crossed_a_barrier(cluster, await live.describe(topic))
        stored = await read_all(cluster, topic, 3)
        values = [json.loads(r.value) for records in stored.values() for r in records if r.value]
        assert 1 not in values, "the frozen transaction's record is visible"
        for offset in acknowledged:
            partition = offset["partition"]
            assert any(r.offset == offset["offset"] for r in stored[partition]), offset
        assert checked == len(values)
        assert all(
            partition_for_key(r.key, 2, 3) == p
            for p, records in stored.items()
            for r in records
            if r.key is not None and json.loads(r.value) >= 10
        )
        print(
            f"change without the zombie: {changed_in:.1f} s; "
            f"{len(acknowledged)} of {len(admitted)} held requests acknowledged after resuming"
        )
    finally:
        for sidecar in started:
            if sidecar.process.returncode is None:
                os.kill(sidecar.process.pid, signal.SIGCONT)
        await asyncio.gather(*(stop_process(s) for s in started), return_exceptions=True)
