"""Helpers to run real sidecars (in this process) against the test cluster."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.waiting import eventually
from sidecar.compose import SidecarServer
from sidecar.config import (
    AuditSettings,
    FaultSettings,
    HttpSettings,
    KafkaSettings,
    ProduceSettings,
    Secret,
    Settings,
    ZooKeeperSettings,
)
from sidecar.core.generations import GenerationLog

ADMIN_TOKEN = "test-token"
TEST_REPLICATION_MARGIN_MS = 1_000
"""Replicas of the local cluster catch up within a fetch wait (500 ms)."""
READY_WITHIN_S = 60.0
"""How long an in-process test sidecar may take to be ready on the running cluster."""
JSON_V2 = "application/vnd.kafka.json.v2+json"
BINARY_V2 = "application/vnd.kafka.binary.v2+json"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def settings_for(
    cluster: ClusterEndpoints,
    root: str,
    name: str,
    *,
    session_timeout_s: float = 6.0,
    hold_timeout_s: float = 30.0,
    barrier_timeout_s: float = 20.0,
    kill_after_phase: str = "",
    withhold_barrier_acks: bool = False,
    stop_before_commit: int = 0,
    stop_before_send: int = 0,
    skip_fence: bool = False,
    stop_before_compaction_write: bool = False,
    ungated_delivery: bool = False,
    zookeeper_hosts: str | None = None,
    request_timeout_ms: int | None = None,
    transaction_lanes: int | None = None,
    header_format: str = "stamp",
    kafka_client: dict[str, str | int | float | bool] | None = None,
    audit_topic: str = "",
) -> Settings:
    """Settings of a test sidecar. The Kafka request timeout defaults to what the session
    timeout allows (``Settings.validate``: a session outlives every send);
    ``kafka_client`` is ``kafka.client`` (aiokafka settings passed through); with
    ``audit_topic`` the sidecar audits to that topic."""
    margin_ms = TEST_REPLICATION_MARGIN_MS
    if request_timeout_ms is None:
        request_timeout_ms = max(2_000, int(session_timeout_s * 1000) - margin_ms - 1_000)
    return Settings(
        sidecar_id=f"{name}-{uuid.uuid4().hex[:6]}",
        kafka=KafkaSettings(
            bootstrap_servers=cluster.kafka_bootstrap,
            security=cluster.kafka_security,
            request_timeout_ms=request_timeout_ms,
            replication_margin_ms=margin_ms,
            transaction_lanes=transaction_lanes or KafkaSettings().transaction_lanes,
            client=kafka_client or {},
        ),
        zookeeper=ZooKeeperSettings(
            hosts=zookeeper_hosts or cluster.sidecar_zookeeper_hosts,
            security=cluster.zookeeper_security,
            root=root,
            session_timeout_s=session_timeout_s,
        ),
        http=HttpSettings(port=0, ops_port=0, admin_enabled=True, admin_token=ADMIN_TOKEN),
        produce=ProduceSettings(
            hold_timeout_s=hold_timeout_s,
            barrier_timeout_s=barrier_timeout_s,
            header_format=header_format,
        ),
        audit=AuditSettings(enabled=True, topic=audit_topic) if audit_topic else AuditSettings(),
        faults=FaultSettings(
            kill_after_phase=kill_after_phase,
            withhold_barrier_acks=withhold_barrier_acks,
            stop_before_commit=stop_before_commit,
            stop_before_send=stop_before_send,
            skip_fence=skip_fence,
            stop_before_compaction_write=stop_before_compaction_write,
            ungated_delivery=ungated_delivery,
        ),
    )


@dataclass
class SidecarClient:
    """An HTTP client of one sidecar (in this process or another)."""

    url: str
    id: str
    http: aiohttp.ClientSession

    async def produce(
        self,
        topic: str,
        records: Sequence[dict[str, Any]],
        *,
        partition: int | None = None,
        content_type: str = JSON_V2,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        path = f"/topics/{topic}" + (f"/partitions/{partition}" if partition is not None else "")
        body = {"records": list(records)} | (extra or {})
        async with self.http.post(
            path,
            data=json.dumps(body),
            headers={"Content-Type": content_type} | (headers or {}),
        ) as response:
            return response.status, await response.json(content_type=None)

    async def admin(
        self, method: str, path: str, body: dict[str, Any] | None = None, token: str = ADMIN_TOKEN
    ) -> tuple[int, dict[str, Any]]:
        async with self.http.request(
            method, path, json=body, headers={"Authorization": f"Bearer {token}"}
        ) as response:
            return response.status, await response.json(content_type=None)

    async def create_topic(self, name: str, partitions: int, **options: Any) -> dict[str, Any]:
        status, body = await self.admin(
            "POST", "/admin/topics", {"name": name, "partitions": partitions} | options
        )
        assert status == 201, body
        return body

    async def change_count(self, topic: str, count: int, **options: Any) -> dict[str, Any]:
        status, body = await self.admin(
            "POST", f"/admin/topics/{topic}/partition-count", {"count": count} | options
        )
        assert status == 200, body
        return body

    async def describe(self, topic: str) -> dict[str, Any]:
        status, body = await self.admin("GET", f"/admin/topics/{topic}")
        assert status == 200, body
        return body


@dataclass
class RunningSidecar(SidecarClient):
    server: SidecarServer


@dataclass
class SidecarProcess(SidecarClient):
    process: asyncio.subprocess.Process
    ops_url: str = ""
    """The operations listener, when the test chose its port (``free_port``)."""


def settings_environment(settings: Settings) -> dict[str, str]:
    """``settings`` as the ``ORDERED_SIDECAR__*`` variables ``sidecar serve`` reads.

    Every field of the sections ``settings_for`` fills in; of ``changes``, ``consumer``
    and ``audit`` only the fields given another value than the default, so that one set
    in the environment (``ORDERED_SIDECAR__CHANGES__COMPACTION_INTERVAL_S=15`` for a
    whole bench run) still reaches the process where the test does not set it. The
    other sections keep what the environment says."""
    env: dict[str, str] = {}
    for section in ("kafka", "zookeeper", "http", "produce", "faults"):
        env |= _section_environment(
            f"ORDERED_SIDECAR__{section.upper()}", getattr(settings, section)
        )
    for section in ("changes", "consumer", "audit"):
        values = getattr(settings, section)
        env |= _section_environment(
            f"ORDERED_SIDECAR__{section.upper()}", values, unless_equal=type(values)()
        )
    env["ORDERED_SIDECAR__SIDECAR_ID"] = settings.sidecar_id
    return env


def _section_environment(prefix: str, values: Any, unless_equal: Any = None) -> dict[str, str]:
    env: dict[str, str] = {}
    for name in values.__dataclass_fields__:
        value = getattr(values, name)
        if name == "client":
            continue
        if unless_equal is not None and value == getattr(unless_equal, name):
            continue
        if dataclasses.is_dataclass(value):  # kafka.security, zookeeper.security
            env |= _section_environment(f"{prefix}__{name.upper()}", value)
            continue
        if isinstance(value, Secret):
            if value:
                env[f"{prefix}__{name.upper()}"] = value.reveal()
            continue
        env[f"{prefix}__{name.upper()}"] = (
            str(value).lower() if isinstance(value, bool) else str(value)
        )
    return env


def _environment(settings: Settings) -> dict[str, str]:
    return dict(os.environ) | settings_environment(settings)


async def start_process(settings: Settings, *, wait_ready: bool = True) -> SidecarProcess:
    """``sidecar serve`` as its own process; returns once it is ready, or, without
    ``wait_ready``, once its operations listener answers (``settings`` must then name
    both ports: ``free_port``)."""
    # Each process logs to a file of its own, kept for a failing test's post-mortem.
    log_path = Path(tempfile.gettempdir()) / f"ordered-sidecar-{settings.sidecar_id}.log"
    with log_path.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).with_name("sidecar")),
            "serve",
            env=_environment(settings),
            stdout=asyncio.subprocess.PIPE,
            stderr=log_file,
        )
    assert process.stdout is not None
    if not wait_ready:
        http = settings.http
        assert http.port, "name the data port to talk to a sidecar not ready"
        assert http.ops_port, "name the operations port to talk to a sidecar not ready"
        ops_url = f"http://{http.ops_host}:{http.ops_port}"

        async def listening() -> bool:
            try:
                async with (
                    aiohttp.ClientSession() as probe,
                    probe.get(f"{ops_url}/healthz") as response,
                ):
                    return response.status == 200
            except aiohttp.ClientConnectionError:
                assert process.returncode is None, f"sidecar exited: see {log_path}"
                return False

        await eventually(listening, 30, "the operations listener answers")
        url = f"http://{http.host}:{http.port}"
        session = aiohttp.ClientSession(url)
        return SidecarProcess(url, settings.sidecar_id, session, process, ops_url)
    line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
    assert " ready on " in line, f"sidecar did not start: {line!r}"
    url = line.rsplit(" ", 1)[1].strip()
    return SidecarProcess(url, settings.sidecar_id, aiohttp.ClientSession(url), process)


def free_port() -> int:
    """A loopback port nothing listens on now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


