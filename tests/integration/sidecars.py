"""Helpers to run real sidecars (in this process) against the test cluster."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from sidecar.config import HttpSettings, KafkaSettings, ProduceSettings, Settings, ZooKeeperSettings
from sidecar.devcluster.provider import ClusterEndpoints
from sidecar.server import SidecarServer

ADMIN_TOKEN = "test-token"
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
) -> Settings:
    return Settings(
        sidecar_id=f"{name}-{uuid.uuid4().hex[:6]}",
        kafka=KafkaSettings(bootstrap_servers=cluster.kafka_bootstrap, request_timeout_ms=10_000),
        zookeeper=ZooKeeperSettings(
            hosts=cluster.zookeeper_hosts, root=root, session_timeout_s=session_timeout_s
        ),
        http=HttpSettings(port=0, admin_enabled=True, admin_token=ADMIN_TOKEN),
        produce=ProduceSettings(hold_timeout_s=hold_timeout_s, barrier_timeout_s=barrier_timeout_s),
    )


@dataclass
class RunningSidecar:
    server: SidecarServer
    http: aiohttp.ClientSession

    @property
    def id(self) -> str:
        return self.server.settings.sidecar_id

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


@asynccontextmanager
async def running_sidecars(
    cluster: ClusterEndpoints, count: int, **options: Any
) -> AsyncIterator[list[RunningSidecar]]:
    """``count`` sidecars sharing one fresh ZooKeeper root (one "deployment")."""
    root = f"/{unique('ordered-test')}"
    started: list[RunningSidecar] = []
    try:
        for index in range(count):
            server = SidecarServer(settings_for(cluster, root, f"sc{index}", **options))
            await server.start()
            session = aiohttp.ClientSession(server.url)
            started.append(RunningSidecar(server, session))
        yield started
    finally:
        for running in started:
            await running.http.close()
            await running.server.stop()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def read_all(
    cluster: ClusterEndpoints, topic: str, partitions: int
) -> dict[int, list[ConsumerRecord[bytes, bytes]]]:
    """Every record now in ``partitions`` of ``topic``, per partition in offset order."""
    consumer = AIOKafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(assigned)
        await consumer.seek_to_beginning()
        ends = await consumer.end_offsets(assigned)
        result: dict[int, list[ConsumerRecord[bytes, bytes]]] = {p: [] for p in range(partitions)}
        remaining = {tp for tp in assigned if ends[tp] > await consumer.position(tp)}
        while remaining:
            batches = await consumer.getmany(timeout_ms=5000)
            assert batches, f"no records within 5 s, still waiting for {remaining}"
            for tp, records in batches.items():
                result[tp.partition].extend(records)
                if records[-1].offset + 1 >= ends[tp]:
                    remaining.discard(tp)
        return result
    finally:
        await consumer.stop()


def header(record: ConsumerRecord[bytes, bytes], name: str) -> bytes | None:
    for key, value in record.headers:
        if key == name:
            return bytes(value) if value is not None else None
    return None
