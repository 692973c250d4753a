"""Running the sidecar image as a container beside a test cluster.

Containers use the host's network only (``network="host"``): the sidecar listens on
127.0.0.1 at a free port, as a local process would, and reaches the cluster's loopback
addresses. Its root filesystem is read-only, as in the Kubernetes manifests.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ordered_dev.devcluster.docker_cluster import LABEL
from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import settings_environment, settings_for, unique
from sidecar.config import Settings
from tests.ops.support import free_port

READY_WITHIN_S = 90.0


@dataclass
class RunningContainer:
    """A started container: testcontainers' handle, where it answers, how long it took."""

    handle: Any
    url: str
    sidecar_id: str
    ready_after_s: float

    @property
    def wrapped(self) -> Any:
        """The Docker SDK's container object."""
        return self.handle.get_wrapped_container()

    def inspect(self) -> dict[str, Any]:
        wrapped = self.wrapped
        wrapped.reload()
        attributes: dict[str, Any] = wrapped.attrs
        return attributes

    def logs(self, tail: int = 200) -> str:
        output: bytes = self.wrapped.logs(tail=tail)
        return output.decode(errors="replace")


def logs_of(*containers: RunningContainer, tail: int = 300) -> Callable[[], Awaitable[str]]:
    """A ``wait_until_delivered`` diagnosis: the end of each container's log. A record a
    consumer never delivered leaves its trace there (a fetch discarded, a position set
    anew) and nowhere else once the containers are removed."""

    async def diagnose() -> str:
        parts = []
        for container in containers:
            log = await asyncio.to_thread(container.logs, tail)
            parts.append(f"\n--- log of {container.sidecar_id} (last {tail} lines) ---\n{log}")
        return "".join(parts)

    return diagnose


def container_settings(cluster: ClusterEndpoints, root: str | None = None) -> Settings:
    """A sidecar's settings for ``cluster`` (admin API on, a fresh ZooKeeper root by
    default) listening on a free loopback port."""
    settings = settings_for(cluster, root or f"/{unique('container')}", "container")
    # Concrete ports, not 0: the image's HEALTHCHECK reads the operations port from the
    # environment, and the containers share the host's network.
    return replace(settings, http=replace(settings.http, port=free_port(), ops_port=free_port()))


def run_container(
    image: str,
    command: list[str] | None = None,
    environment: dict[str, str] | None = None,
    volumes: list[tuple[Path, str]] | None = None,
) -> Any:
    """Start ``image`` with the host's network and a read-only root filesystem; the
    testcontainers handle (stop it with ``.stop()``)."""
    from testcontainers.core.container import DockerContainer

    from ordered_dev.devcluster.docker_cluster import testcontainers_defaults

    testcontainers_defaults()
    container = DockerContainer(
        image, name=f"ordered-sidecar-test-{uuid.uuid4().hex[:8]}"
    ).with_kwargs(network="host", read_only=True, labels={LABEL: "tests"})
    if command is not None:
        container = container.with_command(command)
    for key, value in (environment or {}).items():
        container = container.with_env(key, value)
    for host_path, container_path in volumes or []:
        container = container.with_volume_mapping(str(host_path), container_path, "ro")
    container.start()
    return container


@contextlib.contextmanager
def sidecar_container(image: str, settings: Settings) -> Iterator[RunningContainer]:
    """``sidecar serve`` from ``image`` with ``settings`` (as environment variables), once
    ``/readyz`` answers 200; removed at the end."""
    began = time.monotonic()
    handle = run_container(image, environment=settings_environment(settings))
    try:
        url = f"http://127.0.0.1:{settings.http.port}"
        ready_after = wait_ready(handle, f"{url}/readyz", began)
        yield RunningContainer(handle, url, settings.sidecar_id, ready_after)
    finally:
        handle.stop()


def wait_ready(handle: Any, url: str, began: float, context: ssl.SSLContext | None = None) -> float:
    """Seconds from ``began`` until ``url`` answers 200; fails with the container's log
    if it exits or does not answer within READY_WITHIN_S."""
    while True:
        with (
            contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError),
            urllib.request.urlopen(url, timeout=2, context=context) as response,
        ):
            if response.status == 200:
                return time.monotonic() - began
        wrapped = handle.get_wrapped_container()
        wrapped.reload()
        logs = wrapped.logs(tail=60).decode(errors="replace")
        assert wrapped.status == "running", f"the container exited:\n{logs}"
        assert time.monotonic() - began < READY_WITHIN_S, f"{url} never answered 200:\n{logs}"
        time.sleep(0.2)
