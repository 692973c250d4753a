"""The processes the demo starts beside the cluster, and how they are stopped.

Three ``sidecar serve`` processes, a Prometheus scraping them (when the ``prometheus``
binary is installed), the CLI for one change and the audit job. Each runs in a session
of its own, so a Ctrl-C in the terminal reaches the demo alone and the demo stops them
in order (sidecars finish their requests and leave ZooKeeper last). What must outlive
the demo with ``--keep`` is recorded, pid and the kernel's start time of that pid, in
``demo.json`` of the demo's directory; ``sidecar demo --stop`` stops exactly those
processes (a recycled pid is never signalled), and the cluster if the demo started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import aiohttp

from sidecar.config import ENV_PREFIX, Secret, Settings

STATE_FILE = "demo.json"
READY_WITHIN_S = 90.0
STOP_GRACE_S = 40.0
"""A sidecar drains its requests for up to 30 s (``http.shutdown_grace_s``) before it exits."""


class DemoError(Exception):
    """Something the demo needs did not start or did not answer."""


def sidecar_command() -> list[str]:
    """The ``sidecar`` command of the Python running the demo."""
    script = Path(sys.executable).with_name("sidecar")
    return [str(script)] if script.exists() else [sys.executable, "-m", "sidecar.cli"]


def environment(settings: Settings) -> dict[str, str]:
    """This process's environment with ``settings`` as ``ORDERED_SIDECAR__*`` variables
    (and no other such variable: the demo decides every sidecar setting)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(ENV_PREFIX)}
    for section in ("kafka", "zookeeper", "http", "produce", "audit"):
        env |= _section_environment(f"{ENV_PREFIX}{section.upper()}", getattr(settings, section))
    env[f"{ENV_PREFIX}SIDECAR_ID"] = settings.sidecar_id
    return env


def _section_environment(prefix: str, values: Any) -> dict[str, str]:
    """One section's variables; a nested section (``kafka.security``) as its own keys."""
    env: dict[str, str] = {}
    for item in fields(values):
        value = getattr(values, item.name)
        if item.name == "client":
            continue
        if is_dataclass(value):
            env |= _section_environment(f"{prefix}__{item.name.upper()}", value)
        elif isinstance(value, Secret):
            if value:
                env[f"{prefix}__{item.name.upper()}"] = value.reveal()
        else:
            text = str(value).lower() if isinstance(value, bool) else str(value)
            env[f"{prefix}__{item.name.upper()}"] = text
    return env


@dataclass(frozen=True, slots=True)
class Started:
    """A process the demo started and may leave running."""

    name: str
    pid: int
    start_ticks: int
    url: str
    log: str


@dataclass
class DemoState:
    """What ``demo.json`` holds: enough to print the URLs and to stop everything."""

    cluster_dir: str | None
    """The local cluster the demo started (None: a cluster it did not start)."""
    kafka: str
    zookeeper: str
    topic: str = ""
    token: str = ""
    processes: list[Started] = field(default_factory=list)

    def save(self, directory: Path) -> None:
        path = directory / STATE_FILE
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(self), indent=2) + "\n")
        temporary.replace(path)

    @classmethod
    def load(cls, directory: Path) -> DemoState | None:
        path = directory / STATE_FILE
        if not path.exists():
            return None
        raw: dict[str, Any] = json.loads(path.read_text())
        raw["processes"] = [Started(**p) for p in raw["processes"]]
        return cls(**raw)


# Liveness by pid and start time ---------------------------------------------------------


def start_ticks(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot); None when there is no
    such process or it has exited (a zombie, which is reaped here if it is a child)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, *rest = stat.rsplit(")", 1)[1].split()
    if state == "Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return None
    return int(rest[18])


def alive(process: Started) -> bool:
    return start_ticks(process.pid) == process.start_ticks


