"""A Spark standalone cluster on loopback: one master and one worker, started from the
installed pyspark (its ``bin/spark-class``), for running the audit jobs as they would
run on a real Spark cluster (``--master spark://...``).

Both daemons bind 127.0.0.1 (``--host`` and ``SPARK_LOCAL_IP``, which the web UIs and
the executors the worker starts also bind), run with small heaps and the serial GC,
log to files under the work directory and run in their own process groups.
``spark.json`` records the master's URL and each pid with its start time, so that
``down`` from another process stops exactly what ``up`` started, as
``ordered_dev.devcluster.cluster`` does for Kafka and ZooKeeper.

pyspark (the ``audit`` extra) is imported only when the cluster starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ordered_dev.devcluster.cluster import (
    JVM_FLAGS,
    ProcessRecord,
    _reap,
    _start_ticks,
    free_ports,
    wait_until,
)
from ordered_dev.devcluster.errors import DevClusterError

STATE_FILE = "spark.json"
# The daemons themselves: a master and a worker keep little (the executors the worker
# starts get the job's spark.executor.memory, within the worker's --memory).
DAEMON_MEMORY = "256m"
WORKER_CORES = 1
WORKER_MEMORY = "1g"
# Lines of the daemons' logs that say they are ready.
_MASTER_READY = "I have been elected leader"
_WORKER_READY = "Successfully registered with master"


@dataclass
class SparkState:
    """What ``spark.json`` holds."""

    master_port: int
    master_ui_port: int
    worker_ui_port: int
    processes: dict[str, ProcessRecord] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> SparkState:
        raw = json.loads(path.read_text())
        raw["processes"] = {k: ProcessRecord(**v) for k, v in raw["processes"].items()}
        return cls(**raw)

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)


def spark_home() -> Path:
    """The installed pyspark's directory, which holds ``bin/`` and ``jars/``. Raises
    DevClusterError without pyspark."""
    try:
        import pyspark
    except ImportError as exc:
        raise DevClusterError("pyspark is not installed: pip install -e '.[audit]'") from exc
    return Path(pyspark.__file__).resolve().parent


class SparkStandalone:
    """A standalone master and one worker (``cores`` cores, ``memory`` for executors)."""

    def __init__(
        self, work_dir: Path, *, cores: int = WORKER_CORES, memory: str = WORKER_MEMORY
    ) -> None:
        self.work_dir = work_dir.resolve()
        self.cores = cores
        self.memory = memory
        path = self.work_dir / STATE_FILE
        self.state: SparkState | None = SparkState.load(path) if path.exists() else None

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:<port>``: what ``--master`` takes."""
        return f"spark://127.0.0.1:{self._require_state().master_port}"

    def start(self, timeout: float = 120.0) -> float:
        """Start the master and the worker unless they run, and wait until the worker
        registered with the master. Returns the seconds it took; on failure stops what
        it started and raises DevClusterError with the failing daemon's log tail."""
        began = time.monotonic()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.state is None:
            master, master_ui, worker_ui = free_ports(3)
            self.state = SparkState(master, master_ui, worker_ui)
            self._save()
        state = self.state
        try:
            if not self._alive("master"):
                self._spawn(
                    "master",
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(state.master_port),
                    "--webui-port",
                    str(state.master_ui_port),
                )
            self._wait_for_log("master", _MASTER_READY, began + timeout)
            if not self._alive("worker"):
                self._spawn(
                    "worker",
                    "org.apache.spark.deploy.worker.Worker",
                    self.master_url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--webui-port",
                    str(state.worker_ui_port),
                    "--work-dir",
                    str(self.work_dir / "work"),
                )
            self._wait_for_log("worker", _WORKER_READY, began + timeout)
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - began

    def stop(self, grace: float = 20.0) -> None:
        """Stop the worker (and its executors), then the master: SIGTERM to each
        process group, SIGKILL after ``grace``."""
        if self.state is None:
            return
        for name in ("worker", "master"):
            self._signal(name, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self._alive(name) and time.monotonic() < deadline:
                time.sleep(0.1)
            if self._alive(name):
                self._signal(name, signal.SIGKILL)
                while self._alive(name):
                    time.sleep(0.05)
            self.state.processes.pop(name, None)
        self._save()

    def status(self) -> dict[str, dict[str, object]]:
        """Per daemon: pid and whether it is alive; and the master's URL."""
        state = self._require_state()
        report: dict[str, dict[str, object]] = {}
        for name in ("master", "worker"):
            record = state.processes.get(name)
            report[name] = {"pid": record.pid if record else None, "alive": self._alive(name)}
        report["master"]["url"] = self.master_url
        return report

    def log_tail(self, name: str, chars: int = 4000) -> str:
        path = self._log(name)
        if not path.exists():
            return "(no log output)"
        return f"--- {path}\n{path.read_text(errors='replace')[-chars:]}"

    # Internals ---------------------------------------------------------------------------

    def _spawn(self, name: str, main_class: str, *arguments: str) -> None:
        state = self._require_state()
        home = spark_home()
        environment = os.environ | {
            "SPARK_HOME": str(home),
            # What bin/load-spark-env.sh looks for: without it, a source build's layout.
            "SPARK_SCALA_VERSION": "2.13",
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "SPARK_DAEMON_JAVA_OPTS": " ".join(JVM_FLAGS),
            # No REST submission server: it would take port 6066 whatever --port says.
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            # The launcher's own JVM, which only builds the daemon's command line.
            "SPARK_LAUNCHER_OPTS": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
            "SPARK_WORKER_DIR": str(self.work_dir / "work"),
        }
        # A log from a run before would show its ready line already.
        self._log(name).unlink(missing_ok=True)
        with self._log(name).open("ab") as log:
            # spark-class execs the daemon's JVM: the pid recorded is the JVM's.
            process = subprocess.Popen(
                [str(home / "bin" / "spark-class"), main_class, *arguments],
                cwd=self.work_dir,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        state.processes[name] = ProcessRecord(process.pid, _start_ticks(process.pid) or 0)
        self._save()

    def _wait_for_log(self, name: str, line: str, deadline: float) -> None:
        def ready() -> bool:
            if not self._alive(name):
                raise DevClusterError(f"the Spark {name} exited:\n{self.log_tail(name)}")
            return line in self._log(name).read_text(errors="replace")

        wait_until(
            ready,
            max(1.0, deadline - time.monotonic()),
            f"the Spark {name} did not log {line!r}",
            lambda: self.log_tail(name),
        )

    def _signal(self, name: str, sig: signal.Signals) -> None:
        if not self._alive(name):
            return
        record = self._require_state().processes[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, sig)

    def _alive(self, name: str) -> bool:
        if self.state is None or name not in self.state.processes:
            return False
        record = self.state.processes[name]
        _reap(record.pid)
        ticks = _start_ticks(record.pid)
        return ticks is not None and ticks == record.start_ticks

    def _log(self, name: str) -> Path:
        return self.work_dir / f"{name}.log"

    def _save(self) -> None:
        if self.state is not None:
            self.state.save(self.work_dir / STATE_FILE)

    def _require_state(self) -> SparkState:
        if self.state is None:
            raise DevClusterError(
                f"no Spark cluster in {self.work_dir} (run 'devcluster spark-up' first)"
            )
        return self.state
