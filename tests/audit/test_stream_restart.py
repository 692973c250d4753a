"""The live audit killed and started again on its checkpoint, on the real cluster.

``sidecar audit stream`` runs as its own process (local[2]) over a fresh audit topic. A
faulty history (reordered deliveries, a write across a barrier: ``live.faulty``) is
written for a first topic and counted; a second is written, and the job is killed
(SIGKILL to the driver and its JVM) the moment Spark has planned the micro-batch that
reads it, so the batch is being checked and neither its state nor Spark's commit is
written. The job is started again with the same arguments, and a third history is
written while it starts.

Checked on ``/metrics`` (the same port across the restart, as Prometheus scrapes it):
every event is counted exactly once and every anomaly of the three histories exactly
once, the first history's included (the new process did not check it: its counters go
on from the checkpoint). The bound: the restarted job reports the killed batch's
anomalies and the third history's within 120 s of its start (a JVM start and two
micro-batches on a loaded 2-core machine). The case where the
killed process had saved the batch's state before Spark committed it is checked
without a cluster in ``test_live_checks.py``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from pyspark.sql import SparkSession

from ordered_audit.stream import RunningStream, StateStore, start_stream
from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import unique
from ordered_dev.harness.tools import free_port
from ordered_dev.harness.waiting import eventually
from tests.audit.live import (
    StreamProcess,
    anomalies_by_topic,
    audit_topic_records,
    create_audit_topic,
    events_counted,
    expected_anomalies,
    faulty,
    on_topic,
    stream_arguments,
    stream_config,
    wait_for,
    write_events,
)

pytestmark = pytest.mark.integration

FIRST_START_S = 180.0
REPORTED_AFTER_RESTART_S = 120.0
COMMITTED_WITHIN_S = 60.0
STOPPED_WITHIN_S = 30.0
"""Beyond the grace: Spark's own stop of a query between micro-batches."""


def batch_ids(directory: Path) -> set[int]:
    """The micro-batches in one of Spark's checkpoint logs (``offsets``, ``commits``)."""
    if not directory.is_dir():
        return set()
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()}


async def all_committed(job: StreamProcess, checkpoint: Path) -> int:
    """Waits until Spark committed every batch it planned (the counts come before the
    commit); the last one's id."""
    spark = checkpoint / "spark"
    deadline = time.monotonic() + COMMITTED_WITHIN_S
    while (planned := batch_ids(spark / "offsets")) != batch_ids(spark / "commits"):
        assert time.monotonic() < deadline, f"batches {planned} not committed:\n{job.log_tail()}"
        await asyncio.sleep(0.1)
    return max(planned)


async def kill_when_planned(job: StreamProcess, checkpoint: Path, after: int) -> int:
    """Kills ``job`` as soon as Spark logged the offsets of a batch above ``after``;
    that batch's id."""
    offsets = checkpoint / "spark" / "offsets"
    deadline = time.monotonic() + COMMITTED_WITHIN_S
    while not (planned := {i for i in batch_ids(offsets) if i > after}):
        assert job.process.poll() is None, job.log_tail()
        assert time.monotonic() < deadline, f"no batch read the events:\n{job.log_tail()}"
        await asyncio.sleep(0.02)
    job.kill()
    return min(planned)


async def test_a_job_killed_mid_batch_and_restarted_counts_each_anomaly_once(
    cluster: ClusterEndpoints, tmp_path: Path
) -> None:
    audit_topic = await create_audit_topic(cluster)
    checkpoint = tmp_path / "checkpoint"
    port = free_port()
    arguments = stream_arguments(cluster, audit_topic, checkpoint, port, "--master", "local[2]")
    scenarios = {unique("before"): faulty(), unique("killed"): faulty(), unique("after"): faulty()}
    (before, killed, after) = scenarios
    expected: dict[tuple[str, str], float] = {}
    written = 0

    async def write(topic: str) -> None:
        nonlocal written
        events = on_topic(scenarios[topic], topic)
        await write_events(cluster, audit_topic, events)
        written += len(events)
        expected.update(expected_anomalies(scenarios[topic], topic))

    async with aiohttp.ClientSession() as http:
        job = StreamProcess(arguments, tmp_path / "first.log")
        try:
            await write(before)
            samples = await wait_for(http, port, written, FIRST_START_S)
            assert events_counted(samples) == written, job.log_tail()
            assert anomalies_by_topic(samples) == expected

            committed = await all_committed(job, checkpoint)
            await write(killed)
            batch = await kill_when_planned(job, checkpoint, committed)
        finally:
            job.kill()
        # Killed while checking the batch: nothing of it was saved or committed.
        assert batch not in batch_ids(checkpoint / "spark" / "commits")
        assert not (checkpoint / "state" / f"{batch}.json").exists()

        began = time.monotonic()
        job = StreamProcess(arguments, tmp_path / "second.log")
        try:
            # More anomalies while it starts: a batch after the one Spark runs again.
            await write(after)
            samples = await wait_for(http, port, written, REPORTED_AFTER_RESTART_S)
            reported_after = time.monotonic() - began
            print(f"\nbatch {batch} killed; all reported {reported_after:.1f} s after the start")
            assert events_counted(samples) == written, job.log_tail()
            assert reported_after <= REPORTED_AFTER_RESTART_S + 1
            assert anomalies_by_topic(samples) == expected
            assert "counters go on from the checkpoint" in job.log_tail(100_000)
        finally:
            status = job.stop()
    assert status == 0, job.log_tail()


async def test_a_stop_lets_the_micro_batch_in_progress_end(
    cluster: ClusterEndpoints, spark: SparkSession, tmp_path: Path
) -> None:
    """Stopped right after Spark planned a micro-batch, the stream stops once that batch
    is checked and committed (``RunningStream.stop``), not in the middle of it."""
    audit_topic = await create_audit_topic(cluster)
    events = [e for i in range(4) for e in on_topic(faulty(), unique(f"stopped-{i}"))]
    await write_events(cluster, audit_topic, events)

    # Replicated, so that the first micro-batch reads them all (it reads up to the high
    # watermarks, which a loaded machine's followers can leave behind for a while).
    async def readable() -> bool:
        return await audit_topic_records(cluster, audit_topic) == len(events)

    await eventually(readable, COMMITTED_WITHIN_S, "the events are readable")
    checkpoint = tmp_path / "checkpoint"
    config = stream_config(cluster, audit_topic, checkpoint)
    running: RunningStream = await asyncio.to_thread(start_stream, spark, config)
    offsets = checkpoint / "spark" / "offsets"
    try:
        deadline = time.monotonic() + COMMITTED_WITHIN_S
        while not batch_ids(offsets):
            assert time.monotonic() < deadline, "no micro-batch was planned"
            await asyncio.sleep(0.01)
        planned = min(batch_ids(offsets))
    finally:
        began = time.monotonic()
        await asyncio.to_thread(running.stop)
    stopped_in = time.monotonic() - began
    assert running.query.exception() is None
    assert planned in batch_ids(checkpoint / "spark" / "commits")
    assert StateStore(checkpoint / "state").is_complete(planned)
    assert stopped_in < config.stop_grace_s + STOPPED_WITHIN_S, stopped_in
