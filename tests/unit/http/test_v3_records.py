"""The v3 produce route on a stand-in service: what reaches it, in what order, and how
each answer is shaped (``http.v3_records``)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sidecar.config import HttpSettings, ProduceSettings, Settings
from sidecar.core.errors import FencedGeneration
from sidecar.core.produce import ProduceRequest, RecordFailed, RecordWritten
from sidecar.http.connections import ConnectionGuard, connection_middleware, install
from sidecar.http.error_map import errors_middleware
from sidecar.http.topic_routes import TOPICS_KEY
from sidecar.http.v3_records import add_routes
from sidecar.metrics import SidecarMetrics
from sidecar.service.produce import ProduceOutcome, ProduceService
from sidecar.service.topics import TopicDirectory

Client = TestClient[web.Request, web.Application]
CLUSTER = "test-cluster"
PATH = f"/v3/clusters/{CLUSTER}/topics/orders/records"
JSON = {"Content-Type": "application/json"}


class _Directory:
    async def cluster_id(self) -> str:
        return CLUSTER


@dataclass
class _Service:
    """Writes every record at the next offset of partition 0; fences keys named "fenced"
    with one record alone, fails keys named "bad" per record, breaks on "broken"."""

    settings: Settings
    calls: list[ProduceRequest] = field(default_factory=list)
    registry: Any = field(default_factory=lambda: SimpleNamespace(topics={}))
    release: asyncio.Event = field(default_factory=asyncio.Event)
    called: asyncio.Event = field(default_factory=asyncio.Event)

    async def produce(
        self,
        topic: str,
        request: ProduceRequest,
        partition: int | None = None,
        *,
        on_sent: Callable[[], None] | None = None,
    ) -> ProduceOutcome:
        self.calls.append(request)
        self.called.set()
        if on_sent is not None and request.records[0].key != b"held":
            on_sent()  # queued for the writer, as a managed topic's records are
        await self.release.wait()
        if request.records[0].key == b"fenced":
            raise FencedGeneration("old", current_generation=2, current_count=4)
        if request.records[0].key == b"broken":
            raise RuntimeError("hunter2")
        results: list[RecordWritten | RecordFailed] = []
        for record in request.records:
            if record.key == b"bad":
                results.append(RecordFailed(42201, "refused"))
            else:
                offset = sum(len(c.records) for c in self.calls) - len(request.records)
                results.append(RecordWritten(0, offset + len(results), 1_000))
        return ProduceOutcome(results, 0, 1)


@pytest.fixture
def service() -> _Service:
    settings = Settings(
        sidecar_id="v3-test",
        produce=ProduceSettings(stream_max_in_flight=3, stream_idle_timeout_s=0.5),
    )
    return _Service(settings)


@pytest.fixture
async def client(service: _Service) -> AsyncIterator[Client]:
    metrics = SidecarMetrics()
    app = web.Application(middlewares=[errors_middleware, connection_middleware])
    install(
        app,
        ConnectionGuard(
            max_connections=10,
            header_read_timeout_s=5,
            body_read_timeout_s=5,
            refusal_linger_s=HttpSettings().refusal_linger_s,
            metrics=metrics,
        ),
    )
    app[TOPICS_KEY] = cast(TopicDirectory, _Directory())
    add_routes(app, cast(ProduceService, service), metrics)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


def record(key: str, value: Any = 1) -> dict[str, Any]:
    return {"key": {"type": "STRING", "data": key}, "value": {"type": "JSON", "data": value}}


async def test_one_record_is_answered_with_its_own_status(
    client: Client, service: _Service
) -> None:
    service.release.set()
    response = await client.post(PATH, data=json.dumps(record("k")), headers=JSON)
    assert response.status == 200
    body = await response.json()
    assert body["error_code"] == 200
    assert body["offset"] == 0
    assert body["timestamp"] == "1970-01-01T00:00:01.000Z"
    response = await client.post(PATH, data=json.dumps(record("fenced")), headers=JSON)
    assert response.status == 409
    body = await response.json()
    assert body["error_code"] == 409
    assert body["current_generation"] == 2


async def test_a_bug_is_a_500_in_v3_shape_without_internals(
    client: Client, service: _Service, caplog: pytest.LogCaptureFixture
) -> None:
    service.release.set()
    with caplog.at_level(logging.ERROR):
        response = await client.post(PATH, data=json.dumps(record("broken")), headers=JSON)
    assert response.status == 500
    assert response.content_type == "application/json"
    assert await response.json() == {"error_code": 500, "message": "internal error"}
    (logged,) = caplog.records
    assert logged.exc_info is not None
    assert logged.exc_info[0] is RuntimeError


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b'{"key": 1}',
        b'{"value": {"type": "JSON", "data": 1}} {"value": {"type": "AVRO", "data": 1}}',
        b'{"value": {"data": "AA=="}} trailing',
        b'{"value": {"data": "AA=="}',
        b'{"value": {"data": "AA=="}, }',
    ],
)
async def test_a_malformed_body_is_4xx_in_v3_shape_and_nothing_is_written(
    client: Client, service: _Service, body: bytes
) -> None:
    response = await client.post(PATH, data=body, headers=JSON)
    assert 400 <= response.status < 500
    answer = await response.json()
    assert answer["error_code"] == response.status
    assert isinstance(answer["message"], str)
    assert service.calls == []


async def test_another_cluster_or_content_type_is_refused(
    client: Client, service: _Service
) -> None:
    response = await client.post(
        "/v3/clusters/other/topics/orders/records", data=b"{}", headers=JSON
    )
    assert response.status == 404
    assert (await response.json())["error_code"] == 404
    response = await client.post(PATH, data=b"{}", headers={"Content-Type": "text/plain"})
    assert response.status == 415
    assert (await response.json())["error_code"] == 415
    response = await client.get("/v3/clusters")
    assert (await response.json())["data"][0]["cluster_id"] == CLUSTER
    assert service.calls == []


async def test_a_stream_is_answered_in_order_with_bounded_runs(
    client: Client, service: _Service
) -> None:
    chunks: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def body() -> AsyncIterator[bytes]:
        while (chunk := await chunks.get()) is not None:
            yield chunk

    for key in ["a", "b", "c", "d", "e"]:
        chunks.put_nowait(json.dumps(record(key)).encode())
    posting = asyncio.ensure_future(client.post(PATH, data=body(), headers=JSON, chunked=True))
    # While the records sent are not answered, no more than three are taken from the
    # request (runs may overlap once each is queued for the writer).
    await asyncio.wait_for(service.called.wait(), 5)
    await asyncio.sleep(0.2)
    assert sum(len(c.records) for c in service.calls) == 3
    service.release.set()
    response = await posting
    assert response.status == 200
    lines = [json.loads(await response.content.readline()) for _ in range(5)]
    assert [line["offset"] for line in lines] == [0, 1, 2, 3, 4]
    # Runs never held more than the in-flight bound.
    assert all(len(c.records) <= 3 for c in service.calls)
    # A failing record and a malformed one are answered alone; the stream goes on.
    chunks.put_nowait(b'{"key": {"type": "STRING", "data": "bad"}, "value": null}')
    chunks.put_nowait(b'{"key": {"type": "STRING", "data": 7}}\n')
    chunks.put_nowait(json.dumps(record("f")).encode())
    lines = [json.loads(await response.content.readline()) for _ in range(3)]
    assert [line["error_code"] for line in lines] == [422, 400, 200]
    assert lines[0]["v2_error_code"] == 42201
    # Junk ends the stream with a last 400.
    chunks.put_nowait(b"}{")
    rest = await response.content.read()
    assert [json.loads(line)["error_code"] for line in rest.splitlines()] == [400]
    chunks.put_nowait(None)
    assert [r.key for c in service.calls for r in c.records] == [
        b"a",
        b"b",
        b"c",
        b"d",
        b"e",
        b"bad",
        b"f",
    ]


async def test_an_idle_stream_ends_with_a_408_after_its_answers(
    client: Client, service: _Service
) -> None:
    service.release.set()
    chunks: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def body() -> AsyncIterator[bytes]:
        while (chunk := await chunks.get()) is not None:
            yield chunk

    chunks.put_nowait(json.dumps(record("a")).encode())
    response = await client.post(PATH, data=body(), headers=JSON, chunked=True)
    # Nothing more is sent: after 0.5 s the stream is ended by the sidecar.
    lines = (await asyncio.wait_for(response.content.read(), 10)).splitlines()
    assert [json.loads(line)["error_code"] for line in lines] == [200, 408]
    chunks.put_nowait(None)


async def test_a_client_gone_mid_stream_ends_it_quietly(
    client: Client, service: _Service, caplog: pytest.LogCaptureFixture
) -> None:
    chunks: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def body() -> AsyncIterator[bytes]:
        while (chunk := await chunks.get()) is not None:
            yield chunk

    chunks.put_nowait(json.dumps(record("a")).encode())
    posting = asyncio.ensure_future(client.post(PATH, data=body(), headers=JSON, chunked=True))
    await asyncio.wait_for(service.called.wait(), 5)
    response = await posting
    # Drops the connection with the record in flight: aiohttp cancels the handler, which
    # still waits for what it handed to the service.
    response.close()
    service.release.set()
    await asyncio.sleep(0.3)
    # The record in flight still settled; nothing was logged as a failure.
    assert [r.key for c in service.calls for r in c.records] == [b"a"]
    # The sidecar's own loggers and aiohttp's: a ZooKeeper client left reconnecting by an
    # earlier test of the same process logs on its own thread, and is not this handler.
    assert not [
        r
        for r in caplog.records
        if r.levelname in ("ERROR", "WARNING") and r.name.startswith(("sidecar", "aiohttp"))
    ]
    chunks.put_nowait(None)


async def test_a_run_not_yet_queued_for_the_writer_holds_the_next_one_back(
    client: Client, service: _Service
) -> None:
    # A run held before its records are queued (a barrier) must not be passed by the
    # next: the next starts only once the held one is queued, or answered.
    chunks: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def body() -> AsyncIterator[bytes]:
        while (chunk := await chunks.get()) is not None:
            yield chunk

    chunks.put_nowait(json.dumps(record("held")).encode())
    posting = asyncio.ensure_future(client.post(PATH, data=body(), headers=JSON, chunked=True))
    await asyncio.wait_for(service.called.wait(), 5)
    chunks.put_nowait(json.dumps(record("next")).encode())
    await asyncio.sleep(0.3)
    assert [c.records[0].key for c in service.calls] == [b"held"]
    service.release.set()
    response = await posting
    lines = [json.loads(await response.content.readline()) for _ in range(2)]
    assert [line["offset"] for line in lines] == [0, 1]
    assert [c.records[0].key for c in service.calls] == [b"held", b"next"]
    chunks.put_nowait(None)


async def test_a_shutdown_ends_open_streams_with_a_retriable_503(
    client: Client, service: _Service
) -> None:
    service.release.set()
    chunks: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def body() -> AsyncIterator[bytes]:
        while (chunk := await chunks.get()) is not None:
            yield chunk

    chunks.put_nowait(json.dumps(record("a")).encode())
    response = await client.post(PATH, data=body(), headers=JSON, chunked=True)
    first = json.loads(await response.content.readline())
    assert first["error_code"] == 200
    await client.app.shutdown()  # what the runner's cleanup does first
    last = json.loads(await asyncio.wait_for(response.content.read(), 5))
    assert (last["error_code"], last["v2_error_code"], last["retriable"]) == (503, 50301, True)
    chunks.put_nowait(None)
