"""Which cluster the tests (and the demo) use, and how it is started and stopped.

In order of preference:

1. an external cluster, when ``SIDECAR_TEST_KAFKA_BOOTSTRAP`` and
   ``SIDECAR_TEST_ZOOKEEPER_HOSTS`` are set (nothing is started or stopped);
2. containers, when ``SIDECAR_TEST_CLUSTER=docker`` is set: a
   :class:`~ordered_dev.devcluster.docker_cluster.DockerCluster` (ZooKeeper and three KRaft
   Kafka nodes, by testcontainers, from the test servers' image, host networking) on
   the Docker engine that answers, or the project's own dockerd where none does (root
   on Debian; see ``ordered_dev.devcluster.docker_engine``), stopped again at the end;
3. a :class:`LocalCluster` of local processes in a fresh directory (the default, and
   what CI's session cluster is; CI runs the container tests beside it).

``SIDECAR_TEST_CLUSTER=local`` forces the third. A cluster that cannot start raises: an
integration test never silently skips.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ordered_dev.devcluster.cluster import LocalCluster
from ordered_dev.devcluster.errors import DevClusterError
from ordered_dev.devcluster.security import SIDECAR_USER
from sidecar.adapters.kafka_security import security_arguments
from sidecar.config import (
    KafkaSecuritySettings,
    Secret,
    ZooKeeperSecuritySettings,
)

if TYPE_CHECKING:
    from ordered_dev.devcluster.docker_cluster import DockerCluster

BOOTSTRAP_ENV = "SIDECAR_TEST_KAFKA_BOOTSTRAP"
ZOOKEEPER_ENV = "SIDECAR_TEST_ZOOKEEPER_HOSTS"
KIND_ENV = "SIDECAR_TEST_CLUSTER"


class ClusterServers(Protocol):
    """Stopping and starting single servers, for fault tests: what the local cluster and
    the cluster in containers both offer."""

    def node_ids(self) -> list[int]: ...
    def stop_broker(self, node_id: int, *, kill: bool = False) -> None: ...
    def start_broker(self, node_id: int, timeout: float = ...) -> None: ...
    def stop_zookeeper(self, *, kill: bool = False) -> None: ...
    def start_zookeeper(self, timeout: float = 60.0) -> None: ...
    def wait_for_kafka(
        self, timeout: float = 120.0, nodes: Collection[int] | None = None
    ) -> None: ...


@dataclass(frozen=True)
class ClusterEndpoints:
    """Where the test cluster listens, and its servers if this run started them."""

    kind: str
    kafka_bootstrap: str
    zookeeper_hosts: str
    broker_count: int
    local: LocalCluster | None = None
    """The local processes, when this run started them."""
    docker: DockerCluster | None = None
    """The containers, when this run started them."""
    kafka_security: KafkaSecuritySettings = field(default_factory=KafkaSecuritySettings)
    """How clients of ``kafka_bootstrap`` connect (a secured cluster's listener)."""
    zookeeper_security: ZooKeeperSecuritySettings = field(default_factory=ZooKeeperSecuritySettings)
    """How the sidecars connect to ``sidecar_zookeeper_hosts``."""
    secure_zookeeper_hosts: str = ""
    """A secured cluster's ZooKeeper TLS port; ``zookeeper_hosts`` is its plain port."""

    @property
    def sidecar_zookeeper_hosts(self) -> str:
        """Where sidecars connect to ZooKeeper (with ``zookeeper_security``)."""
        return self.secure_zookeeper_hosts or self.zookeeper_hosts

    def kafka_client_arguments(self) -> dict[str, Any]:
        """aiokafka arguments a test's own client needs at ``kafka_bootstrap``."""
        return security_arguments(self.kafka_security)

    @property
    def replication_factor(self) -> int:
        return min(3, self.broker_count)

    @property
    def servers(self) -> ClusterServers | None:
        """The servers this run started (None for an external cluster)."""
        return self.local or self.docker


@contextmanager
def provide_cluster(
    work_dir: Path | None = None, kind: str | None = None
) -> Iterator[ClusterEndpoints]:
    """The test cluster ``kind`` (default: ``$SIDECAR_TEST_CLUSTER``, else ``auto``)."""
    kind = kind or os.environ.get(KIND_ENV, "auto")
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
    # Imported here: the Docker SDK and testcontainers are test dependencies.
    from ordered_dev.devcluster.docker_cluster import DockerCluster
    from ordered_dev.devcluster.docker_engine import docker_engine
    from ordered_dev.devcluster.images import ensure_servers_image

    with docker_engine():
        cluster = DockerCluster(ensure_servers_image())
        try:
            cluster.start(timeout=240.0)
            yield ClusterEndpoints(
                "docker",
                cluster.kafka_bootstrap,
                cluster.zookeeper_hosts,
                cluster.broker_count,
                docker=cluster,
            )
        finally:
            cluster.stop()


SECURED_BROKERS = 1
"""A secured cluster has one broker: it runs beside the session's PLAINTEXT cluster on a
small machine, and what it tests (TLS, SASL, ACLs) does not depend on replication."""


@contextmanager
def provide_secured_cluster(work_dir: Path | None = None) -> Iterator[LocalCluster]:
    """A local cluster in security mode (``ordered_dev.devcluster.security``), stopped
    at the end. Always local processes: its certificates and users are made here."""
    with tempfile.TemporaryDirectory(prefix="ordered-sidecar-secured-") as temporary:
        cluster = LocalCluster(
            work_dir or Path(temporary), broker_count=SECURED_BROKERS, security="sasl_ssl"
        )
        try:
            cluster.start(timeout=240.0)
            yield cluster
        finally:
            cluster.stop()


SECURED_IDENTITIES = ("scram", "mtls")


def secured_endpoints(
    cluster: LocalCluster, identity: str = "scram", *, user: str = SIDECAR_USER
) -> ClusterEndpoints:
    """``cluster`` (in security mode) as clients of ``identity`` reach it: ``scram``
    (SASL_SSL, SCRAM-SHA-512 as ``user``) or ``mtls`` (mutual TLS with the sidecar's
    certificate, its key encrypted); ZooKeeper over TLS with SASL DIGEST-MD5."""
    material = cluster.material
    if identity == "scram":
        bootstrap = cluster.kafka_bootstrap
        kafka = KafkaSecuritySettings(
            protocol="SASL_SSL",
            ssl_cafile=material.ca,
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username=user,
            sasl_password=Secret(material.passwords[user]),
        )
    elif identity == "mtls":
        bootstrap = cluster.mtls_bootstrap
        kafka = KafkaSecuritySettings(
            protocol="SSL",
            ssl_cafile=material.ca,
            ssl_certfile=str(material.sidecar.certfile),
            ssl_keyfile=str(material.sidecar.keyfile),
            ssl_key_password=Secret(material.sidecar.key_password),
        )
    else:
        raise DevClusterError(f"unknown identity {identity!r}: {SECURED_IDENTITIES}")
    zookeeper = ZooKeeperSecuritySettings(
        tls=True,
        ssl_cafile=material.ca,
        sasl_mechanism="DIGEST-MD5",
        digest_username=SIDECAR_USER,
        digest_password=Secret(material.zookeeper_password),
    )
    return ClusterEndpoints(
        f"secured-{identity}",
        bootstrap,
        cluster.zookeeper_hosts,
        cluster.broker_count,
        local=cluster,
        kafka_security=kafka,
        zookeeper_security=zookeeper,
        secure_zookeeper_hosts=cluster.zookeeper_tls_hosts,
    )
