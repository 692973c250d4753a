"""End to end: the guarantee across random expansions and shrinks, with a consumer killed.

Three producer sidecars write keyed, per-producer sequences; a group of three consumer
instances on two more sidecars reads them through the gate while the partition count
changes eight times (an expansion while a shrink is still draining among them), and
the sidecar of one consumer instance is SIGKILLed and restarted midway.

For every (producer, key) the delivered sequence is in order, no acknowledged record is
lost, and duplicates appear only after the restart.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field

import aiohttp

from sidecar.devcluster.provider import ClusterEndpoints
from tests.integration.consumers import create_consumer
from tests.integration.sidecars import (
    SidecarClient,
    SidecarProcess,
    check_no_record_crossed_a_barrier,
    settings_for,
    start_process,
    stop_process,
    unique,
)

PRODUCERS = 3
KEYS_PER_PRODUCER = 8


@dataclass
class Ledger:
    acknowledged: set[tuple[int, str, int]] = field(default_factory=set)
    """(producer, key, sequence) Kafka acknowledged."""
    placed: dict[tuple[int, str, int], tuple[int, int]] = field(default_factory=dict)
    """Where each acknowledged record landed: (partition, offset)."""
    delivered: list[tuple[float, int, str, int]] = field(default_factory=list)
    """(time, producer, key, sequence) in the order the app received them."""
    restarted_at: float | None = None
    poll_errors: list[str] = field(default_factory=list)


async def _produce(
    sidecar: SidecarClient, producer: int, stop: asyncio.Event, ledger: Ledger, topic: str
) -> None:
    sequence = 0
    keys = [f"p{producer}-k{i}" for i in range(KEYS_PER_PRODUCER)]
    while not stop.is_set():
        records = [
            {"key": key, "value": {"producer": producer, "key": key, "seq": sequence}}
            for key in keys
        ]
        status, body = await sidecar.produce(topic, records)
        assert status == 200, body
        for key, entry in zip(keys, body["offsets"], strict=True):
            assert entry["error_code"] is None, entry
            ledger.acknowledged.add((producer, key, sequence))
            ledger.placed[(producer, key, sequence)] = (entry["partition"], entry["offset"])
        sequence += 1
        await asyncio.sleep(0.02)


async def _consume(
    sidecar: SidecarClient, group: str, name: str, topic: str, ledger: Ledger, stop: asyncio.Event
) -> None:
    consumer = await create_consumer(
        sidecar, group, name, **{"auto.commit.enable": "true", "consumer.request.timeout.ms": 500}
    )
    await consumer.subscribe(topic)
    while not stop.is_set():
        try:
            status, body = await consumer.call("GET", "/records", timeout="300")
        except aiohttp.ClientError:
            return  # its sidecar was killed
        if status != 200:
            ledger.poll_errors.append(f"{name}: {status} {body}")
            await asyncio.sleep(0.1)
            continue
        events = [item for item in body if "type" in item]
        records = [item for item in body if "type" not in item]
        for record in records:
            value = json.loads(base64.b64decode(record["value"]))
            ledger.delivered.append(
                (time.monotonic(), value["producer"], value["key"], value["seq"])
            )
        if events:
            await consumer.ack(*[e["event_id"] for e in events])


async def _diagnose(sidecars: list[SidecarProcess], topic: str, group: str) -> str:
    """What the consumer sidecars report: gated partitions and lag, from /metrics."""
    lines = []
    for sidecar in sidecars:
        if sidecar.process.returncode is not None:
            continue
        try:
            async with sidecar.http.get("/metrics") as response:
                text = await response.text()
        except aiohttp.ClientError:
            continue
        lines += [
            f"{sidecar.id}: {line}"
            for line in text.splitlines()
            if line.startswith(("sidecar_gated_partitions{", "sidecar_consumer_lag{"))
            and not line.endswith(" 0.0")
        ]
    return "; ".join(lines) or "nothing gated, no lag"


async def test_the_guarantee_holds_through_changes_and_a_consumer_crash(
    cluster: ClusterEndpoints,
) -> None:
    root = f"/{unique('e2e')}"
    topic = unique("orders")
    group = unique("group")
    rng = random.Random(2531)
    ledger = Ledger()
    sidecars: list[SidecarProcess] = []
    try:
        for index in range(PRODUCERS + 2):
            sidecars.append(await start_process(settings_for(cluster, root, f"s{index}")))
        producers, stable, doomed = sidecars[:PRODUCERS], sidecars[PRODUCERS], sidecars[-1]
        await producers[0].create_topic(topic, 2, replication_factor=cluster.replication_factor)

        stop_producing, stop_consuming = asyncio.Event(), asyncio.Event()
        consumer_tasks = [
            asyncio.create_task(_consume(stable, group, "a", topic, ledger, stop_consuming)),
            asyncio.create_task(_consume(stable, group, "b", topic, ledger, stop_consuming)),
            asyncio.create_task(_consume(doomed, group, "c", topic, ledger, stop_consuming)),
        ]
        producer_tasks = [
            asyncio.create_task(_produce(s, i, stop_producing, ledger, topic))
            for i, s in enumerate(producers)
        ]
        # Eight changes; the fourth expands right after a shrink, while it drains.
        counts = [2]
        plan = [4, 6, 3, 5, 7, 4, 8, 5]
        for step, target in enumerate(plan):
            await asyncio.sleep(rng.uniform(0.3, 1.0))
            operation = await rng.choice(producers).change_count(topic, target)
            assert operation["phase"] == "done", operation
            counts.append(target)
            if step == 3:
                # Kill the sidecar of consumer "c" and bring it back with a new process.
                ledger.restarted_at = time.monotonic()
                doomed.process.kill()
                await doomed.process.wait()
                await doomed.http.close()
                doomed = await start_process(settings_for(cluster, root, "s-restarted"))
                sidecars.append(doomed)
                consumer_tasks.append(
                    asyncio.create_task(_consume(doomed, group, "c", topic, ledger, stop_consuming))
                )
        await asyncio.sleep(1.0)
        stop_producing.set()
        await asyncio.gather(*producer_tasks)

        # Everything acknowledged is eventually delivered.
        deadline = time.monotonic() + 90
        while True:
            seen = {(p, k, s) for _, p, k, s in ledger.delivered}
            missing = ledger.acknowledged - seen
            if not missing:
                break
            if time.monotonic() >= deadline:
                first_missing: dict[int, int] = {}
                for record in missing:
                    partition, offset = ledger.placed[record]
                    first_missing[partition] = min(first_missing.get(partition, offset), offset)
                raise AssertionError(
                    f"{len(missing)} acknowledged records never delivered; first missing offset "
                    f"per partition: {dict(sorted(first_missing.items()))}; "
                    f"state: {await _diagnose(sidecars, topic, group)}; "
                    f"poll errors: {ledger.poll_errors[:5]}"
                )
            await asyncio.sleep(0.5)
        stop_consuming.set()
        await asyncio.gather(*consumer_tasks, return_exceptions=True)
        description = await producers[0].describe(topic)
    finally:
        await asyncio.gather(*(stop_process(s) for s in sidecars), return_exceptions=True)

    assert ledger.poll_errors == []
    assert [g["undeleted_count"] for g in description["generations"]] == counts
    await check_no_record_crossed_a_barrier(cluster, description)

    by_key: dict[tuple[int, str], list[tuple[float, int]]] = defaultdict(list)
    for at, producer, key, sequence in ledger.delivered:
        by_key[(producer, key)].append((at, sequence))
    assert ledger.restarted_at is not None
    duplicates = 0
    for (producer, key), deliveries in by_key.items():
        highest = -1
        for at, sequence in deliveries:
            if sequence > highest:
                # A gap is allowed only where a sequence number was never acknowledged.
                skipped = (producer, key, highest + 1)
                assert sequence == highest + 1 or skipped not in ledger.acknowledged, (
                    f"{producer}/{key}: {sequence} delivered before {highest + 1}"
                )
                highest = sequence
                continue
            duplicates += 1
            assert at > ledger.restarted_at, (
                f"{producer}/{key}: {sequence} delivered again after {highest} without a restart"
            )
    print(
        f"{len(ledger.delivered)} deliveries of {len(ledger.acknowledged)} records, "
        f"{duplicates} duplicates after the restart, counts {counts}"
    )