STOP_GRACE_S = 40.0
"""How long a stopped ``sidecar serve`` may take to shut down before it is killed."""


async def terminate(process: asyncio.subprocess.Process, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM ``process`` if it still runs, and SIGKILL it if it has not exited within
    ``grace_s``: a sidecar finishes what it holds first, but a test or benchmark must end."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace_s)
        except TimeoutError:
            process.kill()
            await process.wait()


def process_stopped(pid: int) -> bool:
    """Whether the process has stopped on SIGSTOP (a fault hook stops a sidecar)."""
    # Field 3 of /proc/<pid>/stat is the state: T once SIGSTOP took effect.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


async def stop_process(sidecar: SidecarProcess) -> None:
    await sidecar.http.close()
    await terminate(sidecar.process)


@asynccontextmanager
async def running_sidecars(
    cluster: ClusterEndpoints,
    count: int,
    *,
    header_formats: Sequence[str] = (),
    **options: Any,
) -> AsyncIterator[list[RunningSidecar]]:
    """``count`` sidecars sharing one fresh ZooKeeper root (one "deployment"); sidecar i
    writes ``header_formats[i]`` where given (a deployment in the middle of an upgrade)."""
    root = f"/{unique('ordered-test')}"
    started: list[RunningSidecar] = []
    try:
        for index in range(count):
            if index < len(header_formats):
                options["header_format"] = header_formats[index]
            settings = settings_for(cluster, root, f"sc{index}", **options)
            server = SidecarServer(settings)
            await server.start()
            await asyncio.wait_for(server.wait_ready(), READY_WITHIN_S)
            session = aiohttp.ClientSession(server.url)
            started.append(RunningSidecar(server.url, settings.sidecar_id, session, server))
        yield started
    finally:
        for running in started:
            await running.http.close()
            await running.server.stop()


async def wait_for_final_operation(
    sidecar: SidecarClient, topic: str, within_s: float
) -> dict[str, Any]:
    """The topic's description once its partition-count change is done or rolled back."""
    deadline = time.monotonic() + within_s
    while True:
        description = await sidecar.describe(topic)
        operation = description["operation"]
        if isinstance(operation, dict) and operation["phase"] in ("done", "rolled_back"):
            return description
        assert time.monotonic() < deadline, f"the change never finished: {operation}"
        await asyncio.sleep(0.2)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def read_all(
    cluster: ClusterEndpoints, topic: str, partitions: int
) -> dict[int, list[ConsumerRecord[bytes, bytes]]]:
    """Every record a read-committed reader sees in ``partitions`` of ``topic``, per
    partition in offset order, once no transaction is open there any more.

    Managed topics are written in transactions: aborted records (a fenced zombie's) are
    never read, and each transaction's marker takes an offset without being a record.
    The stable offset trails a commit, so this waits for it to reach the log end.
    """
    reader = AIOKafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
        **cluster.kafka_client_arguments(),
    )
    ends_reader = AIOKafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap, **cluster.kafka_client_arguments()
    )
    await reader.start()
    await ends_reader.start()
    try:
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        reader.assign(assigned)
        await reader.seek_to_beginning()
        ends = await ends_reader.end_offsets(assigned)

        async def stable_at_end() -> bool:
            stable = await reader.end_offsets(assigned)
            return all(stable[tp] >= ends[tp] for tp in assigned)

        await eventually(stable_at_end, 30, f"no open transaction left in {topic}")
        result: dict[int, list[ConsumerRecord[bytes, bytes]]] = {p: [] for p in range(partitions)}
        remaining = {tp for tp in assigned if ends[tp] > await reader.position(tp)}
        while remaining:
            batches = await reader.getmany(*remaining, timeout_ms=5000)
            for tp, records in batches.items():
                result[tp.partition].extend(records)
            # Positions move past markers and aborted records too.
            done = {tp for tp in remaining if await reader.position(tp) >= ends[tp]}
            assert batches or done, f"nothing read within 5 s, still waiting for {remaining}"
            remaining -= done
        return result
    finally:
        await reader.stop()
        await ends_reader.stop()


