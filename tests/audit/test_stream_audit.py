"""The live audit against the real cluster: ``/metrics`` of a running stream.

The stream job reads a fresh audit topic (3 partitions, so one history's events reach
it in any order across them) from the start, with the Spark session of the audit tests.
A clean history (an expansion 2 -> 3, deliveries through the gate) is written for one
topic, then a faulty one for another: a consumer without the gate delivers the moved
keys' newer records before their older ones, and a zombie producer writes generation 0
above generation 1.

The bound checked: every injected anomaly is counted on ``/metrics`` within 60 s of the
moment its events were written to the audit topic, by kind and with its topic; the
clean topic never gets an anomaly series; and every event written is counted.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession

from ordered_audit import checks
from ordered_audit.stream import RunningStream, StreamConfig, start_stream
from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import unique
from sidecar.audit.events import Event
from tests.audit.history import History, Scenario, clean, written

pytestmark = pytest.mark.integration

REPORTED_WITHIN_S = 60.0
ANOMALIES = "sidecar_audit_stream_anomalies_total"
EVENTS = "sidecar_audit_stream_events_total"


def on_topic(scenario: Scenario, topic: str) -> list[Event]:
    """The scenario's events, for ``topic``, stamped as if the last one were now."""
    offset = time.time() - scenario.history.events[-1]["time"]
    return [
        {**event, "time": event["time"] + offset, **({"topic": topic} if "topic" in event else {})}
        for event in scenario.history.events
    ]


def faulty() -> Scenario:
    """Partition 2 delivered first (no gate), then a zombie's write across the barrier."""
    scenario = written()
    history: History = scenario.history
    records = scenario.before + scenario.after
    for record in sorted(records, key=lambda r: (r.partition != 2, r.partition, r.offset)):
        history.deliver(record)
    key = next(r.key for r in scenario.before if r.partition == 0)
    history.write(0, key, 0, 2, producer="zombie-sc")
    return scenario


async def write_events(cluster: ClusterEndpoints, topic: str, events: Sequence[Event]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap)
    await producer.start()
    try:
        for event in events:
            await producer.send(topic, json.dumps(event).encode())
        await producer.flush()
    finally:
        await producer.stop()


async def scrape(
    http: aiohttp.ClientSession, port: int
) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def anomalies_by_topic(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float],
) -> dict[tuple[str, str], float]:
    found = {}
    for (name, labels), value in samples.items():
        if name == ANOMALIES:
            label = dict(labels)
            found[(label["kind"], label["topic"])] = value
    return found


async def wait_for(
    http: aiohttp.ClientSession, port: int, events: int, within_s: float
) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Scrapes until ``events`` events were counted; the last scrape."""
    deadline = time.monotonic() + within_s
    while True:
        samples = await scrape(http, port)
        if samples.get((EVENTS, frozenset())) == events or time.monotonic() >= deadline:
            return samples
        await asyncio.sleep(0.5)


async def test_the_stream_reports_injected_anomalies_within_a_minute_and_nothing_else(
    cluster: ClusterEndpoints, spark: SparkSession, tmp_path: Path
) -> None:
    audit_topic = unique("audit-stream")
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(audit_topic, 3, cluster.replication_factor)])
    finally:
        await admin.close()
    good, bad = unique("clean"), unique("faulty")
    config = StreamConfig(
        bootstrap=cluster.kafka_bootstrap,
        topic=audit_topic,
        checkpoint=tmp_path / "checkpoint",
        trigger_s=1.0,
        metrics_port=0,
    )
    running: RunningStream = await asyncio.to_thread(start_stream, spark, config)
    try:
        async with aiohttp.ClientSession() as http:
            clean_events = on_topic(clean(), good)
            await write_events(cluster, audit_topic, clean_events)
            # The first batches also warm the JVM up: not what the bound is about.
            samples = await wait_for(http, running.port, len(clean_events), 120)
            assert samples.get((EVENTS, frozenset())) == len(clean_events), (
                running.query.lastProgress
            )
            assert anomalies_by_topic(samples) == {}

            scenario = faulty()
            faulty_events = on_topic(scenario, bad)
            expected = {
                (checks.NONMONOTONIC, bad): 2 * len(scenario.moved_keys),
                (checks.WRITTEN_ACROSS_BARRIER, bad): 1,
            }
            written_at = time.monotonic()
            await write_events(cluster, audit_topic, faulty_events)
            total = len(clean_events) + len(faulty_events)
            samples = await wait_for(http, running.port, total, REPORTED_WITHIN_S)
            # A batch's anomalies are counted before its events: all are in by now.
            reported_after = time.monotonic() - written_at
            print(f"\nanomalies reported {reported_after:.1f} s after their events were written")
            assert samples.get((EVENTS, frozenset())) == total, running.query.lastProgress
            assert anomalies_by_topic(samples) == expected
            assert reported_after <= REPORTED_WITHIN_S
            lag = samples[("sidecar_audit_stream_lag_seconds", frozenset())]
            assert 0 <= lag < REPORTED_WITHIN_S + 10
            batches = [p.durationMs.get("triggerExecution") for p in running.query.recentProgress]
            print(f"micro-batches (ms, empty ones included): {batches}")
    finally:
        await asyncio.to_thread(running.stop)
    assert running.query.exception() is None
