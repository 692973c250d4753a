"""Produce throughput and latency: the sidecar over HTTP against a direct aiokafka client.

Run from the repository root::

    .venv/bin/python -m bench.produce [--quick] [--no-java] [--profile FILE] [--only PART]

``--only main`` measures the rows below, ``--only security`` only the security row
(``bench.produce_security``: managed produce over SASL_SSL with SCRAM against PLAINTEXT,
on a secured cluster of its own); without it one run measures both, the security row
last, once the main cluster has stopped.

Both paths are measured in the same run, against the same cluster, alternating, so the
ratio between them is meaningful even where the absolute figures are not (the load
generator, the sidecar and three brokers share this machine's cores):

* **direct**: one ``AIOKafkaProducer`` (acks=all, idempotent, batches of up to
  ``PRODUCER_BATCH_BYTES`` as the sidecar's own producers, aiokafka's defaults
  otherwise) writing keyed records to a plain topic of 6 partitions, replication
  factor 3;
* **sidecar**: ``sidecar serve`` as its own process, writing to a managed topic of 6
  partitions, replication factor 3, fed over HTTP (REST Proxy v2 binary format); managed
  topics are written in Kafka transactions (DESIGN §5, fencing);
* **sidecar, unmanaged topic**: the same process passing records through to a plain
  topic with its idempotent producer, no transactions, no ZooKeeper: what the managed
  path costs on top of the sidecar's HTTP and JSON work;
* **direct transactional**: the sidecar's own ``TransactionalWriter`` in this process,
  with the same requests in flight as the sidecar gets over HTTP: what transactions cost
  a Kafka client, without HTTP;
* **sidecar, REST Proxy v3, one record per request**: the managed topic again, each
  request one v3 record (``POST /v3/clusters/{id}/topics/{t}/records``), as many
  requests at once as the v2 path has records in flight, each on its own connection;
* **sidecar, REST Proxy v3 streaming**: the managed topic over ``--connections``
  chunked v3 requests kept open, each with ``--batch`` records sent and not yet
  answered (the same records in flight as the v2 path);
* **wide window**: direct aiokafka with ``wide_window`` (4,000) sends in flight, and the
  sidecar and the direct transactional writer with as many records in flight in
  requests of ``--batch`` (40 x 100): where concurrency is high enough that latency no
  longer bounds throughput, what the managed path keeps of the direct client's rate and
  of its own writer's;
* optionally Kafka's own Java ``ProducerPerformance`` (same producer settings) as the
  ceiling of what the cluster takes from one client here.

Throughput keeps a fixed number of records in flight (direct: ``--window`` send()
futures; sidecar: ``--connections`` concurrent requests of ``--batch`` records each;
by default both 400). Latency is one record at a time, each waited for, with keys
spread over the partitions; two more latency rows (sidecar, direct transactional) write
every record with **one key**, as an app that updates one entity in a row does: each
transaction then goes to the partition the one before it just committed in.

The cluster is ``ordered_dev.devcluster.provider.provide_cluster()``: an external one when
``SIDECAR_TEST_KAFKA_BOOTSTRAP`` and ``SIDECAR_TEST_ZOOKEEPER_HOSTS`` are set, otherwise
a fresh local ZooKeeper + 3 KRaft brokers, stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import random
import re
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import aiohttp
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.machine import (
    CpuMeter,
    CpuShares,
    cluster_pids,
    cores,
    delete_root,
    kafka_line,
    py_spy_path,
)
from bench.report import markdown_table, measure_and_write
from ordered_dev.devcluster.install import (
    _SLF4J_VERSION,
    KAFKA_VERSION,
    _ensure_libs,
    cache_root,
    ensure_installed,
)
from ordered_dev.devcluster.provider import ClusterEndpoints, provide_cluster
from ordered_dev.harness.sidecars import terminate
from ordered_dev.harness.tools import free_port
from sidecar.adapters.kafka import OutgoingKafkaRecord, SentRecord
from sidecar.adapters.kafka.clients import PRODUCER_BATCH_BYTES
from sidecar.adapters.transactions import TransactionalWriter
from sidecar.config import KafkaSecuritySettings, KafkaSettings, Secret
from sidecar.core.procedures import incarnation_ids

if TYPE_CHECKING:
    from bench.produce_security import SecurityResult

    AllResults = tuple[list["SizeResult"], list[SecurityResult]]

PARTITIONS = 6
KEY_BYTES = 16
BINARY_V2 = "application/vnd.kafka.binary.v2+json"
ADMIN_TOKEN = f"bench-{uuid.uuid4().hex}"
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Plan:
    """How long and how hard each phase runs."""

    sizes: tuple[int, ...]
    rounds: int
    warmup_s: float
    throughput_s: float
    latency_s: float
    latency_max_samples: int
    connections: int
    batch: int
    window: int
    wide_window: int
    cluster_warmup_s: float
    java_records: dict[int, int]

    @property
    def wide_connections(self) -> int:
        """Requests of ``batch`` records in flight that make ``wide_window`` records."""
        return max(1, self.wide_window // self.batch)


FULL = Plan(
    sizes=(100, 1024),
    rounds=4,
    warmup_s=3.0,
    throughput_s=5.0,
    latency_s=8.0,
    latency_max_samples=2_000,
    connections=4,
    batch=100,
    window=400,
    wide_window=4_000,
    cluster_warmup_s=40.0,
    java_records={100: 1_000_000, 1024: 250_000},
)
QUICK = Plan(
    sizes=(100, 1024),
    rounds=1,
    warmup_s=1.0,
    throughput_s=3.0,
    latency_s=2.0,
    latency_max_samples=500,
    connections=4,
    batch=100,
    window=400,
    wide_window=4_000,
    cluster_warmup_s=6.0,
    java_records={100: 200_000, 1024: 80_000},
)


# Measuring -------------------------------------------------------------------------------


@dataclass
class Tally:
    acked: int = 0
    failed: int = 0
    first_error: str = ""

    def fail(self, count: int, error: str) -> None:
        self.failed += count
        self.first_error = self.first_error or error


@dataclass(frozen=True, slots=True)
class ThroughputRun:
    records: int
    failed: int
    seconds: float
    first_error: str = ""
    cpu: CpuShares | None = None
    requests: int = 0
    """Requests answered (writes, for the direct transactional writer); 0 where records
    are not sent in requests."""
    transactions: int | None = None
    """Transactions committed meanwhile, where the path writes in transactions."""

    @property
    def per_second(self) -> float:
        return self.records / self.seconds

    @property
    def requests_per_transaction(self) -> float | None:
        if not self.transactions:
            return None
        return self.requests / self.transactions


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of ``samples``."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.5)))
    return ordered[rank - 1]


# Workload --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Workload:
    """Pre-built records and request bodies of one record size (built before timing)."""

    size: int
    records: list[tuple[bytes, bytes]]
    batch_bodies: list[bytes]
    single_bodies: list[bytes]
    v3_records: list[bytes]
    """Each record as one REST Proxy v3 JSON object (BINARY key and value)."""

    def one_key(self) -> Workload:
        """The same values, every record with the first record's key (single bodies)."""
        key = self.records[0][0]
        records = [(key, value) for _, value in self.records[: len(self.single_bodies)]]
        return dataclasses.replace(
            self, records=records, single_bodies=[_records_body([r]) for r in records]
        )


