"""Anomalies made by real components, found by the live audit (and the batch audit).

Two in-process sidecars audit to a fresh audit topic: ``sc`` produces everything,
coordinates the changes and reads through the gate; ``ungated`` runs with the test-only
fault ``faults.ungated_delivery`` (its consumers deliver without the gate). The stream
job (``start_stream``, the Spark session of the audit tests) reads the audit topic from
the start, while three managed topics are written through ``sc``:

- ``clean``: 2 partitions expanded to 3 under load, read by a group through the gate
  while it runs. Nothing may be reported for it.
- ``bypassed``: 2 partitions, written through ``sc`` while a plain aiokafka producer
  writes records of one of the same keys straight to Kafka, to the partition the key
  does not belong to and without the sidecar's stamp; a group on ``sc`` delivers them.
  The design's kind for it: ``unaudited_delivery``, one per bypassing record.
- ``ungated``: 2 partitions expanded to 3 (keys of partition 0 move to partition 2),
  written before and after; then a group on the ``ungated`` sidecar is assigned the
  moved keys' new partition first and the others after it, and delivers every moved
  key's newer records before its older ones. The kind: ``nonmonotonic``, one per record
  delivered after a newer one of its key, as the app received them.

The bound: each injected anomaly is counted on ``/metrics``, by kind and with its
topic, within 60 s of its injection (the last bypassing write, the ungated group's last
response); once every audit event the sidecars wrote is counted, those are the only
anomaly series. The batch audit over the same topic finds the same anomalies.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaProducer
from pyspark.sql import SparkSession

from ordered_audit import checks
from ordered_audit.job import AuditResult
from ordered_audit.stream import RunningStream, start_stream
from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.consumers import create_consumer
from ordered_dev.harness.ledger import (
    Ledger,
    consume_into,
    produce_sequences,
    producer_keys,
    wait_until_delivered,
)
from ordered_dev.harness.sidecars import RunningSidecar, unique
from ordered_dev.harness.waiting import eventually
from tests.audit.live import (
    Samples,
    anomalies_by_topic,
    audit_events_written,
    audited_sidecars,
    batch_anomalies,
    create_audit_topic,
    events_counted,
    scrape,
    stream_config,
    wait_for,
)

pytestmark = pytest.mark.integration

REPORTED_WITHIN_S = 60.0
COUNTED_WITHIN_S = 90.0
BYPASSING_RECORDS = 3
CLEAN, BYPASSED, UNGATED = 0, 1, 2
"""The producer index of each topic's load (its keys: ``producer_keys(index)``)."""


@dataclass
class Injected:
    topics: dict[str, str]
    """clean, bypassed, ungated: the managed topics' names."""
    expected: dict[tuple[str, str], int]
    """(kind, topic): the anomalies the components made."""
    bypassing_key: str
    late: set[tuple[str, int]]
    """(key, seq) the ungated group delivered after a newer record of its key."""
    reported_after_s: dict[str, float]
    """Per kind: from its injection to its count on /metrics."""
    samples: Samples
    """/metrics once every audit event is counted."""
    without_headers: float
    """What the reading sidecar counted of records without its headers (bypassed)."""
    batch: AuditResult
    batch_anomalies: list[dict[str, Any]]


async def bypass(cluster: ClusterEndpoints, topic: str, key: str, partition: int) -> None:
    """Plain aiokafka writes of ``key`` to ``partition`` of a managed topic: no stamp, no
    audit event. The values look like the ledger's so the group's reader takes them."""
    producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap)
    await producer.start()
    try:
        for seq in range(BYPASSING_RECORDS):
            value = {"producer": -1, "key": key, "seq": seq}
            await producer.send_and_wait(
                topic, json.dumps(value).encode(), key=json.dumps(key).encode(), partition=partition
            )
    finally:
        await producer.stop()


def late_deliveries(delivered: Sequence[tuple[str, int]]) -> set[tuple[str, int]]:
    """The oracle: per key, first deliveries of a seq below one delivered before it."""
    highest: dict[str, int] = {}
    late = set()
    for key, seq in delivered:
        if seq < highest.get(key, -1):
            late.add((key, seq))
        highest[key] = max(seq, highest.get(key, -1))
    return late


