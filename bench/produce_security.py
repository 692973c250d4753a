"""The produce benchmark's security row: what TLS and SASL cost the sidecar's produce.

Goal (from the issue): TLS and SASL cost at most 15 % of produce throughput.

One secured dev cluster (``ordered_dev.devcluster``, ``security="sasl_ssl"``, 3 brokers,
the brokers replicating to each other over mutual TLS) is started with a PLAINTEXT
listener beside its SASL_SSL one, so both paths write to the same brokers:

* **PLAINTEXT**: ``sidecar serve`` connected to the PLAINTEXT listener;
* **SASL_SSL**: another ``sidecar serve`` connected to the SASL_SSL listener, TLS with the
  cluster's CA and SCRAM-SHA-512 as ``sidecar``.

Both run at once, each with its own ZooKeeper root (plain ZooKeeper for both: the
comparison is Kafka's client security, and ZooKeeper is off the produce path), and each
writes a managed topic of 6 partitions, RF 3, with the main table's load: REST Proxy v2
binary bodies of ``--batch`` records on ``--connections`` connections. Throughput is
measured alternately, the order reversed every other round; the ratio is the median of
the per-round ratios SASL_SSL / PLAINTEXT, and the cost is 1 - ratio. Latency is one
record at a time, each waited for. The cluster always starts here (its certificates and
users are made with it), in a temporary directory, and stops at the end; an external
cluster named by the environment is not used.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from bench.machine import CpuMeter, cluster_pids
from bench.produce import (
    PARTITIONS,
    Plan,
    Sidecar,
    ThroughputRun,
    create_managed_topic,
    make_workload,
    percentile,
    sidecar_latency,
    sidecar_process,
    sidecar_throughput,
)
from bench.report import markdown_table
from ordered_dev.devcluster.cluster import LocalCluster
from ordered_dev.devcluster.install import KAFKA_VERSION
from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.devcluster.security import SIDECAR_USER
from sidecar.config import KafkaSecuritySettings, Secret

BROKERS = 3
"""As the main rows' cluster: replication factor 3."""
PLAINTEXT, SASL_SSL = "PLAINTEXT", "SASL_SSL (SCRAM-SHA-512)"
SECURITY_PATHS = (PLAINTEXT, SASL_SSL)
GOAL_COST = 0.15
"""At most this share of the PLAINTEXT throughput may go to TLS and SASL."""


@dataclass
class SecurityResult:
    size: int
    throughput: dict[str, list[ThroughputRun]] = field(
        default_factory=lambda: {path: [] for path in SECURITY_PATHS}
    )
    latency: dict[str, list[float]] = field(
        default_factory=lambda: {path: [] for path in SECURITY_PATHS}
    )

    def ratios(self) -> list[float]:
        """SASL_SSL / PLAINTEXT throughput of each round (its two runs ran back to back)."""
        return [
            secured.per_second / plain.per_second
            for secured, plain in zip(
                self.throughput[SASL_SSL], self.throughput[PLAINTEXT], strict=True
            )
        ]


def endpoints(cluster: LocalCluster) -> dict[str, ClusterEndpoints]:
    """How each path's sidecar reaches ``cluster``."""
    material = cluster.material
    plain = ClusterEndpoints(
        "local", cluster.plaintext_bootstrap, cluster.zookeeper_hosts, BROKERS, local=cluster
    )
    secured = KafkaSecuritySettings(
        protocol="SASL_SSL",
        ssl_cafile=material.ca,
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username=SIDECAR_USER,
        sasl_password=Secret(material.passwords[SIDECAR_USER]),
    )
    return {
        PLAINTEXT: plain,
        SASL_SSL: replace(plain, kafka_bootstrap=cluster.kafka_bootstrap, kafka_security=secured),
    }


async def run_security(plan: Plan, log: IO[bytes]) -> tuple[list[SecurityResult], str]:
    """Both paths over every record size of ``plan``; the sidecars' stderr goes to ``log``."""
    suffix = uuid.uuid4().hex[:8]
    results: list[SecurityResult] = []
    with tempfile.TemporaryDirectory(prefix="bench-secured-") as directory:
        cluster = LocalCluster(
            Path(directory), broker_count=BROKERS, security="sasl_ssl", plaintext_listener=True
        )
        print(f"starting a secured cluster of {BROKERS} brokers in {directory}", flush=True)
        try:
            await asyncio.to_thread(cluster.start, 240.0)
            reach = endpoints(cluster)
            pids = cluster_pids(reach[PLAINTEXT])
            async with contextlib.AsyncExitStack() as stack:
                sidecars: dict[str, Sidecar] = {}
                topics: dict[str, str] = {}
                for path, name in ((PLAINTEXT, "plaintext"), (SASL_SSL, "sasl-ssl")):
                    sidecars[path] = await stack.enter_async_context(
                        sidecar_process(
                            reach[path], f"/bench-{name}-{suffix}", log, plan.connections
                        )
                    )
                    topics[path] = f"bench-{name}-{suffix}"
                    await create_managed_topic(sidecars[path], topics[path], min(3, BROKERS))
                await _warm_up(plan, sidecars, topics, pids)
                for size in plan.sizes:
                    result = SecurityResult(size)
                    results.append(result)
                    await _measure_size(plan, result, sidecars, topics, pids)
        finally:
            await asyncio.to_thread(cluster.stop)
    kafka = f"{KAFKA_VERSION}, {BROKERS} brokers (local secured cluster, PLAINTEXT and SASL_SSL)"
    return results, kafka


