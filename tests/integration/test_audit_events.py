"""Audit events reach the audit topic, stamped and complete, without slowing produces."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import aiohttp

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.consumers import create_consumer
from ordered_dev.harness.sidecars import RunningSidecar, read_all, settings_for, unique
from sidecar.compose import SidecarServer
from sidecar.config import AuditSettings


async def test_a_produce_consume_and_change_leave_a_complete_trail(
    cluster: ClusterEndpoints,
) -> None:
    audit_topic = unique("audit")
    topic = unique("audited")
    group = unique("group")
    settings = settings_for(cluster, f"/{unique('root')}", "audited")
    settings = replace(settings, audit=AuditSettings(enabled=True, topic=audit_topic))
    server = SidecarServer(settings)
    await server.start()
    await server.wait_ready()
    http = aiohttp.ClientSession(server.url)
    sidecar = RunningSidecar(server.url, settings.sidecar_id, http, server)
    try:
        await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        status, body = await sidecar.produce(
            topic, [{"key": f"k{i}", "value": i} for i in range(10)]
        )
        assert status == 200, body
        await sidecar.change_count(topic, 3)
        consumer = await create_consumer(sidecar, group, "c")
        await consumer.subscribe(topic)
        got = 0
        while got < 10:
            records, events = await consumer.poll(500)
            got += len(records)
            if events:
                await consumer.ack(*[e["event_id"] for e in events])
        status, _ = await consumer.commit()
        if status == 409:  # a keys_revoked event to acknowledge first
            _, events = await consumer.poll(100)
            await consumer.ack(*[e["event_id"] for e in events])
            status, _ = await consumer.commit()
        assert status == 204
    finally:
        await http.close()
        await server.stop()  # flushes the audit queue
    stored = await read_all(cluster, audit_topic, 6)
    events = [json.loads(r.value) for rs in stored.values() for r in rs]
    kinds = Counter(e["type"] for e in events)
    assert kinds["produce_acked"] == 10
    assert kinds["delivered"] == 10
    assert kinds["committed"] >= 1
    assert kinds["admin"] == 2  # create, expand
    assert {e["phase"] for e in events if e["type"] == "barrier_phase"} >= {
        "creating_partitions",
        "barrier",
        "reading_boundaries",
        "committing",
    }
    assert all(e["schema"] == 1 and e["sidecar"] == settings.sidecar_id for e in events)
    assert sorted(e["seq"] for e in events) == list(range(len(events)))
    acked = {(e["partition"], e["offset"]): e for e in events if e["type"] == "produce_acked"}
    for e in events:
        if e["type"] == "delivered":
            source = acked[(e["partition"], e["offset"])]
            assert (e["producer"], e["producer_seq"]) == (
                source["producer"],
                source["producer_seq"],
            )
    assert server.metrics.audit_dropped._value.get() == 0
