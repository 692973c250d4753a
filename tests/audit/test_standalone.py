"""The audit jobs run unchanged on a Spark cluster: the project's standalone master and
worker (``ordered_dev.devcluster.spark``: the installed pyspark's ``spark-class``, 1
core and 1 GiB for executors, on loopback), and ``sidecar audit run|stream --master
spark://...`` as their own driver processes.

The batch job reads a file of hand-built events with known anomalies. The live audit
reads a fresh audit topic on the real cluster, a faulty history written to it
(``live.faulty``), and must count its anomalies on ``/metrics`` within 180 s of its
start (the driver's JVM, the connector's jars shipped to an executor the worker starts,
the first micro-batches) and exit 0 on SIGTERM. Both check that the work ran on the
worker's executor, not in the driver.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from ordered_audit import checks
from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.devcluster.spark import SparkStandalone
from ordered_dev.harness.sidecars import unique
from ordered_dev.harness.tools import free_port
from tests.audit.history import injected, write_json_lines
from tests.audit.live import (
    StreamProcess,
    anomalies_by_topic,
    create_audit_topic,
    events_counted,
    expected_anomalies,
    faulty,
    on_topic,
    stream_arguments,
    wait_for,
    write_events,
)

# A short job in fresh JVMs: the C1 compiler alone warms up sooner.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# What a job asks of the 1-core, 1 GiB worker: one executor that fits it.
ON_THE_WORKER = [
    "--shuffle-partitions",
    "1",
    "--conf",
    "spark.executor.memory=512m",
    "--conf",
    "spark.cores.max=1",
    "--conf",
    f"spark.driver.extraJavaOptions={QUICK_JVM}",
    "--conf",
    f"spark.executor.extraJavaOptions={QUICK_JVM}",
]
STREAM_REPORTED_WITHIN_S = 180.0


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    spark = SparkStandalone(tmp_path_factory.mktemp("spark-standalone"))
    seconds = spark.start()
    print(f"\nstandalone master and worker up in {seconds:.1f} s")
    try:
        yield spark
    finally:
        spark.stop()
    assert not any(report["alive"] for report in spark.status().values())


def executor_logs(spark: SparkStandalone, since: float) -> list[Path]:
    """The stderr of every executor the worker started after ``since`` (epoch s)."""
    return [
        path
        for path in (spark.work_dir / "work").glob("app-*/*/stderr")
        if path.stat().st_mtime >= since
    ]


def test_the_job_runs_unchanged_on_a_standalone_cluster(
    standalone: SparkStandalone, tmp_path: Path
) -> None:
    scenario = injected()
    events = write_json_lines(scenario.history, tmp_path / "events.jsonl")
    out = tmp_path / "out"
    began, since = time.monotonic(), time.time()
    job = subprocess.run(
        [
            str(Path(sys.executable).with_name("sidecar")),
            "audit",
            "run",
            "--master",
            standalone.master_url,
            "--input",
            str(events),
            "--out",
            str(out),
            *ON_THE_WORKER,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(f"\nstandalone batch job: {time.monotonic() - began:.1f} s")
    assert job.returncode == 0, job.stderr[-3000:]
    assert "2 anomalies" in job.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["anomalies"]["by_kind"] == {kind: 0 for kind in checks.KINDS} | {
        checks.UNAUDITED_DELIVERY: 1,
        checks.WRITTEN_ACROSS_BARRIER: 1,
    }
    (operation,) = summary["operations"]
    assert operation["keys_moved"] == len(scenario.moved_keys)
    assert executor_logs(standalone, since), "no executor ran on the worker"


@pytest.mark.integration
async def test_the_live_audit_runs_unchanged_on_a_standalone_cluster(
    standalone: SparkStandalone, cluster: ClusterEndpoints, tmp_path: Path
) -> None:
    audit_topic = await create_audit_topic(cluster)
    port = free_port()
    arguments = stream_arguments(
        cluster,
        audit_topic,
        tmp_path / "checkpoint",
        port,
        "--master",
        standalone.master_url,
        *ON_THE_WORKER,
    )
    topic = unique("faulty")
    scenario = faulty()
    events = on_topic(scenario, topic)
    began, since = time.monotonic(), time.time()
    job = StreamProcess(arguments, tmp_path / "stream.log")
    try:
        await write_events(cluster, audit_topic, events)
        async with aiohttp.ClientSession() as http:
            samples = await wait_for(http, port, len(events), STREAM_REPORTED_WITHIN_S)
        print(f"\nstandalone live audit: reported {time.monotonic() - began:.1f} s after start")
        assert events_counted(samples) == len(events), job.log_tail()
        assert anomalies_by_topic(samples) == expected_anomalies(scenario, topic)
        assert executor_logs(standalone, since), "no executor ran on the worker"
    finally:
        status = job.stop()
    assert status == 0, job.log_tail()