async def _throughput(
    sidecar: Sidecar, topic: str, size: int, seconds: float, plan: Plan, pids: Sequence[int]
) -> ThroughputRun:
    meter = CpuMeter([sidecar.pid], pids)
    workload = make_workload(size, plan.batch)
    run = await sidecar_throughput(sidecar, topic, workload, seconds, plan.connections)
    return replace(run, cpu=meter.read())


async def _warm_up(
    plan: Plan, sidecars: dict[str, Sidecar], topics: dict[str, str], pids: Sequence[int]
) -> None:
    # A fresh broker JVM is several times slower for its first seconds (JIT); TLS code
    # paths too: both paths are loaded before anything counts.
    print(f"warming up the secured cluster for {plan.cluster_warmup_s:g} s", flush=True)
    for path in SECURITY_PATHS:
        slice_s = plan.cluster_warmup_s / len(SECURITY_PATHS)
        await _throughput(sidecars[path], topics[path], plan.sizes[0], slice_s, plan, pids)


async def _measure_size(
    plan: Plan,
    result: SecurityResult,
    sidecars: dict[str, Sidecar],
    topics: dict[str, str],
    pids: Sequence[int],
) -> None:
    print(f"{result.size} B records, PLAINTEXT against SASL_SSL", flush=True)
    for path in SECURITY_PATHS:
        await _throughput(sidecars[path], topics[path], result.size, plan.warmup_s, plan, pids)
    workload = make_workload(result.size, plan.batch)
    for round_index in range(plan.rounds):
        order = list(SECURITY_PATHS) if round_index % 2 == 0 else list(reversed(SECURITY_PATHS))
        for path in order:
            run = await _throughput(
                sidecars[path], topics[path], result.size, plan.throughput_s, plan, pids
            )
            result.throughput[path].append(run)
            print(f"  {path} throughput: {run.per_second:,.0f} records/s", flush=True)
        for path in order:
            result.latency[path] += await sidecar_latency(
                sidecars[path],
                topics[path],
                workload,
                plan.latency_s / plan.rounds,
                plan.latency_max_samples // plan.rounds,
            )
    ratio = statistics.median(result.ratios())
    print(
        f"  SASL_SSL / PLAINTEXT throughput: {ratio:.2f} (cost {1 - ratio:.0%}, "
        f"goal at most {GOAL_COST:.0%})",
        flush=True,
    )


def render_security(results: Sequence[SecurityResult], plan: Plan) -> list[str]:
    summary_rows = []
    throughput_rows = []
    for result in results:
        size = f"{result.size} B"
        ratios = result.ratios()
        ratio = statistics.median(ratios)
        spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
        p50 = {path: percentile(result.latency[path], 0.5) * 1e3 for path in SECURITY_PATHS}
        summary_rows.append(
            [
                size,
                f"{ratio:.2f}{spread}",
                f"{1 - ratio:.0%}",
                "met" if 1 - ratio <= GOAL_COST else "NOT met",
                f"{p50[PLAINTEXT]:.2f} → {p50[SASL_SSL]:.2f} ms",
            ]
        )
        for path in SECURITY_PATHS:
            runs = result.throughput[path]
            cpu = [run.cpu for run in runs if run.cpu is not None]
            throughput_rows.append(
                [
                    size,
                    path,
                    f"{statistics.median(run.per_second for run in runs):,.0f}",
                    ", ".join(f"{run.per_second:,.0f}" for run in runs),
                    str(sum(run.failed for run in runs)),
                    f"{statistics.fmean(c.sidecars for c in cpu):.0f} %" if cpu else "-",
                    f"{statistics.fmean(c.cluster or 0.0 for c in cpu):.0f} %" if cpu else "-",
                ]
            )
    in_flight = plan.connections * plan.batch
    return [
        "## Security: managed produce over SASL_SSL against PLAINTEXT, same cluster, same run",
        "",
        f"Goal: TLS and SASL cost at most {GOAL_COST:.0%} of produce throughput. One secured "
        f"cluster of {BROKERS} brokers with both listeners; a sidecar on each, {in_flight} "
        f"records in flight each ({plan.connections} x {plan.batch}), {PARTITIONS} "
        f"partitions, RF 3; {plan.rounds} x {plan.throughput_s:g} s per path, alternating.",
        "",
        *markdown_table(
            [
                "record size",
                "throughput SASL_SSL / PLAINTEXT",
                "cost",
                f"goal (at most {GOAL_COST:.0%})",
                "p50 PLAINTEXT → SASL_SSL",
            ],
            summary_rows,
        ),
        "",
        *markdown_table(
            [
                "record size",
                "path",
                "records/s (median)",
                "each round",
                "failed",
                "sidecar CPU",
                "cluster CPU",
            ],
            throughput_rows,
        ),
    ]
