"""A sidecar that starts while a change is under way holds its produces until it ends.

Seen in a 30-minute chaos run: a sidecar restarted moments after a coordinator had
published a change's barrier read the topic with the barrier pending, routed its first
requests under the old generation at once, and the coordinator, which had counted its
participants before this one registered, did not wait for those sends. Two batches of
acknowledged records landed past boundaries the others had committed.

Here the change is held open on purpose: a participant is stopped with SIGSTOP, so the
barrier waits for its session to expire. A third sidecar starts meanwhile and is sent a
record; it must answer only once the change committed, with the new generation. The
race itself (a first produce routed before the barrier read on adoption is applied) is
too narrow to hit on demand here; ``tests/unit/service/test_registry.py`` pins it down.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import (
    SidecarProcess,
    check_no_record_crossed_a_barrier,
    settings_for,
    start_process,
    stop_process,
    unique,
)
from ordered_dev.harness.waiting import eventually
from sidecar.adapters.zookeeper import MetadataStore

STALLED_SESSION_S = 15.0
"""How long the stopped participant holds the barrier: long enough for the third sidecar
to start and send while the change is still under way (checked, not assumed)."""


async def test_a_sidecar_started_during_a_change_holds_until_it_commits(
    cluster: ClusterEndpoints,
) -> None:
    topic, root = unique("late"), f"/{unique('late')}"
    started: list[SidecarProcess] = []
    stalled_pid: int | None = None
    store = MetadataStore(cluster.zookeeper_hosts, root=root)
    try:
        stalling: dict[str, Any] = {"session_timeout_s": STALLED_SESSION_S}
        for name, options in (("coordinator", {}), ("stalled", stalling)):
            started.append(await start_process(settings_for(cluster, root, name, **options)))
        coordinator, stalled = started
        await coordinator.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        before = (await coordinator.describe(topic))["generation"]

        stalled_pid = stalled.process.pid
        os.kill(stalled_pid, signal.SIGSTOP)
        change = asyncio.create_task(coordinator.change_count(topic, 3))
        await store.start()

        async def barrier_published() -> bool:
            return (await store.read_topic(topic)).pending is not None

        await eventually(barrier_published, 30, "the change publishes its barrier")

        late = await start_process(settings_for(cluster, root, "late"))
        started.append(late)
        # The test means something only if the late sidecar is asked during the change.
        assert not change.done(), "the change ended before the late sidecar started"
        assert (await store.read_topic(topic)).pending is not None
        status, body = await late.produce(topic, [{"key": "late", "value": 1}])
        assert status == 200, body
        assert body["offsets"][0].get("error_code") is None, body
        # Answered only under the change's generation: it held until the commit.
        assert body["generation"] == before + 1, body

        operation = await change
        assert operation["phase"] == "done", operation
        assert operation["from_generation"] == before, operation

        os.kill(stalled_pid, signal.SIGCONT)
        stalled_pid = None
        await check_no_record_crossed_a_barrier(cluster, await coordinator.describe(topic))
    finally:
        if stalled_pid is not None:
            os.kill(stalled_pid, signal.SIGCONT)
        await store.stop()
        for sidecar in started:
            await stop_process(sidecar)
