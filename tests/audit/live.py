"""Helpers of the live audit's tests on the real cluster: an audit topic, histories
written to it as events stamped now, real sidecars auditing to it, ``/metrics`` read
back, and ``sidecar audit stream`` run as its own process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession

from ordered_audit import checks
from ordered_audit.job import AuditConfig, AuditResult, run_audit
from ordered_audit.stream import StreamConfig
from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import READY_WITHIN_S, RunningSidecar, settings_for, unique
from sidecar.audit.events import Event
from sidecar.compose import SidecarServer
from tests.audit.history import History, Scenario, written

ANOMALIES = "sidecar_audit_stream_anomalies_total"
EVENTS = "sidecar_audit_stream_events_total"
LAG = "sidecar_audit_stream_lag_seconds"

AUDIT_PARTITIONS = 3
"""Of ``create_audit_topic``'s topics."""

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def stream_config(cluster: ClusterEndpoints, audit_topic: str, checkpoint: Path) -> StreamConfig:
    """The live audit in this process: a micro-batch a second, its /metrics on a free
    port."""
    return StreamConfig(
        bootstrap=cluster.kafka_bootstrap,
        topic=audit_topic,
        checkpoint=checkpoint,
        trigger_s=1.0,
        metrics_port=0,
    )


async def create_audit_topic(cluster: ClusterEndpoints) -> str:
    """A fresh audit topic of 3 partitions, so one history's events reach it in any
    order across them."""
    topic = unique("audit-stream")
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, AUDIT_PARTITIONS, cluster.replication_factor)])
    finally:
        await admin.close()
    return topic


@contextlib.asynccontextmanager
async def audited_sidecars(
    cluster: ClusterEndpoints, audit_topic: str, options: Mapping[str, Mapping[str, Any]]
) -> AsyncIterator[dict[str, RunningSidecar]]:
    """One in-process sidecar per name of ``options`` (its ``settings_for`` options, a
    fault among them), sharing a fresh ZooKeeper root, every one auditing to
    ``audit_topic``; stopping them flushes their audit queues."""
    root = f"/{unique('audited')}"
    started: dict[str, RunningSidecar] = {}
    try:
        for name, extra in options.items():
            settings = settings_for(cluster, root, name, audit_topic=audit_topic, **extra)
            server = SidecarServer(settings)
            await server.start()
            await asyncio.wait_for(server.wait_ready(), READY_WITHIN_S)
            session = aiohttp.ClientSession(server.url)
            started[name] = RunningSidecar(server.url, settings.sidecar_id, session, server)
        yield started
    finally:
        for sidecar in started.values():
            await sidecar.http.close()
            await sidecar.server.stop()


def audit_events_written(sidecars: Sequence[RunningSidecar]) -> tuple[float, float]:
    """(events written to the audit topic, events dropped) by ``sidecars``."""
    written = dropped = 0.0
    for sidecar in sidecars:
        registry = sidecar.server.metrics.registry
        written += registry.get_sample_value("sidecar_audit_events_total") or 0.0
        dropped += registry.get_sample_value("sidecar_audit_events_dropped_total") or 0.0
    return written, dropped


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


def expected_anomalies(scenario: Scenario, topic: str) -> dict[tuple[str, str], float]:
    """What the stream counts for ``faulty()`` written as ``topic``, by (kind, topic)."""
    return {
        (checks.NONMONOTONIC, topic): 2 * len(scenario.moved_keys),
        (checks.WRITTEN_ACROSS_BARRIER, topic): 1,
    }


async def audit_topic_records(cluster: ClusterEndpoints, topic: str) -> int:
    """Records readable in an audit topic of ``create_audit_topic`` (below its high
    watermarks; its writers are not transactional, so the offsets count them)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(AUDIT_PARTITIONS)]
        ends = await consumer.end_offsets(partitions)
        starts = await consumer.beginning_offsets(partitions)
        return sum(ends[tp] - starts[tp] for tp in partitions)
    finally:
        await consumer.stop()


async def batch_anomalies(
    spark: SparkSession, cluster: ClusterEndpoints, audit_topic: str, out: Path, start: float
) -> tuple[AuditResult, list[dict[str, Any]]]:
    """The batch audit over ``audit_topic`` from ``start``: its result and anomaly rows."""
    result = await asyncio.to_thread(
        run_audit,
        spark,
        AuditConfig(out=out, bootstrap=cluster.kafka_bootstrap, topic=audit_topic, start=start),
    )
    rows = spark.read.parquet(str(result.out / "anomalies")).collect()
    return result, [row.asDict() for row in rows]


async def write_events(cluster: ClusterEndpoints, topic: str, events: Sequence[Event]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap)
    await producer.start()
    try:
        for event in events:
            await producer.send(topic, json.dumps(event).encode())
        await producer.flush()
    finally:
        await producer.stop()


async def scrape(http: aiohttp.ClientSession, port: int) -> Samples:
    async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def anomalies_by_topic(samples: Samples) -> dict[tuple[str, str], float]:
    found = {}
    for (name, labels), value in samples.items():
        if name == ANOMALIES:
            label = dict(labels)
            found[(label["kind"], label["topic"])] = value
    return found


def events_counted(samples: Samples) -> float | None:
    return samples.get((EVENTS, frozenset()))


async def wait_for(http: aiohttp.ClientSession, port: int, events: int, within_s: float) -> Samples:
    """Scrapes until ``events`` events were counted (a server not answering yet counts as
    none); the last scrape, or {} if none answered within ``within_s``."""
    deadline = time.monotonic() + within_s
    samples: Samples = {}
    while True:
        with contextlib.suppress(aiohttp.ClientConnectionError):
            samples = await scrape(http, port)
        if events_counted(samples) == events or time.monotonic() >= deadline:
            return samples
        await asyncio.sleep(0.5)


class StreamProcess:
    """``sidecar audit stream`` as its own process group (the Python driver and its
    Spark JVM), logging to ``log``."""

    def __init__(self, arguments: Sequence[str], log: Path) -> None:
        self.log = log
        with log.open("ab") as output:
            self.process = subprocess.Popen(
                [str(Path(sys.executable).with_name("sidecar")), "audit", "stream", *arguments],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def kill(self) -> None:
        """SIGKILL to the whole group, as a crash or an OOM kill of its container."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        # The JVM is the driver's child in the same group: gone with it.
        deadline = time.monotonic() + 30
        while _group_alive(self.process.pid):
            assert time.monotonic() < deadline, "the stream's JVM outlived SIGKILL"
            time.sleep(0.1)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (the command stops its query and exits), SIGKILL after ``timeout``;
        the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            self.kill()
            raise AssertionError(f"the stream did not stop on SIGTERM:\n{self.log_tail()}") from exc
        finally:
            if _group_alive(self.process.pid):
                os.killpg(self.process.pid, signal.SIGKILL)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def stream_arguments(
    cluster: ClusterEndpoints, topic: str, checkpoint: Path, port: int, *spark: str
) -> list[str]:
    """The command line of a stream over ``topic`` with 1-second micro-batches."""
    return [
        "--bootstrap",
        cluster.kafka_bootstrap,
        "--topic",
        topic,
        "--checkpoint",
        str(checkpoint),
        "--metrics-port",
        str(port),
        "--trigger",
        "1",
        "--shuffle-partitions",
        "2",
        *spark,
    ]
