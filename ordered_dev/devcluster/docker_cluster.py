"""The test cluster in containers: ZooKeeper and a 3-node KRaft Kafka cluster, by testcontainers.

Every server is a container of the test servers' image (``sidecar image``), run with
the host's network: it listens on 127.0.0.1 at ports picked free when the cluster
starts, with the same configuration as the local cluster's processes
(``kafka_properties``, ``zookeeper_config``) and small heaps. Ryuk, testcontainers'
reaper, is disabled unless ``TESTCONTAINERS_RYUK_DISABLED`` says otherwise: its image
comes from Docker Hub, which a machine without a registry cannot reach, and ``stop``
removes every container this cluster started (the project's own dockerd, when one
was started, removes the rest when it stops).

A broker or ZooKeeper can be stopped and started again (its container keeps its data),
the same operations the fault tests use on the local cluster.
"""

from __future__ import annotations

import base64
import contextlib
import os
import time
import uuid
from collections.abc import Callable, Collection
from typing import Any

from ordered_dev.devcluster.cluster import (
    RESTART_TIMEOUT_S,
    free_ports,
    kafka_properties,
    port_open,
    registered_brokers,
    run_in_thread,
    wait_until,
    zookeeper_config,
    zookeeper_serving,
)
from ordered_dev.devcluster.errors import DevClusterError

KAFKA_HEAP = "-Xms128m -Xmx512m"
ZOOKEEPER_HEAP = "-Xms32m -Xmx128m"
RYUK_ENV = "TESTCONTAINERS_RYUK_DISABLED"
LABEL = "ordered-sidecar.test-cluster"


def testcontainers_defaults() -> None:
    """Disable Ryuk unless ``TESTCONTAINERS_RYUK_DISABLED`` is set (either way)."""
    from testcontainers.core.config import testcontainers_config

    if RYUK_ENV not in os.environ:
        testcontainers_config.ryuk_disabled = True


def _containers() -> Any:
    """testcontainers' DockerContainer, with the defaults above."""
    from testcontainers.core.container import DockerContainer

    testcontainers_defaults()
    return DockerContainer


