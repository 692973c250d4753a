"""A write across a barrier made by a real zombie sidecar, found by the live audit.

Two ``sidecar serve`` processes audit to a fresh audit topic, read from its start by the
stream job (``start_stream``, the Spark session of the audit tests):

- ``live`` coordinates the change with the fence switched off (``faults.skip_fence``,
  for tests only): the ids of a sidecar whose session is gone are dropped, not fenced.
- ``zombie`` (one transaction lane, a 4 s session) stops itself with SIGSTOP right
  before it sends a produce request's records (``faults.stop_before_send``): routed and
  stamped under generation 0, nothing of them sent.

While the zombie is stopped its session expires, a change 2 -> 3 commits without it and
``live`` writes the same key, which stays in its partition, under generation 1. Resumed,
the zombie sends what it held: a generation-0 record lands above generation-1 records
of its partition. That is what the fence exists to refuse (docs/fencing.md); here the
test reads the partition to show it happened, then checks the audit.

The bound: the stream counts it as ``written_across_barrier`` on ``/metrics``, with its
topic, within 60 s of the zombie's resumption, and once every audit event both sidecars
wrote is counted that is the only anomaly series. The batch audit over the same topic
finds the same record.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pyspark.sql import SparkSession

from ordered_audit import checks
from ordered_audit.stream import RunningStream, start_stream
from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.consumers import create_consumer
from ordered_dev.harness.sidecars import (
    SidecarProcess,
    process_stopped,
    read_all,
    settings_for,
    start_process,
    stop_process,
    unique,
)
from ordered_dev.harness.waiting import eventually
from sidecar.adapters.zookeeper import MetadataStore
from sidecar.core.placement import record_stamp
from sidecar.core.routing import partition_for_key
from tests.audit.live import (
    anomalies_by_topic,
    audit_topic_records,
    batch_anomalies,
    create_audit_topic,
    scrape,
    stream_config,
    wait_for,
)

pytestmark = pytest.mark.integration

REPORTED_WITHIN_S = 60.0
COUNTED_WITHIN_S = 90.0
NEWER_RECORDS = 3


def _staying_key() -> str:
    """A key whose partition the change 2 -> 3 keeps (partition 1 is not split)."""
    for index in range(1000):
        key = f"held-{index}"
        encoded = json.dumps(key).encode()
        if partition_for_key(encoded, 2, 2) == partition_for_key(encoded, 2, 3):
            return key
    raise AssertionError("no key stays")


async def test_a_zombie_writing_across_a_barrier_is_reported_within_a_minute(
    cluster: ClusterEndpoints, spark: SparkSession, tmp_path: Path
) -> None:
    audit_topic = await create_audit_topic(cluster)
    topic, root = unique("zombie-audit"), f"/{unique('zombie-audit')}"
    key = _staying_key()
    began = time.time()
    zombie_options: dict[str, Any] = {
        "session_timeout_s": 4.0,
        "stop_before_send": 2,
        "transaction_lanes": 1,
    }
    config = stream_config(cluster, audit_topic, tmp_path / "checkpoint")
    running: RunningStream = await asyncio.to_thread(start_stream, spark, config)
    started: list[SidecarProcess] = []
    try:
        options: dict[str, Any]
        for name, options in (("live", {"skip_fence": True}), ("zombie", zombie_options)):
            settings = settings_for(cluster, root, name, audit_topic=audit_topic, **options)
            started.append(await start_process(settings))
        live, zombie = started
        await live.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        status, body = await zombie.produce(topic, [{"key": key, "value": 0}])
        assert status == 200, body
        # Its second transaction stops it: the record routed under generation 0.
        held = asyncio.create_task(zombie.produce(topic, [{"key": key, "value": 1}]))

        async def zombie_stopped() -> bool:
            return process_stopped(zombie.process.pid)

        await eventually(zombie_stopped, 30, "the zombie stops itself")
        store = MetadataStore(cluster.zookeeper_hosts, root=root)
        await store.start()
        try:

            async def zombie_gone() -> bool:
                return zombie.id not in await store.live_sidecars()

            await eventually(zombie_gone, 30, "the zombie's session expires")
        finally:
            await store.stop()
        operation = await live.change_count(topic, 3)
        assert operation["phase"] == "done", operation
        for value in range(2, 2 + NEWER_RECORDS):
            status, body = await live.produce(topic, [{"key": key, "value": value}])
            assert status == 200, body
            assert body["generation"] == 1, body

        os.kill(zombie.process.pid, signal.SIGCONT)
        held_status, held_body = await asyncio.wait_for(held, 30)
        print(f"\nthe zombie's held request: {held_status} {held_body}")

        # The injection, as the partition shows it: generation 0 above generation 1.
        partition = partition_for_key(json.dumps(key).encode(), 2, 3)
        stored_by_partition = await read_all(cluster, topic, 3)
        stored = stored_by_partition[partition]
        generations = [
            (r.offset, stamp.generation) for r in stored if (stamp := record_stamp(r.headers))
        ]
        crossing = [
            offset
            for offset, generation in generations
            if generation == 0 and any(g == 1 and o < offset for o, g in generations)
        ]
        assert crossing, f"nothing of generation 0 above generation 1: {generations}"

        # Acknowledged or not (the held request's wait ran on while the zombie was
        # stopped), the record is committed: a group reading through the gate gets it.
        reader = await create_consumer(live, unique("zombie-audit-group"), "r1")
        await reader.subscribe(topic)
        wanted = sum(len(records) for records in stored_by_partition.values())
        received: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while len(received) < wanted:
            assert time.monotonic() < deadline, f"{len(received)} of {wanted} delivered"
            received += await reader.poll_and_commit()
        delivered_at = time.monotonic()
        await reader.delete()
        assert {(r["partition"], r["offset"]) for r in received} >= {
            (partition, offset) for offset in crossing
        }

        expected = {(checks.WRITTEN_ACROSS_BARRIER, topic): float(len(crossing))}
        found: dict[tuple[str, str], float] = {}
        async with aiohttp.ClientSession() as http:

            async def reported() -> bool:
                nonlocal found
                found = anomalies_by_topic(await scrape(http, running.port))
                return all(found.get(series) == count for series, count in expected.items())

            await eventually(reported, REPORTED_WITHIN_S + 30, f"the stream reports {expected}")
            reported_after = time.monotonic() - delivered_at
            print(f"reported {reported_after:.1f} s after the group got the record: {found}")
            assert reported_after <= REPORTED_WITHIN_S, found

            # Stopped, both sidecars flush their audit queues: then every event is counted.
            for sidecar in started:
                await stop_process(sidecar)
            written = await audit_topic_records(cluster, audit_topic)
            samples = await wait_for(http, running.port, written, COUNTED_WITHIN_S)
        assert anomalies_by_topic(samples) == expected
    finally:
        for sidecar in started:
            if sidecar.process.returncode is None:
                os.kill(sidecar.process.pid, signal.SIGCONT)
        await asyncio.gather(*(stop_process(s) for s in started), return_exceptions=True)
        await asyncio.to_thread(running.stop)
    assert running.query.exception() is None

    _, rows = await batch_anomalies(spark, cluster, audit_topic, tmp_path / "batch", began)
    across = [
        (r["topic"], r["partition"], r["offset"])
        for r in rows
        if r["kind"] == checks.WRITTEN_ACROSS_BARRIER
    ]
    assert sorted(across) == [(topic, partition, offset) for offset in sorted(crossing)], rows
