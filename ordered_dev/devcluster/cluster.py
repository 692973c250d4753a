"""A real local cluster: one ZooKeeper server and a 3-node KRaft Apache Kafka cluster.

Every process listens on 127.0.0.1 only, logs to files under the work directory and
runs in its own process group. ``cluster.json`` in the work directory records ports,
pids and each pid's start time, so that ``down`` from another process stops exactly
the processes this cluster started (a recycled pid is never signalled).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Collection, Coroutine, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ordered_dev.devcluster.errors import DevClusterError
from ordered_dev.devcluster.install import InstalledServers, ensure_installed
from ordered_dev.devcluster.security import (
    ADMIN_USER,
    SECURITY_MODES,
    SecurityMaterial,
    kafka_jvm_flags,
    kafka_security_properties,
    zookeeper_jvm_flags,
    zookeeper_security_config,
)

_T = TypeVar("_T")

# How long a restarted broker may take to register again. Seen above 60 s on the loaded
# 2-core machine (three JVMs of the cluster, the tests and other work sharing it).
RESTART_TIMEOUT_S = 180.0

STATE_FILE = "cluster.json"
# Small heaps for a 2-core machine: Kafka 4 runs well with 1 GiB per combined node.
KAFKA_HEAP = ["-Xms256m", "-Xmx1g"]
ZOOKEEPER_HEAP = ["-Xms64m", "-Xmx256m"]
# Serial GC: fewer GC threads competing for two cores; pauses are irrelevant here.
JVM_FLAGS = ["-XX:+UseSerialGC", "-Djava.awt.headless=true"]
_LOG4J2_CONFIG = """\
<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <File name="file" fileName="${sys:ordered.log.file}">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="org.apache.kafka.controller" level="INFO"/>
    <Root level="INFO"><AppenderRef ref="file"/></Root>
  </Loggers>
</Configuration>
"""


@dataclass
class ProcessRecord:
    """A started server process: its pid and the kernel's start time of that pid."""

    pid: int
    start_ticks: int


@dataclass
class ClusterState:
    """What ``cluster.json`` holds."""

    cluster_id: str
    zookeeper_port: int
    kafka_ports: dict[str, int]
    controller_ports: dict[str, int]
    processes: dict[str, ProcessRecord] = field(default_factory=dict)
    security: str = ""
    """"" (PLAINTEXT everywhere) or a mode of ``ordered_dev.devcluster.security``."""
    mtls_ports: dict[str, int] = field(default_factory=dict)
    """Secured clusters: each node's mutual-TLS listener (``kafka_ports`` is SASL_SSL)."""
    secure_zookeeper_port: int = 0
    """Secured clusters: ZooKeeper's TLS client port."""
    plaintext_ports: dict[str, int] = field(default_factory=dict)
    """Secured clusters started with ``plaintext_listener``: each node's PLAINTEXT
    listener beside the secured ones (the produce benchmark compares the two)."""

    @classmethod
    def load(cls, path: Path) -> ClusterState:
        raw = json.loads(path.read_text())
        raw["processes"] = {k: ProcessRecord(**v) for k, v in raw["processes"].items()}
        return cls(**raw)

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)


