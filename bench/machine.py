"""What runs on this machine besides the benchmark: CPU use of the processes involved,
and the local cluster's processes and ZooKeeper root."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient
from kazoo.client import KazooClient

from ordered_dev.devcluster.install import KAFKA_VERSION
from ordered_dev.devcluster.provider import ClusterEndpoints

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# CPU -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CpuShares:
    """CPU over one phase in % of one core (100 % x nproc is the whole machine)."""

    load_generator: float
    sidecars: float
    cluster: float | None
    rest: float

    def render(self) -> str:
        cluster = "-" if self.cluster is None else f"{self.cluster:.0f} %"
        return (
            f"load generator {self.load_generator:.0f} %, sidecars {self.sidecars:.0f} %, "
            f"cluster {cluster}, rest of machine {self.rest:.0f} %"
        )


class CpuMeter:
    """CPU time of this process, the sidecars, the cluster and the machine over a phase."""

    def __init__(self, sidecar_pids: Sequence[int], cluster_pids: Sequence[int]) -> None:
        self._sidecar_pids = list(sidecar_pids)
        self._cluster_pids = list(cluster_pids)
        self._began = time.monotonic()
        self._own = process_ticks(os.getpid())
        self._sidecars = sum(process_ticks(pid) for pid in self._sidecar_pids)
        self._cluster = sum(process_ticks(pid) for pid in self._cluster_pids)
        self._busy, self._total = machine_ticks()

    def read(self) -> CpuShares:
        seconds = max(1e-6, time.monotonic() - self._began)
        busy, all_ticks = machine_ticks()

        def percent(ticks: int) -> float:
            return ticks / CLOCK_TICKS / seconds * 100

        own = percent(process_ticks(os.getpid()) - self._own)
        sidecars = percent(sum(process_ticks(pid) for pid in self._sidecar_pids) - self._sidecars)
        cluster = percent(sum(process_ticks(pid) for pid in self._cluster_pids) - self._cluster)
        machine = (busy - self._busy) / max(1, all_ticks - self._total) * 100 * cores()
        rest = max(0.0, machine - own - sidecars - cluster)
        return CpuShares(own, sidecars, cluster if self._cluster_pids else None, rest)


def cores() -> int:
    return len(os.sched_getaffinity(0))


def process_ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks (0 once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    # Fields after the command name (which may hold spaces): utime and stime are 14, 15.
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def machine_ticks() -> tuple[int, int]:
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    all_ticks = sum(values[:8])
    return all_ticks - idle, all_ticks


# The cluster -----------------------------------------------------------------------------


def kafka_line(cluster: ClusterEndpoints) -> str:
    """What the result header says about the cluster."""
    line = f"{KAFKA_VERSION}, {cluster.broker_count} brokers ({cluster.kind} cluster)"
    return line + (" on loopback" if cluster.kind == "local" else "")


def cluster_pids(cluster: ClusterEndpoints) -> list[int]:
    if cluster.local is None:
        return []
    return [int(server["pid"]) for server in cluster.local.status().values() if server["pid"]]


def delete_root(hosts: str, root: str) -> None:
    """Remove the benchmark's ZooKeeper root (its managed topics' metadata)."""
    zookeeper = KazooClient(hosts=hosts)
    try:
        zookeeper.start(timeout=10)
        zookeeper.delete(root, recursive=True)
    except Exception as exc:  # cleanup only: report, never mask the results
        print(f"could not delete ZooKeeper root {root}: {exc!r}", file=sys.stderr)
    finally:
        zookeeper.stop()
        zookeeper.close()


async def remove_data(cluster: ClusterEndpoints, topics: Sequence[str], root: str) -> None:
    """Delete the benchmark's topics and ZooKeeper root; cleanup only: a failure is
    reported, never raised (it must not mask the results)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        await admin.start()
        await admin.delete_topics(list(topics))
    except Exception as exc:
        print(f"could not delete topics {list(topics)}: {exc!r}", file=sys.stderr)
    finally:
        await admin.close()
    delete_root(cluster.zookeeper_hosts, root)


def py_spy_path() -> str:
    """Where py-spy is: on the PATH, or in /tmp/tools/bin (``pip install --target
    /tmp/tools py-spy``: it is not a dependency). Raises RuntimeError when it is in
    neither; a benchmark asks before its first phase, not after its last."""
    py_spy = shutil.which("py-spy") or shutil.which("py-spy", path="/tmp/tools/bin")
    if py_spy is None:
        raise RuntimeError("profiling needs py-spy on the PATH (or in /tmp/tools/bin)")
    return py_spy
