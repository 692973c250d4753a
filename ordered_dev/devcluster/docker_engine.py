"""A Docker engine for the image builds and the container tests.

The engine that answers is used as it is: ``DOCKER_HOST``, else the default socket.
Where none answers and this is root on Debian, the project runs its own: Debian's
``docker.io`` (installed with apt when ``dockerd`` is missing) started as

    dockerd --bridge=none --iptables=false --ip-forward=false --ip-masq=false
            --data-root var/docker/data --exec-root var/docker/exec
            --pidfile var/docker/dockerd.pid --host unix://var/docker/docker.sock

so it creates no network, writes no firewall rule and changes no sysctl: containers
run with the host's network only (``network_mode="host"``) and reach the loopback
servers. While it runs, ``DOCKER_HOST`` in this process points at its socket (the
docker CLI, the Docker SDK and testcontainers all read it).

Several commands may share that engine (a test run and ``./run image`` in the same
checkout): each holds a shared lock on ``var/docker/engine.lock`` while it uses it, and
the last one to leave stops it. An engine left running by a killed run is adopted by
the next one, which stops it at its end.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ordered_dev.devcluster.errors import DevClusterError

DOCKER_HOST_ENV = "DOCKER_HOST"
# A unix socket path must fit in sockaddr_un (108 bytes with the terminating NUL), and
# containerd puts its own socket a few levels below the exec root.
_SOCKET_PATH_LIMIT = 100
_START_TIMEOUT_S = 90.0
_STOP_TIMEOUT_S = 60.0

Log = Callable[[str], None]


def default_engine_dir() -> Path:
    """``var/docker`` in the source checkout (ignored by git)."""
    return Path(__file__).resolve().parents[2] / "var" / "docker"


@dataclass(frozen=True)
class Engine:
    """A Docker engine that answers at ``host`` (a ``DOCKER_HOST`` value)."""

    host: str
    own: bool
    """Whether it is the project's dockerd (under ``engine_dir``) rather than the user's."""
    engine_dir: Path


def engine_answers(host: str | None) -> bool:
    """Whether a Docker engine answers a ping at ``host`` (None: the SDK's default)."""
    import docker
    import docker.errors
    import requests

    try:
        client = docker.DockerClient(base_url=host, timeout=5) if host else docker.from_env()
    except docker.errors.DockerException:
        return False
    try:
        return bool(client.ping())
    except (docker.errors.DockerException, requests.RequestException, OSError):
        return False
    finally:
        client.close()


@contextlib.contextmanager
def docker_engine(engine_dir: Path | None = None, log: Log | None = None) -> Iterator[Engine]:
    """An answering Docker engine for the duration of the block.

    Raises DevClusterError when none answers and the project cannot start its own (not
    root, not Debian, or dockerd failed: the error carries the tail of its log).
    """
    say = log or (lambda _message: None)
    engine_dir = (engine_dir or default_engine_dir()).resolve()
    configured = os.environ.get(DOCKER_HOST_ENV)
    own = _OwnEngine(engine_dir)
    if configured != own.host and engine_answers(configured):
        yield Engine(configured or "unix:///var/run/docker.sock", False, engine_dir)
        return
    _check_can_run_own(configured)
    engine_dir.mkdir(parents=True, exist_ok=True)
    with own.used(say):
        previous = os.environ.get(DOCKER_HOST_ENV)
        os.environ[DOCKER_HOST_ENV] = own.host
        try:
            yield Engine(own.host, True, engine_dir)
        finally:
            if previous is None:
                os.environ.pop(DOCKER_HOST_ENV, None)
            else:
                os.environ[DOCKER_HOST_ENV] = previous


def _check_can_run_own(configured: str | None) -> None:
    where = f"{DOCKER_HOST_ENV}={configured}" if configured else "/var/run/docker.sock"
    if os.geteuid() != 0 or not Path("/etc/debian_version").exists():
        raise DevClusterError(
            f"no Docker engine answers at {where}. Start one (or set {DOCKER_HOST_ENV}); "
            "as root on Debian the project starts its own dockerd (Debian's docker.io)."
        )


def apt_install(*packages: str) -> None:
    """``apt-get install`` Debian packages (after ``apt-get update``); root only."""
    environment = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (
        ["apt-get", "-q", "update"],
        ["apt-get", "-q", "install", "-y", "--no-install-recommends", *packages],
    ):
        result = subprocess.run(
            command, env=environment, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            tail = (result.stdout + result.stderr)[-3000:]
            raise DevClusterError(f"{' '.join(command)} failed:\n{tail}")


class _OwnEngine:
    """The project's dockerd under ``engine_dir``: started, shared and stopped."""

    def __init__(self, engine_dir: Path) -> None:
        self.engine_dir = engine_dir
        runtime = engine_dir
        # Deep checkouts would overflow the socket path limit: keep the runtime files
        # (socket, exec root) in a short directory named after the checkout instead.
        if len(str(engine_dir / "exec" / "containerd" / "containerd.sock")) > _SOCKET_PATH_LIMIT:
            import hashlib

            digest = hashlib.sha256(str(engine_dir).encode()).hexdigest()[:12]
            runtime = Path("/tmp") / f"ordered-sidecar-docker-{digest}"
        self.runtime_dir = runtime
        self.socket = runtime / "docker.sock"
        self.exec_root = runtime / "exec"
        self.data_root = engine_dir / "data"
        self.pidfile = engine_dir / "dockerd.pid"
        self.log_path = engine_dir / "dockerd.log"

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @contextlib.contextmanager
    def used(self, say: Log) -> Iterator[None]:
        with (self.engine_dir / "engine.lock").open("a+") as users:
            with self._exclusive("start.lock"):
                fcntl.flock(users, fcntl.LOCK_SH)
                if engine_answers(self.host):
                    say(f"docker: using the project's dockerd at {self.host}")
                else:
                    self._start(say)
            try:
                yield
            finally:
                fcntl.flock(users, fcntl.LOCK_UN)
                with self._exclusive("start.lock"):
                    try:
                        fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        say("docker: the project's dockerd is still in use elsewhere: left running")
                    else:
                        self._stop(say)
                        fcntl.flock(users, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _exclusive(self, name: str) -> Iterator[None]:
        with (self.engine_dir / name).open("a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _start(self, say: Log) -> None:
        dockerd = shutil.which("dockerd")
        if dockerd is None:
            say("docker: installing Debian's docker.io (dockerd is missing)")
            apt_install("docker.io")
            dockerd = shutil.which("dockerd")
            if dockerd is None:
                raise DevClusterError("docker.io is installed but dockerd is not on the PATH")
        self._stop_leftover()
        self.runtime_dir.mkdir(parents=True, exist_ok=True)
        self.data_root.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        command = [
            dockerd,
            "--bridge=none",
            "--iptables=false",
            "--ip-forward=false",
            "--ip-masq=false",
            f"--data-root={self.data_root}",
            f"--exec-root={self.exec_root}",
            f"--pidfile={self.pidfile}",
            f"--host={self.host}",
        ]
        say(f"docker: starting the project's dockerd ({self.host}, log {self.log_path})")
        began = time.monotonic()
        log_file: IO[bytes]
        with self.log_path.open("ab") as log_file:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = began + _START_TIMEOUT_S
        while not engine_answers(self.host):
            if process.poll() is not None:
                raise DevClusterError(f"dockerd exited at start:\n{self._log_tail()}")
            if time.monotonic() > deadline:
                self._stop(say)
                raise DevClusterError(
                    f"dockerd did not answer within {_START_TIMEOUT_S:.0f} s:\n{self._log_tail()}"
                )
            time.sleep(0.2)
        say(f"docker: dockerd answers after {time.monotonic() - began:.1f} s")

    def _stop_leftover(self) -> None:
        """Stop a dockerd of this directory that no longer answers (a wedged leftover)."""
        pid = self._pid()
        if pid is not None:
            self._terminate(pid)

    def _stop(self, say: Log) -> None:
        pid = self._pid()
        if pid is None:
            return
        began = time.monotonic()
        self._terminate(pid)
        say(f"docker: the project's dockerd stopped ({time.monotonic() - began:.1f} s)")

    def _terminate(self, pid: int) -> None:
        # dockerd leads its own process group (start_new_session), with the containerd it
        # started: signal the group. It stops its containers before it exits.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        while _is_dockerd(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.1)
        if _is_dockerd(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            while _is_dockerd(pid):
                _reap(pid)
                time.sleep(0.05)
        with contextlib.suppress(FileNotFoundError):
            self.pidfile.unlink()
        # dockerd leaves its bind mount of the host's network namespace
        # (<exec-root>/netns/default) behind, which makes the directory undeletable.
        for root in (self.exec_root, self.data_root):
            unmount_under(root)

    def _pid(self) -> int | None:
        try:
            pid = int(self.pidfile.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if _is_dockerd(pid) else None

    def _log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return "(no log)"


def _is_dockerd(pid: int) -> bool:
    """Whether ``pid`` is a live dockerd (not a recycled pid of another program)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    state = stat[stat.rindex(")") + 2 :].split()[0]
    return state != "Z" and os.path.basename(command) == b"dockerd"


def unmount_under(directory: Path) -> None:
    """Unmount every mount point at or below ``directory``, deepest first."""
    prefix = str(directory.resolve())
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    # Field 5 is the mount point, with spaces and the like written as octal escapes.
    points = {
        line.split()[4].encode().decode("unicode_escape") for line in lines if len(line.split()) > 4
    }
    inside = [p for p in points if p == prefix or p.startswith(prefix + "/")]
    for point in sorted(inside, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