async def read_ungated(
    sidecar: RunningSidecar, topic: str, ledger: Ledger
) -> list[tuple[str, int]]:
    """A group on the ungated sidecar reads the moved keys' new partitions, then the
    rest; (key, seq) in the order the app received them."""
    spans: dict[str, set[int]] = {}
    newest: dict[str, tuple[int, int]] = {}
    for (_, key, seq), (partition, _) in ledger.placed.items():
        spans.setdefault(key, set()).add(partition)
        newest[key] = max(newest.get(key, (-1, -1)), (seq, partition))
    moved = [key for key, partitions in spans.items() if len(partitions) > 1]
    assert moved, f"the change moved no key: {spans}"
    placed = [partition for partition, _ in ledger.placed.values()]
    # Where a moved key's newest record is: the partition it moved to.
    first = {newest[key][1] for key in moved}
    rest = set(placed) - first
    consumer = await create_consumer(sidecar, unique("ungated-group"), "u1")
    received: list[tuple[str, int]] = []
    for partitions in (first, rest):
        await consumer.assign(*[(topic, p) for p in sorted(partitions)])
        wanted = len(received) + sum(1 for p in placed if p in partitions)
        deadline = time.monotonic() + 60
        while len(received) < wanted:
            assert time.monotonic() < deadline, f"{len(received)} of {wanted} delivered"
            records, _ = await consumer.poll(300)
            for record in records:
                value = json.loads(base64.b64decode(record["value"]))
                received.append((value["key"], value["seq"]))
    await consumer.delete()
    return received


async def until_reported(
    http: aiohttp.ClientSession,
    port: int,
    expected: dict[tuple[str, str], int],
    since: float,
    within_s: float,
) -> float:
    """Scrapes until every expected series has its count; seconds since ``since``."""
    found: dict[tuple[str, str], float] = {}

    async def reported() -> bool:
        nonlocal found
        found = anomalies_by_topic(await scrape(http, port))
        return all(found.get(series) == count for series, count in expected.items())

    try:
        await eventually(reported, within_s, f"the stream reports {expected}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; reported: {found}") from None
    return time.monotonic() - since


async def counted(http: aiohttp.ClientSession, port: int, events: float) -> Samples:
    """/metrics once the stream has counted ``events`` events."""
    samples = await wait_for(http, port, int(events), COUNTED_WITHIN_S)
    assert events_counted(samples) == events, (
        f"not within {COUNTED_WITHIN_S:g} s: the stream counts {events:g} events "
        f"(it counted {events_counted(samples)})"
    )
    return samples


