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
import time
from pathlib import Path

import aiohttp
import pytest
from pyspark.sql import SparkSession

from ordered_audit.stream import RunningStream, start_stream
from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import unique
from tests.audit.history import clean
from tests.audit.live import (
    EVENTS,
    LAG,
    anomalies_by_topic,
    create_audit_topic,
    expected_anomalies,
    faulty,
    on_topic,
    stream_config,
    wait_for,
    write_events,
)

pytestmark = pytest.mark.integration

REPORTED_WITHIN_S = 60.0


async def test_the_stream_reports_injected_anomalies_within_a_minute_and_nothing_else(
    cluster: ClusterEndpoints, spark: SparkSession, tmp_path: Path
) -> None:
    audit_topic = await create_audit_topic(cluster)
    good, bad = unique("clean"), unique("faulty")
    config = stream_config(cluster, audit_topic, tmp_path / "checkpoint")
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
            expected = expected_anomalies(scenario, bad)
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
            lag = samples[(LAG, frozenset())]
            assert 0 <= lag < REPORTED_WITHIN_S + 10
            batches = [p.durationMs.get("triggerExecution") for p in running.query.recentProgress]
            print(f"micro-batches (ms, empty ones included): {batches}")
    finally:
        await asyncio.to_thread(running.stop)
    assert running.query.exception() is None