async def stop(processes: list[Started], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM each process that is still the one started, wait for all, then SIGKILL
    the process group of any left after ``grace_s``."""
    running = [p for p in processes if alive(p)]
    for process in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    # Processes that are not children announce no exit (--stop): poll their pids.
    while any(alive(p) for p in running) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.1)
    for process in running:
        if alive(process):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    while any(alive(p) for p in running):  # noqa: ASYNC110
        await asyncio.sleep(0.05)


def _spawn(command: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    with log.open("ab") as output:
        process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process.pid


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# Sidecars ------------------------------------------------------------------------------


async def start_sidecar(name: str, settings: Settings, directory: Path) -> Started:
    """``sidecar serve`` with ``settings`` (port 0: the kernel picks a free one); returns
    once its ready line is in its log. Raises DemoError with the log's tail."""
    log = directory / f"{name}.log"
    log.unlink(missing_ok=True)
    pid = _spawn([*sidecar_command(), "serve"], log, environment(settings.validate()))
    ticks = start_ticks(pid)
    marker = f"sidecar {settings.sidecar_id} ready on "
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(marker):
                return Started(name, pid, ticks or 0, line[len(marker) :].strip(), str(log))
        if start_ticks(pid) is None:
            raise DemoError(f"{name} exited at start:\n{tail(log)}")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    raise DemoError(f"{name} was not ready within {READY_WITHIN_S:g} s:\n{tail(log)}")


# Prometheus ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def start_prometheus(targets: list[str], directory: Path) -> Started | None:
    """A Prometheus scraping ``targets`` (host:port) every second, storing under
    ``directory``; None when no ``prometheus`` binary is installed. Raises DemoError when
    it does not become ready."""
    binary = shutil.which("prometheus")
    if binary is None:
        return None
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "15s"},
        "scrape_configs": [
            {"job_name": "ordered-sidecar", "static_configs": [{"targets": targets}]}
        ],
    }
    path = directory / "prometheus.yml"
    path.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
    log = directory / "prometheus.log"
    log.unlink(missing_ok=True)
    pid = _spawn(
        [
            binary,
            f"--config.file={path}",
            f"--storage.tsdb.path={directory / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        log,
    )
    started = Started(
        "prometheus", pid, start_ticks(pid) or 0, f"http://127.0.0.1:{port}", str(log)
    )
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if not alive(started):
                raise DemoError(f"prometheus exited at start:\n{tail(log)}")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{started.url}/-/ready") as response:
                    if response.status == 200:
                        return started
            await asyncio.sleep(0.2)
    await stop([started], grace_s=5)
    raise DemoError(f"prometheus was not ready within 30 s:\n{tail(log)}")


# Subprocesses the demo waits for -------------------------------------------------------


async def run_printing(
    command: list[str],
    say: Callable[[str], None],
    *,
    env: dict[str, str] | None = None,
    stderr_log: Path | None = None,
) -> int:
    """Run ``command`` to its end, passing each line of its output to ``say``; its exit
    status. Its stderr goes to ``stderr_log`` (else with its output). Killed, with its
    whole process group, if the demo is interrupted meanwhile."""
    error_file = stderr_log.open("wb") if stderr_log is not None else None
    try:
        process = await asyncio.create_subprocess_exec(
            *command,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=error_file if error_file is not None else asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        if error_file is not None:
            error_file.close()
    assert process.stdout is not None
    try:
        async for raw in process.stdout:
            say(raw.decode(errors="replace").rstrip())
        return await process.wait()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        raise


async def run_audit(
    *,
    bootstrap: str,
    topic: str,
    start: float,
    end: float,
    out: Path,
    prometheus: str | None,
    say: Callable[[str], None],
) -> tuple[int, Path]:
    """``sidecar audit run`` over the audit topic for [start, end) (epoch seconds);
    (its exit status, its stderr log: Spark's own logging)."""
    log = out.with_name(out.name + ".log")
    command = [
        *sidecar_command(),
        "audit",
        "run",
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        f"--from={start:.3f}",
        f"--to={end:.3f}",
        "--bucket",
        "5",
        "--out",
        str(out),
        # A small window: one shuffle partition, and the JVM's quick compiler only. On a
        # 2-core machine this halves the job's CPU time (58 s against 142 s, measured on
        # the 1,551 events of a --quick run; nearly all of it is fixed cost): its dozens
        # of short stages never pay back the optimising compiler's work.
        "--shuffle-partitions",
        "1",
        "--conf",
        "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    ]
    if prometheus is not None:
        command += ["--prometheus", prometheus]
    code = await run_printing(command, say, stderr_log=log)
    return code, log