def _records_body(chunk: Sequence[tuple[bytes, bytes]]) -> bytes:
    """A REST Proxy v2 binary produce body of ``chunk``."""
    encoded = [
        {"key": base64.b64encode(key).decode(), "value": base64.b64encode(value).decode()}
        for key, value in chunk
    ]
    return json.dumps({"records": encoded}).encode()


def make_workload(size: int, batch: int, bodies: int = 64) -> Workload:
    rng = random.Random(size)
    records = [
        (f"key-{index:012d}".encode(), rng.randbytes(size)) for index in range(batch * bodies)
    ]

    return Workload(
        size=size,
        records=records,
        batch_bodies=[_records_body(records[i : i + batch]) for i in range(0, len(records), batch)],
        single_bodies=[_records_body([record]) for record in records[:bodies]],
        v3_records=[
            json.dumps(
                {
                    "key": {"type": "BINARY", "data": base64.b64encode(key).decode()},
                    "value": {"type": "BINARY", "data": base64.b64encode(value).decode()},
                }
            ).encode()
            for key, value in records
        ],
    )


# Direct aiokafka -------------------------------------------------------------------------


async def direct_throughput(
    producer: Any, topic: str, workload: Workload, seconds: float, window: int
) -> ThroughputRun:
    """Keep ``window`` records in flight for ``seconds``, then flush; count the acked ones."""
    slots = asyncio.Semaphore(window)
    tally = Tally()

    in_flight: set[asyncio.Future[Any]] = set()

    def settled(future: asyncio.Future[Any]) -> None:
        slots.release()
        in_flight.discard(future)
        if future.cancelled():
            tally.fail(1, "cancelled")
        elif (exc := future.exception()) is not None:
            tally.fail(1, repr(exc))
        else:
            tally.acked += 1

    records = workload.records
    began = time.perf_counter()
    deadline = began + seconds
    index = 0
    while time.perf_counter() < deadline:
        await slots.acquire()
        key, value = records[index % len(records)]
        index += 1
        future = await producer.send(topic, value=value, key=key)
        in_flight.add(future)
        future.add_done_callback(settled)
    if in_flight:
        await asyncio.wait(set(in_flight))
    elapsed = time.perf_counter() - began
    return ThroughputRun(tally.acked, tally.failed, elapsed, tally.first_error)


async def direct_latency(
    producer: Any, topic: str, workload: Workload, seconds: float, max_samples: int
) -> list[float]:
    """Seconds per ``send_and_wait`` of one record, one at a time."""
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline and len(samples) < max_samples:
        key, value = workload.records[len(samples) % len(workload.records)]
        began = time.perf_counter()
        await producer.send_and_wait(topic, value=value, key=key)
        samples.append(time.perf_counter() - began)
    return samples


# The transactional writer in-process ------------------------------------------------------


async def transactional_throughput(
    writer: TransactionalWriter,
    topic: str,
    workload: Workload,
    seconds: float,
    connections: int,
    batch: int,
) -> ThroughputRun:
    """``connections`` writers each writing ``batch`` records back to back, as the sidecar's
    HTTP requests reach its writer."""
    tally = Tally()
    records = [
        OutgoingKafkaRecord(index % PARTITIONS, key, value, [])
        for index, (key, value) in enumerate(workload.records)
    ]
    chunks = [records[i : i + batch] for i in range(0, len(records), batch)]

    async def write(index: int) -> None:
        result = await writer.write(topic, chunks[index % len(chunks)])
        for outcome in result.outcomes:
            if isinstance(outcome, SentRecord):
                tally.acked += 1
            else:
                tally.fail(1, outcome.message)

    return await _requests_in_flight(write, tally, seconds, connections)


async def _requests_in_flight(
    request: Callable[[int], Awaitable[None]], tally: Tally, seconds: float, connections: int
) -> ThroughputRun:
    """``connections`` workers each making ``request(index)`` back to back for ``seconds``."""
    began = time.perf_counter()
    deadline = began + seconds
    requests = 0

    async def worker(first: int) -> None:
        nonlocal requests
        index = first
        while time.perf_counter() < deadline:
            await request(index)
            requests += 1
            index += connections

    await asyncio.gather(*(worker(k) for k in range(connections)))
    elapsed = time.perf_counter() - began
    return ThroughputRun(tally.acked, tally.failed, elapsed, tally.first_error, requests=requests)


async def transactional_latency(
    writer: TransactionalWriter, topic: str, workload: Workload, seconds: float, max_samples: int
) -> list[float]:
    """Seconds per write of one record (one transaction each), one at a time."""
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline and len(samples) < max_samples:
        key, value = workload.records[len(samples) % len(workload.records)]
        began = time.perf_counter()
        result = await writer.write(topic, [OutgoingKafkaRecord(0, key, value, [])])
        samples.append(time.perf_counter() - began)
        if not isinstance(result.outcomes[0], SentRecord):
            raise RuntimeError(f"a transactional write failed: {result.outcomes[0]}")
    return samples


