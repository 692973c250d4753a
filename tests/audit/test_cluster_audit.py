"""The audit job against the real cluster, real sidecars and a real Prometheus.

Two sidecars with auditing on (one produces and coordinates, one consumes) while a
producer load runs through an expansion 3 -> 5 and a shrink 5 -> 4 and a group reads
everything through the gate; Prometheus scrapes both every second. Then two
injections: a producer that bypasses the sidecars writes to a managed partition, and an
ungated consumer reads the topic's partitions newest first and writes its own
``delivered`` events to the audit topic.

The job, reading the audit topic with Spark's Kafka source:

- over the scenario's window, finds nothing and reports each change with its produce
  hold and gate stall from Prometheus;
- over the whole run, finds exactly the injected anomalies with their keys.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaProducer
from pyspark.sql import SparkSession

from ordered_audit import checks
from ordered_audit.job import AuditConfig, AuditResult, run_audit
from ordered_audit.report import change_label
from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.ledger import (
    Ledger,
    consume_into,
    gate_and_lag_lines,
    produce_sequences,
    producer_keys,
    wait_until_delivered,
)
from ordered_dev.harness.sidecars import (
    READY_WITHIN_S,
    RunningSidecar,
    read_all,
    settings_for,
    unique,
)
from sidecar.audit import events as audit_events
from sidecar.compose import SidecarServer
from sidecar.config import AuditSettings
from sidecar.core.routing import partition_for_key
from tests.ops.support import running_prometheus

pytestmark = pytest.mark.integration

PRODUCERS = 2
ROGUE_KEYS = [f"rogue-{i}".encode() for i in range(3)]
UNGATED_GROUP = "ungated-group"


@dataclass
class Run:
    """What the scenario did, and the job's two results."""

    topic: str
    group: str
    clean: AuditResult
    injected: AuditResult
    holds: float
    """Produce holds the sidecars' own registries counted (all during the changes)."""
    gate_waits: float
    expected_nonmonotonic: set[tuple[str, str, int]]
    """(producer, base64 key, producer_seq) the ungated consumer delivered late."""


@contextlib.asynccontextmanager
async def audited_sidecars(
    cluster: ClusterEndpoints, audit_topic: str
) -> AsyncIterator[list[RunningSidecar]]:
    root = f"/{unique('audit-root')}"
    started: list[RunningSidecar] = []
    try:
        for name in ("producer", "consumer"):
            settings = settings_for(cluster, root, name)
            settings = replace(settings, audit=AuditSettings(enabled=True, topic=audit_topic))
            server = SidecarServer(settings)
            await server.start()
            await asyncio.wait_for(server.wait_ready(), READY_WITHIN_S)
            session = aiohttp.ClientSession(server.url)
            started.append(RunningSidecar(server.url, settings.sidecar_id, session, server))
        yield started
    finally:
        for sidecar in started:
            await sidecar.http.close()
            await sidecar.server.stop()  # flushes its audit queue