@pytest.fixture(scope="module")
async def injected(
    cluster: ClusterEndpoints, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Injected:
    directory = tmp_path_factory.mktemp("live-injection")
    audit_topic = await create_audit_topic(cluster)
    topics = {name: unique(name) for name in ("clean", "bypassed", "ungated")}
    began = time.time()
    config = stream_config(cluster, audit_topic, directory / "checkpoint")
    running: RunningStream = await asyncio.to_thread(start_stream, spark, config)
    options: dict[str, dict[str, Any]] = {"sc": {}, "ungated": {"ungated_delivery": True}}
    try:
        async with (
            audited_sidecars(cluster, audit_topic, options) as sidecars,
            aiohttp.ClientSession() as http,
        ):
            sc = sidecars["sc"]
            for name in topics:
                rf = cluster.replication_factor
                await sc.create_topic(topics[name], 2, replication_factor=rf)
            ledgers = {name: Ledger() for name in topics}
            stop_producing, stop_consuming = asyncio.Event(), asyncio.Event()
            producers = [
                asyncio.create_task(
                    produce_sequences(sc, index, topics[name], ledgers[name], stop_producing)
                )
                for index, name in enumerate(topics)
            ]
            groups = {name: unique(f"{name}-group") for name in ("clean", "bypassed")}
            consumers = [
                asyncio.create_task(
                    consume_into(
                        sc, groups[name], "c1", topics[name], ledgers[name], stop_consuming
                    )
                )
                for name in groups
            ]
            await asyncio.sleep(1.5)

            # (a) A producer that bypasses the sidecar, beside it, on one of its keys.
            key = producer_keys(BYPASSED)[0]
            placed = next(p for (_, k, _), (p, _) in ledgers["bypassed"].placed.items() if k == key)
            await bypass(cluster, topics["bypassed"], key, 1 - placed)
            unaudited = {(checks.UNAUDITED_DELIVERY, topics["bypassed"]): BYPASSING_RECORDS}
            bypass_reported = asyncio.create_task(
                until_reported(
                    http, running.port, unaudited, time.monotonic(), REPORTED_WITHIN_S + 30
                )
            )

            for name in ("clean", "ungated"):
                operation = await sc.change_count(topics[name], 3)
                assert operation["phase"] == "done", operation
            await asyncio.sleep(1.5)
            stop_producing.set()
            await asyncio.gather(*producers)
            bypassing = {(-1, key, seq) for seq in range(BYPASSING_RECORDS)}
            ledgers["bypassed"].acknowledged |= bypassing
            for name in groups:
                await wait_until_delivered(ledgers[name], within_s=60)
            stop_consuming.set()
            await asyncio.gather(*consumers)

            # (b) A consumer without the gate reads the expanded topic.
            received = await read_ungated(
                sidecars["ungated"], topics["ungated"], ledgers["ungated"]
            )
            ungated_at = time.monotonic()
            late = late_deliveries(received)
            assert late, "the ungated group delivered every key in order"

            expected = unaudited | {(checks.NONMONOTONIC, topics["ungated"]): len(late)}
            print(f"\ninjected: {expected}")
            reported_after = {
                checks.UNAUDITED_DELIVERY: await bypass_reported,
                checks.NONMONOTONIC: await until_reported(
                    http, running.port, expected, ungated_at, REPORTED_WITHIN_S + 30
                ),
            }
            without_headers = (
                sc.server.metrics.registry.get_sample_value(
                    "sidecar_records_without_sidecar_headers_total", {"topic": topics["bypassed"]}
                )
                or 0.0
            )
        # The sidecars are stopped: their audit queues are flushed.
        written, dropped = audit_events_written(list(sidecars.values()))
        assert dropped == 0
        async with aiohttp.ClientSession() as http:
            samples = await counted(http, running.port, written)
        batches = [p.durationMs.get("triggerExecution") for p in running.query.recentProgress]
        print(f"\nmicro-batches (ms): {batches}")
    finally:
        await asyncio.to_thread(running.stop)
    assert running.query.exception() is None
    batch, found = await batch_anomalies(spark, cluster, audit_topic, directory / "batch", began)
    return Injected(
        topics,
        expected,
        key,
        {(k, s) for k, s in late},
        reported_after,
        samples,
        without_headers,
        batch,
        found,
    )


def test_a_producer_bypassing_the_sidecar_is_reported_as_unaudited_delivery(
    injected: Injected,
) -> None:
    topic = injected.topics["bypassed"]
    found = anomalies_by_topic(injected.samples)
    assert found.get((checks.UNAUDITED_DELIVERY, topic)) == BYPASSING_RECORDS
    assert {kind for kind, t in found if t == topic} == {checks.UNAUDITED_DELIVERY}
    after = injected.reported_after_s[checks.UNAUDITED_DELIVERY]
    print(f"\nunaudited_delivery reported {after:.1f} s after the bypassing writes")
    assert after <= REPORTED_WITHIN_S
    # The sidecar that delivered them counted them too.
    assert injected.without_headers == BYPASSING_RECORDS
    rows = [
        r for r in injected.batch_anomalies if r["topic"] == topic and r["kind"] != checks.DUPLICATE
    ]
    key = base64.b64encode(json.dumps(injected.bypassing_key).encode()).decode()
    assert (
        sorted((r["kind"], r["key"]) for r in rows)
        == [(checks.UNAUDITED_DELIVERY, key)] * BYPASSING_RECORDS
    )


def test_an_ungated_consumer_is_reported_as_nonmonotonic(injected: Injected) -> None:
    topic = injected.topics["ungated"]
    found = anomalies_by_topic(injected.samples)
    assert found.get((checks.NONMONOTONIC, topic)) == len(injected.late)
    assert {kind for kind, t in found if t == topic} == {checks.NONMONOTONIC}
    after = injected.reported_after_s[checks.NONMONOTONIC]
    print(f"\nnonmonotonic reported {after:.1f} s after the ungated group's last response")
    assert after <= REPORTED_WITHIN_S
    rows = [r for r in injected.batch_anomalies if r["topic"] == topic]
    assert {r["kind"] for r in rows} <= {checks.NONMONOTONIC, checks.DUPLICATE}
    late = [r for r in rows if r["kind"] == checks.NONMONOTONIC]
    keys = {base64.b64encode(json.dumps(k).encode()).decode(): k for k in producer_keys(UNGATED)}
    assert len(late) == len(injected.late)
    assert {keys[r["key"]] for r in late} == {key for key, _ in injected.late}


def test_nothing_else_is_reported_and_nothing_for_the_clean_topic(injected: Injected) -> None:
    assert anomalies_by_topic(injected.samples) == injected.expected
    clean = injected.topics["clean"]
    # Duplicates are at-least-once (a group coordinator that moved re-delivers what was
    # not committed yet) and batch-only: not a broken guarantee.
    assert not [
        r for r in injected.batch_anomalies if r["topic"] == clean and r["kind"] != checks.DUPLICATE
    ]
    operations = injected.batch.summary["operations"]
    assert {(o["kind"], o["from_count"], o["target_count"]) for o in operations} == {
        ("expand", 2, 3)
    }
