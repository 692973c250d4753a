"""Install the servers the local cluster runs: Apache Kafka and ZooKeeper jars from Maven.

Each server's runtime classpath is resolved by Maven from a generated POM into
``<cache>/<server>-<version>/libs`` (the Maven repository itself in ``<cache>/m2``), so
a fresh machine needs only ``java`` and ``mvn``. A marker file is written after a
complete copy: an interrupted install is redone, a finished one costs nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ordered_dev.devcluster.errors import DevClusterError

# Kafka 4.3: the newest release line; aiokafka >= 0.13 negotiates API versions with
# it (Kafka 4 removed the pre-2.1 protocol versions older clients relied on).
KAFKA_VERSION = "4.3.0"
# ZooKeeper 3.9: current stable line; it holds only the sidecars' metadata.
ZOOKEEPER_VERSION = "3.9.4"
_LOG4J_VERSION = "2.24.3"
_SLF4J_VERSION = "2.0.17"

_KAFKA_DEPENDENCIES = [
    ("org.apache.kafka", "kafka_2.13", KAFKA_VERSION),
    # Kafka 4 logs through SLF4J 2 to log4j2; without these it would log nothing.
    ("org.slf4j", "slf4j-api", _SLF4J_VERSION),
    ("org.apache.logging.log4j", "log4j-slf4j2-impl", _LOG4J_VERSION),
    ("org.apache.logging.log4j", "log4j-core", _LOG4J_VERSION),
]
_ZOOKEEPER_DEPENDENCIES = [
    ("org.apache.zookeeper", "zookeeper", ZOOKEEPER_VERSION),
    # ZooKeeper's POM declares these "provided": its release tarball ships them, Maven
    # does not. The default metrics provider needs Dropwizard metrics; loading the
    # database at start needs snappy (the server dies without it, still listening).
    ("io.dropwizard.metrics", "metrics-core", "4.1.12.1"),
    ("org.xerial.snappy", "snappy-java", "1.1.10.5"),
    ("org.slf4j", "slf4j-api", _SLF4J_VERSION),
    ("org.apache.logging.log4j", "log4j-slf4j2-impl", _LOG4J_VERSION),
    ("org.apache.logging.log4j", "log4j-core", _LOG4J_VERSION),
]
_MARKER = ".complete"


@dataclass(frozen=True, slots=True)
class InstalledServers:
    """Where the servers' jars are, and which versions they are."""

    kafka_version: str
    kafka_libs: Path
    zookeeper_version: str
    zookeeper_libs: Path
    java: str

    @property
    def kafka_classpath(self) -> str:
        return str(self.kafka_libs / "*")

    @property
    def zookeeper_classpath(self) -> str:
        return str(self.zookeeper_libs / "*")


def cache_root() -> Path:
    """``$ORDERED_SIDECAR_CACHE``, default ``~/.cache/ordered-sidecar``."""
    configured = os.environ.get("ORDERED_SIDECAR_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "ordered-sidecar"


def ensure_installed(root: Path | None = None) -> InstalledServers:
    """Resolve both servers' jars if they are not installed yet.

    Raises DevClusterError if ``java`` or ``mvn`` is missing or Maven cannot resolve
    the artifacts (with the tail of Maven's output).
    """
    root = root or cache_root()
    java = shutil.which("java")
    if java is None:
        raise DevClusterError("java is not installed (Kafka and ZooKeeper need Java 17+)")
    kafka_libs = _ensure_libs(root, f"kafka-{KAFKA_VERSION}", _KAFKA_DEPENDENCIES)
    zookeeper_libs = _ensure_libs(root, f"zookeeper-{ZOOKEEPER_VERSION}", _ZOOKEEPER_DEPENDENCIES)
    return InstalledServers(
        kafka_version=KAFKA_VERSION,
        kafka_libs=kafka_libs,
        zookeeper_version=ZOOKEEPER_VERSION,
        zookeeper_libs=zookeeper_libs,
        java=java,
    )


def _ensure_libs(root: Path, name: str, dependencies: list[tuple[str, str, str]]) -> Path:
    libs = root / name / "libs"
    if (libs / _MARKER).exists():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DevClusterError("mvn is not installed: it resolves the server jars")
    if libs.exists():
        shutil.rmtree(libs)
    libs.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="ordered-sidecar-pom-") as work:
        pom = Path(work) / "pom.xml"
        pom.write_text(_pom(name, dependencies))
        command = [
            mvn,
            "-B",
            "-q",
            f"-Dmaven.repo.local={root / 'm2'}",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={libs}",
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-3000:]
        raise DevClusterError(f"maven could not resolve {name}:\n{tail}")
    (libs / _MARKER).write_text("ok\n")
    return libs


def _pom(name: str, dependencies: list[tuple[str, str, str]]) -> str:
    entries = "\n".join(
        f"    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
        f"<version>{version}</version></dependency>"
        for group, artifact, version in dependencies
    )
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.ordered-sidecar</groupId>
  <artifactId>{name}</artifactId>
  <version>1</version>
  <dependencies>
{entries}
  </dependencies>
</project>
"""