@contextlib.asynccontextmanager
async def scraping_prometheus(targets: Sequence[int], directory: Path) -> AsyncIterator[str]:
    """A real Prometheus scraping ``targets`` (ports on 127.0.0.1) every second; its URL."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "ordered-sidecar",
                "static_configs": [{"targets": [f"127.0.0.1:{t}" for t in targets]}],
            }
        ],
    }
    async with running_prometheus(config, directory) as url:
        yield url


async def _consumer_state(sidecar: RunningSidecar, topic: str) -> str:
    """What the consuming sidecar says of the topic: gated partitions, lag, modes."""
    async with sidecar.http.get("/metrics") as response:
        metrics = await response.text()
    lines = gate_and_lag_lines(metrics)
    description = await sidecar.describe(topic)
    return f"metrics: {lines or 'nothing gated, no lag'}; topic: {description}"


def registry_total(sidecars: Sequence[RunningSidecar], name: str, labels: dict[str, str]) -> float:
    """A histogram's _count summed over the sidecars' registries and the given labels."""
    total = 0.0
    for sidecar in sidecars:
        for family in sidecar.server.metrics.registry.collect():
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
    return total


async def bypass_the_sidecars(cluster: ClusterEndpoints, topic: str) -> None:
    """Plain aiokafka writes to managed partition 0: no headers, no audit event. The
    values look like the ledger's so that the group's reader takes them in its stride."""
    producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap)
    await producer.start()
    try:
        for index, key in enumerate(ROGUE_KEYS):
            value = {"producer": -1, "key": key.decode(), "seq": index}
            await producer.send_and_wait(topic, json.dumps(value).encode(), key=key, partition=0)
    finally:
        await producer.stop()


async def ungated_consumer(
    cluster: ClusterEndpoints, topic: str, audit_topic: str, partitions: int
) -> list[dict[str, Any]]:
    """Reads every partition, the newest partitions first (no gate), and writes the
    ``delivered`` events a sidecar would have to the audit topic; returns them."""
    stored = await read_all(cluster, topic, partitions)
    emitted: list[dict[str, Any]] = []
    for partition in sorted(stored, reverse=True):
        for record in stored[partition]:
            event = audit_events.delivered(
                group=UNGATED_GROUP,
                instance="ungated-1",
                topic=topic,
                partition=partition,
                offset=record.offset,
                key=record.key,
                headers=[(k, bytes(v)) for k, v in record.headers],
            )
            emitted.append(audit_events.stamped(event, sidecar="ungated-app", seq=len(emitted)))
    producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap)
    await producer.start()
    try:
        for event in emitted:
            await producer.send(audit_topic, json.dumps(event).encode())
        await producer.flush()
    finally:
        await producer.stop()
    return emitted


def late_deliveries(emitted: Sequence[dict[str, Any]]) -> set[tuple[str, str, int]]:
    """The oracle: per (producer, key), first deliveries of a seq below one before it."""
    highest: dict[tuple[str, str], int] = {}
    seen: set[tuple[str, str, int]] = set()
    late = set()
    for event in emitted:
        producer, key, seq = event["producer"], event["key"], event["producer_seq"]
        if producer is None or key is None or (producer, key, seq) in seen:
            continue
        seen.add((producer, key, seq))
        if seq < highest.get((producer, key), -1):
            late.add((producer, key, seq))
        highest[(producer, key)] = max(seq, highest.get((producer, key), -1))
    return late


@pytest.fixture(scope="module")
async def run(
    cluster: ClusterEndpoints, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Run:
    directory = tmp_path_factory.mktemp("cluster-audit")
    audit_topic = unique("audit")
    topic = unique("audited")
    group = unique("group")
    ledger = Ledger()
    async with audited_sidecars(cluster, audit_topic) as sidecars:
        producing, consuming = sidecars
        await producing.create_topic(topic, 3, replication_factor=cluster.replication_factor)
        ports = [s.server.port or 0 for s in sidecars]
        async with scraping_prometheus(ports, directory) as prometheus_url:
            started = time.time()
            stop_producing, stop_consuming = asyncio.Event(), asyncio.Event()
            producers = [
                asyncio.create_task(
                    produce_sequences(producing, i, topic, ledger, stop_producing, pause_s=0.005)
                )
                for i in range(PRODUCERS)
            ]
            consumer = asyncio.create_task(
                consume_into(consuming, group, "c1", topic, ledger, stop_consuming)
            )
            await asyncio.sleep(2)
            for target in (5, 4):
                operation = await producing.change_count(topic, target)
                assert operation["phase"] == "done", operation
                await asyncio.sleep(3)
            stop_producing.set()
            await asyncio.gather(*producers)
            await wait_until_delivered(ledger, within_s=60)
            await asyncio.sleep(2.5)  # scrapes after the last hold and gate wait
            clean_end = time.time()
            holds = registry_total(sidecars, "sidecar_produce_hold_seconds_count", {"topic": topic})
            gate_waits = registry_total(
                sidecars, "sidecar_gate_wait_seconds_count", {"topic": topic}
            )

            # Counted before the writes: the group may deliver the first of them before
            # the last is acknowledged.
            delivered_before = len(ledger.delivered)
            await bypass_the_sidecars(cluster, topic)
            # Generous: on a loaded machine a fresh cluster's group coordinator can move
            # for tens of seconds, and this is not what the test measures.
            deadline = time.monotonic() + 90
            while len(ledger.delivered) < delivered_before + len(ROGUE_KEYS):
                if time.monotonic() >= deadline:
                    state = await _consumer_state(consuming, topic)
                    raise AssertionError(
                        f"the group never got the bypassing records; poll errors "
                        f"{ledger.poll_errors[-5:]}; {state}"
                    )
                await asyncio.sleep(0.2)
            physical = (await producing.describe(topic))["physical_count"]
            emitted = await ungated_consumer(cluster, topic, audit_topic, physical)
            stop_consuming.set()
            await consumer
            assert ledger.poll_errors == []

            clean = await asyncio.to_thread(
                run_audit,
                spark,
                AuditConfig(
                    out=directory / "clean",
                    bootstrap=cluster.kafka_bootstrap,
                    topic=audit_topic,
                    start=started,
                    end=clean_end,
                    prometheus=prometheus_url,
                    step_s=1.0,
                    bucket_s=2.0,
                ),
            )
    # The sidecars are stopped: every audit event is in the topic.
    injected = await asyncio.to_thread(
        run_audit,
        spark,
        AuditConfig(
            out=directory / "injected",
            bootstrap=cluster.kafka_bootstrap,
            topic=audit_topic,
            start=started,
        ),
    )
    return Run(topic, group, clean, injected, holds, gate_waits, late_deliveries(emitted))


def redelivered_by_rebalances(summary: dict[str, Any]) -> int:
    """The duplicates of a run, all of which must have come through a rebalance: a
    commit before it that did not land (the group's coordinator moved, as it can on a
    fresh cluster) delivers the records after it again, as at-least-once allows. Any
    other duplicate fails the test."""
    anomalies = summary["anomalies"]
    causes = anomalies.get("duplicates_by_cause") or {}
    assert set(causes) <= {checks.REBALANCE}, anomalies
    assert anomalies["by_kind"][checks.DUPLICATE] == sum(causes.values()), anomalies
    return int(causes.get(checks.REBALANCE, 0))


def test_the_clean_scenario_has_no_anomaly(run: Run) -> None:
    summary = run.clean.summary
    redelivered = redelivered_by_rebalances(summary)
    assert summary["anomalies"]["total"] == redelivered, summary["anomalies"]
    assert summary["events"]["by_type"]["produce_acked"] > 100
    assert (
        summary["events"]["by_type"]["delivered"] >= summary["events"]["by_type"]["produce_acked"]
    )
    assert summary["unseen"] == []


def test_each_change_shows_its_hold_and_stall_from_prometheus(run: Run) -> None:
    operations = run.clean.summary["operations"]
    assert [(o["kind"], o["from_count"], o["target_count"], o["result"]) for o in operations] == [
        ("expand", 3, 5, "done"),
        ("shrink", 5, 4, "done"),
    ]
    # Every hold and gate wait the sidecars counted happened during one of the changes,
    # and Prometheus charged each to its change.
    assert run.holds > 0, "no produce was held at a barrier"
    assert run.gate_waits > 0, "no partition waited at the gate"
    assert sum(o["holds"] for o in operations) == run.holds
    assert sum(o["gate_waits"] for o in operations) == run.gate_waits
    for operation in operations:
        if operation["holds"]:
            assert operation["hold_p99_s"] > 0
            assert operation["hold_max_s"] >= operation["hold_p99_s"]
        if operation["gate_waits"]:
            assert operation["gate_wait_max_s"] > 0
        assert operation["fenced"] == 0
        assert 0 < operation["barrier_s"] <= operation["duration_s"]
    # Nothing but what a rebalance delivered again (none, unless the coordinator moved).
    redelivered = redelivered_by_rebalances(run.clean.summary)
    assert sum(operation["violations"] for operation in operations) <= redelivered
    # Keys moved: those whose linear-hash partition differs between the counts.
    keys = [json.dumps(k).encode() for p in range(PRODUCERS) for k in producer_keys(p)]
    for operation, (old, new) in zip(operations, [(3, 5), (5, 4)], strict=True):
        moved = sum(1 for k in keys if partition_for_key(k, 3, old) != partition_for_key(k, 3, new))
        assert operation["keys_moved"] == moved
    report = (run.clean.out / "report.md").read_text()
    assert ("**no anomalies**" in report) == (redelivered == 0)
    for operation in operations:
        row = next(line for line in report.splitlines() if f"| {change_label(operation)} |" in line)
        cells = [cell.strip() for cell in row.split("|")][1:-1]
        assert cells[2] == "done"
        hold_p99, longest_stall = cells[8], cells[13]
        assert (hold_p99 != "-") == bool(operation["holds"]), row
        assert (longest_stall != "-") == bool(operation["gate_waits"]), row
        assert float(cells[6]) == pytest.approx(operation["ack_gap_s"], abs=0.001)
    assert (run.clean.out / "gate_stalls.png").stat().st_size > 0


def test_the_injected_anomalies_are_found_with_their_keys(run: Run, spark: SparkSession) -> None:
    summary = run.injected.summary
    assert run.expected_nonmonotonic, "reading newest partitions first reordered nothing"
    assert summary["anomalies"]["by_kind"] == {kind: 0 for kind in checks.KINDS} | {
        checks.NONMONOTONIC: len(run.expected_nonmonotonic),
        checks.UNAUDITED_DELIVERY: 2 * len(ROGUE_KEYS),
        checks.DUPLICATE: redelivered_by_rebalances(summary),
    }
    found = [
        row.asDict() for row in spark.read.parquet(str(run.injected.out / "anomalies")).collect()
    ]
    unaudited = {
        (row["group"], row["key"], row["partition"])
        for row in found
        if row["kind"] == checks.UNAUDITED_DELIVERY
    }
    rogue = {base64.b64encode(key).decode() for key in ROGUE_KEYS}
    assert unaudited == {(g, k, 0) for g in (run.group, UNGATED_GROUP) for k in rogue}
    late = {
        (row["producer"], row["key"], row["producer_seq"])
        for row in found
        if row["kind"] == checks.NONMONOTONIC
    }
    assert late == run.expected_nonmonotonic
    assert all(row["group"] == UNGATED_GROUP for row in found if row["kind"] == checks.NONMONOTONIC)