def header(record: ConsumerRecord[bytes, bytes], name: str) -> bytes | None:
    for key, value in record.headers:
        if key == name:
            return bytes(value) if value is not None else None
    return None


@dataclass
class ProduceTally:
    written: int = 0
    refused: int = 0
    """Requests answered with an error status (collected in ``errors``)."""
    errors: list[str] | None = None


async def produce_until(
    sidecar: SidecarClient,
    topic: str,
    keys: Sequence[str],
    stop: asyncio.Event,
    tally: ProduceTally,
    *,
    pause_s: float = 0.0,
) -> None:
    """Produce one record per key per request until ``stop``; count what happened.

    A connection error (the sidecar died) ends the loop: it counts as refused.
    """
    tally.errors = tally.errors if tally.errors is not None else []
    sequence = 0
    while not stop.is_set():
        records = [{"key": key, "value": {"seq": sequence, "by": sidecar.id}} for key in keys]
        sequence += 1
        try:
            status, body = await sidecar.produce(topic, records)
        except aiohttp.ClientError as exc:
            tally.refused += 1
            tally.errors.append(f"{sidecar.id}: {exc!r}")
            return
        if status != 200:
            tally.refused += 1
            tally.errors.append(f"{sidecar.id}: {status} {body.get('error_code')}")
        else:
            tally.written += sum(1 for entry in body["offsets"] if entry["error_code"] is None)
        if pause_s:
            await asyncio.sleep(pause_s)