def wait_until(
    ready: Callable[[], bool], timeout: float, message: str, log_tail: Callable[[], str]
) -> None:
    """Poll ``ready`` every 0.5 s (a failing probe counts as not ready) until it holds;
    raises DevClusterError with ``message`` and the server's log tail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except DevClusterError:
            raise
        except Exception:
            pass
        time.sleep(0.5)
    raise DevClusterError(f"{message} within {timeout:.0f} s:\n{log_tail()}")


class LocalCluster:
    """ZooKeeper plus ``broker_count`` combined broker/controller Kafka nodes on loopback."""

    def __init__(
        self,
        work_dir: Path,
        *,
        broker_count: int = 3,
        installed: InstalledServers | None = None,
        security: str = "",
        plaintext_listener: bool = False,
    ) -> None:
        if security and security not in SECURITY_MODES:
            raise DevClusterError(f"unknown security mode {security!r}: {SECURITY_MODES}")
        if plaintext_listener and not security:
            raise DevClusterError("plaintext_listener is for a secured cluster")
        self.work_dir = work_dir.resolve()
        self.broker_count = broker_count
        self._plaintext_listener = plaintext_listener
        self._installed = installed
        state_path = self.work_dir / STATE_FILE
        self.state: ClusterState | None = (
            ClusterState.load(state_path) if state_path.exists() else None
        )
        # A cluster keeps the mode it was created with (``down`` needs no flag).
        self.security = self.state.security if self.state is not None else security
        if self.state is not None:
            self.broker_count = len(self.state.kafka_ports)
        self._material: SecurityMaterial | None = None

    # Addresses ---------------------------------------------------------------------------

    @property
    def kafka_bootstrap(self) -> str:
        state = self._require_state()
        return ",".join(f"127.0.0.1:{port}" for port in state.kafka_ports.values())

    @property
    def zookeeper_hosts(self) -> str:
        """ZooKeeper's plain client port (a secured cluster's too: for clients without
        an identity, which can read at most)."""
        return f"127.0.0.1:{self._require_state().zookeeper_port}"

    @property
    def mtls_bootstrap(self) -> str:
        """A secured cluster's mutual-TLS listeners."""
        state = self._require_state()
        return ",".join(f"127.0.0.1:{port}" for port in state.mtls_ports.values())

    @property
    def plaintext_bootstrap(self) -> str:
        """A secured cluster's PLAINTEXT listeners (started with ``plaintext_listener``)."""
        state = self._require_state()
        if not state.plaintext_ports:
            raise DevClusterError("this cluster was started without a PLAINTEXT listener")
        return ",".join(f"127.0.0.1:{port}" for port in state.plaintext_ports.values())

    @property
    def zookeeper_tls_hosts(self) -> str:
        """A secured cluster's ZooKeeper TLS client port."""
        return f"127.0.0.1:{self._require_state().secure_zookeeper_port}"

    @property
    def material(self) -> SecurityMaterial:
        """A secured cluster's CA, certificates and credentials (made at its first start)."""
        if not self.security:
            raise DevClusterError("this cluster runs without security")
        if self._material is None:
            self._material = SecurityMaterial.load_or_create(self.work_dir / "security")
        return self._material

    def node_ids(self) -> list[int]:
        return list(range(1, self.broker_count + 1))

    # Whole-cluster lifecycle -------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> float:
        """Start every server not running yet and wait until all accept clients.

        Returns the seconds it took. On failure stops what it started and raises
        DevClusterError with the tail of the failing server's log.
        """
        began = time.monotonic()
        self._installed = self._installed or ensure_installed()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.state is None:
            self.state = self._new_state()
            self._save()
        try:
            self.start_zookeeper(timeout=timeout)
            for node_id in self.node_ids():
                if not self._alive(f"kafka-{node_id}"):
                    self._spawn_kafka(node_id)
            self.wait_for_kafka(timeout=max(1.0, timeout - (time.monotonic() - began)))
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - began

    def stop(self, grace: float = 20.0) -> None:
        """Stop every process this cluster started: SIGTERM, then SIGKILL after ``grace``."""
        if self.state is None:
            return
        names = [n for n in self.state.processes if n.startswith("kafka-")]
        names += [n for n in self.state.processes if not n.startswith("kafka-")]
        for name in names:
            self._signal(name, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name in names:
            self._wait_exit(name, deadline)
        self._save()

    def status(self) -> dict[str, dict[str, Any]]:
        """Per server: pid, whether it is alive, its port, whether the port answers."""
        state = self._require_state()
        report: dict[str, dict[str, Any]] = {}
        ports = {"zookeeper": state.zookeeper_port} | {
            f"kafka-{node}": port for node, port in state.kafka_ports.items()
        }
        for name, port in ports.items():
            record = state.processes.get(name)
            report[name] = {
                "pid": record.pid if record else None,
                "alive": self._alive(name),
                "port": port,
                "listening": port_open(port),
            }
        return report

    # Single servers, for fault tests -----------------------------------------------------

    def stop_broker(self, node_id: int, *, kill: bool = False) -> None:
        """Stop one Kafka node (SIGKILL if ``kill``); its data stays for a restart."""
        name = f"kafka-{node_id}"
        self._signal(name, signal.SIGKILL if kill else signal.SIGTERM)
        self._wait_exit(name, time.monotonic() + 30.0)
        self._save()

    def start_broker(self, node_id: int, timeout: float = RESTART_TIMEOUT_S) -> None:
        """Start one stopped Kafka node again and wait until the cluster sees it and every
        other node still running. A node stopped on purpose is not waited for: a fault
        test may bring one node back while another is down (an unclean election)."""
        if not self._alive(f"kafka-{node_id}"):
            self._spawn_kafka(node_id)
        running = {node_id} | {n for n in self.node_ids() if self._alive(f"kafka-{n}")}
        self.wait_for_kafka(timeout=timeout, nodes=running)

    def stop_zookeeper(self, *, kill: bool = False) -> None:
        self._signal("zookeeper", signal.SIGKILL if kill else signal.SIGTERM)
        self._wait_exit("zookeeper", time.monotonic() + 30.0)
        self._save()

    def pause_zookeeper(self) -> None:
        """Freeze ZooKeeper (SIGSTOP): connections stay open, nothing is answered."""
        self._signal("zookeeper", signal.SIGSTOP)

    def resume_zookeeper(self) -> None:
        self._signal("zookeeper", signal.SIGCONT)

    def start_zookeeper(self, timeout: float = 60.0) -> None:
        """Start ZooKeeper if it is not running and wait until it serves requests."""
        if not self._alive("zookeeper"):
            self._spawn_zookeeper()
        port = self._require_state().zookeeper_port

        def ready() -> bool:
            if not self._alive("zookeeper"):
                raise DevClusterError(
                    f"zookeeper exited during start:\n{self.log_tail('zookeeper')}"
                )
            return zookeeper_serving(port)

        self._wait_until(ready, timeout, "zookeeper", "ZooKeeper did not serve requests")

    def wait_for_kafka(self, timeout: float = 120.0, nodes: Collection[int] | None = None) -> None:
        """Wait until every Kafka node (or each of ``nodes``) runs and is registered with
        the cluster's controller, unfenced."""
        expected = set(self.node_ids() if nodes is None else nodes)
        state = self._require_state()
        ports = [state.kafka_ports[str(node)] for node in sorted(expected)]
        # Only the awaited nodes are asked: the client logs each refused connection (a
        # node stopped on purpose) at ERROR level.
        bootstrap = ",".join(f"127.0.0.1:{port}" for port in ports)

        def ready() -> bool:
            for node in sorted(expected):
                if not self._alive(f"kafka-{node}"):
                    raise DevClusterError(
                        f"kafka-{node} exited during start:\n{self.log_tail(f'kafka-{node}')}"
                    )
            # Ask the cluster only once every listener is up (the same log noise).
            if not all(port_open(port) for port in ports):
                return False
            probe = registered_brokers(bootstrap, **self.admin_client_arguments())
            return expected <= run_in_thread(probe)

        log_name = f"kafka-{min(expected)}"
        self._wait_until(ready, timeout, log_name, f"Kafka did not show brokers {sorted(expected)}")

    def grant_acls(self, principal: str, *resources: str) -> None:
        """Allow ``principal`` (``User:name``) operations on ``resources`` of a secured
        cluster, each ``<type>:<literal|prefixed>:<name>[:<operation>]`` (ALL unless
        given; ``java/GrantAcls.java``)."""
        self._run_admin_tool("GrantAcls.java", principal, *resources, what="granting ACLs")

    def set_scram_credential(
        self, user: str, password: str | None, mechanism: str = "SCRAM-SHA-512"
    ) -> None:
        """Create or change ``user``'s SCRAM credential for ``mechanism`` on a running
        secured cluster, or delete it (``password`` None): Kafka checks it at every new
        connection (``java/ScramCredentials.java``)."""
        if password is None:
            self._run_admin_tool(
                "ScramCredentials.java", "delete", user, mechanism, what="deleting a credential"
            )
        else:
            self._run_admin_tool(
                "ScramCredentials.java",
                "upsert",
                user,
                mechanism,
                what="setting a credential",
                stdin=password + "\n",
            )

    def _run_admin_tool(
        self, source_name: str, *arguments: str, what: str, stdin: str | None = None
    ) -> None:
        """Run one of ``java/`` (a single-file program over the Admin API of the
        installed kafka-clients) as the ``admin`` super user."""
        material = self.material
        config = Path(material.directory) / "admin.properties"
        password = material.passwords[ADMIN_USER]
        config.write_text(
            f"bootstrap.servers={self.kafka_bootstrap}\n"
            "security.protocol=SASL_SSL\n"
            "sasl.mechanism=SCRAM-SHA-512\n"
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule "
            f'required username="{ADMIN_USER}" password="{password}";\n'
            "ssl.truststore.type=PEM\n"
            f"ssl.truststore.location={material.ca}\n"
        )
        installed = self._require_installed()
        source = Path(__file__).parent / "java" / source_name
        result = subprocess.run(
            [
                installed.java,
                *JVM_FLAGS,
                "-cp",
                installed.kafka_classpath,
                str(source),
                str(config),
                *arguments,
            ],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if result.returncode != 0:
            raise DevClusterError(f"{what} failed:\n{(result.stdout + result.stderr)[-3000:]}")

    def admin_client_arguments(self) -> dict[str, Any]:
        """aiokafka arguments of a super user at ``kafka_bootstrap`` (none: PLAINTEXT)."""
        if not self.security:
            return {}
        context = ssl.create_default_context(cafile=self.material.ca)
        return {
            "security_protocol": "SASL_SSL",
            "ssl_context": context,
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": ADMIN_USER,
            "sasl_plain_password": self.material.passwords[ADMIN_USER],
        }

    def log_tail(self, name: str, chars: int = 4000) -> str:
        """The end of a server's log file and of its console output (where a JVM that
        failed before logging was configured writes its stack trace)."""
        parts = []
        for path in (self._node_dir(name) / "server.log", self._node_dir(name) / "console.log"):
            if path.exists() and path.stat().st_size:
                parts.append(f"--- {path}\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts) or "(no log output)"

    # Internals ---------------------------------------------------------------------------

    def _new_state(self) -> ClusterState:
        nodes = [str(n) for n in self.node_ids()]
        ports = free_ports(2 + 4 * len(nodes))
        secured = bool(self.security)
        plaintext = ports[2 + 3 * len(nodes) :]
        return ClusterState(
            cluster_id=base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="),
            zookeeper_port=ports[0],
            kafka_ports={n: ports[2 + i] for i, n in enumerate(nodes)},
            controller_ports={n: ports[2 + len(nodes) + i] for i, n in enumerate(nodes)},
            security=self.security,
            mtls_ports={n: ports[2 + 2 * len(nodes) + i] for i, n in enumerate(nodes)}
            if secured
            else {},
            secure_zookeeper_port=ports[1] if secured else 0,
            plaintext_ports=dict(zip(nodes, plaintext, strict=True))
            if self._plaintext_listener
            else {},
        )

    def _spawn_zookeeper(self) -> None:
        installed = self._require_installed()
        state = self._require_state()
        node_dir = self._node_dir("zookeeper")
        (node_dir / "data").mkdir(parents=True, exist_ok=True)
        config = node_dir / "zoo.cfg"
        text = zookeeper_config(state.zookeeper_port, node_dir / "data")
        security_flags: list[str] = []
        if self.security:
            text += "\n".join(zookeeper_security_config(self.material, state.secure_zookeeper_port))
            text += "\n"
            jaas = node_dir / "jaas.conf"
            jaas.write_text(self.material.zookeeper_jaas())
            security_flags = zookeeper_jvm_flags(jaas)
        config.write_text(text)
        command = [
            installed.java,
            *ZOOKEEPER_HEAP,
            *JVM_FLAGS,
            *security_flags,
            *self._logging_flags(node_dir),
            "-cp",
            installed.zookeeper_classpath,
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            str(config),
        ]
        self._spawn("zookeeper", command, node_dir)

    def _spawn_kafka(self, node_id: int) -> None:
        installed = self._require_installed()
        state = self._require_state()
        name = f"kafka-{node_id}"
        node_dir = self._node_dir(name)
        log_dir = node_dir / "data"
        properties = node_dir / "server.properties"
        properties.parent.mkdir(parents=True, exist_ok=True)
        properties.write_text(self._kafka_properties(node_id, log_dir))
        if not (log_dir / "meta.properties").exists():
            self._format_storage(properties, node_dir)
        command = [
            installed.java,
            *KAFKA_HEAP,
            *JVM_FLAGS,
            *(kafka_jvm_flags(self.material) if self.security else []),
            *self._logging_flags(node_dir),
            "-cp",
            installed.kafka_classpath,
            "kafka.Kafka",
            str(properties),
        ]
        del state
        self._spawn(name, command, node_dir)

    def _kafka_properties(self, node_id: int, log_dir: Path) -> str:
        state = self._require_state()
        overrides: dict[str, object] = {}
        if self.security:
            node = str(node_id)
            overrides = kafka_security_properties(
                self.material,
                node_id,
                state.kafka_ports[node],
                state.mtls_ports[node],
                state.controller_ports[node],
                state.plaintext_ports.get(node),
            )
        return kafka_properties(
            node_id, state.kafka_ports, state.controller_ports, log_dir, overrides
        )

    def _format_storage(self, properties: Path, node_dir: Path) -> None:
        installed = self._require_installed()
        state = self._require_state()
        command = [
            installed.java,
            *JVM_FLAGS,
            *self._logging_flags(node_dir, "format.log"),
            "-cp",
            installed.kafka_classpath,
            "kafka.tools.StorageTool",
            "format",
            "--ignore-formatted",
            # One argument: an id is URL-safe base64 and may start with "-", which the
            # tool would take for an option (1 start in 64 failed).
            f"--cluster-id={state.cluster_id}",
            "-c",
            str(properties),
            *(self.material.scram_arguments() if self.security else []),
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise DevClusterError(
                f"kafka storage format failed for {node_dir.name}:\n"
                f"{(result.stdout + result.stderr)[-3000:]}"
            )

    def _logging_flags(self, node_dir: Path, file_name: str = "server.log") -> list[str]:
        config = self.work_dir / "log4j2.xml"
        if not config.exists():
            config.write_text(_LOG4J2_CONFIG)
        return [
            f"-Dlog4j2.configurationFile={config}",
            f"-Dordered.log.file={node_dir / file_name}",
            f"-Dkafka.logs.dir={node_dir}",
        ]

    def _spawn(self, name: str, command: list[str], node_dir: Path) -> None:
        state = self._require_state()
        node_dir.mkdir(parents=True, exist_ok=True)
        with (node_dir / "console.log").open("ab") as console:
            process = subprocess.Popen(
                command,
                cwd=node_dir,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        state.processes[name] = ProcessRecord(process.pid, _start_ticks(process.pid) or 0)
        self._save()

    def _signal(self, name: str, sig: signal.Signals) -> None:
        if not self._alive(name):
            return
        record = self._require_state().processes[name]
        # The process leads its own group (start_new_session): signal the group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, sig)

    def _wait_exit(self, name: str, deadline: float) -> None:
        while self._alive(name) and time.monotonic() < deadline:
            _reap(self._require_state().processes[name].pid)
            time.sleep(0.1)
        if self._alive(name):
            self._signal(name, signal.SIGKILL)
            while self._alive(name):
                _reap(self._require_state().processes[name].pid)
                time.sleep(0.05)
        self._require_state().processes.pop(name, None)

    def _alive(self, name: str) -> bool:
        if self.state is None or name not in self.state.processes:
            return False
        record = self.state.processes[name]
        _reap(record.pid)
        ticks = _start_ticks(record.pid)
        return ticks is not None and ticks == record.start_ticks

    def _wait_until(
        self, ready: Callable[[], bool], timeout: float, log_name: str, message: str
    ) -> None:
        wait_until(ready, timeout, message, lambda: self.log_tail(log_name))

    def _node_dir(self, name: str) -> Path:
        return self.work_dir / name

    def _save(self) -> None:
        if self.state is not None:
            self.state.save(self.work_dir / STATE_FILE)

    def _require_state(self) -> ClusterState:
        if self.state is None:
            raise DevClusterError(f"no cluster in {self.work_dir} (run 'devcluster up' first)")
        return self.state

    def _require_installed(self) -> InstalledServers:
        if self._installed is None:
            self._installed = ensure_installed()
        return self._installed


def zookeeper_config(port: int, data_dir: Path | str) -> str:
    """A standalone ZooKeeper's zoo.cfg, listening on 127.0.0.1:``port``."""
    return "\n".join(
        [
            f"dataDir={data_dir}",
            f"clientPort={port}",
            "clientPortAddress=127.0.0.1",
            "tickTime=500",
            # Sessions between 1 s and 20 s: fault tests expire them quickly.
            "minSessionTimeout=1000",
            "maxSessionTimeout=20000",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,stat",
            "maxClientCnxns=0",
            "",
        ]
    )


def kafka_properties(
    node_id: int,
    kafka_ports: Mapping[str, int],
    controller_ports: Mapping[str, int],
    log_dir: Path | str,
    overrides: Mapping[str, object] | None = None,
) -> str:
    """server.properties of combined broker/controller ``node_id`` of a KRaft cluster whose
    nodes listen on 127.0.0.1 at ``kafka_ports`` and ``controller_ports`` (by node id);
    ``overrides`` replace or add lines (a secured cluster's listeners)."""
    port = kafka_ports[str(node_id)]
    controller_port = controller_ports[str(node_id)]
    voters = ",".join(f"{node}@127.0.0.1:{p}" for node, p in controller_ports.items())
    replication = min(3, len(kafka_ports))
    settings = {
        "process.roles": "broker,controller",
        "node.id": node_id,
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": log_dir,
        "num.partitions": 1,
        "default.replication.factor": replication,
        "offsets.topic.replication.factor": replication,
        # Fewer internal partitions: the first group join on a 2-core box is faster.
        "offsets.topic.num.partitions": 10,
        "transaction.state.log.replication.factor": replication,
        "transaction.state.log.min.isr": min(2, replication),
        "transaction.state.log.num.partitions": 5,
        "share.coordinator.state.topic.replication.factor": replication,
        "share.coordinator.state.topic.min.isr": min(2, replication),
        "auto.create.topics.enable": "false",
        "delete.topic.enable": "true",
        "group.initial.rebalance.delay.ms": 0,
        # Compacted topics get cleaned within seconds in tests.
        "log.cleaner.backoff.ms": 1000,
        "log.cleaner.threads": 1,
        "num.network.threads": 2,
        "num.io.threads": 2,
        "num.replica.fetchers": 1,
        "background.threads": 2,
    }
    settings.update(overrides or {})
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def zookeeper_serving(port: int) -> bool:
    # `srvr`, not `ruok`: ZooKeeper answers `imok` as soon as it listens, even when its
    # server thread died while loading the database; `srvr` reports a mode only while
    # it serves requests.
    with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
        sock.sendall(b"srvr")
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    return b"Mode: " in answer


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time); None if the pid is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces: the fields after it follow the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def _reap(pid: int) -> None:
    # Collect the exit status of a child this process started, so it does not linger
    # as a zombie; harmless for processes started by another process.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


async def registered_brokers(bootstrap: str, **client: Any) -> set[int]:
    """The node ids of the brokers the cluster's metadata shows (registered, unfenced)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000, **client)
    try:
        await admin.start()
        description = await admin.describe_cluster()
        return {int(broker["node_id"]) for broker in description["brokers"]}
    finally:
        await admin.close()


def run_in_thread(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coroutine`` on a fresh event loop in a worker thread.

    The cluster's API is synchronous and is also called from async tests, where the
    calling thread already runs a loop.
    """
    results: list[_T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            results.append(asyncio.run(coroutine))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, name="devcluster-probe")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]