# The sidecar over HTTP -------------------------------------------------------------------


@dataclass
class Sidecar:
    url: str
    pid: int
    process: asyncio.subprocess.Process
    http: aiohttp.ClientSession = field(repr=False)
    ops_url: str = ""
    """Its operations listener (``/metrics``)."""
    cluster_id: str = ""
    """Kafka's cluster id, as REST Proxy v3 paths name it."""

    async def transactions_committed(self) -> int:
        """``sidecar_transactions_total{outcome="committed"}`` as it stands."""
        async with self.http.get(f"{self.ops_url}/metrics") as response:
            text = await response.text()
        found = _COMMITTED.search(text)
        return int(float(found.group(1))) if found else 0


_COMMITTED = re.compile(r'^sidecar_transactions_total\{outcome="committed"\} (\S+)$', re.M)


@contextlib.asynccontextmanager
async def sidecar_process(
    cluster: ClusterEndpoints, root: str, log: IO[bytes], connections: int
) -> AsyncIterator[Sidecar]:
    """``sidecar serve`` as its own process on a free port; SIGTERM at the end."""
    ops_port = free_port()
    env = dict(os.environ)
    env |= {
        "ORDERED_SIDECAR__KAFKA__BOOTSTRAP_SERVERS": cluster.kafka_bootstrap,
        "ORDERED_SIDECAR__ZOOKEEPER__HOSTS": cluster.zookeeper_hosts,
        "ORDERED_SIDECAR__ZOOKEEPER__ROOT": root,
        "ORDERED_SIDECAR__HTTP__PORT": "0",
        # Several sidecars run side by side: the operations listener's default port
        # (8081) would be taken by the first.
        "ORDERED_SIDECAR__HTTP__OPS_PORT": str(ops_port),
        "ORDERED_SIDECAR__HTTP__ADMIN_ENABLED": "true",
        "ORDERED_SIDECAR__HTTP__ADMIN_TOKEN": ADMIN_TOKEN,
        **kafka_security_environment(cluster.kafka_security),
    }
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("sidecar")),
        "serve",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 90)).decode()
        if " ready on " not in line:
            raise RuntimeError(f"the sidecar did not start (see its log {log.name}): {line!r}")
        url = line.rsplit(" ", 1)[1].strip()
        connector = aiohttp.TCPConnector(limit=connections)
        async with aiohttp.ClientSession(url, connector=connector) as http:
            async with http.get("/v3/clusters") as response:
                cluster_id = (await response.json())["data"][0]["cluster_id"]
            ops_url = f"http://127.0.0.1:{ops_port}"
            yield Sidecar(url, process.pid, process, http, ops_url, cluster_id)
    finally:
        await terminate(process)


def kafka_security_environment(security: KafkaSecuritySettings) -> dict[str, str]:
    """``security`` as the ``ORDERED_SIDECAR__KAFKA__SECURITY__*`` variables ``sidecar
    serve`` reads (the settings that differ from the defaults)."""
    defaults = KafkaSecuritySettings()
    env = {}
    for setting in dataclasses.fields(security):
        value = getattr(security, setting.name)
        if value == getattr(defaults, setting.name):
            continue
        if isinstance(value, Secret):
            text = value.reveal()
        elif isinstance(value, bool):
            text = str(value).lower()
        else:
            text = str(value)
        env[f"ORDERED_SIDECAR__KAFKA__SECURITY__{setting.name.upper()}"] = text
    return env


async def create_managed_topic(sidecar: Sidecar, topic: str, replication_factor: int) -> None:
    body = {"name": topic, "partitions": PARTITIONS, "replication_factor": replication_factor}
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with sidecar.http.post("/admin/topics", json=body, headers=headers) as response:
        if response.status != 201:
            raise RuntimeError(f"creating {topic}: {response.status} {await response.text()}")


async def _post(sidecar: Sidecar, topic: str, body: bytes) -> tuple[int, dict[str, Any]]:
    async with sidecar.http.post(
        f"/topics/{topic}", data=body, headers={"Content-Type": BINARY_V2}
    ) as response:
        return response.status, json.loads(await response.read())


def _count(status: int, answer: dict[str, Any], records: int, tally: Tally) -> None:
    if status != 200:
        tally.fail(records, f"{status} {answer}")
        return
    for offset in answer["offsets"]:
        if offset.get("error_code") is None:
            tally.acked += 1
        else:
            tally.fail(1, str(offset))


async def sidecar_throughput(
    sidecar: Sidecar, topic: str, workload: Workload, seconds: float, connections: int
) -> ThroughputRun:
    """``connections`` workers each posting batch bodies back to back for ``seconds``."""
    tally = Tally()
    bodies = workload.batch_bodies
    per_body = len(workload.records) // len(bodies)

    async def post(index: int) -> None:
        status, answer = await _post(sidecar, topic, bodies[index % len(bodies)])
        _count(status, answer, per_body, tally)

    return await _requests_in_flight(post, tally, seconds, connections)


async def sidecar_latency(
    sidecar: Sidecar, topic: str, workload: Workload, seconds: float, max_samples: int
) -> list[float]:
    """Seconds per request of one record, one request at a time."""
    samples: list[float] = []
    tally = Tally()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline and len(samples) < max_samples:
        body = workload.single_bodies[len(samples) % len(workload.single_bodies)]
        began = time.perf_counter()
        status, answer = await _post(sidecar, topic, body)
        samples.append(time.perf_counter() - began)
        _count(status, answer, 1, tally)
    if tally.failed:
        raise RuntimeError(f"{tally.failed} single-record produces failed: {tally.first_error}")
    return samples


# The sidecar over REST Proxy v3 ------------------------------------------------------------


def _v3_path(sidecar: Sidecar, topic: str) -> str:
    return f"/v3/clusters/{sidecar.cluster_id}/topics/{topic}/records"


def _count_v3(answer: dict[str, Any], tally: Tally) -> None:
    if answer.get("error_code") == 200:
        tally.acked += 1
    else:
        tally.fail(1, str(answer))


