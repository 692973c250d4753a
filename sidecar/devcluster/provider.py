"""Which cluster the tests (and the demo) use, and how it is started and stopped.

In order of preference:

1. an external cluster, when ``SIDECAR_TEST_KAFKA_BOOTSTRAP`` and
   ``SIDECAR_TEST_ZOOKEEPER_HOSTS`` are set (nothing is started or stopped);
2. testcontainers, when ``SIDECAR_TEST_CLUSTER=docker`` is set and a Docker engine
   answers (one KRaft Kafka container plus a ZooKeeper container);
3. a :class:`LocalCluster` of local processes in a fresh directory (the default, and
   what CI uses: these machines have no Docker engine).

``SIDECAR_TEST_CLUSTER=local`` forces the third. A cluster that cannot start raises: an
integration test never silently skips.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.devcluster.cluster import LocalCluster
from sidecar.devcluster.errors import DevClusterError

BOOTSTRAP_ENV = "SIDECAR_TEST_KAFKA_BOOTSTRAP"
ZOOKEEPER_ENV = "SIDECAR_TEST_ZOOKEEPER_HOSTS"
KIND_ENV = "SIDECAR_TEST_CLUSTER"


@dataclass(frozen=True)
class ClusterEndpoints:
    """Where the test cluster listens, and the local processes if this run started them."""

    kind: str
    kafka_bootstrap: str
    zookeeper_hosts: str
    broker_count: int
    local: LocalCluster | None = None

    @property
    def replication_factor(self) -> int:
        return min(3, self.broker_count)


@contextmanager
def provide_cluster(work_dir: Path | None = None) -> Iterator[ClusterEndpoints]:
    kind = os.environ.get(KIND_ENV, "auto")
    bootstrap = os.environ.get(BOOTSTRAP_ENV)
    zookeeper = os.environ.get(ZOOKEEPER_ENV)
    if kind in ("auto", "external") and bootstrap and zookeeper:
        yield ClusterEndpoints("external", bootstrap, zookeeper, _external_broker_count())
        return
    if kind == "external":
        raise DevClusterError(f"{KIND_ENV}=external needs {BOOTSTRAP_ENV} and {ZOOKEEPER_ENV}")
    if kind == "docker":
        with _docker_cluster() as endpoints:
            yield endpoints
        return
    if kind not in ("auto", "local"):
        raise DevClusterError(f"{KIND_ENV} must be auto, local, docker or external, not {kind!r}")
    with _local_cluster(work_dir) as endpoints:
        yield endpoints


def _external_broker_count() -> int:
    return int(os.environ.get("SIDECAR_TEST_BROKER_COUNT", "3"))


@contextmanager
def _local_cluster(work_dir: Path | None) -> Iterator[ClusterEndpoints]:
    with tempfile.TemporaryDirectory(prefix="ordered-sidecar-cluster-") as temporary:
        cluster = LocalCluster(work_dir or Path(temporary))
        try:
            cluster.start(timeout=240.0)
            yield ClusterEndpoints(
                "local",
                cluster.kafka_bootstrap,
                cluster.zookeeper_hosts,
                cluster.broker_count,
                local=cluster,
            )
        finally:
            cluster.stop()


@contextmanager
def _docker_cluster() -> Iterator[ClusterEndpoints]:
    # Imported here: testcontainers probes for Docker at import time in some versions.
    from testcontainers.community.kafka import KafkaContainer
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    kafka: Any = KafkaContainer("confluentinc/cp-kafka:7.6.0").with_kraft()
    zookeeper: Any = DockerContainer("zookeeper:3.9").with_exposed_ports(2181)
    with kafka, zookeeper:
        wait_for_logs(zookeeper, "binding to port", timeout=60)
        hosts = f"{zookeeper.get_container_host_ip()}:{zookeeper.get_exposed_port(2181)}"
        yield ClusterEndpoints("docker", kafka.get_bootstrap_server(), hosts, 1)
