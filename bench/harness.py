"""What the expansion, consume and gate benchmarks share: several ``sidecar serve``
processes under one ZooKeeper root, their /metrics, CPU shares, and cleanup.

``bench.produce`` starts one sidecar process (``sidecar_process``); this module starts
as many as a benchmark needs with the same helper, so every benchmark runs the sidecar
exactly as a deployment would (its own process, its own event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import statistics
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.machine import py_spy_path
from bench.produce import ADMIN_TOKEN, Sidecar, percentile, sidecar_process
from ordered_dev.devcluster.provider import ClusterEndpoints

CONSUMER_V2 = "application/vnd.kafka.v2+json"
BINARY_V2 = "application/vnd.kafka.binary.v2+json"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MIB = 1024 * 1024


@contextlib.asynccontextmanager
async def sidecars(
    cluster: ClusterEndpoints, root: str, count: int, log: IO[bytes], connections: int
) -> AsyncIterator[list[Sidecar]]:
    """``count`` sidecar processes sharing ZooKeeper root ``root`` (one deployment),
    each with an HTTP client of ``connections`` connections; all stopped at the end."""
    async with contextlib.AsyncExitStack() as stack:
        started = [
            await stack.enter_async_context(sidecar_process(cluster, root, log, connections))
            for _ in range(count)
        ]
        yield started


async def admin_call(
    sidecar: Sidecar, method: str, path: str, body: Mapping[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    """One admin API call with the benchmark's token: (status, JSON body)."""
    async with sidecar.http.request(method, path, json=body, headers=ADMIN_HEADERS) as response:
        return response.status, await response.json(content_type=None)


async def create_topic(
    sidecar: Sidecar,
    topic: str,
    partitions: int,
    replication_factor: int,
    *,
    compacted: bool = False,
) -> None:
    """A managed topic, created through the admin API (ordered delivery on)."""
    body = {
        "name": topic,
        "partitions": partitions,
        "replication_factor": replication_factor,
        "compacted": compacted,
    }
    status, answer = await admin_call(sidecar, "POST", "/admin/topics", body)
    if status != 201:
        raise RuntimeError(f"creating {topic}: {status} {answer}")


# Metrics ---------------------------------------------------------------------------------

SampleKey = tuple[str, frozenset[tuple[str, str]]]
"""A Prometheus sample: its name (with _bucket/_sum/_count) and its labels."""


async def scrape(sidecar: Sidecar) -> dict[SampleKey, float]:
    """Every sample of the sidecar's /metrics."""
    async with sidecar.http.get("/metrics") as response:
        return parse_samples(await response.text())