async def v3_single_throughput(
    sidecar: Sidecar, topic: str, workload: Workload, seconds: float, in_flight: int
) -> ThroughputRun:
    """``in_flight`` workers, each on its own connection, posting one v3 record per request
    back to back for ``seconds``."""
    tally = Tally()
    path = _v3_path(sidecar, topic)
    headers = {"Content-Type": "application/json"}
    records = workload.v3_records
    connector = aiohttp.TCPConnector(limit=in_flight)
    async with aiohttp.ClientSession(sidecar.url, connector=connector) as http:

        async def post(index: int) -> None:
            async with http.post(path, data=records[index % len(records)], headers=headers) as r:
                _count_v3(json.loads(await r.read()), tally)

        return await _requests_in_flight(post, tally, seconds, in_flight)


class _V3Stream:
    """One open v3 streaming request: ``send`` queues a record, answers come in order."""

    def __init__(self, sidecar: Sidecar, topic: str) -> None:
        self._outgoing: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def body() -> AsyncIterator[bytes]:
            while True:
                first = await self._outgoing.get()
                if first is None:
                    return
                chunk = [first]
                # What queued meanwhile goes in the same chunk: one write, not one each.
                while not self._outgoing.empty():
                    more = self._outgoing.get_nowait()
                    if more is None:
                        yield b"".join(chunk)
                        return
                    chunk.append(more)
                yield b"".join(chunk)

        self._posting = asyncio.ensure_future(
            sidecar.http.post(
                _v3_path(sidecar, topic),
                data=body(),
                headers={"Content-Type": "application/json"},
                chunked=True,
            )
        )
        self._response: aiohttp.ClientResponse | None = None

    def send(self, record: bytes) -> None:
        self._outgoing.put_nowait(record)

    async def answer(self) -> dict[str, Any]:
        if self._response is None:
            # The head goes out with the first chunk: await it once something was sent.
            self._response = await self._posting
        line = await self._response.content.readline()
        if not line:
            raise RuntimeError("the v3 stream ended early")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def close(self) -> None:
        self._outgoing.put_nowait(None)
        response = self._response or await self._posting
        await response.read()
        response.release()


async def v3_stream_throughput(
    sidecar: Sidecar, topic: str, workload: Workload, seconds: float, streams: int, window: int
) -> ThroughputRun:
    """``streams`` open v3 streams, each keeping ``window`` records sent and unanswered,
    for ``seconds``; then every answer is read."""
    tally = Tally()
    records = workload.v3_records
    began = time.perf_counter()
    deadline = began + seconds

    async def one_stream(first: int) -> None:
        stream = _V3Stream(sidecar, topic)
        slots = asyncio.Semaphore(window)
        unanswered: asyncio.Queue[bool] = asyncio.Queue()  # True per record sent, then False

        async def read_answers() -> None:
            while await unanswered.get():
                _count_v3(await stream.answer(), tally)
                slots.release()

        reader = asyncio.ensure_future(read_answers())
        index = first
        while time.perf_counter() < deadline:
            await slots.acquire()
            stream.send(records[index % len(records)])
            unanswered.put_nowait(True)
            index += streams
        unanswered.put_nowait(False)
        await reader
        await stream.close()

    await asyncio.gather(*(one_stream(k) for k in range(streams)))
    elapsed = time.perf_counter() - began
    return ThroughputRun(tally.acked, tally.failed, elapsed, tally.first_error)


async def v3_single_latency(
    sidecar: Sidecar, topic: str, workload: Workload, seconds: float, max_samples: int
) -> list[float]:
    """Seconds per v3 request of one record, one request at a time."""
    samples: list[float] = []
    tally = Tally()
    path = _v3_path(sidecar, topic)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline and len(samples) < max_samples:
        body = workload.v3_records[len(samples) % len(workload.v3_records)]
        began = time.perf_counter()
        async with sidecar.http.post(
            path, data=body, headers={"Content-Type": "application/json"}
        ) as response:
            answer = json.loads(await response.read())
        samples.append(time.perf_counter() - began)
        _count_v3(answer, tally)
    if tally.failed:
        raise RuntimeError(f"{tally.failed} v3 single-record produces failed: {tally.first_error}")
    return samples


async def v3_stream_latency(
    sidecar: Sidecar, topic: str, workload: Workload, seconds: float, max_samples: int
) -> list[float]:
    """Seconds from sending one record on an open v3 stream to its answer, one at a time."""
    samples: list[float] = []
    tally = Tally()
    stream = _V3Stream(sidecar, topic)
    try:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline and len(samples) < max_samples:
            began = time.perf_counter()
            stream.send(workload.v3_records[len(samples) % len(workload.v3_records)])
            _count_v3(await stream.answer(), tally)
            samples.append(time.perf_counter() - began)
    finally:
        await stream.close()
    if tally.failed:
        raise RuntimeError(f"{tally.failed} v3 streamed produces failed: {tally.first_error}")
    return samples


# Kafka's Java producer -------------------------------------------------------------------

_JAVA_SUMMARY = re.compile(
    r"^(\d+) records sent, ([\d.]+) records/sec .*?([\d.]+) ms avg latency, "
    r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th",
    re.MULTILINE,
)


@dataclass(frozen=True, slots=True)
class JavaRun:
    records: int
    per_second: float
    p50_ms: float
    p99_ms: float


def java_tools_classpath() -> str:
    """``kafka-tools`` (ProducerPerformance) and its runtime jars, resolved once by Maven.

    Kept in its own cache directory, apart from the jars the local cluster runs from,
    so resolving it never rewrites a directory a running broker reads.
    """
    ensure_installed()  # the shared Maven repository and the java check
    libs = _ensure_libs(
        cache_root(),
        f"bench-kafka-tools-{KAFKA_VERSION}",
        [
            ("org.apache.kafka", "kafka-tools", KAFKA_VERSION),
            ("org.slf4j", "slf4j-nop", _SLF4J_VERSION),
        ],
    )
    return str(libs / "*")