class DockerCluster:
    """ZooKeeper plus ``broker_count`` combined broker/controller Kafka nodes in containers."""

    def __init__(self, image: str, *, broker_count: int = 3) -> None:
        self.image = image
        self.broker_count = broker_count
        self.run_id = uuid.uuid4().hex[:8]
        self.cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        nodes = [str(node) for node in self.node_ids()]
        ports = free_ports(1 + 2 * len(nodes))
        self.zookeeper_port = ports[0]
        self.kafka_ports = {node: ports[1 + i] for i, node in enumerate(nodes)}
        self.controller_ports = {node: ports[1 + len(nodes) + i] for i, node in enumerate(nodes)}
        self._containers: dict[str, Any] = {}

    # Addresses ---------------------------------------------------------------------------

    @property
    def kafka_bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.kafka_ports.values())

    @property
    def zookeeper_hosts(self) -> str:
        return f"127.0.0.1:{self.zookeeper_port}"

    def node_ids(self) -> list[int]:
        return list(range(1, self.broker_count + 1))

    # Whole-cluster lifecycle -------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> float:
        """Start every container and wait until ZooKeeper serves and every broker is
        registered; returns the seconds it took. On failure removes what it started and
        raises DevClusterError with the tail of the failing server's log."""
        began = time.monotonic()
        try:
            self._run("zookeeper")
            self.start_zookeeper(timeout=timeout)
            for node in self.node_ids():
                self._run(f"kafka-{node}")
            self.wait_for_kafka(timeout=max(1.0, timeout - (time.monotonic() - began)))
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - began

    def stop(self) -> None:
        """Remove every container this cluster started (killed: the data goes with it)."""
        for name in list(self._containers):
            container = self._containers.pop(name)
            with contextlib.suppress(Exception):
                container.stop()

    def status(self) -> dict[str, dict[str, Any]]:
        """Per server: container id and state, its port, whether the port answers."""
        ports = {"zookeeper": self.zookeeper_port} | {
            f"kafka-{node}": port for node, port in self.kafka_ports.items()
        }
        report: dict[str, dict[str, Any]] = {}
        for name, port in ports.items():
            wrapped = self._wrapped(name)
            report[name] = {
                "container": wrapped.short_id if wrapped is not None else None,
                "alive": self._running(name),
                "port": port,
                "listening": port_open(port),
            }
        return report

    # Single servers, for fault tests -----------------------------------------------------

    def stop_broker(self, node_id: int, *, kill: bool = False) -> None:
        """Stop one Kafka container (SIGKILL if ``kill``); its data stays for a restart."""
        self._halt(f"kafka-{node_id}", kill)

    def start_broker(self, node_id: int, timeout: float = RESTART_TIMEOUT_S) -> None:
        """Start one stopped Kafka container again and wait until the cluster sees it and
        every other node still running (as ``LocalCluster.start_broker``)."""
        self._resume(f"kafka-{node_id}")
        running = {node_id} | {n for n in self.node_ids() if self._running(f"kafka-{n}")}
        self.wait_for_kafka(timeout=timeout, nodes=running)

    def stop_zookeeper(self, *, kill: bool = False) -> None:
        self._halt("zookeeper", kill)

    def start_zookeeper(self, timeout: float = 60.0) -> None:
        """Start ZooKeeper's container if it is stopped and wait until it serves."""
        self._resume("zookeeper")

        def ready() -> bool:
            self._require_running("zookeeper")
            return zookeeper_serving(self.zookeeper_port)

        self._wait_until(ready, timeout, "zookeeper", "ZooKeeper did not serve requests")

    def wait_for_kafka(self, timeout: float = 120.0, nodes: Collection[int] | None = None) -> None:
        """Wait until every Kafka node (or each of ``nodes``) runs and is registered with
        the cluster's controller, unfenced."""
        expected = set(self.node_ids() if nodes is None else nodes)
        ports = [self.kafka_ports[str(node)] for node in sorted(expected)]
        bootstrap = ",".join(f"127.0.0.1:{port}" for port in ports)

        def ready() -> bool:
            for node in sorted(expected):
                self._require_running(f"kafka-{node}")
            if not all(port_open(port) for port in ports):
                return False
            return expected <= run_in_thread(registered_brokers(bootstrap))

        log_name = f"kafka-{min(expected)}"
        self._wait_until(ready, timeout, log_name, f"Kafka did not show brokers {sorted(expected)}")

    def container(self, name: str) -> Any:
        """The Docker SDK's object of server ``name``'s container, freshly inspected."""
        wrapped = self._wrapped(name)
        if wrapped is None:
            raise DevClusterError(f"no container for {name}")
        wrapped.reload()
        return wrapped

    def log_tail(self, name: str, chars: int = 4000) -> str:
        """The end of a server container's output (its log)."""
        wrapped = self._wrapped(name)
        if wrapped is None:
            return "(no container)"
        try:
            output: bytes = wrapped.logs(tail=200)
        except Exception as exc:
            return f"(logs unavailable: {exc})"
        return output.decode(errors="replace")[-chars:] or "(no log output)"

    # Internals ---------------------------------------------------------------------------

    def _run(self, name: str) -> None:
        server, _, node = name.partition("-")
        if server == "zookeeper":
            config = zookeeper_config(self.zookeeper_port, "/data/zookeeper/data")
            environment = {"SERVER_CONFIG": config, "SERVER_HEAP": ZOOKEEPER_HEAP}
        else:
            config = kafka_properties(
                int(node), self.kafka_ports, self.controller_ports, "/data/kafka/data"
            )
            environment = {
                "SERVER_CONFIG": config,
                "SERVER_HEAP": KAFKA_HEAP,
                "KAFKA_CLUSTER_ID": self.cluster_id,
            }
        container = (
            _containers()(self.image, name=f"ordered-sidecar-{name}-{self.run_id}")
            .with_command([server])
            .with_envs(**environment)
            .with_kwargs(
                # `network`, not `network_mode`: testcontainers then keeps its own choice
                # of network out of it.
                network="host",
                labels={LABEL: self.run_id},
            )
        )
        self._containers[name] = container
        container.start()

    def _wrapped(self, name: str) -> Any:
        container = self._containers.get(name)
        if container is None:
            return None
        from testcontainers.core.exceptions import ContainerStartException

        try:
            return container.get_wrapped_container()
        except ContainerStartException:
            return None

    def _running(self, name: str) -> bool:
        wrapped = self._wrapped(name)
        if wrapped is None:
            return False
        try:
            wrapped.reload()
        except Exception:
            return False
        return bool(wrapped.status == "running")

    def _require_running(self, name: str) -> None:
        if not self._running(name):
            raise DevClusterError(f"{name} exited during start:\n{self.log_tail(name)}")

    def _halt(self, name: str, kill: bool) -> None:
        wrapped = self._wrapped(name)
        if wrapped is None:
            raise DevClusterError(f"no container for {name}")
        if kill:
            wrapped.kill()
        else:
            wrapped.stop(timeout=30)
        wrapped.wait(timeout=60)

    def _resume(self, name: str) -> None:
        wrapped = self._wrapped(name)
        if wrapped is None:
            raise DevClusterError(f"no container for {name}")
        if not self._running(name):
            wrapped.start()

    def _wait_until(
        self, ready: Callable[[], bool], timeout: float, log_name: str, message: str
    ) -> None:
        wait_until(ready, timeout, message, lambda: self.log_tail(log_name))