def parse_samples(text: str) -> dict[SampleKey, float]:
    """Every sample of a Prometheus text exposition."""
    samples: dict[SampleKey, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = float(sample.value)
    return samples


def select(
    samples: Mapping[SampleKey, float], name: str, **labels: str
) -> dict[frozenset[tuple[str, str]], float]:
    """The samples named ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return {key[1]: value for key, value in samples.items() if key[0] == name and wanted <= key[1]}


def total(samples: Mapping[SampleKey, float], name: str, **labels: str) -> float:
    return sum(select(samples, name, **labels).values())


@dataclass(frozen=True, slots=True)
class BucketCounts:
    """A Prometheus histogram summed over sidecars: cumulative count per upper bound."""

    cumulative: tuple[tuple[float, float], ...]  # (le, count), ascending le, +Inf last
    count: float
    sum: float

    def quantile(self, fraction: float) -> float:
        """The upper bound of the bucket holding the ``fraction`` quantile (so the true
        value is at most this); +Inf when it lies beyond the largest bound."""
        if self.count == 0:
            return float("nan")
        rank = fraction * self.count
        for bound, cumulative in self.cumulative:
            if cumulative >= rank:
                return bound
        return float("inf")

    @property
    def maximum(self) -> float:
        """Upper bound of the highest non-empty bucket."""
        return self.quantile(1.0)

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else float("nan")


def histogram(
    scrapes: Sequence[Mapping[SampleKey, float]], name: str, **labels: str
) -> BucketCounts:
    """Histogram ``name`` (with ``labels``) summed over several sidecars' scrapes."""
    parts = []
    for samples in scrapes:
        buckets = tuple(
            (float(dict(key)["le"]), value)
            for key, value in select(samples, f"{name}_bucket", **labels).items()
        )
        parts.append(
            BucketCounts(
                buckets,
                total(samples, f"{name}_count", **labels),
                total(samples, f"{name}_sum", **labels),
            )
        )
    return merge(parts)


def merge(parts: Sequence[BucketCounts]) -> BucketCounts:
    """Histograms added bucket by bucket (several sidecars, several topics)."""
    by_bound: dict[float, float] = {}
    for part in parts:
        for bound, count in part.cumulative:
            by_bound[bound] = by_bound.get(bound, 0.0) + count
    return BucketCounts(
        tuple(sorted(by_bound.items())), sum(p.count for p in parts), sum(p.sum for p in parts)
    )


# Summaries -------------------------------------------------------------------------------


def milliseconds(seconds: float) -> str:
    if seconds != seconds:  # NaN: no samples
        return "-"
    if seconds == float("inf"):
        return "> max bucket"
    return f"{seconds * 1e3:,.0f}"


def spread(samples: Sequence[float]) -> tuple[float, float, float, float]:
    """(p50, p95, p99, max) of ``samples`` (NaN when empty)."""
    if not samples:
        nan = float("nan")
        return nan, nan, nan, nan
    return (
        percentile(samples, 0.5),
        percentile(samples, 0.95),
        percentile(samples, 0.99),
        max(samples),
    )


def mean(samples: Sequence[float]) -> float:
    return statistics.fmean(samples) if samples else float("nan")


# REST consumers --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Poll:
    """One records response: records and hand-off events, and when it arrived."""

    records: list[dict[str, Any]]
    events: list[dict[str, Any]]
    arrived: float


@dataclass(frozen=True, slots=True)
class RestConsumer:
    """A REST Proxy v2 consumer instance, as an app would drive it."""

    sidecar: Sidecar
    group: str
    name: str

    @property
    def path(self) -> str:
        return f"/consumers/{self.group}/instances/{self.name}"

    @classmethod
    async def create(
        cls, sidecar: Sidecar, group: str, name: str, **config: object
    ) -> RestConsumer:
        """``POST /consumers/{group}``; ``config`` adds to binary format, earliest reset."""
        body = {"name": name, "format": "binary", "auto.offset.reset": "earliest"} | config
        async with sidecar.http.post(
            f"/consumers/{group}", data=json.dumps(body), headers={"Content-Type": CONSUMER_V2}
        ) as response:
            if response.status != 200:
                raise RuntimeError(f"creating {group}/{name}: {await response.text()}")
        return cls(sidecar, group, name)

    async def call(
        self, method: str, suffix: str, body: object | None = None, **params: str
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        async with self.sidecar.http.request(
            method,
            self.path + suffix,
            data=data,
            headers={"Content-Type": CONSUMER_V2},
            params=params,
        ) as response:
            raw = await response.read()
            return response.status, (json.loads(raw) if raw else None)

    async def expect(
        self, method: str, suffix: str, body: object | None = None, status: int = 204
    ) -> Any:
        got, answer = await self.call(method, suffix, body)
        if got != status:
            raise RuntimeError(f"{method} {self.path}{suffix}: {got} {answer}")
        return answer

    async def subscribe(self, *topics: str) -> None:
        await self.expect("POST", "/subscription", {"topics": list(topics)})

    async def assign(self, topic: str, *partitions: int) -> None:
        body = {"partitions": [{"topic": topic, "partition": p} for p in partitions]}
        await self.expect("POST", "/assignments", body)

    async def assignment(self) -> list[tuple[str, int]]:
        answer = await self.expect("GET", "/assignments", status=200)
        return [(entry["topic"], entry["partition"]) for entry in answer["partitions"]]

    async def poll(self, max_bytes: int | None = None) -> Poll:
        """One ``GET records`` (waiting up to the instance's request timeout)."""
        params = {} if max_bytes is None else {"max_bytes": str(max_bytes)}
        async with self.sidecar.http.get(
            self.path + "/records", params=params, headers={"Accept": BINARY_V2}
        ) as response:
            raw = await response.read()
            if response.status != 200:
                raise RuntimeError(f"GET {self.path}/records: {response.status} {raw[:300]!r}")
        arrived = time.monotonic()
        items: list[dict[str, Any]] = json.loads(raw)
        events = [item for item in items if "type" in item]
        records = [item for item in items if "type" not in item] if events else items
        return Poll(records, events, arrived)

    async def ack(self, events: Sequence[Mapping[str, Any]]) -> None:
        await self.expect("POST", "/events/ack", {"event_ids": [e["event_id"] for e in events]})

    async def commit(self) -> tuple[int, Any]:
        """Commit everything delivered (no body), as REST Proxy v2 does."""
        return await self.call("POST", "/offsets")

    async def delete(self) -> None:
        with contextlib.suppress(aiohttp.ClientError):
            await self.call("DELETE", "")


# Profiling -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def profiled(processes: Mapping[str, int], output: Path | None) -> AsyncIterator[None]:
    """py-spy on each of ``processes`` (name -> pid) while the block runs, raw stacks
    into ``output``/<name>.txt (a directory that exists); nothing if ``output`` is None.
    py-spy is not a dependency: ``pip install --target /tmp/tools py-spy``."""
    if output is None:
        yield
        return
    py_spy = py_spy_path()
    spies = [
        await asyncio.create_subprocess_exec(
            py_spy,
            "record",
            "--pid",
            str(pid),
            "--rate",
            "100",
            "--format",
            "raw",
            "--output",
            str(output / f"{name}.txt"),
            "--nonblocking",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        for name, pid in processes.items()
    ]
    try:
        yield
    finally:
        for spy in spies:
            if spy.returncode is None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its output and exits
        for spy in spies:
            await spy.wait()