async def java_throughput(
    classpath: str, bootstrap: str, topic: str, records: int, size: int
) -> JavaRun:
    java = shutil.which("java") or "java"
    process = await asyncio.create_subprocess_exec(
        java,
        "-Xmx512m",
        "-cp",
        classpath,
        "org.apache.kafka.tools.ProducerPerformance",
        "--topic",
        topic,
        "--num-records",
        str(records),
        "--record-size",
        str(size),
        "--throughput",
        "-1",
        "--producer-props",
        f"bootstrap.servers={bootstrap}",
        "acks=all",
        "enable.idempotence=true",
        "linger.ms=0",
        f"batch.size={PRODUCER_BATCH_BYTES}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 180)
    text = output.decode(errors="replace")
    match = _JAVA_SUMMARY.search(text)
    if process.returncode != 0 or match is None:
        raise RuntimeError(f"ProducerPerformance failed ({process.returncode}):\n{text[-2000:]}")
    return JavaRun(int(match[1]), float(match[2]), float(match[5]), float(match[7]))


# Profiling -------------------------------------------------------------------------------


async def profile_sidecar(
    sidecar: Sidecar, topic: str, workload: Workload, plan: Plan, output: Path
) -> ThroughputRun:
    """One extra sidecar throughput phase under py-spy (not counted in the results)."""
    py_spy = py_spy_path()
    seconds = max(5, int(plan.throughput_s))
    spy = await asyncio.create_subprocess_exec(
        py_spy,
        "record",
        "--pid",
        str(sidecar.pid),
        "--duration",
        str(seconds),
        "--rate",
        "200",
        "--format",
        "raw",
        "--output",
        str(output),
        "--nonblocking",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        return await sidecar_throughput(sidecar, topic, workload, seconds, plan.connections)
    finally:
        await spy.wait()


# The run ---------------------------------------------------------------------------------


DIRECT, SIDECAR, DIRECT_WIDE = "direct aiokafka", "sidecar (HTTP)", "direct aiokafka, wide window"
UNMANAGED, TRANSACTIONAL = "sidecar (HTTP), unmanaged topic", "direct transactional writer"
V3_SINGLE, V3_STREAM = "sidecar REST v3, one record per request", "sidecar REST v3 streaming"
SIDECAR_WIDE = "sidecar (HTTP), wide window"
TRANSACTIONAL_WIDE = "direct transactional writer, wide window"
PATHS = (
    DIRECT,
    SIDECAR,
    DIRECT_WIDE,
    UNMANAGED,
    TRANSACTIONAL,
    V3_SINGLE,
    V3_STREAM,
    SIDECAR_WIDE,
    TRANSACTIONAL_WIDE,
)
SIDECAR_ONE_KEY = "sidecar (HTTP), one key"
TRANSACTIONAL_ONE_KEY = "direct transactional writer, one key"
LATENCY_PATHS = (
    DIRECT,
    SIDECAR,
    UNMANAGED,
    TRANSACTIONAL,
    V3_SINGLE,
    V3_STREAM,
    SIDECAR_ONE_KEY,
    TRANSACTIONAL_ONE_KEY,
)


@dataclass
class SizeResult:
    size: int
    throughput: dict[str, list[ThroughputRun]] = field(
        default_factory=lambda: {path: [] for path in PATHS}
    )
    latency: dict[str, list[float]] = field(
        default_factory=lambda: {path: [] for path in LATENCY_PATHS}
    )
    java: JavaRun | None = None


@dataclass(frozen=True, slots=True)
class Target:
    """Both ways of producing, ready: the producer and plain topic, the sidecar and its topic."""

    producer: Any
    plain: str
    sidecar: Sidecar
    managed: str
    cluster_pids: Sequence[int]
    writer: TransactionalWriter
    passed_through: str
    """A plain topic the sidecar writes to unmanaged."""

    async def throughput(
        self, path: str, workload: Workload, seconds: float, plan: Plan
    ) -> ThroughputRun:
        meter = CpuMeter([self.sidecar.pid], self.cluster_pids)
        committed = await self._transactions(path)
        if path in (SIDECAR, UNMANAGED):
            topic = self.managed if path == SIDECAR else self.passed_through
            run = await sidecar_throughput(self.sidecar, topic, workload, seconds, plan.connections)
        elif path == SIDECAR_WIDE:
            run = await sidecar_throughput(
                self.sidecar, self.managed, workload, seconds, plan.wide_connections
            )
        elif path in (TRANSACTIONAL, TRANSACTIONAL_WIDE):
            connections = plan.wide_connections if path == TRANSACTIONAL_WIDE else plan.connections
            run = await transactional_throughput(
                self.writer, self.plain, workload, seconds, connections, plan.batch
            )
        elif path == V3_SINGLE:
            run = await v3_single_throughput(
                self.sidecar, self.managed, workload, seconds, plan.connections * plan.batch
            )
        elif path == V3_STREAM:
            run = await v3_stream_throughput(
                self.sidecar, self.managed, workload, seconds, plan.connections, plan.batch
            )
        else:
            window = plan.wide_window if path == DIRECT_WIDE else plan.window
            run = await direct_throughput(self.producer, self.plain, workload, seconds, window)
        cpu = meter.read()
        if committed is not None:
            transactions = await self._transactions(path)
            assert transactions is not None
            run = dataclasses.replace(run, transactions=transactions - committed)
        return dataclasses.replace(run, cpu=cpu)

    async def _transactions(self, path: str) -> int | None:
        """Transactions committed so far by what ``path`` writes through, if it writes
        managed requests in transactions."""
        if path in (SIDECAR, SIDECAR_WIDE):
            return await self.sidecar.transactions_committed()
        if path in (TRANSACTIONAL, TRANSACTIONAL_WIDE):
            return self.writer.transactions
        return None

    async def latency(
        self, path: str, workload: Workload, seconds: float, max_samples: int
    ) -> list[float]:
        if path == SIDECAR_ONE_KEY:
            one_key = workload.one_key()
            return await sidecar_latency(self.sidecar, self.managed, one_key, seconds, max_samples)
        if path == TRANSACTIONAL_ONE_KEY:
            one_key = workload.one_key()
            return await transactional_latency(
                self.writer, self.plain, one_key, seconds, max_samples
            )
        if path in (SIDECAR, UNMANAGED):
            topic = self.managed if path == SIDECAR else self.passed_through
            return await sidecar_latency(self.sidecar, topic, workload, seconds, max_samples)
        if path == TRANSACTIONAL:
            return await transactional_latency(
                self.writer, self.plain, workload, seconds, max_samples
            )
        if path == V3_SINGLE:
            return await v3_single_latency(
                self.sidecar, self.managed, workload, seconds, max_samples
            )
        if path == V3_STREAM:
            return await v3_stream_latency(
                self.sidecar, self.managed, workload, seconds, max_samples
            )
        return await direct_latency(self.producer, self.plain, workload, seconds, max_samples)


async def run(
    plan: Plan, java: bool, profile: Path | None, log: IO[bytes]
) -> tuple[list[SizeResult], str]:
    """Every phase of ``plan``; the sidecar's stderr goes to ``log``."""
    classpath = java_tools_classpath() if java else ""
    suffix = uuid.uuid4().hex[:8]
    managed, plain = f"bench-sidecar-{suffix}", f"bench-direct-{suffix}"
    passed_through = f"bench-unmanaged-{suffix}"
    root = f"/bench-{suffix}"
    results: list[SizeResult] = []
    with provide_cluster() as cluster:
        kafka = kafka_line(cluster)
        print(f"cluster: Kafka {kafka}, bootstrap {cluster.kafka_bootstrap}", flush=True)
        rf = cluster.replication_factor
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
        await admin.start()
        # The sidecar's producers' batch size: at 1 KiB aiokafka's 16 KiB default holds
        # 16 records a batch, and the comparison would be of batch sizes.
        producer = AIOKafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap,
            acks="all",
            enable_idempotence=True,
            max_batch_size=PRODUCER_BATCH_BYTES,
        )
        writer_settings = KafkaSettings(bootstrap_servers=cluster.kafka_bootstrap)
        writer = TransactionalWriter(
            writer_settings,
            incarnation_ids("bench", suffix, 0, writer_settings.transaction_lanes),
        )
        try:
            await admin.create_topics(
                [NewTopic(plain, PARTITIONS, rf), NewTopic(passed_through, PARTITIONS, rf)]
            )
            await producer.start()
            await writer.start()
            connections = max(plan.connections, plan.wide_connections)
            async with sidecar_process(cluster, root, log, connections) as sidecar:
                await create_managed_topic(sidecar, managed, rf)
                target = Target(
                    producer,
                    plain,
                    sidecar,
                    managed,
                    cluster_pids(cluster),
                    writer,
                    passed_through,
                )
                await _warm_up(plan, target)
                for size in plan.sizes:
                    result = SizeResult(size)
                    results.append(result)
                    await _measure_size(plan, make_workload(size, plan.batch), result, target)
                    if java:
                        records = plan.java_records[size]
                        print(f"  Java ProducerPerformance, {records:,} records", flush=True)
                        result.java = await java_throughput(
                            classpath, cluster.kafka_bootstrap, plain, records, size
                        )
                        print(f"  Java: {result.java.per_second:,.0f} records/s", flush=True)
                if profile is not None:
                    workload = make_workload(plan.sizes[0], plan.batch)
                    # The unmanaged phase is the HTTP edge alone, which every managed
                    # request pays as well.
                    for topic, output in (
                        (managed, profile),
                        (passed_through, profile.with_name(profile.name + ".unmanaged")),
                    ):
                        print(f"profiling the sidecar into {output}", flush=True)
                        profiled = await profile_sidecar(sidecar, topic, workload, plan, output)
                        print(f"  (profiled run: {profiled.per_second:,.0f} records/s)", flush=True)
        finally:
            await producer.stop()
            await writer.stop()
            with contextlib.suppress(Exception):
                await admin.delete_topics([plain, managed, passed_through])
            await admin.close()
            delete_root(cluster.zookeeper_hosts, root)
    return results, kafka


async def _warm_up(plan: Plan, target: Target) -> None:
    """Load both paths before measuring: a fresh broker JVM is several times slower
    in its first seconds (JIT), which would be charged to whichever path ran first."""
    print(f"warming up the cluster for {plan.cluster_warmup_s:g} s", flush=True)
    workload = make_workload(plan.sizes[0], plan.batch)
    slice_s = plan.cluster_warmup_s / 4
    for path in (DIRECT, SIDECAR, UNMANAGED, TRANSACTIONAL, V3_STREAM):
        await target.throughput(path, workload, slice_s, plan)


async def _measure_size(plan: Plan, workload: Workload, result: SizeResult, target: Target) -> None:
    print(f"{workload.size} B records", flush=True)
    for path in (DIRECT, SIDECAR, UNMANAGED, TRANSACTIONAL, V3_SINGLE, V3_STREAM):
        await target.throughput(path, workload, plan.warmup_s, plan)
    for round_index in range(plan.rounds):
        # Alternate the order, so that a drift in the machine's load hits every path.
        order = list(PATHS)
        if round_index % 2:
            order.reverse()
        for path in order:
            run = await target.throughput(path, workload, plan.throughput_s, plan)
            result.throughput[path].append(run)
            print(f"  {path} throughput: {run.per_second:,.0f} records/s", flush=True)
        latency_s = plan.latency_s / plan.rounds
        samples = plan.latency_max_samples // plan.rounds
        for path in LATENCY_PATHS if round_index % 2 == 0 else reversed(LATENCY_PATHS):
            result.latency[path] += await target.latency(path, workload, latency_s, samples)
    p50s = ", ".join(
        f"{path} {percentile(samples, 0.5) * 1e3:.2f} ms"
        for path, samples in result.latency.items()
    )
    print(f"  latency p50: {p50s}", flush=True)


# Rendering -------------------------------------------------------------------------------


def _median_rate(runs: Sequence[ThroughputRun]) -> float:
    return statistics.median(run.per_second for run in runs)


def _paired_ratio(
    numerators: Sequence[ThroughputRun], denominators: Sequence[ThroughputRun]
) -> str:
    """Median (min-max) of the per-round ratios: each round's runs ran back to back, so
    a change in the machine's other load between rounds cancels out of its ratio."""
    ratios = [
        top.per_second / bottom.per_second
        for top, bottom in zip(numerators, denominators, strict=True)
    ]
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}"
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def _median_or_dash(values: Iterable[float | None]) -> str:
    known = [value for value in values if value is not None]
    return f"{statistics.median(known):,.1f}" if known else "-"


