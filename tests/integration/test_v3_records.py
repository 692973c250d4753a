"""REST Proxy v3 produce through a real sidecar: one record, streams, fencing, clusters."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from ordered_dev.devcluster.provider import ClusterEndpoints
from ordered_dev.harness.sidecars import RunningSidecar, header, read_all, running_sidecars, unique
from sidecar.core.placement import is_stamped, routed_generation
from sidecar.core.routing import default_partition, partition_for_key

JSON = {"Content-Type": "application/json"}


async def cluster_id_of(sidecar: RunningSidecar) -> str:
    async with sidecar.http.get("/v3/clusters") as response:
        assert response.status == 200
        body = await response.json()
    assert body["kind"] == "KafkaClusterList"
    (cluster,) = body["data"]
    return str(cluster["cluster_id"])


def records_path(cluster_id: str, topic: str) -> str:
    return f"/v3/clusters/{cluster_id}/topics/{topic}/records"


async def produce_one(
    sidecar: RunningSidecar,
    cluster_id: str,
    topic: str,
    record: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    async with sidecar.http.post(
        records_path(cluster_id, topic), data=json.dumps(record), headers=JSON | (headers or {})
    ) as response:
        return response.status, await response.json(content_type=None)


class Stream:
    """One chunked v3 request kept open: records go in when sent, answers come out."""

    def __init__(self, sidecar: RunningSidecar, path: str, headers: dict[str, str]) -> None:
        self._sidecar = sidecar
        self._path = path
        self._headers = headers
        self._outgoing: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._response: aiohttp.ClientResponse | None = None
        self._posting: asyncio.Future[aiohttp.ClientResponse] | None = None

    async def __aenter__(self) -> Stream:
        async def body() -> AsyncIterator[bytes]:
            while (chunk := await self._outgoing.get()) is not None:
                yield chunk

        # The client sends the request head with the first chunk of the body, so the
        # answer's head is awaited only once something was sent (``answers``).
        self._posting = asyncio.ensure_future(
            self._sidecar.http.post(
                self._path, data=body(), headers=JSON | self._headers, chunked=True
            )
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._outgoing.put_nowait(None)
        (await self._started()).release()

    async def _started(self) -> aiohttp.ClientResponse:
        if self._response is None:
            assert self._posting is not None
            self._response = await asyncio.wait_for(self._posting, 60)
            assert self._response.status == 200
        return self._response

    def send(self, raw: bytes) -> None:
        self._outgoing.put_nowait(raw)

    def send_records(self, records: list[dict[str, Any]]) -> None:
        # Concatenated without separators in one chunk, then split across two.
        text = "".join(json.dumps(r) for r in records).encode()
        self.send(text[: len(text) // 2])
        self.send(text[len(text) // 2 :])

    async def answers(self, count: int) -> list[dict[str, Any]]:
        response = await self._started()
        got: list[dict[str, Any]] = []
        for _ in range(count):
            line = await asyncio.wait_for(response.content.readline(), 60)
            assert line, f"the stream ended after {len(got)} of {count} answers"
            got.append(json.loads(line))
        return got

    async def end(self) -> bytes:
        """Close the request body; what the sidecar still answers."""
        self._outgoing.put_nowait(None)
        response = await self._started()
        return await asyncio.wait_for(response.content.read(), 60)


def keyed(key: str, value: Any) -> dict[str, Any]:
    return {"key": {"type": "STRING", "data": key}, "value": {"type": "JSON", "data": value}}


async def test_clusters_are_kafkas_and_another_id_is_404(cluster: ClusterEndpoints) -> None:
    topic = unique("v3-plain")
    async with running_sidecars(cluster, 1) as (sidecar,):
        cluster_id = await cluster_id_of(sidecar)
        async with sidecar.http.get(f"/v3/clusters/{cluster_id}") as response:
            assert response.status == 200
            assert (await response.json())["cluster_id"] == cluster_id
        async with sidecar.http.get("/v3/clusters/not-this-one") as response:
            assert response.status == 404
            body = await response.json()
        assert body["error_code"] == 404
        assert isinstance(body["message"], str)
        await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        status, body = await produce_one(sidecar, "not-this-one", topic, keyed("k", 1))
        assert status == 404
        assert body["error_code"] == 404
    assert await read_all(cluster, topic, 2) == {0: [], 1: []}
    # The id is the one Kafka's own metadata reports.
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await admin.start()
    try:
        described = await admin.describe_cluster()
    finally:
        await admin.close()
    assert described["cluster_id"] == cluster_id


async def test_one_record_to_a_managed_topic(cluster: ClusterEndpoints) -> None:
    topic = unique("v3-managed")
    stamp = "2026-11-23T12:34:56.789Z"
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 3, replication_factor=cluster.replication_factor)
        cluster_id = await cluster_id_of(sidecar)
        status, body = await produce_one(
            sidecar,
            cluster_id,
            topic,
            {
                "key": {"type": "STRING", "data": "user-7"},
                "value": {"type": "BINARY", "data": base64.b64encode(b"\x00\x01").decode()},
                "headers": [{"name": "trace", "value": base64.b64encode(b"t1").decode()}],
                "timestamp": stamp,
            },
        )
        assert status == 200, body
        assert body["error_code"] == 200
        assert body["cluster_id"] == cluster_id
        assert body["topic_name"] == topic
        assert body["partition_id"] == partition_for_key(b"user-7", 3, 3)
        assert body["timestamp"] == stamp
        assert body["key"] == {"type": "STRING", "size": 6}
        assert body["value"] == {"type": "BINARY", "size": 2}
        # A malformed record is 4xx in v3's shape, and nothing more is written.
        status, refused = await produce_one(
            sidecar, cluster_id, topic, {"key": {"type": "STRING", "data": 5}}
        )
        assert status == 400
        assert refused["error_code"] == 400
        assert isinstance(refused["message"], str)
    stored = await read_all(cluster, topic, 3)
    everything = [r for rs in stored.values() for r in rs]
    assert len(everything) == 1
    (record,) = everything
    assert record.partition == body["partition_id"]
    assert record.offset == body["offset"]
    assert record.key == b"user-7"
    assert record.value == b"\x00\x01"
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert record.timestamp == (datetime.fromisoformat(stamp) - epoch) // timedelta(milliseconds=1)
    assert header(record, "trace") == b"t1"
    assert routed_generation(record.headers) == 0


async def test_unmanaged_topics_pass_through_with_the_default_partitioner(
    cluster: ClusterEndpoints,
) -> None:
    topic = unique("v3-plain")
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 4, cluster.replication_factor)])
    finally:
        await admin.close()
    keys = [f"k{i}" for i in range(12)]
    async with running_sidecars(cluster, 1) as (sidecar,):
        cluster_id = await cluster_id_of(sidecar)
        async with Stream(sidecar, records_path(cluster_id, topic), {}) as stream:
            stream.send_records([keyed(k, {"n": i}) for i, k in enumerate(keys)])
            answers = await stream.answers(len(keys))
            assert await stream.end() == b""
    assert [a["error_code"] for a in answers] == [200] * len(keys)
    assert [a["partition_id"] for a in answers] == [default_partition(k.encode(), 4) for k in keys]
    stored = await read_all(cluster, topic, 4)
    assert sum(len(rs) for rs in stored.values()) == len(keys)
    assert not any(is_stamped(r.headers) for rs in stored.values() for r in rs)


async def test_a_stream_keeps_going_across_a_partition_count_change(
    cluster: ClusterEndpoints,
) -> None:
    topic = unique("v3-stream")
    keys = [f"user-{i}" for i in range(24)]
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 3, replication_factor=cluster.replication_factor)
        cluster_id = await cluster_id_of(sidecar)
        async with Stream(sidecar, records_path(cluster_id, topic), {}) as stream:
            stream.send_records([keyed(k, {"round": 0}) for k in keys])
            before = await stream.answers(len(keys))
            # The change commits while the stream is open; it holds nothing of the stream's.
            await sidecar.change_count(topic, 5)
            stream.send_records([keyed(k, {"round": 1}) for k in keys])
            after = await stream.answers(len(keys))
            # A malformed record is answered on its own and the stream goes on.
            stream.send(b'{"key": {"type": "STRING", "data": 5}, "value": null}\n')
            stream.send(json.dumps(keyed("user-0", {"round": 2})).encode())
            malformed, following = await stream.answers(2)
            # Bytes that cannot start a record end the stream with a last error.
            stream.send(b"]]")
            ending = await stream.end()
    assert [a["error_code"] for a in before + after] == [200] * (2 * len(keys))
    assert [a["partition_id"] for a in before] == [
        partition_for_key(k.encode(), 3, 3) for k in keys
    ]
    assert [a["partition_id"] for a in after] == [partition_for_key(k.encode(), 3, 5) for k in keys]
    assert malformed["error_code"] == 400
    assert "key.data" in malformed["message"]
    assert following["error_code"] == 200
    assert following["partition_id"] == partition_for_key(b"user-0", 3, 5)
    (last,) = [json.loads(line) for line in ending.splitlines()]
    assert last["error_code"] == 400
    stored = await read_all(cluster, topic, 5)
    everything = [r for rs in stored.values() for r in rs]
    assert len(everything) == 2 * len(keys) + 1
    for record in everything:
        round_ = json.loads(record.value)["round"]
        assert routed_generation(record.headers) == (0 if round_ == 0 else 1)
    # Records of one stream are written in the stream's order: in every partition,
    # offsets grow with the position in the stream (24 records were in flight at once).
    for answers in (before, after):
        for partition in {a["partition_id"] for a in answers}:
            offsets = [a["offset"] for a in answers if a["partition_id"] == partition]
            assert offsets == sorted(offsets)


async def test_a_fenced_record_is_refused_and_nothing_is_written(
    cluster: ClusterEndpoints,
) -> None:
    topic = unique("v3-fenced")
    async with running_sidecars(cluster, 1) as (sidecar,):
        await sidecar.create_topic(topic, 2, replication_factor=cluster.replication_factor)
        await sidecar.change_count(topic, 3)
        cluster_id = await cluster_id_of(sidecar)
        stale = {"Ordered-Expected-Generation": "0"}
        status, body = await produce_one(sidecar, cluster_id, topic, keyed("k", 1), stale)
        assert status == 409, body
        assert body["error_code"] == 409
        assert body["v2_error_code"] == 40910
        assert body["current_generation"] == 1
        assert body["current_count"] == 3
        async with Stream(sidecar, records_path(cluster_id, topic), stale) as stream:
            stream.send_records([keyed("a", 1), keyed("b", 2)])
            answers = await stream.answers(2)
        assert [a["error_code"] for a in answers] == [409, 409]
        current = {"Ordered-Expected-Generation": "1"}
        status, body = await produce_one(sidecar, cluster_id, topic, keyed("k", 2), current)
        assert status == 200, body
    stored = await read_all(cluster, topic, 3)
    assert [json.loads(r.value) for rs in stored.values() for r in rs] == [2]
