"""The job runs unchanged on a Spark cluster: a standalone master and one worker started
from the pyspark installation (small heaps), and ``sidecar audit run --master spark://``
as its own driver process, on a file of hand-built events with known anomalies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyspark

from ordered_audit import checks
from tests.audit.history import injected, write_json_lines
from tests.ops.support import free_port

STARTUP_S = 60
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _wait_for(log: Path, text: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_S
    while text not in log.read_text(errors="replace"):
        assert process.poll() is None, f"exited: {log.read_text(errors='replace')[-2000:]}"
        assert time.monotonic() < deadline, f"no {text!r}: {log.read_text()[-2000:]}"
        time.sleep(0.2)


@contextmanager
def standalone_cluster(directory: Path) -> Iterator[str]:
    """A master and a worker (1 core, 1 GiB for executors); the master's URL."""
    spark_home = Path(pyspark.__file__).parent
    classpath = str(spark_home / "jars" / "*")
    # What bin/load-spark-env.sh would set: the worker builds its executors' command
    # line from them (without the Scala version it looks for a source build).
    env = os.environ | {
        "SPARK_HOME": str(spark_home),
        "SPARK_SCALA_VERSION": "2.13",
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    daemon = ["java", "-Xmx256m", "-XX:+UseSerialGC", "-cp", classpath]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        master_log = directory / "master.log"
        with master_log.open("wb") as log:
            master = subprocess.Popen(
                [
                    *daemon,
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--webui-port",
                    str(free_port()),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        processes.append(master)
        _wait_for(master_log, "I have been elected leader", master)
        worker_log = directory / "worker.log"
        with worker_log.open("wb") as log:
            worker = subprocess.Popen(
                [
                    *daemon,
                    "org.apache.spark.deploy.worker.Worker",
                    url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(directory / "work"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        processes.append(worker)
        _wait_for(worker_log, "Successfully registered with master", worker)
        yield url
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def test_the_job_runs_unchanged_on_a_standalone_cluster(tmp_path: Path) -> None:
    scenario = injected()
    events = write_json_lines(scenario.history, tmp_path / "events.jsonl")
    out = tmp_path / "out"
    began = time.monotonic()
    with standalone_cluster(tmp_path) as master:
        cluster_up = time.monotonic() - began
        job = subprocess.run(
            [
                str(Path(sys.executable).with_name("sidecar")),
                "audit",
                "run",
                "--master",
                master,
                "--input",
                str(events),
                "--out",
                str(out),
                "--shuffle-partitions",
                "1",
                "--conf",
                "spark.executor.memory=512m",
                "--conf",
                "spark.cores.max=1",
                # A short job in fresh JVMs: the C1 compiler alone warms up sooner.
                "--conf",
                f"spark.driver.extraJavaOptions={QUICK_JVM}",
                "--conf",
                f"spark.executor.extraJavaOptions={QUICK_JVM}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    total = time.monotonic() - began
    print(f"\nstandalone: cluster up in {cluster_up:.1f} s, {total:.1f} s in all")
    assert job.returncode == 0, job.stderr[-3000:]
    assert "2 anomalies" in job.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["anomalies"]["by_kind"] == {kind: 0 for kind in checks.KINDS} | {
        checks.UNAUDITED_DELIVERY: 1,
        checks.WRITTEN_ACROSS_BARRIER: 1,
    }
    (operation,) = summary["operations"]
    assert operation["keys_moved"] == len(scenario.moved_keys)
    # The work ran on the cluster's executor, not in the driver.
    executors = list((tmp_path / "work").glob("app-*/*/stderr"))
    assert executors, "no executor ran on the worker"