def log_of_description(description: dict[str, Any]) -> GenerationLog:
    """The generation log an admin description of a topic shows (``GET
    /admin/topics/{t}``), compacted or not."""
    from sidecar.core.serialization import generation_from_json, log_from_generations

    generations = [generation_from_json(g) for g in description["generations"]]
    first = description.get("first_generation", 0)
    folded = None
    if first:
        waits = [
            [w["partition"], w["source"], w["boundary"], w["generation"], w["kind"]]
            for w in description["folded_waits"]
        ]
        folded = {"first_generation": first, "waits": waits}
    return log_from_generations(description["config"]["initial_count"], generations, folded)


async def check_no_record_crossed_a_barrier(
    cluster: ClusterEndpoints, description: dict[str, Any]
) -> int:
    """Every record's routing generation (its stamp) is the generation its offset lies in, and
    every keyed record sits where linear hashing puts its key for that generation's
    count. Returns how many records were checked."""
    from sidecar.core.placement import record_stamp
    from sidecar.core.routing import partition_for_key

    config = description["config"]
    log = log_of_description(description)
    stored = await read_all(cluster, config["name"], description["physical_count"])
    checked = 0
    for partition, records in stored.items():
        for record in records:
            stamp = record_stamp(record.headers)
            assert stamp is not None, f"partition {partition} offset {record.offset}: no stamp"
            routed_with, count = stamp.generation, stamp.count
            lies_in = log.generation_of(partition, record.offset)
            assert routed_with == lies_in, (
                f"partition {partition} offset {record.offset} was routed with generation "
                f"{routed_with} but lies in generation {lies_in}"
            )
            assert count == log[routed_with].undeleted_count
            if record.key is not None and header(record, "ordered.relocation") is None:
                assert partition == partition_for_key(record.key, log.initial_count, count)
            checked += 1
    return checked