def _cpu(runs: Sequence[ThroughputRun], which: str) -> str:
    values = [getattr(run.cpu, which) for run in runs]
    if any(value is None for value in values):
        return "-"
    return f"{statistics.fmean(values):.0f} %"


def render(results: Sequence[SizeResult], plan: Plan) -> list[str]:
    labels = {
        DIRECT: f"direct aiokafka, {plan.window:,} in flight",
        SIDECAR: f"sidecar over HTTP, {plan.connections} x {plan.batch} in flight",
        DIRECT_WIDE: f"direct aiokafka, {plan.wide_window:,} in flight",
        SIDECAR_WIDE: f"sidecar over HTTP, {plan.wide_connections} x {plan.batch} in flight",
        TRANSACTIONAL_WIDE: (
            f"direct transactional writer, {plan.wide_connections} x {plan.batch} in flight"
        ),
        UNMANAGED: f"sidecar, unmanaged topic, {plan.connections} x {plan.batch} in flight",
        TRANSACTIONAL: (
            f"direct transactional writer, {plan.connections} x {plan.batch} in flight"
        ),
        V3_SINGLE: (
            f"sidecar REST v3, one record per request, {plan.connections * plan.batch} "
            "requests in flight"
        ),
        V3_STREAM: f"sidecar REST v3 streaming, {plan.connections} x {plan.batch} in flight",
    }
    latency_labels = {
        DIRECT: "direct aiokafka",
        SIDECAR: "sidecar over HTTP (managed: transactions)",
        UNMANAGED: "sidecar over HTTP, unmanaged topic",
        TRANSACTIONAL: "direct transactional writer (a transaction each)",
        V3_SINGLE: "sidecar REST v3, one request per record (managed)",
        V3_STREAM: "sidecar REST v3, one record at a time on an open stream (managed)",
        SIDECAR_ONE_KEY: "sidecar over HTTP (managed), every record with one key",
        TRANSACTIONAL_ONE_KEY: "direct transactional writer, every record with one key",
    }
    cost_rows = []
    goal_rows = []
    v3_rows = []
    headline_rows = []
    throughput_rows = []
    transactions_rows = []
    latency_rows = []
    for result in results:
        size = f"{result.size} B"
        rates = {path: _median_rate(runs) for path, runs in result.throughput.items()}
        runs_of = result.throughput
        latencies = result.latency
        p50 = {path: percentile(samples, 0.5) * 1e3 for path, samples in latencies.items()}
        cost_rows.append(
            [
                size,
                _paired_ratio(runs_of[TRANSACTIONAL], runs_of[DIRECT]),
                f"{p50[DIRECT]:.2f} → {p50[TRANSACTIONAL]:.2f} ms",
                _paired_ratio(runs_of[SIDECAR], runs_of[UNMANAGED]),
                f"{p50[UNMANAGED]:.2f} → {p50[SIDECAR]:.2f} ms",
            ]
        )
        headline_rows.append(
            [
                size,
                _paired_ratio(runs_of[SIDECAR], runs_of[DIRECT]),
                f"{p50[SIDECAR] - p50[DIRECT]:+.2f} ms",
                f"{p50[DIRECT]:.2f} → {p50[SIDECAR]:.2f} ms",
                _paired_ratio(runs_of[SIDECAR], runs_of[DIRECT_WIDE]),
            ]
        )
        goal_rows.append(
            [
                size,
                _paired_ratio(runs_of[SIDECAR], runs_of[TRANSACTIONAL]),
                f"{p50[SIDECAR] - p50[TRANSACTIONAL]:+.2f} ms",
                _paired_ratio(runs_of[SIDECAR_WIDE], runs_of[TRANSACTIONAL_WIDE]),
                _paired_ratio(runs_of[SIDECAR_WIDE], runs_of[DIRECT_WIDE]),
                _paired_ratio(runs_of[UNMANAGED], runs_of[DIRECT]),
            ]
        )
        v3_rows.append(
            [
                size,
                _paired_ratio(runs_of[V3_SINGLE], runs_of[DIRECT]),
                _paired_ratio(runs_of[V3_STREAM], runs_of[DIRECT]),
                _paired_ratio(runs_of[V3_STREAM], runs_of[SIDECAR]),
                f"{p50[V3_SINGLE] - p50[DIRECT]:+.2f} ms",
                f"{p50[V3_STREAM] - p50[DIRECT]:+.2f} ms",
            ]
        )
        for path in (SIDECAR, TRANSACTIONAL, SIDECAR_WIDE, TRANSACTIONAL_WIDE):
            runs = result.throughput[path]
            transactions_rows.append(
                [
                    size,
                    labels[path],
                    _median_or_dash(
                        run.transactions / run.seconds if run.transactions is not None else None
                        for run in runs
                    ),
                    _median_or_dash(run.requests_per_transaction for run in runs),
                    _median_or_dash(
                        run.records / run.transactions if run.transactions else None for run in runs
                    ),
                ]
            )
        for path in PATHS:
            runs = result.throughput[path]
            throughput_rows.append(
                [
                    size,
                    labels[path],
                    f"{rates[path]:,.0f}",
                    f"{rates[path] * result.size / MIB:.2f}",
                    ", ".join(f"{run.per_second:,.0f}" for run in runs),
                    str(sum(run.failed for run in runs)),
                    _cpu(runs, "load_generator"),
                    _cpu(runs, "sidecars"),
                    _cpu(runs, "cluster"),
                    _cpu(runs, "rest"),
                ]
            )
        if result.java is not None:
            java = result.java
            throughput_rows.append(
                [
                    size,
                    "Java ProducerPerformance (unkeyed)",
                    f"{java.per_second:,.0f}",
                    f"{java.per_second * result.size / MIB:.2f}",
                    f"{java.records:,} records",
                    "0",
                    "-",
                    "-",
                    "-",
                    "-",
                ]
            )
        for path, samples in latencies.items():
            latency_rows.append(
                [
                    size,
                    latency_labels[path],
                    f"{len(samples):,}",
                    f"{percentile(samples, 0.5) * 1e3:.2f}",
                    f"{percentile(samples, 0.99) * 1e3:.2f}",
                    f"{statistics.fmean(samples) * 1e3:.2f}",
                ]
            )
    in_flight = plan.connections * plan.batch
    return [
        "## Headline: the sidecar against direct aiokafka, same cluster, same run",
        "",
        *markdown_table(
            [
                "record size",
                f"throughput sidecar / direct ({in_flight} in flight each)",
                "single-record p50 overhead",
                "p50 direct → sidecar",
                f"sidecar / direct with {plan.wide_window:,} in flight",
            ],
            headline_rows,
        ),
        "",
        "Throughput ratios: median (min-max) over the rounds of the ratio within a round.",
        "",
        "## Against what the guarantee costs: the direct transactional writer (same run)",
        "",
        "A managed produce is acknowledged once its transaction commits; the direct "
        "transactional writer is the sidecar's own writer in this process, without HTTP.",
        "",
        *markdown_table(
            [
                "record size",
                f"managed / direct transactional writer ({in_flight} in flight each)",
                "single-record p50, managed minus direct transactional writer",
                f"managed / direct transactional writer ({plan.wide_window:,} in flight each)",
                f"managed / direct idempotent ({plan.wide_window:,} in flight each)",
                f"unmanaged / direct idempotent ({in_flight} in flight each)",
            ],
            goal_rows,
        ),
        "",
        "## Requests per transaction (same run)",
        "",
        "How many requests a transaction carried (medians over the rounds): the sidecar's "
        '`sidecar_transactions_total{outcome="committed"}` and the writer\'s own count, '
        "read around each throughput run. In this process the writer's workers are "
        "answered together when their transaction commits and queue their next writes in "
        "the same turn of the event loop, so the next transaction takes them all; over "
        "HTTP the next requests reach the sidecar one by one, and the first is appended "
        "before the others arrive.",
        "",
        *markdown_table(
            [
                "record size",
                "path",
                "transactions/s",
                "requests per transaction",
                "records per transaction",
            ],
            transactions_rows,
        ),
        "",
        "## REST Proxy v3 against direct aiokafka (managed topic, same run)",
        "",
        *markdown_table(
            [
                "record size",
                f"v3 one record per request / direct ({in_flight} in flight each)",
                f"v3 streaming / direct ({in_flight} in flight each)",
                "v3 streaming / v2 batches",
                "p50 overhead, v3 request",
                "p50 overhead, v3 stream",
            ],
            v3_rows,
        ),
        "",
        "## What transactions cost (managed topics are written in transactions)",
        "",
        *markdown_table(
            [
                "record size",
                "throughput transactional / idempotent (direct)",
                "p50 idempotent → transactional (direct)",
                "throughput managed / unmanaged (sidecar)",
                "p50 unmanaged → managed (sidecar)",
            ],
            cost_rows,
        ),
        "",
        f"## Throughput ({PARTITIONS} partitions, RF 3, acks=all, idempotent, keyed records; "
        f"{plan.rounds} x {plan.throughput_s:g} s per path, alternating)",
        "",
        "In flight: records sent and not yet acknowledged (direct: send() futures; sidecar: "
        f"{plan.connections} connections, each with one request of {plan.batch} records). "
        "CPU is the mean over the runs, in % of one core (the machine has "
        f"{cores()} cores, {cores() * 100} %): the load generator (this process, with "
        "the direct producer in it), the sidecar process, ZooKeeper + brokers (when this "
        "run started them) and the rest of the machine (other work on it, the kernel).",
        "",
        *markdown_table(
            [
                "record size",
                "path",
                "records/s (median)",
                "payload MiB/s",
                "each round",
                "failed",
                "load gen CPU",
                "sidecar CPU",
                "cluster CPU",
                "rest of machine",
            ],
            throughput_rows,
        ),
        "",
        "## Single-record latency (one record at a time, each acknowledged before the next)",
        "",
        *markdown_table(
            ["record size", "path", "samples", "p50 ms", "p99 ms", "mean ms"], latency_rows
        ),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    # Imported here: the security row builds on this module's helpers.
    from bench.produce_security import render_security, run_security

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short phases, one round, no Java")
    parser.add_argument("--no-java", action="store_true", help="skip Kafka's ProducerPerformance")
    parser.add_argument(
        "--profile",
        type=Path,
        help="also record the sidecar with py-spy (raw stacks) to FILE (managed topic) and "
        "FILE.unmanaged",
    )
    parser.add_argument(
        "--only",
        choices=("main", "security"),
        help="main: every row but the security one; security: only SASL_SSL against "
        "PLAINTEXT, on a secured cluster of its own",
    )
    args = parser.parse_args(argv)
    if args.profile is not None:
        py_spy_path()  # before the run, not after its ten minutes
    plan = QUICK if args.quick else FULL
    java = not (args.quick or args.no_java)

    async def measure(log: IO[bytes]) -> tuple[AllResults, str]:
        main_results: list[SizeResult] = []
        security_results: list[SecurityResult] = []
        ran_against = []
        if args.only in (None, "main"):
            main_results, kafka = await run(plan, java, args.profile, log)
            ran_against.append(kafka)
        if args.only in (None, "security"):
            security_results, kafka = await run_security(plan, log)
            ran_against.append(kafka)
        return (main_results, security_results), "; ".join(ran_against)

    def render_all(results: AllResults) -> list[str]:
        main_results, security_results = results
        lines = render(main_results, plan) if main_results else []
        if security_results:
            lines += [*([""] if lines else []), *render_security(security_results, plan)]
        return lines

    # A run of the security row alone keeps its own result file: the main one stays whole.
    alone = args.only == "security"
    measure_and_write(
        "produce_security" if alone else "produce",
        "Produce benchmark: SASL_SSL against PLAINTEXT" if alone else "Produce benchmark",
        measure,
        render_all,
        module="bench.produce",
    )


if __name__ == "__main__":
    main()
